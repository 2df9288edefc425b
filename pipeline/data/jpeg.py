"""Which rows a device decoder gets (``extract --decode``): the modes, the share of rows
(a pure function of the row index) and the files it can decode exactly (baseline 3-channel JPEGs).
Everything else is decoded on the CPU by the loader workers (``pipeline.data.decode``)."""
from __future__ import annotations

DECODE_MODES = ("cpu", "gpu", "mixed", "hw", "hw-mixed")


def device_share(mode: str) -> tuple[int, int]:
    """(N, D): row ``i`` goes to the device decoder when ``i % D < N`` (if its file is a JPEG it
    can decode).  ``gpu``/``hw`` = 1/1, ``mixed``/``hw-mixed`` = 1/2, ``mixed:N/D`` or
    ``hw:N/D`` with 0 < N < D <= 64."""
    if mode in ("gpu", "hw"):
        return 1, 1
    if mode in ("mixed", "hw-mixed"):
        return 1, 2
    kind, _, frac = mode.partition(":")
    num, _, den = frac.partition("/")
    if kind in ("mixed", "hw") and num.isdigit() and den.isdigit() \
            and 0 < int(num) < int(den) <= 64:
        return int(num), int(den)
    raise ValueError(f"--decode {mode!r}: expected one of {DECODE_MODES}, mixed:N/D or hw:N/D "
                     "(device rows i % D < N, 0 < N < D <= 64)")


def uses_hardware(mode: str) -> bool:
    """True for the modes decoded by the NVJPG engines (nvImageCodec) rather than nvJPEG."""
    return mode == "hw" or mode.startswith(("hw-", "hw:"))


_SOF_BASELINE = (0xC0, 0xC1)
_SOF_OTHER = tuple(m for m in range(0xC2, 0xD0) if m not in (0xC4, 0xC8, 0xCC))


def device_decodable(data: bytes) -> bool:
    """True for a complete baseline JPEG with 3 components and no Adobe RGB transform: the
    kind nvJPEG's batched decoder handles exactly like libjpeg-turbo up to IDCT rounding."""
    if data[:2] != b"\xff\xd8" or data.rstrip(b"\x00")[-2:] != b"\xff\xd9":
        return False
    pos, n = 2, len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return False
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        length = int.from_bytes(data[pos + 2: pos + 4], "big")
        if marker in _SOF_BASELINE:
            return pos + 9 < n and data[pos + 9] == 3
        if marker in _SOF_OTHER or marker == 0xDA:  # progressive/lossless/arithmetic, or no SOF
            return False
        if marker == 0xEE and data[pos + 4: pos + 9] == b"Adobe" and pos + 15 < n \
                and data[pos + 15] == 0:
            return False  # Adobe "transform 0": RGB stored without YCbCr conversion
        pos += 2 + length
    return False
