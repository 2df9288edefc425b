"""JPEG decoding on the accelerator (``extract --decode gpu|mixed``).

Loader workers only read the file bytes of the images the accelerator will decode (and fully
decode + resize the others on the CPU, as ``ImageRows`` does); a thread of the main process
(``DecodeAhead``) decodes each batch's bytes in one batched ``torchvision.io.decode_jpeg(...,
device=...)`` call (nvJPEG on CUDA) on a stream of its own and resizes/crops all of them in a few
batched matrix products (``pipeline.resize``), one batch ahead of the model.

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

import queue
import threading
import warnings
from contextlib import nullcontext
from typing import Callable

import numpy as np
import torch

from pipeline.data import BadImageError, ImageRows, ResizeCrop, decode_file
from pipeline.resize import BatchResize
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
    """Turns a ``collate_raw`` batch into uint8 (N, C, H, W) on ``device`` plus the valid flags.

    torchvision's ``decode_jpeg(device="cuda")`` allocates its outputs on the caller's current
    stream but writes them from a private stream (and the hardware decoder ignores stream order
    altogether) without waiting for work queued there, so a block that queued kernels still read
    or write can be handed to the decoder and overwritten (pytorch/vision#9606).  Called on the
    model's stream, that corrupted the previous batch's outputs (NaN logits).  Here nvJPEG is
    called with ``alloc_stream`` current, on which no kernel is ever queued, so every block of
    its pool is idle; the decoded images are used on ``stream`` (high priority: resizing is short
    and keeps the model fed) and ``record_stream``-ed there, so their blocks only return to the
    pool once that work is done -- no host synchronisation.  The consumer waits on the batch's
    event and ``record_stream``-s the result on its own stream (``DecodeAhead``).
    """

    def __init__(self, samples: SampleList, transform: ResizeCrop, device: torch.device,
                 skip_bad: bool):
        self.samples, self.transform, self.device, self.skip_bad = samples, transform, device, skip_bad
        self.resize = BatchResize(transform.cfg)
        cuda = device.type == "cuda"
        self.alloc_stream = torch.cuda.Stream(device) if cuda else None
        self.stream = torch.cuda.Stream(device, priority=-1) if cuda else None
        if device.type != "cpu":
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
            with self._on_stream():
                self._decode_jpeg([data, data])
        except Exception as err:  # noqa: BLE001 - any failure means: not usable here
            first = (str(err).splitlines() or [""])[0]
            raise DataError(f"--decode gpu/mixed: torchvision cannot decode JPEGs on {self.device} "
                            f"({type(err).__name__}: {first}); use --decode cpu") from None

    def _on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()

    def _decode_jpeg(self, data):
        from torchvision.io import ImageReadMode, decode_jpeg

        alloc = torch.cuda.stream(self.alloc_stream) if self.alloc_stream is not None \
            else nullcontext()
        with warnings.catch_warnings(), alloc:
            warnings.simplefilter("ignore", DeprecationWarning)
            out = decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        if self.stream is not None:  # used on self.stream from here on
            self.stream.wait_stream(self.alloc_stream)
            for img in (out if isinstance(out, list) else [out]):
                img.record_stream(self.stream)
        return out

    def __call__(self, batch: tuple) -> tuple:
        """-> (images uint8 (N, C, H, W) on the device, rows, valid, event): ``event`` (CUDA)
        marks the end of the work on the decode stream; wait for it before using ``images``."""
        with self._on_stream():
            images, rows, valid = self._convert(batch)
            event = None
            if self.stream is not None:
                event = torch.cuda.Event()
                event.record(self.stream)
        return images, rows, valid, event

    def _convert(self, batch: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        packed, dec, dec_pos, rows, valid = batch
        out = torch.empty((len(rows), *self.transform.cfg.input_size), dtype=torch.uint8,
                          device=self.device)
        valid = valid.numpy().copy()
        if dec is not None:
            out.index_copy_(0, dec_pos.to(self.device, non_blocking=True),
                            dec.to(self.device, non_blocking=True))
        if packed is not None:
            flat, ends, raw_pos = packed
            starts = [0, *ends[:-1].tolist()]
            raw = [flat[a:b] for a, b in zip(starts, ends.tolist())]
            positions = raw_pos.tolist()
            images = self._decode(raw, rows.numpy()[raw_pos.numpy()])
            for pos, img in zip(positions, images):
                if img is None:  # undecodable (--skip-bad): zeros, as ImageRows gives
                    valid[pos] = 0
                    out[pos].zero_()
            self._resize_into(out, images, positions)
        return out, rows, torch.from_numpy(valid)

    def _decode(self, tensors: list[torch.Tensor], rows: np.ndarray) -> list[torch.Tensor | None]:
        try:
            return list(self._decode_jpeg(tensors))
        except Exception:  # noqa: BLE001 - one bad file fails the whole batch: find it
            return [self._decode_one(t, int(r)) for t, r in zip(tensors, rows)]

    def _decode_one(self, data: torch.Tensor, row: int) -> torch.Tensor | None:
        try:
            return self._decode_jpeg(data)
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


_END = object()


class DecodeAhead:
    """Iterates ``decode(batch)`` for the loader's batches, computed in a background thread up
    to ``depth`` batches ahead: while the model runs on batch i, the thread receives batch i+1
    from the workers and decodes it (nvJPEG and the resize launches release the GIL), and the
    accelerator decodes on its own stream concurrently with the model.

    Yields (images, rows, valid) in loader order; the consumer's current stream waits for each
    batch's decode and owns the images from then on.  An exception in the thread (a bad file)
    is raised by the consumer at that batch's place, after the batches before it.  ``close()``
    stops the thread, then the loader's workers.
    """

    def __init__(self, batches, decode: Callable, device: torch.device, depth: int = 2):
        self.batches, self.decode, self.device = batches, decode, device
        if device.type == "cuda" and device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="decode-ahead", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # the current device is per thread
            with torch.inference_mode():
                for batch in self.batches:
                    if self.stop.is_set():
                        return
                    self._put(self.decode(batch))
            self._put(_END)
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            self._put(err)

    def _put(self, item) -> None:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        while True:
            try:
                item = self.queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.queue.empty():
                    raise RuntimeError("the decode thread stopped without a result") from None
        if item is _END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        images, rows, valid, event = item
        if event is not None:
            stream = torch.cuda.current_stream(images.device)
            stream.wait_event(event)
            images.record_stream(stream)  # its block is not reused while the model reads it
        return images, rows, valid

    def close(self, timeout: float = 60.0) -> None:
        """Stop the thread (it finishes the batch it is receiving), then the loader workers."""
        self.stop.set()
        self.thread.join(timeout)
        shutdown = getattr(self.batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


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
