"""MC-Dropout (Gal & Ghahramani, ICML 2016) for ``extract --mc-dropout T``: T stochastic passes per
batch with ONLY the classifier's dropout active, summarised per row beside the deterministic
outputs (cache/schema.py ``MC_COLUMNS``).

What is switched on (``dropout_sites``):

* every ``nn.Dropout``-family module with p > 0 (timm: ``head_drop``, ``pos_drop``, ``proj_drop``,
  ``attn_drop``, MLP dropouts);
* a module that applies dropout in its own forward code, gated by its own ``training`` flag --
  timm's ResNet family (``F.dropout(x, p=self.drop_rate, training=self.training)`` before the
  head) and fused attention (``dropout_p=self.attn_drop.p if self.training else 0.``) -- but only
  where the source of its forward methods uses ``self.training`` for dropout alone, so that
  setting the flag changes nothing else.  Its children keep their own flags.

Everything else stays in eval mode: BatchNorm (batch statistics would make a row's score depend on
its batch), and stochastic depth (``DropPath``) and patch dropout, which drop whole residual
branches or tokens: another approximate posterior than the dropout the method is defined on.

Masks come from the global RNG seeded per batch by (``--seed``, the batch's first global row):
batches never straddle shards and depend only on ``--shard-size`` and ``--batch-size`` (recorded in
the identity), so a resumed run and any number of torchrun ranks draw the same masks.  The T passes
run one after the other on the same batch; where every dropout site lies in the head (timm's
``drop_rate``), the backbone runs once and only the head T times (``head_only``, recorded).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
from contextlib import contextmanager
from dataclasses import replace

import torch
from torch import nn

from pipeline.core.models import ModelError, ModelSpec, build_model

MASKS = "global RNG seeded per batch by sha256(seed, first global row of the batch)"
_FORWARDS = ("forward", "forward_features", "forward_head")


@functools.lru_cache(maxsize=None)   # per class: dropout_on asks for every batch
def _gates_only_dropout(cls: type) -> bool:
    """True if every line of the class's forward methods that reads ``self.training`` is about
    dropout (so switching the flag on switches dropout on and nothing else)."""
    lines = []
    for name in _FORWARDS:
        method = getattr(cls, name, None)
        if method is None or method is getattr(nn.Module, name, None):
            continue
        try:
            lines += [ln for ln in inspect.getsource(method).splitlines() if "self.training" in ln]
        except (OSError, TypeError):   # no source (compiled): not switched
            return False
    return bool(lines) and all("dropout" in ln.lower() for ln in lines)


def _rate_of(module: nn.Module) -> float:
    """The dropout rate a module applies in its own forward code (0 when none)."""
    rate = getattr(module, "drop_rate", 0.0)
    drop = getattr(module, "attn_drop", None)
    if isinstance(drop, nn.modules.dropout._DropoutNd):
        rate = max(float(rate or 0.0), float(drop.p))
    return float(rate or 0.0) if isinstance(rate, (int, float)) else 0.0


def dropout_sites(model: nn.Module) -> dict[str, tuple[nn.Module, float]]:
    """{module name ("" = the model): (module, rate)} of the dropout MC-Dropout switches on."""
    sites = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            if module.p > 0:
                sites[name] = (module, float(module.p))
        elif _rate_of(module) > 0 and _gates_only_dropout(type(module)):
            sites[name] = (module, _rate_of(module))
    return sites


def mc_model(spec: ModelSpec, seed: int, rate: float | None, text: str) -> tuple[nn.Module, dict]:
    """The classifier for an MC-Dropout extract and its record's rates part.  ``rate``
    (--mc-dropout-rate): the model rebuilt with timm's ``drop_rate`` (dropout before the head);
    without it the model's own dropout, refused when it has none."""
    plain = build_model(spec, seed=seed)
    own = {n: p for n, (_, p) in dropout_sites(plain).items()}
    named = f"{text}: timm model {spec.name}"
    if rate is None:
        if not own:
            raise ModelError(f"{named} has no active dropout layer (none, or every rate is 0), so "
                             "--mc-dropout would repeat the same pass. Give --mc-dropout-rate R "
                             "(e.g. 0.1) to rebuild it with timm's drop_rate=R (dropout before "
                             "its classifier head, at test time only), or leave out --mc-dropout")
        return plain, {"rates": own, "rate_option": None, "test_time_only": False}
    try:
        model = build_model(replace(spec, kwargs={**spec.kwargs, "drop_rate": rate}), seed=seed)
    except ModelError as err:
        raise ModelError(f"--mc-dropout-rate: {named} cannot be rebuilt with timm's "
                         f"drop_rate={rate} ({err}); use a classifier whose timm model takes "
                         "drop_rate, or leave out --mc-dropout-rate to use its own dropout"
                         ) from None
    rates = {n: p for n, (_, p) in dropout_sites(model).items()}
    if rate > 0 and rate not in rates.values():
        raise ModelError(f"--mc-dropout-rate: {named} accepts drop_rate={rate} but applies no "
                         "dropout that MC-Dropout can switch on (no dropout module, nor dropout "
                         "gated by the training flag alone); use another classifier")
    return model, {"rates": rates, "rate_option": rate, "test_time_only": not own}


def head_only(model: nn.Module, input_size: tuple) -> bool:
    """True when no dropout site acts inside ``forward_features`` (and the model's forward is
    ``forward_head(forward_features(x))``): the backbone's output is then the same in every pass,
    so it is computed once per batch and only the head runs T times -- the numbers of T full
    passes at a fraction of the cost (timm's ``drop_rate`` is dropout before the head)."""
    if not all(hasattr(model, f) for f in _FORWARDS[1:]):
        return False
    sites = dropout_sites(model)
    if "" in sites and "self.training" in inspect.getsource(type(model).forward_features):
        return False
    fired = []
    hooks = [m.register_forward_hook(lambda *_: fired.append(1)) for n, (m, _) in sites.items()
             if n]
    x = torch.zeros(1, *input_size)
    try:
        with torch.inference_mode():
            feats = model.forward_features(x)
            in_backbone = bool(fired)
            same = torch.equal(model.forward_head(feats), model(x))
    finally:
        for hook in hooks:
            hook.remove()
    return same and not in_backbone


def record(passes: int, rates: dict, seed: int, batch_size: int) -> dict:
    """The identity attribute ``mc_dropout`` (cache/schema.py)."""
    return {"passes": passes, **rates, "seed": seed, "batch_size": batch_size, "masks": MASKS}


def batch_seed(seed: int, first_row: int) -> int:
    digest = hashlib.sha256(f"mc-dropout:{seed}:{first_row}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@contextmanager
def dropout_on(model: nn.Module):
    """The dropout sites in training mode, every other module as it was (eval)."""
    sites = [m for m, _ in dropout_sites(model).values()]
    before = [m.training for m in sites]
    try:
        for m in sites:
            m.training = True       # the flag alone: children (BatchNorm) keep theirs
        yield
    finally:
        for m, flag in zip(sites, before):
            m.training = flag


def mc_columns(model: nn.Module, x: torch.Tensor, passes: int, seed: int, first_row: int,
               device: torch.device, head: bool = False) -> dict[str, torch.Tensor]:
    """T passes over ``x`` (``head``: of the head alone, on features computed once) -> the MC
    columns (float32) and their finite flag."""
    mean, expected_entropy, finite = None, None, None
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    feats = model.forward_features(x) if head else None   # no dropout there (``head_only``)
    with torch.random.fork_rng(devices=cuda), dropout_on(model):
        torch.manual_seed(batch_seed(seed, first_row))
        for _ in range(passes):
            logits = (model(x) if feats is None else model.forward_head(feats)).float()
            probs = logits.softmax(dim=-1)
            entropy = -torch.special.xlogy(probs, probs).sum(dim=-1)
            ok = torch.isfinite(logits).all(dim=-1)
            mean = probs if mean is None else mean + probs
            expected_entropy = entropy if expected_entropy is None else expected_entropy + entropy
            finite = ok if finite is None else finite & ok
    mean, expected_entropy = mean / passes, expected_entropy / passes
    predictive = -torch.special.xlogy(mean, mean).sum(dim=-1)
    return {"finite_mcd": finite, "mcd_msp": mean.max(dim=-1).values, "mcd_entropy": predictive,
            # >= 0 in exact arithmetic (Jensen); clipped so rounding never makes it negative
            "mcd_mi": (predictive - expected_entropy).clamp_min(0.0)}
