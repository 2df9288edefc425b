"""A finished ``train-oracle`` run as a Python object: its chosen oracle and the frozen classifier
it judges, scoring image files, PIL images or tensors.

    oracle = load_oracle("runs/vit-vit_ce_seed0_0123abcd4567")
    scores = oracle.score_files(["a.jpg", "b.png"])
    scores.pred, scores.confidence, scores.trust          # (2,) each

Every batch of images is scored (``_batches.py``) by ``pipeline.oracle.deploy.images``'
``score_batch``, the step of ``cli.py predict --images``, with the models that command builds
(``rebuild.deployed_models``: the classifier its training cache recorded, weights checked by hash;
the run's best oracle; each in the precision it ran in before), so the numbers equal that
command's table.  A row is trusted when its confidence is >= the threshold, chosen as ``predict
--images`` chooses it (``pipeline.oracle.deploy.threshold``): a number as given, or a target met on
the run's held-out rows; by default ``("tpr", 0.95)``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from PIL import Image

from cache.outputs import MadeOn
from cache.runfile import RunFile
from cache.schema import CLASSIFIER_KEYS, check_identity
from pipeline.core.models import DataConfig
from pipeline.core.options import check_device
from pipeline.core.precision import PRECISIONS, made_on
from pipeline.data.labels import class_names
from pipeline.data.orientation import EXIF_TRANSPOSE
from pipeline.oracle.deploy import images as deploy
from pipeline.oracle.deploy import rebuild
from pipeline.oracle.deploy.exported import (deployed_export, exported_choice, is_exported,
                                             open_export)
from pipeline.oracle.deploy.predict import note_other_numerics
from pipeline.oracle.deploy.threshold import given_threshold, pick_threshold
from trust_oracles import _batches as batches
from trust_oracles import _inputs as inputs
from trust_oracles._inputs import ThresholdSpec
from trust_oracles.caches import Cache
from trust_oracles.errors import received
from trust_oracles.scores import Scores, scores_from


@dataclass(frozen=True, eq=False)
class TrustOracle:
    """A finished run's chosen oracle and its classifier, ready to score (``load_oracle``).

    Attributes
    ----------
    run_dir : Path
    device : torch.device
        Where both models run.
    batch_size : int
        Images per forward pass.
    stacked : bool
        The oracle's head also reads the classifier's logits (a head-only run on stacked
        inputs): ``score(x)`` then needs them.
    data_config, classifier_data_config : DataConfig
        The oracle's and the classifier's input: ``input_size`` (C, H, W), resize/crop, mean, std.
    precision, classifier_precision : str
        The autocast each model runs in (bf16, fp16 or fp32).
    made_on : MadeOn
        What makes this oracle's scores (device, precision): where it is the run's own
        (``open_run(run_dir).scores(split).made_on``), the same images give the run's stored
        scores bit for bit; elsewhere they differ a little (docs/METRICS.md, "Scores on another
        device"), and ``load_oracle`` says so once (an ``OtherDeviceNote`` warning).
    classes : tuple of str
        Readable names of the classifier's outputs (``classes[scores.pred[i]]``).
    """

    run_dir: Path
    device: torch.device
    batch_size: int
    stacked: bool
    data_config: DataConfig
    classifier_data_config: DataConfig
    precision: str
    classifier_precision: str
    made_on: MadeOn
    classes: tuple[str, ...] = field(repr=False)
    _run: RunFile | None = field(repr=False)   # None: an exported oracle (no run directory)
    _classifier: dict = field(repr=False)       # the training cache's identity
    _models: rebuild.DeployedModels = field(repr=False)     # the classifier and the oracle
    _choices: dict = field(default_factory=dict, repr=False)
    _exported: dict | None = field(default=None, repr=False)   # its config.json

    def threshold(self, target: str | tuple[str, float] = deploy.DEFAULT_TARGET) -> float:
        """The threshold meeting ``target`` on the run's held-out rows (``predict --target``).

        Parameters
        ----------
        target : ("tpr", T) or ("risk", R), or "tpr=T" / "risk=R"
            ``tpr``: the highest threshold that trusts at least T of the classifier's correct
            held-out answers; ``risk``: the lowest whose share of wrong answers among the
            trusted held-out rows is at most R.

        Returns
        -------
        float
            The threshold: a confidence at or above it is trusted.

        Raises
        ------
        RunError
            The run held out no rows (``--val-fraction 0``), or they cannot meet the target.
        InputError
            ``target`` is not a target.
        """
        return self.threshold_choice(target)["threshold"]

    def threshold_choice(self, threshold: ThresholdSpec = None) -> dict:
        """How a threshold is chosen and what it reaches on the held-out rows.

        Parameters
        ----------
        threshold : float, target or None
            A threshold in [0, 1], a target as for ``threshold`` (("tpr", T), "risk=R", ...),
            or None: the run's default target (TPR 0.95 on the held-out rows).

        Returns
        -------
        dict
            The ``trust`` record of ``predict --images``' meta JSON: ``threshold``,
            ``chosen_by``, ``reached`` (tpr, fpr, coverage, risk, rows) where the run has
            held-out rows.
        """
        key = inputs.threshold_key(threshold)
        if key not in self._choices:
            if self._exported is not None:
                self._choices[key] = exported_choice(self._exported, key, self.run_dir,
                                                     threshold is None)
            elif isinstance(key, float):
                self._choices[key] = given_threshold(self.run_dir, self._run, key)
            else:
                self._choices[key] = pick_threshold(self.run_dir, self._run, *key)
        return copy.deepcopy(self._choices[key])

    def score(self, x: torch.Tensor, logits: torch.Tensor | None = None, *,
              threshold: ThresholdSpec = None) -> Scores:
        """Score a batch already at the oracle's input size.

        Parameters
        ----------
        x : Tensor (B, C, H, W)
            ``(C, H, W) == data_config.input_size``, on the CPU or on ``device``; either uint8
            pixels after the oracle's resize/crop (``pipeline.data.images.ResizeCrop``),
            normalised here, or float32 already normalised as ``GpuNormalize`` does:
            ``(pixels - 255 * mean) / (255 * std)`` per channel.
        logits : Tensor (B, K), optional
            The classifier's logits of the same images, as it gives them.  Needed by a stacked
            oracle; where given, ``Scores.pred`` and ``msp`` are computed from them.
        threshold : float, target or None
            A number in [0, 1], a target (see ``threshold``), or None for ("tpr", 0.95).

        Returns
        -------
        Scores
            B rows.

        Raises
        ------
        InputError
            ``x`` or ``logits`` of the wrong type, shape, dtype or device; a stacked oracle
            without ``logits``.
        """
        cut = self.threshold_choice(threshold)["threshold"]
        x = inputs.checked_batch(x, self.data_config.input_size, self.device)
        logits = inputs.checked_logits(logits, len(x), int(self._classifier["num_classes"]),
                                       self.stacked, self.device)
        out = batches.score_tensors(self._models, x, logits, self.device, self.batch_size)
        return scores_from(out, cut, pixels=logits is not None)

    def score_images(self, images: Sequence[Image.Image], *,
                     threshold: ThresholdSpec = None) -> Scores:
        """Score PIL images through the classifier and the oracle, as ``predict --images``
        scores files: each image converted to 8-bit RGB (16-bit greys keep their high byte),
        turned upright where the run's training cache was read so, resized and cropped for each
        model, batched.  ``score_files`` on the same files gives the same numbers where PIL
        decodes them as torchvision does (true of PNG; JPEG decoders may round differently).

        Parameters
        ----------
        images : sequence of PIL.Image.Image
        threshold : float, target or None
            As for ``score``.

        Returns
        -------
        Scores
            One row per image, with the classifier's ``pred`` and ``msp``.

        Raises
        ------
        InputError
            An item that is not a PIL image, of a pixel format whose range is unknown (32-bit
            samples), or too elongated for the classifier's crop.
        """
        cut = self.threshold_choice(threshold)["threshold"]
        inputs.refuse_single(images, Image.Image, "score_images(images)", "PIL images")
        upright = self._classifier.get(EXIF_TRANSPOSE, False)
        out = batches.score_images(self._models, images, upright, self.device, self.batch_size)
        return scores_from(out, cut, pixels=True)

    def score_files(self, paths: Sequence[str | Path], *, threshold: ThresholdSpec = None,
                    skip_bad: bool = False, workers: int = 0) -> Scores:
        """Score image files exactly as ``cli.py predict --images`` does, in the given order.

        Parameters
        ----------
        paths : sequence of str or Path
            Image files (any format ``predict --images`` reads).
        threshold : float, target or None
            As for ``score``.
        skip_bad : bool, default False
            Mark a file that cannot be read or used invalid (``Scores.valid``) instead of
            raising, as ``--skip-bad``.
        workers : int, default 0
            Decoding processes (0: in this process).

        Returns
        -------
        Scores
            One row per path, in the given order.

        Raises
        ------
        DataError
            A path that is not a file (without ``skip_bad``).
        BadImageError
            A file that cannot be decoded or used (without ``skip_bad``).
        """
        cut = self.threshold_choice(threshold)["threshold"]
        inputs.refuse_single(paths, (str, Path), "score_files(paths)", "paths of image files")
        samples = inputs.file_list(paths, self._classifier.get(EXIF_TRANSPOSE, False), skip_bad)
        out = batches.score_files(samples, self._models, self.device, self.batch_size, workers,
                                  skip_bad)
        return scores_from(out, cut, pixels=True)

    def check_cache(self, cache: Cache) -> None:
        """Refuse a cache of another classifier than the one this oracle was trained to judge.

        Parameters
        ----------
        cache : Cache
            A classifier cache (``open_cache``).

        Raises
        ------
        CacheMismatch
            Its model, weights, preprocessing or classes differ, each named.
        """
        check_identity(cache.identity, self._classifier, f"cache {cache.path}",
                       keys=CLASSIFIER_KEYS,
                       hint="It was extracted with another classifier than the training split's "
                            "cache; re-extract it with the same --classifier, --weights FILE, "
                            "--model-kwargs and --preprocess.")


def load_oracle(run_dir: str | Path, *, weights: str | Path | None = None,
                device: str | torch.device | None = None, batch_size: int = 256,
                precision: str | None = None) -> TrustOracle:
    """Load a finished run's chosen oracle and the classifier it judges.

    Parameters
    ----------
    run_dir : str or Path
        A complete ``train-oracle`` run directory, a folder ``cli.py export`` wrote (every file
        checked against config.json's hashes), or ``"hf-hub:org/name[@revision]"``: such a
        folder in the local Hugging Face cache (downloaded where the hub is reachable; only the
        cache with ``HF_HUB_OFFLINE=1``; needs ``pip install 'trust-oracles[hub]'``).  An
        exported oracle's threshold is the one chosen at export (or a number given here).
    weights : str or Path, optional
        The classifier's weights (and a head-only run's backbone's) at another path, where the
        file its cache recorded was moved; checked against the recorded hashes (the file's
        before any model is built, where its cache recorded it).
    device : str or torch.device, optional
        ``cpu``, ``cuda`` or ``cuda:N``; default: cuda if available, else cpu.
    batch_size : int, default 256
    precision : {"bf16", "fp16", "fp32"}, optional
        Override both models' autocast; default: the precision each ran in before (the
        classifier: its cache's; the oracle: the run's), as ``predict --images``.

    Returns
    -------
    TrustOracle
        Ready to score (eval mode, frozen), on ``device``.

    Raises
    ------
    RunError
        ``run_dir`` is no run directory (missing, or a classifier cache), or not a complete run;
        its training cache is nowhere it was recorded (its absolute path, its path from the run
        directory, or, for runs that recorded only the path as typed, relative to a folder above
        the run).
    CacheMismatch
        The folder of its training cache now holds another classifier's cache (re-extracted in
        place with other weights or another model), or other rows: the oracle was not trained
        to judge that classifier.
    ModelError
        The classifier's weights file moved, or ``weights`` is another file or holds other
        weights (a head-only run whose backbone cannot be found: ``RunError``).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise received("load_oracle(batch_size)", repr(batch_size), "an int >= 1")
    if precision is not None and precision not in PRECISIONS:
        raise received("load_oracle(precision)", repr(precision), f"one of {PRECISIONS} or None")
    device = check_device(None if device is None else str(device))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if is_exported(run_dir):
        return _load_exported(run_dir, weights, device, batch_size, precision)
    run_dir = Path(run_dir)
    run = rebuild.complete_run(run_dir)
    cache = deploy.training_cache(run_dir, run)
    models = rebuild.deployed_models(run_dir, run, cache, None if weights is None else str(weights),
                                     precision, device, option="load_oracle(weights={})")
    clf, orc = models
    made = made_on(device, orc.precision)
    note_other_numerics(run_dir, run, made)
    return TrustOracle(run_dir=run_dir, device=device, batch_size=batch_size,
                       stacked=orc.model.stacked, data_config=orc.data_config,
                       classifier_data_config=clf.data_config, precision=orc.precision,
                       classifier_precision=clf.precision, made_on=made,
                       classes=tuple(class_names(cache.manifest.get("classes") or [])),
                       _run=run, _classifier=dict(cache.identity), _models=models)


def _load_exported(source, weights, device, batch_size, precision) -> TrustOracle:
    """``load_oracle`` of an exported folder or hub id (``trust_oracles.export``)."""
    folder, config = open_export(source)
    models, clf = deployed_export(folder, config, None if weights is None else str(weights),
                                  precision, device, option="load_oracle(weights={})")
    return TrustOracle(run_dir=folder, device=device, batch_size=batch_size,
                       stacked=models.oracle.model.stacked, data_config=models.oracle.data_config,
                       classifier_data_config=models.classifier.data_config,
                       precision=models.oracle.precision,
                       classifier_precision=models.classifier.precision,
                       made_on=made_on(device, models.oracle.precision),
                       classes=tuple(class_names(clf.manifest["classes"])), _run=None,
                       _classifier=dict(clf.identity), _models=models, _exported=config)
