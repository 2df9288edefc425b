"""How ``trust_oracles.oracles.TrustOracle`` scores, once its arguments are checked
(``_inputs.py``): tensors, PIL images and files, batch by batch, through the models and the step of
``cli.py predict --images`` (``pipeline.oracle.deploy.images``), so the numbers are that command's.
Each returns the columns ``scores.scores_from`` takes; a non-finite output is refused, naming the
row, as the command refuses it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from PIL import Image

from pipeline.data.errors import BadImageError, worker_message
from pipeline.data.sources import SampleList
from pipeline.oracle.deploy import images as deploy
from pipeline.oracle.deploy.rebuild import DeployedModels
from trust_oracles import _inputs as inputs


def score_tensors(models: DeployedModels, x: torch.Tensor, logits: torch.Tensor | None,
                  device: torch.device, batch_size: int) -> dict:
    """The oracle's z of a batch at its input size (uint8 pixels normalised here, float32 as
    given), with the classifier's pred and msp where its ``logits`` are given."""
    norm = deploy.normalizers(models, device)[1]
    oracle = models.oracle
    parts = []
    with torch.inference_mode():
        for i in range(0, len(x), batch_size):
            xb = x[i:i + batch_size]
            xb = norm(xb) if xb.dtype == torch.uint8 else \
                xb.to(device).contiguous(memory_format=norm.memory_format)
            lb = None if logits is None else logits[i:i + batch_size].to(device)
            parts.append(deploy.oracle_z(oracle.model, oracle.precision, xb, lb, device)
                         .float().cpu())
    out = {"z": inputs.concat(parts), "valid": np.ones(len(x), bool)}
    deploy.check_finite(lambda i: f"row {i} of x", {**out, "msp": np.zeros(len(x))})
    if logits is not None:
        probs = logits.float().softmax(dim=-1)
        out.update(pred=probs.argmax(dim=-1).cpu().numpy(),
                   msp=probs.max(dim=-1).values.cpu().numpy())
    return out


def score_images(models: DeployedModels, images: Sequence[Image.Image], upright: bool,
                 device: torch.device, batch_size: int) -> dict:
    """PIL images through both models, each converted, turned upright where ``upright``, resized
    and cropped for each model as ``predict --images`` treats a decoded file."""
    views = deploy.model_views(models)
    norm = deploy.normalizers(models, device)
    parts = []
    with torch.inference_mode():
        for start in range(0, len(images), batch_size):
            batch = [inputs.image_views(views, im, start + j, upright)
                     for j, im in enumerate(images[start:start + batch_size])]
            stacked = [torch.stack(v) for v in zip(*batch)]
            parts.append({k: v.cpu() for k, v in
                          deploy.score_batch(models, norm, stacked, device).items()})
    out = {k: inputs.concat([p[k] for p in parts], dtype) for k, dtype in
           (("z", np.float32), ("pred", np.int64), ("msp", np.float32))}
    out["valid"] = np.ones(len(images), bool)
    deploy.check_finite(lambda i: f"image {i}", out)
    return out


def score_files(samples: SampleList, models: DeployedModels, device: torch.device,
                batch_size: int, workers: int, skip_bad: bool) -> dict:
    """``predict --images``' pass over the files; its advice for a bad file names the Python
    argument instead of the option."""
    try:
        return deploy.score_files(samples, models, device, batch_size=batch_size,
                                  workers=workers, skip_bad=skip_bad)
    except BadImageError as err:
        raise BadImageError(worker_message(err).replace(
            "re-run with --skip-bad", "pass skip_bad=True")) from None
