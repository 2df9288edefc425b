"""Oracle losses against hand-computed values, SS's direction and range, the authors' broadcasting
variant, class-balanced weights and option checks (pipeline/oracle/nets/losses.py)."""
from __future__ import annotations

import math

import pytest
import torch

from pipeline.core.losses import Context, LossOptionError, check_options, get
from pipeline.core.losses.base import class_balanced_weights
from pipeline.core.losses.ss import steep_slope, steep_slope_max
from pipeline.oracle.nets.losses import broadcast_coefficients, coefficients, per_sample_loss

Z = torch.tensor([0.0, 2.0, 2.0, -1.0, -3.0])
O = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0])


def make(name: str, **kw):
    """A resolved loss of ``name``: its own parameters and the class weights by keyword."""
    own = {p.name for p in get(name).params}
    return get(name)({k: v for k, v in kw.items() if k in own},
                     **{k: v for k, v in kw.items() if k not in own})


def resolve_loss(name: str, given: dict, slopes, counts):
    check_options(name, given)
    return get(name).resolve(given, Context(tuple(slopes)), counts)


def loss(name: str, z=Z, o=O, p_true=None, **kw) -> torch.Tensor:
    cfg = make(name, **kw)
    return per_sample_loss(cfg, z, o, torch.zeros_like(z) if p_true is None else p_true)


def test_cross_entropy_hand_values():
    # -log sigmoid(z) for o=1, -log(1 - sigmoid(z)) for o=0
    expected = [math.log(2), 0.1269280110429725, 2.1269280110429727, 0.31326168751822286,
                3.048587351573742]
    assert torch.allclose(loss("ce"), torch.tensor(expected), atol=1e-6)


def test_cross_entropy_weights_scale_each_class():
    out = loss("ce", pos_weight=1.0, neg_weight=5.0)
    assert torch.allclose(out, loss("ce") * torch.tensor([1, 1, 5, 5, 1.0]), atol=1e-6)


def test_focal_hand_values_gamma_2():
    # z=0, o=1: 0.5^2 ln 2; z=2, o=1: (1-p)^2 ln(1+e^-2); z=2, o=0: p^2 ln(1+e^2), p = 0.8808
    p2 = 1 / (1 + math.exp(-2))
    expected = [0.25 * math.log(2), (1 - p2) ** 2 * 0.1269280110429725,
                p2 ** 2 * 2.1269280110429727]
    assert torch.allclose(loss("focal", gamma=2.0)[:3], torch.tensor(expected), atol=1e-6)
    assert abs(expected[0] - 0.17328679513998632) < 1e-12
    # gamma = 0 is plain cross entropy
    assert torch.allclose(loss("focal", gamma=0.0), loss("ce"), atol=1e-6)


def test_tcp_hand_values():
    z = torch.tensor([0.0, math.log(3.0)])          # sigmoid = 0.5, 0.75
    out = loss("tcp", z=z, o=torch.ones(2), p_true=torch.tensor([0.2, 1.0]))
    assert torch.allclose(out, torch.tensor([0.09, 0.0625]), atol=1e-6)


def test_steep_slope_hand_values_vit_alphas():
    # alpha+ = 1, alpha- = 3, s = z / (1 + |z|)
    z = torch.tensor([0.0, 0.0, 1.0, 1.0, -3.0, -3.0])
    o = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    expected = [1 - math.exp(-1),                    # 0.632121
                1 - math.exp(-3),                    # 0.950213
                math.exp(-0.5) - math.exp(-1),       # 0.238651
                math.exp(1.5) - math.exp(-3),        # 4.431902
                math.exp(0.75) - math.exp(-1),       # 1.749121
                math.exp(-2.25) - math.exp(-3)]      # 0.055612
    out = loss("ss", z=z, o=o, alpha_pos=1.0, alpha_neg=3.0)
    assert torch.allclose(out, torch.tensor(expected), atol=1e-6)
    assert abs(expected[3] - 4.431902) < 1e-6


@pytest.mark.parametrize("alphas", [(1.0, 3.0), (2.0, 5.0)])
def test_steep_slope_gradient_pushes_z_the_right_way(alphas):
    z = torch.linspace(-20, 20, 81, requires_grad=True)
    ones, zeros = torch.ones(81), torch.zeros(81)
    steep_slope(z, ones, zeros, *alphas).sum().backward()
    assert (z.grad < 0).all()          # o = 1: descending the loss increases z
    z.grad = None
    steep_slope(z, zeros, ones, *alphas).sum().backward()
    assert (z.grad > 0).all()          # o = 0: descending the loss decreases z


def test_paper_printed_equation_would_push_the_wrong_way():
    """Documented sign note: exp(+a s) for o = 1 (the printed Eq.) grows with z."""
    z = torch.tensor([0.5], requires_grad=True)
    s = z / (1 + z.abs())
    (torch.exp(1.0 * s) - math.exp(-1.0)).sum().backward()
    assert z.grad.item() > 0           # minimising it would push correct predictions down


@pytest.mark.parametrize("alphas", [(1.0, 3.0), (2.0, 5.0), (0.5, 0.5)])
def test_steep_slope_range(alphas):
    z = torch.cat([torch.linspace(-50, 50, 1001), torch.tensor([-1e6, 1e6, 0.0])])
    top = steep_slope_max(*alphas)
    for o in (torch.ones_like(z), torch.zeros_like(z)):
        out = steep_slope(z, o, 1 - o, *alphas)
        assert (out >= 0).all() and (out <= top + 1e-5).all()
    # minimum 0 approached at the far end of each slide, maximum at the other end
    assert steep_slope(torch.tensor([1e6]), torch.ones(1), torch.zeros(1), *alphas).item() < 1e-5
    far = steep_slope(torch.tensor([-1e6]), torch.ones(1), torch.zeros(1), *alphas).item()
    assert abs(far - (math.exp(alphas[0]) - math.exp(-alphas[0]))) < 1e-3


def _authors_broadcast(name: str, z: torch.Tensor, o: torch.Tensor, w_pos: float, w_neg: float,
                       gamma: float = 2.0) -> torch.Tensor:
    """The authors' expression with x of shape (B, 1) and labels (B,): a (B, B) matrix, mean."""
    x, gt = z[:, None], o                      # (B,1) vs (B,)
    p = torch.sigmoid(x)
    if name == "ce":
        mat = -gt * w_pos * torch.log(p) - (1 - gt) * w_neg * torch.log(1 - p)
    else:
        mat = (-gt * w_pos * (1 - p) ** gamma * torch.log(p)
               - (1 - gt) * w_neg * p ** gamma * torch.log(1 - p))
    assert mat.shape == (len(z), len(z))
    return mat.mean()


@pytest.mark.parametrize("name", ["ce", "focal"])
@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 5.0), (0.4, 1.6)])
def test_broadcast_variant_equals_bxb_mean(name, weights):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(40, generator=g, dtype=torch.float64) * 3
    o = (torch.rand(40, generator=g) < 0.8).double()
    gamma = {"gamma": 2.0} if name == "focal" else {}
    cfg = make(name, **gamma, pos_weight=weights[0], neg_weight=weights[1], broadcast=True)
    ours = per_sample_loss(cfg, z, o, o, broadcast_coefficients(cfg, o, len(z))).mean()
    assert torch.allclose(ours.double(), _authors_broadcast(name, z, o, *weights), atol=1e-5)
    # split into micro-batches (DDP ranks / accumulation) against the GLOBAL batch's labels
    parts = [per_sample_loss(cfg, z[i:i + 10], o[i:i + 10], o[i:i + 10],
                             broadcast_coefficients(cfg, o, 10)).mean() for i in range(0, 40, 10)]
    assert torch.allclose(torch.stack(parts).mean(), ours, atol=1e-6)
    # and it differs from the per-sample loss: every output is pushed to the batch mean label
    per_sample = per_sample_loss(make(name, **gamma, pos_weight=weights[0],
                                      neg_weight=weights[1]), z, o, o).mean()
    assert abs(per_sample.item() - ours.item()) > 1e-3


def test_class_balanced_weights_formula():
    beta, n_neg, n_pos = 0.999, 120, 880
    raw_neg, raw_pos = (1 - beta) / (1 - beta ** n_neg), (1 - beta) / (1 - beta ** n_pos)
    w_neg, w_pos = class_balanced_weights(n_neg, n_pos, beta)
    assert w_neg + w_pos == pytest.approx(2.0)
    assert w_neg / w_pos == pytest.approx(raw_neg / raw_pos)
    assert w_neg == pytest.approx(2 * raw_neg / (raw_neg + raw_pos))
    assert w_neg > 1 > w_pos                   # the rarer class (errors) weighs more
    assert class_balanced_weights(500, 500) == pytest.approx((1.0, 1.0))
    with pytest.raises(LossOptionError, match="both classes"):
        class_balanced_weights(0, 10)


def test_resolved_class_balanced_weights_reach_the_loss():
    cfg = resolve_loss("ce", {"class_balanced": True}, (1, 3), counts=(120, 880))
    w_neg, w_pos = class_balanced_weights(120, 880, 0.999)
    assert (cfg.neg_weight, cfg.pos_weight) == pytest.approx((w_neg, w_pos))
    c_pos, c_neg = coefficients(cfg, torch.tensor([1.0, 0.0]))
    assert c_pos.tolist() == pytest.approx([w_pos, 0]) and c_neg.tolist() == pytest.approx([0, w_neg])


@pytest.mark.parametrize("loss_name, given, match", [
    ("ce", {"alpha_pos": 1.0}, "--alpha-pos does not apply to --loss ce"),
    ("ss", {"gamma": 2.0}, "--gamma does not apply"),
    ("ce", {"gamma": 0.0}, "--gamma does not apply"),          # 0 is a value, not "unset"
    ("tcp", {"class_balanced": True}, "--class-balanced does not apply"),
    ("ss", {"broadcast": True}, "--authors-broadcast does not apply"),
    ("focal", {"z": "linear"}, "--ss-distance does not apply"),
    ("ce", {"cb_beta": 0.99}, "--cb-beta needs --class-balanced"),
    ("ce", {"class_balanced": True, "neg_weight": 5.0}, "exclusive"),
    ("ce", {"neg_weight": -1.0}, "positive"),
    ("ss", {"alpha_neg": float("nan")}, "positive"),
    ("hinge", {}, "--loss"),
])
def test_option_misfits_are_refused(loss_name, given, match):
    with pytest.raises(LossOptionError, match=match):
        check_options(loss_name, given)


def test_defaults_variants_and_labels():
    assert resolve_loss("focal", {}, (1, 3), None).gamma == 2.0
    assert resolve_loss("focal", {"class_balanced": True}, (1, 3), (10, 90)).gamma == 0.5
    ss = resolve_loss("ss", {}, (2.0, 5.0), None)
    assert (ss.alpha_pos, ss.alpha_neg) == (2.0, 5.0)
    assert ss.tags("hyperplane") == [] and ss.display([]) == "SS"
    assert ss.tags("linear") == ["linear-z"]
    assert ss.display(["linear-z"]) == "SS (linear z)"
    assert ss.tags("hyperplane", (1.0, 3.0)) == ["a2-5"]     # other than the oracle's slopes
    assert ss.display(["a2-5"]) == "SS (α+ 2, α− 5)"
    ce = resolve_loss("ce", {"broadcast": True}, (1, 3), None)
    assert ce.display(ce.tags("linear")) == "CE (broadcast)"
    w = resolve_loss("ce", {"neg_weight": 5.0}, (1, 3), None)
    assert w.tags("linear") == ["w1-5"]
    cb = resolve_loss("focal", {"class_balanced": True, "broadcast": True}, (1, 3), (10, 90))
    assert cb.tags("linear") == ["broadcast", "cb"]
    assert cb.display(["broadcast", "cb"]) == "Focal (broadcast, CB)"
