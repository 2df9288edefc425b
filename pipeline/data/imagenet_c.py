"""ImageNet-C's 19 corruption names, which code applies each, and the built-in ones' severity
parameters: plain data, importable without torch (the CLI builds its --corruption choices from it;
pipeline/data/corruptions.py applies them).

Order and groups are ImageNet-C's (Hendrycks & Dietterich, ICLR 2019): 15 benchmark corruptions in
four groups, then the four "extra" (validation) corruptions.
"""

REFERENCE_SIZE = 224   # ImageNet-C corrupts the 224-px centre crop; spatial parameters refer to it
SEVERITIES = (1, 2, 3, 4, 5)

GROUPS = {
    "noise": ("gaussian_noise", "shot_noise", "impulse_noise"),
    "blur": ("defocus_blur", "glass_blur", "motion_blur", "zoom_blur"),
    "weather": ("snow", "frost", "fog", "brightness"),
    "digital": ("contrast", "elastic_transform", "pixelate", "jpeg_compression"),
    "extra": ("speckle_noise", "gaussian_blur", "spatter", "saturate"),
}
CORRUPTIONS = tuple(name for names in GROUPS.values() for name in names)
BENCHMARK = CORRUPTIONS[:15]
GROUP_OF = {name: group for group, names in GROUPS.items() for name in names}

# Built-in (pipeline/data/corruptions.py): ImageNet-C severity 1..5 parameters
# (make_imagenet_c.py), intensities on a [0, 1] scale.  Blur radii/sigmas are pixels at 224 and
# are scaled to the image's shorter side.
PARAMS = {
    "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),        # std of additive N(0, c^2)
    "shot_noise": (60, 25, 12, 5, 3),                          # Poisson(x * c) / c
    "impulse_noise": (0.03, 0.06, 0.09, 0.17, 0.27),          # salt & pepper fraction (s:p = 1:1)
    "defocus_blur": ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)),  # disk radius, alias sigma
    "gaussian_blur": (1, 2, 3, 4, 6),                          # sigma
    "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),                    # (x - mean) * c + mean
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),                   # HSV value + c
    "jpeg_compression": (25, 18, 15, 10, 7),                   # JPEG quality
}
BUILT_IN = tuple(PARAMS)

# The other eleven run the `imagecorruptions` package's own functions (its parameters);
# pipeline/data/imagecorruptions_compat.py makes them run on today's numpy / scikit-image.
# Those whose parameters are per pixel (speckle, saturate) or relative to the image size (zoom
# factors, pixelate's downscale factor) run on the image as it is; the others at ImageNet-C's
# scale (resampled so that the shorter side is REFERENCE_SIZE, corrupted, resampled back).
PACKAGE_NATIVE_SCALE = ("zoom_blur", "pixelate", "speckle_noise", "saturate")
PACKAGE = tuple(name for name in CORRUPTIONS if name not in PARAMS)
IMAGECORRUPTIONS_VERSION = "1.1.2"   # the release whose internals the compatibility layer knows


def corruption_choices_help() -> str:
    """The names by group, for option help texts and error messages."""
    return "; ".join(f"{group}: {', '.join(names)}" for group, names in GROUPS.items())
