"""A finished run's models rebuilt for new data (``predict --images``, the Python API's
``load_oracle``): the run refused unless complete, the classifier built as its training cache
recorded it and the run's chosen oracle (``model.load_trained_oracle``), each on the device in the
precision it ran in before.

A weights file is checked before any model is built (its sha256 against the one the cache
recorded) and the built classifier again (``weights_sha256``), so a changed or different file is
refused, naming it, rather than scoring with other weights.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from cache.reader import ClassifierCache
from cache.runfile import RunFile
from cache.runs import RunDir
from pipeline.core.models import (DataConfig, ModelError, checkpoint_model, file_sha256,
                                  weights_sha256)
from pipeline.oracle.deploy.predict import run_precision
from pipeline.oracle.nets.model import cache_classifier, load_trained_oracle, recorded_weights

WEIGHTS_OPTION = "--weights {}"    # how messages name a weights file given by the caller


class Deployed(NamedTuple):
    """One rebuilt model: the module on its device, the input it takes (resize/crop, mean, std)
    and the precision it runs in."""
    model: torch.nn.Module
    data_config: DataConfig
    precision: str


class DeployedModels(NamedTuple):
    """A run's two models, as ``deployed_models`` rebuilds them."""
    classifier: Deployed
    oracle: Deployed


def load_classifier(cache: ClassifierCache, weights: str | None,
                    option: str = WEIGHTS_OPTION) -> torch.nn.Module:
    """The classifier of ``cache``, built as ``extract`` built it (``weights``: another path to
    the same weights; ``option``: how the caller names it, e.g. "--weights {}"), refused unless
    its weights are the cache's: the file's sha256 against the one the cache recorded before any
    model is built (where recorded), then the built model's weights against ``weights_sha256``."""
    recorded = recorded_weights(cache)
    path = weights or recorded
    source = (option.format(weights) if weights else
              f"the classifier's weights file {recorded} (recorded by cache {cache.path})")
    fix = (f"pass {option.format('FILE')} with the file the cache was extracted with" if weights
           else f"restore that file, or pass {option.format('FILE')} with the original weights")
    if path and not Path(path).is_file():
        raise ModelError(f"{source} is not there now (moved or deleted{_relative(path)}): pass "
                         f"{option.format('FILE')}, the weights the cache was extracted with "
                         "(checked by their hash)")
    if path:
        check_weights_file(cache, path, source, fix)
    random_init = bool(cache.manifest.get("config", {}).get("random_init")) and not weights
    try:
        model = cache_classifier(cache, path, random_init)
    except ModelError:
        if not path:
            raise
        raise ModelError(f"{source} does not hold the weights of the classifier of cache "
                         f"{cache.path} ({cache.identity['model']}): they do not load into it; "
                         f"{fix}") from None
    found = weights_sha256(model)
    if found != cache.identity["weights_sha256"]:
        raise ModelError(f"{source} holds other weights than the classifier of cache {cache.path} "
                         f"(weights_sha256 {found[:12]}..., the cache records "
                         f"{cache.identity['weights_sha256'][:12]}...): {fix}")
    return model


def check_weights_file(cache: ClassifierCache, path: str, source: str, fix: str) -> None:
    """Before any model is built: the file must be the one the cache was extracted with (its
    bytes' sha256, recorded by caches since), or at least a checkpoint of the cache's model."""
    want = cache.manifest.get("weights_file_sha256")
    model = cache.identity["model"]
    if want:
        found = file_sha256(path)
        if found != want:
            raise ModelError(f"{source} is not the weights file the classifier of cache "
                             f"{cache.path} ({model}) was extracted with: its sha256 is "
                             f"{found[:12]}..., the cache records {want[:12]}... (for "
                             f"{recorded_weights(cache)}): {fix}")
        return
    named = checkpoint_model(path)          # caches written before the file's hash: its model
    if named not in (None, model):
        raise ModelError(f"{source} is a checkpoint of {named}, not of the classifier of cache "
                         f"{cache.path} ({model}): {fix}")


def _relative(path) -> str:
    """A path recorded as given on a command line: relative to the folder that command ran in."""
    return ("" if Path(path).is_absolute() else
            ", or recorded relative to the folder the command that wrote it ran in: run predict "
            "from there")


def complete_run(run_dir: Path) -> RunFile:
    """run.json of a finished run; a folder that is no run, or a run still training, stopped or
    failed, is refused (``RunError``)."""
    return RunDir(run_dir).require_record().require_complete(run_dir)


def deployed_models(run_dir: Path, run: RunFile, cache: ClassifierCache, weights: str | None,
                    precision: str | None, device: torch.device,
                    option: str = WEIGHTS_OPTION) -> DeployedModels:
    """The classifier and the oracle on ``device``, each model in the precision it ran in
    before unless ``precision`` overrides both (module docstring); what ``score_files`` and
    ``score_batch`` take as ``models``.  ``option``: how the caller names ``weights`` in its
    messages."""
    classifier = load_classifier(cache, weights, option).to(device)
    oracle, oracle_cfg, _ = load_trained_oracle(run_dir, run, weights, option)
    return DeployedModels(
        Deployed(classifier, DataConfig.from_dict(cache.identity["data_config"]),
                 precision or cache.identity["precision"]),
        Deployed(oracle.to(device), oracle_cfg, precision or run_precision(run)))
