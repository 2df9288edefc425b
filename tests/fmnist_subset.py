"""A small Fashion-MNIST copy (first rows of each idx file) for fast end-to-end tests: the same
files and code paths as the embedded dataset, pointed at with ``--data DIR``."""
from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from conftest import FMNIST_DIR


def write_fmnist_subset(out: Path, n_train: int, n_test: int) -> Path:
    """DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz with the first rows of the real files.
    The embedded split ranges still apply: clf-train = train rows [0, 12000) present here."""
    if not FMNIST_DIR.exists():
        pytest.skip("dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist)")
    out.mkdir(parents=True, exist_ok=True)
    for stem, n in (("train", n_train), ("t10k", n_test)):
        for kind, ndim in (("images", 3), ("labels", 1)):
            name = f"{stem}-{kind}-idx{ndim}-ubyte.gz"
            with gzip.open(FMNIST_DIR / name, "rb") as fh:
                raw = fh.read()
            dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
            row = 1 if ndim == 1 else dims[1] * dims[2]
            header = raw[:4] + n.to_bytes(4, "big") + raw[8: 4 + 4 * ndim]
            body = raw[4 + 4 * ndim: 4 + 4 * ndim + n * row]
            with gzip.open(out / name, "wb", compresslevel=1) as fh:
                fh.write(header + body)
    return out
