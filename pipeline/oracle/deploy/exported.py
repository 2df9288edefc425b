"""A run's chosen oracle as an exported folder (``cache.export``'s layout), and back: the oracle
module whose state becomes model.safetensors with the record config.json keeps of it, and the
two models rebuilt from such a folder for ``predict --images`` and ``load_oracle`` (the oracle
alone for ``predict --split``: ``predict_split``) -- without its run directory or its training
cache.  ``hf-hub:org/name`` resolves to such a folder in the local Hugging Face cache.

The oracle is rebuilt from config.json's architecture (timm name and kwargs, head, inputs) with
random weights, then given the exported ones (every tensor, strict), so the module is the run's
``load_trained_oracle`` module tensor for tensor: the same images give the same scores.  The
classifier is not in the folder (it is another party's model): it is rebuilt as its cache
recorded it, from the weights file the caller passes (or the recorded path, or the seeded random
init it was), and refused unless its weights are the recorded ones (sha256 of the file, then of
the built model's weights), naming both hashes.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import load_model, save_model

from cache.export import CONFIG, ExportError, is_export_dir, read_export
from cache.reader import ClassifierCache
from cache.runfile import RunFile
from cache.runs import BEST, RunDir, RunError
from cache.schema import CLASSIFIER_KEYS
from pipeline.core import dist
from pipeline.core.hub import unreachable
from pipeline.core.inference import for_inference
from pipeline.core.models import DataConfig, ModelError, ModelSpec, build_model, file_sha256
from pipeline.data.orientation import EXIF_TRANSPOSE
from pipeline.oracle.deploy.predict import PredictConfig, run_precision
from pipeline.oracle.deploy.rebuild import Deployed, DeployedModels, load_classifier
from pipeline.oracle.loop.outputs import score_images
from pipeline.oracle.nets.checkpoint import load_checkpoint
from pipeline.oracle.nets.heads import make_head
from pipeline.oracle.nets.model import Oracle, build_oracle, load_trained_oracle, recorded_weights
from pipeline.oracle.settings.targets import open_split

HUB_PREFIX = "hf-hub:"
HUB_INSTALL = "pip install 'trust-oracles[hub]' (or: pip install huggingface_hub)"


class ClassifierRecord(NamedTuple):
    """The classifier an exported oracle judges, in the shape ``rebuild.load_classifier`` reads a
    classifier cache in (``path`` names where it is recorded, for messages)."""
    path: str
    identity: dict
    manifest: dict


def oracle_record(run_dir: Path, run: RunFile) -> tuple[torch.nn.Module, dict]:
    """The run's chosen oracle on the CPU and how to rebuild it (config.json's ``oracle``)."""
    module, _, _ = load_trained_oracle(run_dir, run)
    info = run.oracle_build
    record = {"head_only": bool(info.get("head_only")), "model": info["model"],
              "model_kwargs": dict(info["model_kwargs"]), "head": info["head"],
              "data_config": info["data_config"], "precision": run_precision(run),
              "stacked": module.stacked}
    if record["head_only"]:
        ckpt = load_checkpoint(RunDir(run_dir).checkpoint(BEST))
        state = ckpt["head"]
        record["head_arch"] = arch = ckpt.get("arch", "linear")
        # the head's input width as head_from_checkpoint reads it (features + logit statistics)
        record["head_in_features"] = int(
            state["linear.weight" if arch == "linear" else "w0"].shape[1])
    return module, record


def classifier_record(cache: ClassifierCache) -> dict:
    """config.json's ``classifier``: the identity the oracle judges and how it was built."""
    ident, config = cache.identity, cache.manifest.get("config", {})
    keep = (*CLASSIFIER_KEYS, "dataset", "precision", EXIF_TRANSPOSE)
    return {"identity": {k: ident[k] for k in keep if k in ident},
            "build": {k: config.get(k) for k in ("classifier", "seed", "model_kwargs",
                                                  "random_init")},
            "weights_file": recorded_weights(cache),
            "weights_file_sha256": cache.manifest.get("weights_file_sha256"),
            "classes": list(cache.manifest.get("classes") or [])}


def save_oracle(module: torch.nn.Module, path: Path) -> None:
    """model.safetensors: every tensor of the oracle (shared ones once: ``save_model``)."""
    save_model(module, str(path), metadata={"format": "pt"})


def _rebuild_oracle(folder: Path, record: dict) -> Oracle:
    """The oracle of ``record`` with random weights, then the folder's (strict)."""
    spec = ModelSpec(record["model"], record["model_kwargs"], None, True, record["data_config"])
    if record["head_only"]:
        backbone = build_model(spec, seed=0)
        backbone.reset_classifier(0)
        head = make_head(record["head_arch"], record["head_in_features"],
                         record["head"] == "hyperplane", None, record["stacked"])
        module = Oracle(backbone, head, cached_features=True)
    else:
        module, _ = build_oracle(spec, record["head"], "model", seed=0)
    missing, unexpected = load_model(module, str(folder / "model.safetensors"), strict=False)
    if missing or unexpected:
        raise ExportError(f"exported oracle {folder}: model.safetensors does not fit the "
                          f"architecture config.json records (missing {sorted(missing)[:3]}, "
                          f"unexpected {sorted(unexpected)[:3]}); export the run again")
    module = for_inference(module)
    # as load_trained_oracle: a head-only backbone in extract's memory format, same kernels
    return module.to(memory_format=torch.channels_last) if record["head_only"] else module


def classifier_of(folder: str, config: dict) -> ClassifierRecord:
    """The recorded classifier as ``load_classifier`` takes it."""
    clf = config["classifier"]
    build = {k: v for k, v in clf["build"].items() if v is not None}
    manifest = {"config": build, "weights_file": clf.get("weights_file"),
                "weights_file_sha256": clf.get("weights_file_sha256"),
                "classes": clf.get("classes") or []}
    return ClassifierRecord(f"{folder}/{CONFIG}", dict(clf["identity"]), manifest)


def check_classifier_file(record: ClassifierRecord, weights: str, option: str) -> None:
    """A classifier weights file given for an exported oracle: its sha256 against the recorded
    one, before anything is built."""
    want = record.manifest.get("weights_file_sha256")
    if not want or not Path(weights).is_file():
        return                  # load_classifier names a missing file; the built model is checked
    found = file_sha256(weights)
    if found != want:
        raise ModelError(f"{option.format(weights)} is not the classifier this oracle was trained "
                         f"to judge ({record.identity['model']}): its sha256 is {found}, the "
                         f"exported oracle ({record.path}) records {want}; pass "
                         f"{option.format('FILE')} with that classifier's weights file")


def deployed_export(folder: Path, config: dict, weights: str | None, precision: str | None,
                    device: torch.device,
                    option: str = "--weights {}") -> tuple[DeployedModels, ClassifierRecord]:
    """Both models of an exported oracle on ``device`` (as ``rebuild.deployed_models``)."""
    record = classifier_of(str(folder), config)
    if weights:
        check_classifier_file(record, weights, option)
    classifier = load_classifier(record, weights, option).to(device)
    orc = config["oracle"]
    oracle = _rebuild_oracle(Path(folder), orc).to(device)
    return DeployedModels(
        Deployed(classifier, DataConfig.from_dict(record.identity["data_config"]),
                 precision or record.identity["precision"]),
        Deployed(oracle, DataConfig.from_dict(orc["data_config"]),
                 precision or orc["precision"])), record


def predict_split(cfg: PredictConfig) -> list[dict]:
    """``predict --run DIR --split TAG --cache ROOT --out-file FILE.h5``: an exported oracle over
    one labelled split, written as the run's own outputs are (``loop.outputs.score_images``)."""
    if len(cfg.splits) != 1 or cfg.cache is None or cfg.out is None:
        raise RunError(f"--run {cfg.run} is an exported oracle, which keeps no run's data or "
                       "outputs folder: give one --split with its --cache ROOT (and --data) and "
                       "--out-file FILE.h5 for its scores")
    info, device = dist.init(cfg.device)
    folder, config = open_export(cfg.run)
    record, run = classifier_of(str(folder), config), config["run"]["record"]
    split = open_split(cfg.data, Path(cfg.cache), run["classifier"], cfg.splits[0],
                       cfg.labels_file, same_classifier_as=record.identity)
    found = split.cache.identity["dataset_fingerprint"]
    if found == config["training_data"]["dataset_fingerprint"]:
        raise RunError(f"--split {split.tag} lists the images the exported oracle {cfg.run} was "
                       f"trained on (dataset fingerprint {found[:12]}): its scores would be "
                       "training-set numbers. Predict on another split.")
    oracle = _rebuild_oracle(folder, config["oracle"]).to(device)
    opts = dict(batch_size=cfg.batch_size, workers=cfg.workers, progress=cfg.progress,
                precision=cfg.precision or config["oracle"]["precision"])
    out = Path(cfg.out)
    return [score_images(RunDir(out.parent), oracle, split, out, run,
                         DataConfig.from_dict(config["oracle"]["data_config"]), opts, info,
                         device)]


def is_exported(source: str | Path) -> bool:
    """Whether ``source`` names an exported oracle: ``hf-hub:...`` or a folder ``cli.py export``
    wrote."""
    return str(source).startswith(HUB_PREFIX) or is_export_dir(source)


def open_export(source: str | Path) -> tuple[Path, dict]:
    """(folder, its checked config.json) of an exported oracle: a folder, or ``hf-hub:org/name``
    resolved through the local Hugging Face cache (``hub_folder``)."""
    text = str(source)
    if text.startswith(HUB_PREFIX):
        folder = hub_folder(text)
        return folder, read_export(folder, source=f"{text} ({folder})")
    return Path(source), read_export(Path(source))


def hub_folder(spec: str) -> Path:
    """``hf-hub:org/name[@revision]`` -> its snapshot folder in the local Hugging Face cache,
    downloaded where allowed.  Offline (``HF_HUB_OFFLINE``) only the local cache is read, so a
    repository not in it fails at once, naming it and the fix."""
    repo, _, revision = spec[len(HUB_PREFIX):].partition("@")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ExportError(f"{spec} needs huggingface_hub: {HUB_INSTALL}") from None
    # read at call time: huggingface_hub reads its environment once, at its import
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")
    cache_dir = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None)
    why = "HF_HUB_OFFLINE is set" if offline else None
    if not offline:         # one probe, seconds: not a minute of the library's retries
        from huggingface_hub import constants
        down = unreachable(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT)
        why = f"the hub cannot be reached ({down})" if down else None
    try:
        return Path(snapshot_download(repo, revision=revision or None, cache_dir=cache_dir,
                                      local_files_only=why is not None, etag_timeout=5))
    except Exception as err:  # noqa: BLE001 - its error classes vary by huggingface_hub version
        where = cache_dir or "the default Hugging Face cache"
        if why:
            raise ExportError(f"{spec} is not in the local Hugging Face cache ({where}) and "
                              f"{why}: download it once where the hub is reachable (without "
                              "HF_HUB_OFFLINE), or pass the exported folder's path "
                              "instead") from None
        raise ExportError(f"{spec} could not be fetched from the Hugging Face hub "
                          f"({type(err).__name__}: {str(err).splitlines()[0][:160]}); check the "
                          "name and the network, or pass the exported folder's path") from None


def exported_choice(config: dict, key: float | tuple[str, float], where: Path,
                    default: bool) -> dict:
    """The trust threshold of an exported oracle: the one chosen at export (``default``: none
    asked for, or the same target asked), a number as given; another target is refused, as
    the held-out rows it would be picked on stay with the run."""
    chosen = dict(config["threshold"])
    if default:
        return chosen
    if isinstance(key, float):
        return {"threshold": float(key), "chosen_by": "--threshold"}
    asked = f"{key[0]}={key[1]:g}"
    if chosen["chosen_by"] == asked:
        return chosen
    raise RunError(f"exported oracle {where} carries the threshold chosen by "
                   f"{chosen['chosen_by']} ({chosen['threshold']:.6g}); a threshold for {asked} "
                   "is picked on the run's held-out rows, which stay with the run: pass a number "
                   f"(--threshold X), or export the run again with `cli.py export RUN --target "
                   f"{asked} --out DIR`")
