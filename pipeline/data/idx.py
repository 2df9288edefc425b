"""The idx file format of MNIST and Fashion-MNIST (uint8 arrays with a big-endian header),
read once per file and process."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from pipeline.data.errors import DataError


_IDX_MEMO: dict[tuple, np.ndarray] = {}


def read_idx(path_stem: Path) -> np.ndarray:
    """The idx file as a read-only array; remembered per (file, size, mtime) in this process: a
    run lists train, test and a shifted test (two reads of t10k), and a process that trains many
    head-only runs (a sweep, the demo) would otherwise decompress the same files each time."""
    for path in (path_stem, path_stem.with_name(path_stem.name + ".gz")):
        if path.exists():
            st = path.stat()
            key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
            if key not in _IDX_MEMO:
                _IDX_MEMO[key] = _parse_idx(path)
            return _IDX_MEMO[key]
    raise DataError(f"Fashion-MNIST file {path_stem}[.gz] not found")


def _parse_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if raw[:3] != b"\x00\x00\x08" or data.size != int(np.prod(dims)):
        raise DataError(f"{path} is not a valid uint8 idx file (truncated or corrupt)")
    return data.reshape(dims)          # frombuffer over bytes: read-only, safe to share
