"""JPEG decoding on the GPU's hardware JPEG engines (``extract --decode hw|hw-mixed``).

A100, A30, H100, H200 (and later data-centre GPUs) carry NVJPG engines, fixed-function JPEG
decoders beside the SMs.  torchvision's batched ``decode_jpeg(device="cuda")`` (``--decode gpu``)
already sends baseline JPEGs to them (nvJPEG's hardware backend), but from a low-priority stream of
its own, with two host synchronisations per call, and what the engines leave to CUDA kernels
(colour conversion) queues behind the model's kernels.  NVIDIA's nvImageCodec library (the optional
extra ``nvimgcodec``, imported only when asked for) drives the same engines with the decoding
ordered on a stream of ours (``DeviceDecoder`` gives it a high-priority one).  Here the decoder
is built with the hardware backend ONLY: a file the engines cannot decode comes back
as ``None`` and ``DeviceDecoder`` decodes it on the CPU, as it does for ``gpu`` -- never silently
on the SMs, so what decoded a row stays a pure function of the file and the row index (nvImageCodec's
own load balancing between backends would make it depend on the batch).

Outputs are planar RGB uint8 (3, H, W) on the device, torchvision's layout, handed to the same
batched resize as ``gpu``; EXIF orientation is not applied (as ``--decode cpu|gpu``).  The
images' memory belongs to nvImageCodec, not to PyTorch's caching allocator, so ``record_stream``
cannot protect it: ``DeviceDecoder`` keeps each batch's images alive until the event that marks
the end of the work reading them has completed.

On a CPU device (the Python API, tests) the same class drives nvImageCodec's bundled
libjpeg-turbo backend: the code path (byte streams -> batch decode -> tensors, ``None`` for a bad
file) is the one the GPU runs.  The CLI refuses ``--decode hw`` without CUDA, like ``gpu``.
"""
from __future__ import annotations

import contextlib
import io
import os
import tempfile

import numpy as np
import torch

from pipeline.data.errors import DataError

INSTALL = ("pip install '.[nvimgcodec]' (nvImageCodec and nvJPEG for CUDA 13; with a CUDA 12 "
           "driver: pip install nvidia-nvimgcodec-cu12 nvidia-nvjpeg-cu12)")
ENGINES = "A100, A30, H100, H200 and later data-centre GPUs; not GeForce/RTX or L4/L40 cards"


@contextlib.contextmanager
def _stderr_captured(log: list[str]):
    """nvImageCodec's C++ code prints to file descriptor 2 on import and decoder creation (one
    line per codec library it cannot load: nvJPEG2000, nvTIFF...).  Capture it: shown only
    inside the error message when the decoder cannot be built."""
    try:
        fd = os.dup(2)
    except OSError:  # no stderr at all
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(fd, 2)
            os.close(fd)
            tmp.seek(0)
            log.append(tmp.read().decode(errors="replace"))


def load_nvimgcodec():
    """The ``nvidia.nvimgcodec`` module, or a DataError saying what to install."""
    log: list[str] = []
    try:
        with _stderr_captured(log):
            import nvidia.nvimgcodec as nvimgcodec
    except ImportError as err:
        raise DataError(f"--decode hw decodes JPEGs on the GPU's hardware JPEG engines through "
                        f"NVIDIA nvImageCodec, which is not installed ({err}): {INSTALL}; or use "
                        "--decode gpu (torchvision's nvJPEG)") from None
    return nvimgcodec


def version() -> str | None:
    """nvImageCodec's version if importable (recorded in the manifest of hw-decoded caches)."""
    try:
        return str(load_nvimgcodec().__version__)
    except DataError:
        return None


def _sample_jpeg() -> bytes:
    """A 4:2:0 baseline JPEG like ImageNet's (the engines decode those), with real content."""
    from PIL import Image

    y, x = np.mgrid[0:192, 0:256]
    rgb = np.stack([x, y, (x + y) // 2], -1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=90)
    return buf.getvalue()


class HardwareJpeg:
    """Batches of JPEG byte arrays -> uint8 RGB (3, H, W) tensors on ``device`` (``None`` where
    the hardware decoder cannot decode the file).  Built and self-tested up front, so an
    unusable decoder is a clear refusal before anything is written."""

    def __init__(self, device: torch.device):
        nv = load_nvimgcodec()
        self.nv, self.device = nv, device
        self.on_cuda = device.type == "cuda"
        if self.on_cuda:
            index = device.index if device.index is not None else torch.cuda.current_device()
            kind, device_id = nv.BackendKind.HW_GPU_ONLY, index
        else:
            kind, device_id = nv.BackendKind.CPU_ONLY, nv.NVIMGCODEC_DEVICE_CPU_ONLY
        self.params = nv.DecodeParams(apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB,
                                      sample_format=nv.SampleFormat.P_RGB)
        log: list[str] = []
        try:
            with _stderr_captured(log):
                self.decoder = nv.Decoder(device_id=device_id, backends=[nv.Backend(kind)])
                self._self_test()
        except DataError as err:
            raise DataError(f"{err}{_why(log)}") from None
        except Exception as err:  # noqa: BLE001 - any failure means: not usable on this machine
            first = (str(err).splitlines() or [""])[0]
            raise DataError(f"--decode hw: nvImageCodec {nv.__version__} cannot decode on "
                            f"{self._where()} ({type(err).__name__}: {first}){_why(log)}. "
                            f"{self._advice()}") from None

    def _where(self) -> str:
        if self.on_cuda:
            return f"{self.device} ({torch.cuda.get_device_name(self.device)})"
        return "the CPU"

    def _advice(self) -> str:
        return (f"The hardware JPEG engines exist on {ENGINES}; nvImageCodec also needs nvJPEG "
                f"({INSTALL}). Otherwise use --decode gpu (torchvision's nvJPEG) or --decode cpu")

    def _self_test(self) -> None:
        data = _sample_jpeg()
        images = self([torch.frombuffer(bytearray(data), dtype=torch.uint8)] * 2)
        if any(img is None or tuple(img.shape) != (3, 192, 256) for img in images):
            raise DataError(f"--decode hw: the hardware JPEG decoder did not decode a baseline "
                            f"4:2:0 JPEG on {self._where()}. {self._advice()}")
        from torchvision.io import decode_jpeg

        ref = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        err = (images[0].cpu().int() - ref.int()).abs().float().mean().item()
        if err > 4.0:  # IDCT/upsampling rounding is ~1 level; garbage is tens
            raise DataError(f"--decode hw: the hardware JPEG decoder on {self._where()} returned "
                            f"wrong pixels (mean |difference| {err:.1f} levels from libjpeg-turbo "
                            f"on a test image). {self._advice()}")

    def __call__(self, data: list[torch.Tensor],
                 stream: torch.cuda.Stream | None = None) -> list[torch.Tensor | None]:
        """Decode ``data`` (uint8 CPU tensors, one JPEG file each) in one batch.  On CUDA the
        decoding is ordered on ``stream`` (work queued there afterwards sees the pixels); the
        tensors alias nvImageCodec's buffers: keep them alive while queued work reads them."""
        srcs = [self.nv.CodeStream(t.numpy()) for t in data]
        handle = stream.cuda_stream if stream is not None else 0
        images = self.decoder.decode(srcs, params=self.params, cuda_stream=handle)
        if not self.on_cuda:
            return [None if img is None else torch.from_numpy(np.array(img.cpu()))
                    for img in images]
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx:  # DLPack: the consumer's (current) stream waits for the producer's
            return [None if img is None else torch.from_dlpack(img) for img in images]


def _why(log: list[str]) -> str:
    """The library's own explanation, condensed to the lines that name a missing library."""
    lines = [ln.strip() for text in log for ln in text.splitlines()]
    keep = [ln for ln in lines if "nvjpeg library" in ln.lower() or "libcuda" in ln.lower()]
    return f" [nvImageCodec: {'; '.join(dict.fromkeys(keep))}]" if keep else ""
