"""The attacks, their defaults and checks: torchattacks' PGD (L-inf, L2) and the authors'
ReColorAdv (``recolor.py``) on [0, 1] pixels.

The classifier is attacked in the space it reads: the uint8 image after its own resize/crop, as
floats in [0, 1], behind the same normalisation ``extract`` applies (``PixelClassifier``).  So a
perturbation of eps = 8/255 is 8 grey levels of the stored PNG, whatever the model's mean/std.

Defaults (``ATTACKS``) are torchattacks 3.5.1's own constructor defaults, which are Madry et al.
(ICLR 2018)'s CIFAR-10 L-inf budget (eps 8/255, step 2/255) with 10 steps, and for L2 eps 1.0,
step 0.2, 10 steps; random start on, as in Madry et al.  ``recoloradv``'s are the settings Luo et
al. attacked with (``recolor.py``); its --eps is a bound on its colour map, not on pixels.
"""
from __future__ import annotations

from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import nn

from cache.errors import TrustOraclesError
from pipeline.attack import recolor
from pipeline.core.models import DataConfig
from pipeline.core.precision import autocast

LIBRARY = "torchattacks"
# name -> (library, its class, defaults).  PGD's eps and alpha are in [0, 1] pixel units.
ATTACKS = {
    "pgd_linf": (LIBRARY, "PGD", dict(eps=8 / 255, alpha=2 / 255, steps=10, random_start=True)),
    "pgd_l2": (LIBRARY, "PGDL2", dict(eps=1.0, alpha=0.2, steps=10, random_start=True)),
    "recoloradv": (recolor.LIBRARY, "ReColorAdv", recolor.DEFAULTS),
}
DEFAULTS_SOURCE = {LIBRARY: "torchattacks constructor defaults (pipeline/attack/methods.py)",
                   recolor.LIBRARY: recolor.SOURCE}


class AttackError(TrustOraclesError, ValueError):
    """An attack option out of range, a missing library, or a classifier it cannot attack."""


def parse_amount(text: str | float, option: str) -> float:
    """'8/255', '0.03' or a float -> float; an AttackError naming ``option`` otherwise."""
    if isinstance(text, (int, float)):
        return float(text)
    try:
        return float(Fraction(str(text).strip()))
    except (ValueError, ZeroDivisionError):
        raise AttackError(f"{option} {text!r}: expected a number such as 0.03 or 8/255") from None


def resolve_params(attack: str, eps=None, alpha=None, steps=None, random_start=None) -> dict:
    """The attack's parameters: given values over the defaults, each checked (errors name the
    option: eps >= 0, step size > 0, steps >= 1)."""
    if attack not in ATTACKS:
        raise AttackError(f"--attack {attack!r}: expected one of {', '.join(ATTACKS)}")
    p = dict(ATTACKS[attack][2])
    given = dict(eps=eps, alpha=alpha, steps=steps, random_start=random_start)
    p.update({k: v for k, v in given.items() if v is not None})
    p["eps"], p["alpha"] = parse_amount(p["eps"], "--eps"), parse_amount(p["alpha"], "--step-size")
    if not p["eps"] >= 0:
        raise AttackError(f"--eps {p['eps']}: the perturbation budget must be >= 0")
    if not p["alpha"] > 0:
        raise AttackError(f"--step-size {p['alpha']}: the step size must be > 0")
    if int(p["steps"]) != p["steps"] or p["steps"] < 1:
        raise AttackError(f"--steps {p['steps']}: the attack needs at least 1 step")
    p["steps"], p["random_start"] = int(p["steps"]), bool(p["random_start"])
    return p


def library_version(attack: str) -> str:
    """'<library> <version>' of the attack's library, or an AttackError saying how to install it."""
    if ATTACKS[attack][0] == recolor.LIBRARY:
        try:
            return recolor.version()
        except recolor.MissingLibrary as err:
            raise AttackError(str(err)) from None
    try:
        import torchattacks
    except ImportError:
        raise AttackError("the attack library torchattacks is not installed: `pip install "
                          "--no-deps torchattacks==3.5.1` (its pinned requests~=2.25.1 is unused "
                          "by its code; see the attack extra in pyproject.toml)") from None
    return f"{LIBRARY} {torchattacks.__version__}"


def check_channels(attack: str, channels: int, name: str) -> None:
    """ReColorAdv maps colours through CIELUV: it needs RGB input (mister_ed's colour spaces
    unpack exactly 3 channels; a grey image would fail deep inside the package)."""
    if ATTACKS[attack][0] == recolor.LIBRARY and channels != 3:
        raise AttackError(f"--attack {attack} recolours RGB images, but --classifier {name} reads "
                          f"{channels}-channel input (grey images such as Fashion-MNIST's): "
                          "attack it with --attack pgd_linf or pgd_l2")


class PixelClassifier(nn.Module):
    """[0, 1] pixels (N, C, H, W) -> float32 logits: the frozen classifier behind the
    normalisation of ``GpuNormalize`` (same formula, so q / 255 and the uint8 path agree).

    Built in eval mode: torchattacks restores the wrapper's mode after every attack, and a
    wrapper left in nn.Module's default train mode put the classifier's BatchNorm layers in
    training mode after the first batch, so the logged accuracies of a BatchNorm classifier
    (clean from the second batch on, and stored) used batch statistics, not the frozen model's."""

    def __init__(self, model: nn.Module, cfg: DataConfig, precision: str, device: torch.device):
        super().__init__()
        c = cfg.input_size[0]
        self.model, self.precision, self.device = model, precision, device
        self.register_buffer("mean", torch.tensor(cfg.mean[:c]).view(1, c, 1, 1) * 255.0)
        self.register_buffer("inv_std", 1.0 / (torch.tensor(cfg.std[:c]).view(1, c, 1, 1) * 255.0))
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = ((x * 255.0 - self.mean) * self.inv_std).contiguous(memory_format=torch.channels_last)
        with autocast(self.precision, self.device):
            return self.model(x).float()


def build_attack(attack: str, model: PixelClassifier, params: dict):
    """``atk(x, labels) -> adversarial x``; its random start draws from torch's global generator,
    which the caller seeds per batch (so a row's perturbation does not depend on the number of
    processes)."""
    library_version(attack)
    if ATTACKS[attack][0] == recolor.LIBRARY:
        return recolor.ReColorAdvAttack(model, params)
    import torchattacks
    cls = getattr(torchattacks, ATTACKS[attack][1])
    return cls(model, eps=params["eps"], alpha=params["alpha"], steps=params["steps"],
               random_start=params["random_start"])


def check_differentiable(model: PixelClassifier, x: torch.Tensor, labels: torch.Tensor,
                         name: str) -> None:
    """Refuse a classifier whose loss has no usable gradient w.r.t. the input pixels (a forward
    run under no_grad/inference mode, integer or rounding ops, a non-differentiable export): PGD
    would then return the clean images and call them adversarial."""
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        try:
            logits = model(x)
        except RuntimeError as err:
            raise AttackError(f"--classifier {name}: forward pass with input gradients failed "
                              f"({err}); the attack needs a differentiable classifier") from None
        if not logits.requires_grad:
            raise AttackError(f"--classifier {name} cannot be differentiated: its outputs carry no "
                              "gradient w.r.t. the input (forward under no_grad/inference mode or "
                              "a non-differentiable export); attack a differentiable copy")
        (grad,) = torch.autograd.grad(F.cross_entropy(logits, labels), x, allow_unused=True)
    if grad is None or not bool(torch.isfinite(grad).all()) or not bool(grad.abs().sum() > 0):
        state = "no" if grad is None else "a non-finite" if not bool(torch.isfinite(grad).all()) \
            else "an all-zero"
        raise AttackError(f"--classifier {name} cannot be differentiated: the loss has {state} "
                          "gradient w.r.t. the input pixels (rounding/integer ops or saturated "
                          "outputs); a gradient attack cannot perturb it")
