"""The exceptions (and notes) the Python API raises, each where the pipeline raises it.

Every error a user can fix carries the message the command line prints for the same problem:
what is wrong, named (the file, the run, the attribute), and the fix.  The classes are the
pipeline's own, re-exported here so one import catches them all; none is wrapped or renamed, so
``except CacheError`` catches the same errors from ``trust_oracles`` and from ``cli.py``.

TrustOraclesError
    The base class of the errors below, not of the notes: ``except TrustOraclesError`` catches
    an error a user can fix.  Each keeps its built-in base too (``ValueError``,
    ``RuntimeError``, ``ImportError``), named with it below.  ``exit_code``: the exit status the
    command line gives it (1; 2 for options that do not fit, as click's usage errors).
CacheError
    A classifier cache or an oracle output file is missing, incomplete, damaged, foreign, or
    lacks a column (``Cache.features`` of a cache extracted without ``--features``); its images
    changed since extraction (``Cache.paths``).  A ``RuntimeError``.
CacheMismatch
    A ``CacheError``: a cache exists but is another one than asked for (another classifier,
    another dataset fingerprint, another schema version), naming each differing attribute.
DataError
    The data root, a split, a class folder or a labels file is missing or inconsistent; an image
    path given to ``score_files`` is not a file.  A ``ValueError``.
ModelError
    A weights file that is gone (moved or deleted), holds other weights than the ones recorded
    (checked by hash), or does not fit the model; a model giving non-finite scores.  A
    ``ValueError``.
RunError
    A run directory that is not a finished run, whose training cache moved, or that cannot give
    what is asked (a trust threshold for a target when it held out no rows, a target its
    held-out rows cannot reach).  A ``RuntimeError``.
BadImageError
    An image file that cannot be decoded or used (``score_files`` without ``skip_bad=True``).
    A ``RuntimeError``.
DeviceError
    ``device=`` names no device, or one this machine does not have.  A ``ValueError``.
ExportError
    An exported oracle's folder (``load_oracle(DIR)``, ``export_oracle``) with a missing or
    altered file (its sha256 against config.json), a model card whose metrics belong to other
    weights, another format version; an ``hf-hub:`` id not in the local cache while offline;
    an ``export_oracle`` folder that is not empty (without ``force``).  A ``ValueError``.
HubUnreachable
    Pretrained weights are in no local cache and their source cannot be reached.  A
    ``RuntimeError``.
CustomLossError
    A loss of your own (``train(..., loss=...)``, ``train_head``): a class that lacks a name,
    label, TNR rule or formula, or takes a name another class holds; or a loss that returned
    something other than finite, differentiable losses of the expected shape.  Names the loss.
    A ``ValueError``.
LossOptionError
    A loss option that does not apply to the chosen loss, or an invalid value.  A ``ValueError``.
TrainingDiverged
    The training loss became NaN or infinite; the last good checkpoint is kept.  A ``RunError``.
InputError
    An argument of the wrong kind: a tensor of the wrong shape, dtype or device, an image the
    classifier cannot take, a threshold outside [0, 1], an unknown target.  Its message says
    what was received and what is expected.  A ``ValueError``.
MissingDependencyError
    An optional package a method needs is not installed (``Cache.to_frame``: pandas); the
    message names the ``pip install`` command.  An ``ImportError``.

Notes (warnings, not errors):

UnverifiedCacheWarning
    A cache written before per-shard checksums: read, but its files cannot be verified.
UnstampedCacheWarning
    A cache written before image stamps: changed images cannot be found.
OtherDeviceNote
    ``load_oracle`` scores on another device or in another precision than the run's stored
    scores were made on: its numbers are close to the run's, not equal (docs/METRICS.md, "Scores
    on another device").
"""
from __future__ import annotations

# every class from where it is defined, in modules that load no torch: catching them loads nothing
from cache.errors import TrustOraclesError
from cache.export import ExportError
from cache.outputs import OtherDeviceNote
from cache.reader import UnstampedCacheWarning, UnverifiedCacheWarning
from cache.runs import RunError
from cache.schema import CacheError, CacheMismatch
from pipeline.core.errors import HubUnreachable, ModelError
from pipeline.core.losses import CustomLossError, LossOptionError
from pipeline.core.options import DeviceError
from pipeline.data.errors import BadImageError, DataError

__all__ = ["BadImageError", "CacheError", "CacheMismatch", "CustomLossError", "DataError",
           "DeviceError", "ExportError", "HubUnreachable", "InputError", "LossOptionError",
           "MissingDependencyError", "ModelError", "OtherDeviceNote", "RunError",
           "TrainingDiverged", "TrustOraclesError",
           "UnstampedCacheWarning", "UnverifiedCacheWarning"]


class InputError(TrustOraclesError, ValueError):
    """An argument the API cannot take: says what was received and what is expected."""


class MissingDependencyError(TrustOraclesError, ImportError):
    """An optional package is not installed; the message names the ``pip install`` command."""


def received(what: str, got: str, expected: str, fix: str = "") -> InputError:
    """An ``InputError`` worded alike everywhere: ``what`` got ``got``; expected ``expected``."""
    return InputError(f"{what}: got {got}; expected {expected}" + (f". {fix}" if fix else ""))


def __getattr__(name: str):
    # TrainingDiverged is defined beside the training loop, which loads torch: imported when
    # asked for (``except errors.TrainingDiverged`` evaluates it only once an error propagates)
    if name == "TrainingDiverged":
        from pipeline.oracle.loop.state import TrainingDiverged
        return TrainingDiverged
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
