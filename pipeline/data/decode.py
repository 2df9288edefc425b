"""JPEG decoding on the accelerator (``extract --decode gpu|mixed|hw|hw-mixed``).

Loader workers only read the file bytes of the images the accelerator will decode (and fully
decode + resize the others on the CPU, as ``ImageRows`` does); threads of the main process
(``pipeline.data.prefetch``) decode each batch's bytes in one batched ``torchvision.io.decode_jpeg(...,
device=...)`` call (nvJPEG on CUDA) and resize/crop all of them in a few batched matrix products
(``pipeline.data.resize``) on streams of their own, ahead of the model.

Which rows go to the device is a pure function of the file and the row index, so a cache's
content does not depend on worker count, batch order or the number of processes:

* ``gpu``: every baseline 3-channel JPEG that ends with an EOI marker;
* ``mixed``: those among the even rows (the odd rows keep the CPU busy in parallel, which is
  faster when both the CPU decoders and the accelerator are near their limit, e.g. ResNet-50);
  ``mixed:N/D`` (Python API / benchmark): rows with ``i % D < N`` (``mixed`` = ``mixed:1/2``);
* ``hw``, ``hw-mixed``, ``hw:N/D``: the same rows as ``gpu``, ``mixed``, ``mixed:N/D``, decoded
  by the GPU's hardware JPEG engines through nvImageCodec (``pipeline.data.hwdecode``; hardware
  backend only, on a high-priority stream of ours) instead of torchvision's nvJPEG call; a file
  the engines refuse is decoded on the CPU, never on the SMs;
* anything else (PNG, progressive, CMYK/grey, Adobe-RGB or truncated JPEGs) is decoded on the
  CPU in the worker with the same code as ``--decode cpu`` -- including the bad-file handling.

The bad-image semantics are those of ``--decode cpu``: a file that fails on the device is
retried with the CPU decoder; if that fails too the row is an error naming file and index, or
(``--skip-bad``) an invalid row.
"""
from __future__ import annotations

import warnings
from collections import deque
from contextlib import nullcontext
from typing import Callable

import numpy as np
import torch

from pipeline.data.errors import DataError
from pipeline.data.hwdecode import HardwareJpeg
from pipeline.data.images import BadImageError, ImageRows, ResizeCrop, decode_file
from pipeline.data.jpeg import DECODE_MODES, device_decodable, device_share, uses_hardware
from pipeline.data.resize import BatchResize
from pipeline.data.sources import SampleList
from pipeline.data.stamps import read_stamped

__all__ = ["DECODE_MODES", "DeviceDecoder", "RawRows", "collate_raw", "device_decodable",
           "device_share", "make_dataset", "uses_hardware"]


class RawRows(ImageRows):
    """Row ``i`` -> (payload, i, valid): payload = the file's bytes (numpy uint8, decoded later on
    the device) or, for rows the CPU handles, the resized uint8 CHW tensor, as ``ImageRows``."""

    def __init__(self, samples: SampleList, transform: ResizeCrop, mode: str,
                 skip_bad: bool = False):
        self.share = device_share(mode)
        if samples.idx_images is not None:
            raise DataError("--decode gpu/mixed decodes JPEG files; the embedded dataset is "
                            "already decoded in memory: use --decode cpu")
        super().__init__(samples, transform, None, skip_bad)
        self.mode = mode

    def __getitem__(self, i: int):
        if i % self.share[1] < self.share[0]:
            try:
                data, stamp = read_stamped(self.samples.path(i))
                if self.recorder is not None:
                    self.recorder.record(i, stamp)
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
    """Turns a ``collate_raw`` batch into uint8 (N, C, H, W) on ``device`` plus the valid flags.

    torchvision's ``decode_jpeg(device="cuda")`` allocates its outputs on the caller's current
    stream but writes them from a private stream (and the hardware decoder ignores stream order
    altogether) without waiting for work queued there, so a block that queued kernels still read
    or write can be handed to the decoder and overwritten (pytorch/vision#9606).  Called on the
    model's stream, that corrupted the previous batch's outputs (NaN logits).  Here nvJPEG is
    called with ``alloc_stream`` current, a stream only the decoded images are allocated on;
    they are used on ``stream`` (high priority: resizing is short and keeps the model fed) and
    ``record_stream``-ed there, so a block returns to that pool only once the work on it is
    done and nvJPEG never gets a busy one -- no host synchronisation.  The consumer waits on the batch's
    event and ``record_stream``-s the result on its own stream (``StagedPrefetch``).

    ``mode`` hw/hw-mixed/hw:N/D: the hardware JPEG engines (``HardwareJpeg``) decode, ordered on
    ``alloc_stream``; their buffers are nvImageCodec's, so each batch's decoded images are held
    until the event after its resize has completed (``_hold``) instead of ``record_stream``.
    """

    def __init__(self, samples: SampleList, transform: ResizeCrop, device: torch.device,
                 skip_bad: bool, mode: str = "gpu"):
        self.samples, self.transform, self.device, self.skip_bad = samples, transform, device, skip_bad
        self.resize = BatchResize(transform.cfg)
        cuda = device.type == "cuda"
        hw = uses_hardware(mode)
        # hw: nvImageCodec decodes in this stream's order; high priority so the kernels the
        # engines leave to the SMs (colour conversion) do not queue behind the model's
        self.alloc_stream = torch.cuda.Stream(device, priority=-1 if hw else 0) if cuda else None
        self.stream = torch.cuda.Stream(device, priority=-1) if cuda else None
        # built (and self-tested) here: an unusable decoder is refused before anything is written
        self.hw = HardwareJpeg(device) if hw else None
        self._held: deque = deque()
        if device.type != "cpu" and self.hw is None:
            self._self_test()

    def _self_test(self) -> None:
        """Fail early and clearly where torchvision cannot decode on this device (built without
        nvJPEG, say), instead of silently falling back to the CPU file by file."""
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (16, 16), (200, 30, 90)).save(buf, "JPEG")
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        try:
            with torch.cuda.stream(self.alloc_stream) if self.alloc_stream else nullcontext():
                self._decode_jpeg([data, data])
        except Exception as err:  # noqa: BLE001 - any failure means: not usable here
            first = (str(err).splitlines() or [""])[0]
            raise DataError(f"--decode gpu/mixed: torchvision cannot decode JPEGs on {self.device} "
                            f"({type(err).__name__}: {first}); use --decode cpu") from None

    def _on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()

    def _decode_jpeg(self, data):
        if self.hw is not None:
            if isinstance(data, list):
                return self.hw(data, self.alloc_stream)
            img = self.hw([data], self.alloc_stream)[0]
            if img is None:
                raise ValueError("the hardware JPEG decoder cannot decode this file")
            return img
        from torchvision.io import ImageReadMode, decode_jpeg

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)

    @property
    def stages(self) -> list:
        """The two halves of ``__call__``, for a pipeline with one thread each (StagedPrefetch):
        nvJPEG blocks its thread for most of a batch, resizing is mostly kernel launches."""
        return [self.decode, self.finish]

    def __call__(self, batch: tuple) -> tuple:
        """-> (images uint8 (N, C, H, W) on the device, rows, valid, event): ``event`` (CUDA)
        marks the end of the work on the decoder's streams; wait for it before using ``images``."""
        return self.finish(self.decode(batch))

    def decode(self, batch: tuple) -> tuple:
        """nvJPEG on the batch's file bytes, with ``alloc_stream`` current (see the class)."""
        packed, rows = batch[0], batch[3]
        images, event = None, None
        alloc = torch.cuda.stream(self.alloc_stream) if self.alloc_stream is not None \
            else nullcontext()
        with alloc:
            if packed is not None:
                flat, ends, raw_pos = packed
                starts = [0, *ends[:-1].tolist()]
                raw = [flat[a:b] for a, b in zip(starts, ends.tolist())]
                images = self._decode(raw, rows.numpy()[raw_pos.numpy()])
            if self.stream is not None:
                # hw: nvImageCodec's buffers are not the caching allocator's; finish() holds the
                # whole batch (CPU fallbacks included) until its resize is done instead
                for img in (images or []) if self.hw is None else []:
                    if img is not None:  # its block returns to the pool once finish()'s work is done
                        img.record_stream(self.stream)
                event = torch.cuda.Event()
                event.record(self.alloc_stream)
        return batch, images, event

    def finish(self, state: tuple) -> tuple:
        """Place CPU-decoded rows, blank bad rows, resize the decoded ones (on ``stream``)."""
        (packed, dec, dec_pos, rows, valid), images, decoded = state
        with self._on_stream():
            if decoded is not None:
                self.stream.wait_event(decoded)
            out = torch.empty((len(rows), *self.transform.cfg.input_size), dtype=torch.uint8,
                              device=self.device)
            valid = valid.numpy().copy()
            if dec is not None:
                out.index_copy_(0, dec_pos.to(self.device, non_blocking=True),
                                dec.to(self.device, non_blocking=True))
            if packed is not None:
                positions = packed[2].tolist()
                for pos, img in zip(positions, images):
                    if img is None:  # undecodable (--skip-bad): zeros, as ImageRows gives
                        valid[pos] = 0
                        out[pos].zero_()
                self._resize_into(out, images, positions)
            event = None
            if self.stream is not None:
                event = torch.cuda.Event()
                event.record(self.stream)
                if self.hw is not None:
                    self._hold(event, images)
        return out, rows, torch.from_numpy(valid), event

    def _hold(self, event: torch.cuda.Event, images: list | None) -> None:
        """Keep ``images`` (nvImageCodec's device buffers, freed with the tensors) alive until
        ``event`` -- the end of the resize that reads them -- has completed."""
        while self._held and self._held[0][0].query():
            self._held.popleft()
        self._held.append((event, images))

    def _decode(self, tensors: list[torch.Tensor], rows: np.ndarray) -> list[torch.Tensor | None]:
        try:
            images = list(self._decode_jpeg(tensors))
        except Exception:  # noqa: BLE001 - one bad file fails the whole batch: find it
            return [self._decode_one(t, int(r)) for t, r in zip(tensors, rows)]
        # the hardware decoder gives None for a file it cannot decode: the CPU decodes it
        return [img if img is not None else self._decode_cpu(int(r))
                for img, r in zip(images, rows)]

    def _decode_one(self, data: torch.Tensor, row: int) -> torch.Tensor | None:
        try:
            return self._decode_jpeg(data)
        except Exception:  # noqa: BLE001 - retried on the CPU below
            return self._decode_cpu(row)

    def _decode_cpu(self, row: int) -> torch.Tensor | None:
        try:  # same fallback and message as the CPU path
            return decode_file(str(self.samples.path(row))).to(self.device)
        except Exception as err:  # noqa: BLE001 - any decoder failure is a bad row
            if not self.skip_bad:
                raise BadImageError(f"cannot decode {self.samples.path(row)} (row {row}): {err}. "
                                    "Replace the file, or re-run with --skip-bad to record it "
                                    "as invalid") from None
            return None

    def _resize_into(self, out: torch.Tensor, images: list, positions: list[int]) -> None:
        """All images the batched resize supports in a few matrix products, the rest (grey
        models, crops that need padding) one by one with ``ResizeCrop``."""
        batched, single = [], []
        for k, img in enumerate(images):
            if img is not None:
                (batched if self.resize.supports(*img.shape[-2:]) else single).append(k)
        if batched:
            for ks, resized in self.resize([images[k] for k in batched]):
                index = torch.tensor([positions[batched[k]] for k in ks])
                out.index_copy_(0, index.to(self.device, non_blocking=True), resized)
        for k in single:
            out[positions[k]] = self.transform(images[k])


def make_dataset(samples: SampleList, transform: ResizeCrop, mode: str, corrupt: Callable | None,
                 skip_bad: bool) -> ImageRows:
    """The loader's dataset for a decode mode (cpu: decode + resize in the workers)."""
    if mode == "cpu":
        return ImageRows(samples, transform, corrupt, skip_bad)
    device_share(mode)  # a clear error for an unknown mode first
    if samples.exif_transpose:   # the device decoders give the pixels as stored
        raise DataError("--exif-transpose turns images upright on the CPU after decoding; "
                        f"--decode {mode} does not: use --decode cpu")
    if corrupt is not None:
        raise DataError("--corruption is applied in the CPU loader workers before resizing; "
                        "it cannot be combined with --decode gpu/mixed: use --decode cpu")
    return RawRows(samples, transform, mode, skip_bad)
