"""ImageNet-C corruption names and severity parameters: plain data, importable without torch
(the CLI builds its --corruption choices from it; pipeline/data/corruptions.py applies them)."""

REFERENCE_SIZE = 224   # ImageNet-C corrupts the 224-px centre crop; spatial parameters refer to it
SEVERITIES = (1, 2, 3, 4, 5)

# ImageNet-C severity 1..5 parameters (make_imagenet_c.py), intensities on a [0, 1] scale.
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
CORRUPTIONS = tuple(PARAMS)
