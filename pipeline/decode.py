"""JPEG decoding on the accelerator (``extract --decode gpu|mixed``).

Loader workers only read the file bytes of the images the accelerator will decode (and fully
decode + resize the others on the CPU, as ``ImageRows`` does); the main process decodes the
bytes in one batched ``torchvision.io.decode_jpeg(..., device=...)`` call (nvJPEG on CUDA) and
resizes/crops them on the device, grouping images of equal size into one resize call.

Which rows go to the device is a pure function of the file and the row index, so a cache's
content does not depend on worker count, batch order or the number of processes:

* ``gpu``: every baseline 3-channel JPEG that ends with an EOI marker;
* ``mixed``: those among the even rows (the odd rows keep the CPU busy in parallel, which is
  faster when both the CPU decoders and the accelerator are near their limit, e.g. ResNet-50);
* anything else (PNG, progressive, CMYK/grey, Adobe-RGB or truncated JPEGs) is decoded on the
  CPU in the worker with the same code as ``--decode cpu`` -- including the bad-file handling.

The bad-image semantics are those of ``--decode cpu``: a file that fails on the device is
retried with the CPU decoder; if that fails too the row is an error naming file and index, or
(``--skip-bad``) an invalid row.
"""
from __future__ import annotations

import warnings
from collections import defaultdict
from typing import Callable

import numpy as np
import torch

from pipeline.data import BadImageError, ImageRows, ResizeCrop, decode_file
from pipeline.sources import DataError, SampleList

DECODE_MODES = ("cpu", "gpu", "mixed")
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


class RawRows(ImageRows):
    """Row ``i`` -> (payload, i, valid): payload = the file's bytes (numpy uint8, decoded later on
    the device) or, for rows the CPU handles, the resized uint8 CHW tensor, as ``ImageRows``."""

    def __init__(self, samples: SampleList, transform: ResizeCrop, mode: str,
                 skip_bad: bool = False):
        if mode not in ("gpu", "mixed"):
            raise ValueError(f"decode mode {mode!r}: expected gpu or mixed")
        if samples.idx_images is not None:
            raise DataError("--decode gpu/mixed decodes JPEG files; the embedded dataset is "
                            "already decoded in memory: use --decode cpu")
        super().__init__(samples, transform, None, skip_bad)
        self.mode = mode

    def __getitem__(self, i: int):
        if self.mode == "gpu" or i % 2 == 0:
            try:
                with open(self.samples.path(i), "rb") as fh:
                    data = fh.read()
            except OSError:
                data = b""  # unreadable: let the CPU path raise/record it with its message
            if device_decodable(data):
                return np.frombuffer(data, np.uint8), i, 1
        return super().__getitem__(i)


def collate_raw(batch: list) -> tuple:
    """-> (raw, dec, dec_pos, rows, valid) with raw = (all file bytes concatenated, their end
    offsets, their batch positions) or None, and dec = the stacked CPU-decoded images or None.
    Built in the worker, so one shared-memory tensor per field crosses to the main process."""
    raw, raw_pos, dec, dec_pos = [], [], [], []
    for pos, (payload, _, _) in enumerate(batch):
        if isinstance(payload, np.ndarray):
            raw.append(payload)
            raw_pos.append(pos)
        else:
            dec.append(payload)
            dec_pos.append(pos)
    rows = torch.tensor([b[1] for b in batch], dtype=torch.int64)
    valid = torch.tensor([b[2] for b in batch], dtype=torch.uint8)
    packed = None
    if raw:
        ends = torch.from_numpy(np.cumsum([len(a) for a in raw]))
        packed = (torch.from_numpy(np.concatenate(raw)), ends, torch.tensor(raw_pos))
    return packed, torch.stack(dec) if dec else None, torch.tensor(dec_pos, dtype=torch.int64), \
        rows, valid


class DeviceDecoder:
    """Turns a ``collate_raw`` batch into uint8 (N, C, H, W) on ``device`` plus the valid flags."""

    def __init__(self, samples: SampleList, transform: ResizeCrop, device: torch.device,
                 skip_bad: bool):
        self.samples, self.transform, self.device, self.skip_bad = samples, transform, device, skip_bad
        if device.type != "cpu":
            self._self_test()

    def _self_test(self) -> None:
        """Fail early and clearly where torchvision cannot decode on this device (built without
        nvJPEG, say), instead of silently falling back to the CPU file by file."""
        import io

        from PIL import Image
        from torchvision.io import ImageReadMode, decode_jpeg

        buf = io.BytesIO()
        Image.new("RGB", (16, 16), (200, 30, 90)).save(buf, "JPEG")
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                decode_jpeg([data, data], mode=ImageReadMode.RGB, device=self.device)
        except Exception as err:  # noqa: BLE001 - any failure means: not usable here
            first = (str(err).splitlines() or [""])[0]
            raise DataError(f"--decode gpu/mixed: torchvision cannot decode JPEGs on {self.device} "
                            f"({type(err).__name__}: {first}); use --decode cpu") from None

    def __call__(self, batch: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (images uint8 (N, C, H, W) on the device, rows, valid) like a ``--decode cpu`` batch.

        No host<->device synchronisation: images are placed by stacking per-position views (an
        index tensor built on the host would need a blocking copy and stall the pipeline)."""
        packed, dec, dec_pos, rows, valid = batch
        pieces: list[torch.Tensor | None] = [None] * len(rows)
        valid = valid.numpy().copy()
        if dec is not None:
            for pos, img in zip(dec_pos.tolist(), dec.to(self.device, non_blocking=True)):
                pieces[pos] = img
        if packed is not None:
            flat, ends, raw_pos = packed
            starts = [0, *ends[:-1].tolist()]
            raw = [flat[a:b] for a, b in zip(starts, ends.tolist())]
            images = self._decode(raw, rows.numpy()[raw_pos.numpy()])
            self._resize_into(pieces, images, raw_pos.tolist())
        blank = None
        for pos, piece in enumerate(pieces):
            if piece is None:  # undecodable (--skip-bad): zeros, as ImageRows gives
                valid[pos] = 0
                blank = blank if blank is not None else torch.zeros(
                    self.transform.cfg.input_size, dtype=torch.uint8, device=self.device)
                pieces[pos] = blank
        return torch.stack(pieces), rows, torch.from_numpy(valid)

    def _decode(self, tensors: list[torch.Tensor], rows: np.ndarray) -> list[torch.Tensor | None]:
        from torchvision.io import ImageReadMode, decode_jpeg

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                return list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=self.device))
            except Exception:  # noqa: BLE001 - one bad file fails the whole batch: find it
                return [self._decode_one(t, int(r)) for t, r in zip(tensors, rows)]

    def _decode_one(self, data: torch.Tensor, row: int) -> torch.Tensor | None:
        from torchvision.io import ImageReadMode, decode_jpeg

        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except Exception:  # noqa: BLE001 - retried on the CPU below
            pass
        try:  # same fallback and message as the CPU path
            return decode_file(str(self.samples.path(row))).to(self.device)
        except Exception as err:  # noqa: BLE001 - any decoder failure is a bad row
            if not self.skip_bad:
                raise BadImageError(f"cannot decode {self.samples.path(row)} (row {row}): {err}. "
                                    "Replace the file, or re-run with --skip-bad to record it "
                                    "as invalid") from None
            return None

    def _resize_into(self, pieces: list, images: list, positions: list[int]) -> None:
        groups: dict[tuple, list[int]] = defaultdict(list)
        for k, img in enumerate(images):
            if img is not None:
                groups[tuple(img.shape)].append(k)
        for ks in groups.values():  # one resize call per distinct input size
            resized = self.transform(torch.stack([images[k] for k in ks]))
            for k, img in zip(ks, resized):
                pieces[positions[k]] = img


def make_dataset(samples: SampleList, transform: ResizeCrop, mode: str, corrupt: Callable | None,
                 skip_bad: bool) -> ImageRows:
    """The loader's dataset for a decode mode (cpu: decode + resize in the workers)."""
    if mode not in DECODE_MODES:
        raise ValueError(f"--decode {mode!r}: expected one of {DECODE_MODES}")
    if mode == "cpu":
        return ImageRows(samples, transform, corrupt, skip_bad)
    if corrupt is not None:
        raise DataError("--corruption is applied in the CPU loader workers before resizing; "
                        "it cannot be combined with --decode gpu/mixed: use --decode cpu")
    return RawRows(samples, transform, mode, skip_bad)
