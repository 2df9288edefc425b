"""Named models and the embedded dataset's settings — the one visible place for them.

ImageNet presets are the paper's two classifiers.  On the embedded dataset (Fashion-MNIST) the same
names mean small timm models that ``cli.py fit-classifier`` trains on the dataset's ``clf-train``
split; their checkpoints then stand in for hub weights, through the same code paths.
"""
from __future__ import annotations

from pathlib import Path

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
