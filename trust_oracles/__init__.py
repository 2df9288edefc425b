"""trust-oracles as a Python library: the caches, oracles, metrics and training runs of the command
line as typed objects, for a notebook.  docs/API.md shows each use as a runnable block.

    import trust_oracles as to
    cache = to.open_cache("artifacts/fashion-mnist/cache/vit/test")     # logits, correct, ...
    run = to.open_run(run_dir)                      # run.record.loss, run.scores("test").confidence
    oracle = to.load_oracle(run_dir)                # a finished train-oracle run, ready to score
    to.export_oracle(run_dir, "shared")             # its oracle as a Hugging Face Hub folder
    scores = oracle.score_files(paths)              # confidence, trust, the classifier's pred
    ev = to.evaluate(scores.confidence, correct, bootstrap=1000)        # report.json's numbers
    to.compare(oracle_conf, msp, correct)["aurc"].favours               # paired bootstrap
    result = to.train(to.settings(loss="ss", head_only=True), loss=my_loss)

Modules: caches.py (open_cache, Cache), runs.py (open_run: a run directory and its scores per
split), oracles.py (load_oracle, TrustOracle; scores.py: Scores; _inputs.py checks their arguments,
_batches.py scores them batch by batch), evaluation.py (evaluate, Evaluation), comparison.py
(compare), posthoc.py (the post-hoc baselines and your own score functions), training.py (settings,
train, RunResult), heads.py (train_head: a head on features in memory), losses.py (your own loss),
export.py (export_oracle: a run's oracle as a Hugging Face
Hub-layout folder, which load_oracle reads back), errors.py (every exception the API raises).
Each is a caller of the functions the commands run, never a second version of them.  Names are
loaded on first use: the metrics (evaluate, compare, posthoc) load no torch.
"""
from __future__ import annotations

from importlib import import_module
import importlib.metadata as _metadata

try:                    # the installed distribution's version (pyproject.toml's [project] version)
    __version__ = _metadata.version("trust-oracles")
except _metadata.PackageNotFoundError:     # a checkout that was never installed
    __version__ = "0+unknown"

# public name -> the module that defines it (loaded on first use, PEP 562)
_WHERE = {
    **dict.fromkeys(("Cache", "open_cache"), "caches"),
    **dict.fromkeys(("TrustOracle", "load_oracle"), "oracles"), "Scores": "scores",
    "export_oracle": "export",
    **dict.fromkeys(("Evaluation", "Interval", "MetricSet", "check_scores", "evaluate"),
                    "evaluation"),
    **dict.fromkeys(("Comparison", "Difference", "compare"), "comparison"),
    **dict.fromkeys(("POSTHOC_SCORES", "PosthocFit", "evaluate_posthoc", "fit_posthoc",
                     "posthoc_scores"), "posthoc"),
    **dict.fromkeys(("MadeOn", "Run", "RunRecord", "SplitScores", "open_run"), "runs"),
    **dict.fromkeys(("RunResult", "TrainConfig", "settings", "train"), "training"),
    **dict.fromkeys(("HeadOracle", "train_head"), "heads"),
    **dict.fromkeys(("LossFn", "custom_loss_name"), "losses"),
    **dict.fromkeys(("BadImageError", "CacheError", "CacheMismatch", "CustomLossError",
                     "DataError", "DeviceError", "ExportError", "HubUnreachable", "InputError",
                     "LossOptionError", "MissingDependencyError", "ModelError",
                     "OtherDeviceNote", "RunError", "TrainingDiverged", "TrustOraclesError"),
                    "errors"),
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'trust_oracles' has no attribute {name!r}; its public "
                             f"names: {', '.join(__all__)}")
    value = getattr(import_module(f"trust_oracles.{_WHERE[name]}"), name)
    globals()[name] = value          # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
