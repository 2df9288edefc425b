"""ReColorAdv (Laidlaw & Feizi, NeurIPS 2019), the attack of the paper's Table 2, through its
authors' package ``recoloradv`` 0.0.1 (MIT; installed by the ``recoloradv`` extra, never copied
here), called like a torchattacks attack: ``ReColorAdvAttack(model, params)(x, labels)``.

The settings are those Luo et al. attacked with (their ``eval_oracle_adversarial.py``, which
repeats the ReColorAdv authors' ``evaluate_imagenet.py``): a ``FullSpatial`` colour map, a
16 x 32 x 32 grid in CIELUV space whose nodes move at most 0.06 (L-inf, in the colour space's
[0, 1] units) from the identity, its smoothness as the perturbation norm; the loss, Carlini-Wagner
f6 (the true class's logit minus the largest other, unclamped: kappa = inf) + 0.05 x that norm,
minimised by Adam (lr 0.001, unsigned steps) for 100 to 300 iterations (after 100 the package's
own rule stops once the batch's summed loss is >= 0.999 x the previous iteration's), keeping each
image's best iterate; no random start.  ``--eps`` is the grid bound, ``--step-size`` Adam's lr,
``--steps`` the most iterations (the least is min(100, steps)).

Today's torch (2.14 CPU checked) runs the package unpatched; what this module adds:

* ``six``: imported by ``mister_ed/adversarial_attacks.py`` but not declared by the package, so
  the extra installs it.
* the device: mister_ed places every tensor on ``cuda`` (the current device) or the CPU by the
  process-wide environment flag ``MISTER_ED_GPU``, which it sets from ``torch.cuda.is_available()``
  on first use: ``--device cpu`` on a GPU machine would mix devices.  The flag is set from the
  batch's device before each attack through the package's own ``set_global_gpu``.
* the classifier's weights are frozen (``requires_grad`` off) for the attack: mister_ed calls
  ``backward()`` on the loss, which otherwise also computes and accumulates every weight's
  gradient.  The images do not change; only the wasted work goes.
* warnings the package triggers on every batch under today's torch (``float()`` of a tensor that
  requires grad, the no-op ``Variable`` wrapper) are silenced during the attack.

Randomness: none with the default (no random start); ``--random-start`` draws the start from
torch's global generator, which the caller seeds per batch.  The stop after 100 iterations looks
at the whole batch's loss, so an image's result depends on its batch (fixed by the shard ranges
and ``--batch-size``, both part of the split's identity, never by the number of processes).
"""
from __future__ import annotations

import warnings
from importlib.metadata import PackageNotFoundError, version as dist_version

import torch
from torch import nn

from cache.errors import TrustOraclesError

LIBRARY = "recoloradv"
VERSION = "0.0.1"
EXTRA = "pip install '.[recoloradv]'"
DEFAULTS = dict(eps=0.06, alpha=0.001, steps=300, random_start=False)
MIN_STEPS = 100                  # evaluate_imagenet.py's num_iterations=(100, 300)
SOURCE = ("ReColorAdv authors' evaluate_imagenet.py, as in Luo et al.'s eval_oracle_adversarial.py "
          "(pipeline/attack/recolor.py)")
_QUIET = ("Converting a tensor with requires_grad=True to a scalar",
          "As of >=pytorch0.4.0 this is no longer necessary")


class MissingLibrary(TrustOraclesError, ImportError):
    """The extra is not installed; the message says how to install it."""


def load():
    """The package's modules, or MissingLibrary naming the extra."""
    try:
        from recoloradv import color_spaces, color_transformers, perturbations
        from recoloradv.mister_ed import adversarial_attacks, adversarial_perturbations
        from recoloradv.mister_ed import loss_functions
        from recoloradv.mister_ed.utils import pytorch_utils
    except ImportError as err:
        raise MissingLibrary(f"--attack recoloradv needs the authors' package recoloradv=="
                             f"{VERSION} and six ({err}): {EXTRA}") from None
    return dict(cs=color_spaces, ct=color_transformers, pt=perturbations, aa=adversarial_attacks,
                ap=adversarial_perturbations, lf=loss_functions, utils=pytorch_utils)


def version() -> str:
    load()
    try:
        return f"{LIBRARY} {dist_version(LIBRARY)}"
    except PackageNotFoundError:        # importable without its metadata (a plain copy on the path)
        return f"{LIBRARY} {VERSION}"


class ReColorAdvAttack:
    """``atk(x, labels)``: [0, 1] float images (N, 3, H, W) -> their ReColorAdv versions."""

    def __init__(self, model: nn.Module, params: dict):
        lib = load()
        model.requires_grad_(False)
        self.lib, self.params = lib, params
        identity = lib["utils"].IdentityNormalize()     # PixelClassifier normalises itself
        loss = lib["lf"].RegularizedLoss(
            {"cw": lib["lf"].CWLossF6(model, identity, kappa=float("inf")),
             "pert": lib["lf"].PerturbationNormLoss(lp=2)},
            {"cw": 1.0, "pert": 0.05}, negate=True)
        threat = lib["ap"].ThreatModel(lib["pt"].ReColorAdv, {
            "xform_class": lib["ct"].FullSpatial, "cspace": lib["cs"].CIELUVColorSpace(),
            "lp_style": "inf", "lp_bound": params["eps"],
            "xform_params": {"resolution_x": 16, "resolution_y": 32, "resolution_z": 32},
            "use_smooth_loss": True})
        self.pgd = lib["aa"].PGD(model, identity, threat, loss)

    def __call__(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        p = self.params
        self.lib["utils"].set_global_gpu(x.is_cuda)
        self.pgd.use_gpu = x.is_cuda
        with warnings.catch_warnings():
            for text in _QUIET:
                warnings.filterwarnings("ignore", message=f".*{text}")
            pert = self.pgd.attack(
                x, labels, optimizer=torch.optim.Adam, optimizer_kwargs={"lr": p["alpha"]},
                signed=False, verbose=False, random_init=p["random_start"],
                num_iterations=(min(MIN_STEPS, p["steps"]), p["steps"]))
            return pert.adversarial_tensors().detach()
