"""Check the imagecorruptions compatibility layer against the unpatched package under the old
numpy / scikit-image it was written for (the outputs must match to float rounding).

Step 1, in a separate environment with the old versions (no torch needed), e.g.:

    python3.10 -m venv /tmp/old && /tmp/old/bin/pip install numpy==1.23.5 scikit-image==0.19.3 \\
        scipy==1.10.1 opencv-python-headless==4.7.0.72 imagecorruptions==1.1.2 "setuptools<70"
    /tmp/old/bin/python bench/check_imagecorruptions.py dump /tmp/reference.npz

Step 2, in the project's environment:

    python bench/check_imagecorruptions.py compare /tmp/reference.npz

Every corruption function the package has except impulse_noise (its scikit-image noise ignores
numpy's global seed, so it is not reproducible there either; the project uses its own) runs on a
224-px crop of skimage's chelsea and a 48x64 random image at severities 1-5, seeded with
np.random.seed(k) there and the layer's ``seeded(k)`` here (the same stream).  glass_blur is
compared on the small image only (the package needs ~5 s per 224-px image) and through the
layer's exact fast version.  Prints the largest differences per corruption; exits 1 above 1e-3.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

NAMES = ["gaussian_noise", "shot_noise", "speckle_noise", "defocus_blur", "glass_blur",
         "motion_blur", "zoom_blur", "gaussian_blur", "snow", "frost", "fog", "spatter",
         "brightness", "contrast", "saturate", "elastic_transform", "pixelate", "jpeg_compression"]


def cases():
    import skimage.data
    images = {"chelsea224": skimage.data.chelsea()[:224, 50:274],
              "random48x64": np.random.RandomState(1).randint(0, 256, (48, 64, 3)).astype(np.uint8)}
    for iname, img in images.items():
        for name in NAMES:
            if name == "glass_blur" and iname == "chelsea224":
                continue
            for severity in range(1, 6):
                yield f"{iname}/{name}/{severity}", img, name, severity, 1000 * severity + len(name)


def dump(path: str) -> None:
    from imagecorruptions import corruptions as lib
    out = {}
    for key, img, name, severity, seed in cases():
        np.random.seed(seed)
        out[key] = np.asarray(getattr(lib, name)(Image.fromarray(img), severity), np.float64)
    np.savez_compressed(path, **out)
    print(f"{len(out)} reference outputs -> {path}")


def compare(path: str) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pipeline.data import imagecorruptions_compat as compat

    ref = np.load(path)
    worst: dict[str, list] = {}
    for key, img, name, severity, seed in cases():
        with compat.seeded(seed):
            fn = compat.glass_blur if name == "glass_blur" else getattr(compat.package(), name)
            ours = np.asarray(fn(Image.fromarray(img), severity), np.float64)
        d = np.abs(ours - ref[key])
        worst.setdefault(name, []).append((d.max(), d.mean()))
    bad = 0
    for name, v in worst.items():
        v = np.array(v)
        bad += v[:, 0].max() > 1e-3
        print(f"{name:18s} max |difference| {v[:, 0].max():.2e}  mean {v[:, 1].max():.2e}  (of 255)")
    return int(bad > 0)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("dump", "compare"):
        raise SystemExit(__doc__)
    sys.exit(dump(sys.argv[2]) if sys.argv[1] == "dump" else compare(sys.argv[2]))
