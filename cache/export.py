"""An exported oracle: a folder in the Hugging Face Hub's model layout (``cli.py export``).

    DIR/model.safetensors   the chosen oracle's weights (backbone and head), nothing else
    DIR/config.json         what loading needs (``EXPORT_KIND``, ``EXPORT_VERSION``; the oracle's
                            architecture and input, its loss, threshold, the classifier it judges,
                            the training data's identity) and each other file's sha256 and size
    DIR/README.md           the model card; its YAML front matter names the sha256 of the weights
                            its metrics belong to (``CARD_WEIGHTS_KEY``)

The folder is written whole or not at all (``write_export``: a hidden temporary folder beside it,
then renamed), and read back only after every check (``read_export``): the version, each file's
hash against config.json (sha256, not XXH3: the Hub shows and checks sha256, and a shared file
is worth the slower hash), and the card's weights hash against the weights, so a card whose
metrics describe other weights is refused rather than shown beside them.  Torch-free: the
weights are written by the caller's ``write_weights(path)``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping

from cache.errors import TrustOraclesError
from cache.integrity import file_sha256
from cache.runs import is_run_dir
from cache.schema import canonical

EXPORT_KIND = "trust-oracles-export"
EXPORT_VERSION = 1      # bump when a field of config.json changes meaning; readers refuse others
WEIGHTS, CONFIG, CARD = "model.safetensors", "config.json", "README.md"
CARD_WEIGHTS_KEY = "trust_oracles_weights_sha256"
_CARD_LINE = re.compile(rf"^{CARD_WEIGHTS_KEY}:\s*([0-9a-f]{{64}})\s*$", re.MULTILINE)


class ExportError(TrustOraclesError, ValueError):
    """An exported oracle folder that cannot be written or used: missing or altered files, another
    version, a folder that is in the way."""


def is_export_dir(path: Path | str) -> bool:
    """Whether ``path`` is a folder holding an exported oracle's config.json, or its weights
    without one (then ``read_export`` names the missing config.json, not a missing run.json)."""
    config = Path(path) / CONFIG
    if not config.is_file():
        return (Path(path) / WEIGHTS).is_file() and not is_run_dir(Path(path))
    try:
        return json.loads(config.read_text()).get("kind") == EXPORT_KIND
    except (OSError, ValueError, AttributeError):
        return False


def card_front_matter(weights_sha256: str, fields: Mapping[str, Any]) -> str:
    """The card's YAML front matter (the Hub reads it as metadata): ``fields`` as flat
    ``key: value`` lines (JSON scalars and lists are YAML), then the weights hash line."""
    lines = [f"{k}: {json.dumps(v)}" for k, v in fields.items()]
    return "---\n" + "\n".join(lines + [f"{CARD_WEIGHTS_KEY}: {weights_sha256}"]) + "\n---\n"


def write_export(out: Path, write_weights: Callable[[Path], None], config: Mapping[str, Any],
                 card: Callable[[str], str], force: bool = False) -> Path:
    """Write the folder ``out``: weights, then the card (``card(weights_sha256)`` -> its text),
    then config.json with both files' hashes.  Refused (``ExportError``) where ``out`` is a file
    or a non-empty folder, unless ``force`` (then replaced, only once the new one is complete)."""
    out = Path(out)
    check_target(out, force)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write_weights(tmp / WEIGHTS)
        digest = file_sha256(tmp / WEIGHTS)
        (tmp / CARD).write_text(card(digest))
        files = {name: {"sha256": file_sha256(tmp / name), "bytes": (tmp / name).stat().st_size}
                 for name in (WEIGHTS, CARD)}
        doc = {**config, "kind": EXPORT_KIND, "version": EXPORT_VERSION, "files": files}
        (tmp / CONFIG).write_text(json.dumps(canonical(doc), indent=2, sort_keys=True) + "\n")
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def check_target(out: Path, force: bool) -> None:
    """Refuse (``ExportError``) a file, or a non-empty folder unless ``force``."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file: choose a folder to export into")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"--out {out} is a folder that is not empty: choose a new folder, or "
                          "pass --force to replace it")


def _swap_in(tmp: Path, out: Path) -> None:
    """``tmp`` renamed to ``out``; an existing ``out`` (``--force``) is set aside first and
    deleted only after the rename, so a failure leaves the old folder or the new one."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        if old.exists():
            os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def read_export(folder: Path | str, source: str | None = None) -> dict:
    """config.json of the exported oracle in ``folder``, after every check (module docstring).
    ``source``: how messages name the folder (e.g. the hub id it was resolved from)."""
    folder = Path(folder)
    where = source or str(folder)
    fix = "export it again with `cli.py export RUN --out DIR --force`, or download it again"
    try:
        doc = json.loads((folder / CONFIG).read_text())
    except FileNotFoundError:
        raise ExportError(f"exported oracle {where}: {CONFIG} is missing (not an exported "
                          f"oracle, or copied incompletely); {fix}") from None
    except (OSError, ValueError) as err:
        raise ExportError(f"exported oracle {where}: {CONFIG} is unreadable ({err}); "
                          f"{fix}") from None
    if not isinstance(doc, dict) or doc.get("kind") != EXPORT_KIND:
        raise ExportError(f"{folder / CONFIG} is not an exported oracle's config (no kind "
                          f"{EXPORT_KIND!r}); pass a folder written by `cli.py export`")
    if doc.get("version") != EXPORT_VERSION:
        raise ExportError(f"exported oracle {where} has format version {doc.get('version')!r}; "
                          f"this version of trust-oracles reads version {EXPORT_VERSION}: "
                          f"{fix} with this version")
    for name in (WEIGHTS, CARD):
        _check_file(folder, name, doc.get("files", {}).get(name), where, fix)
    _check_card(folder, where, doc["files"][WEIGHTS]["sha256"])
    return doc


def _check_file(folder: Path, name: str, want: Mapping | None, where: str, fix: str) -> None:
    path = folder / name
    if not want:
        raise ExportError(f"exported oracle {where}: {CONFIG} records no hash of {name}; {fix}")
    if not path.is_file():
        raise ExportError(f"exported oracle {where}: {name} is missing; {fix}")
    found = file_sha256(path)
    if found != want["sha256"]:
        raise ExportError(f"exported oracle {where}: {name} was altered (sha256 {found[:12]}..., "
                          f"{CONFIG} records {want['sha256'][:12]}...); {fix}")


def _check_card(folder: Path, where: str, weights: str) -> None:
    """The card's metrics belong to the weights its front matter names: they must be these."""
    match = _CARD_LINE.search((folder / CARD).read_text())
    named = match.group(1) if match else None
    if named != weights:
        what = (f"names weights {named[:12]}..." if named else
                f"names no weights ({CARD_WEIGHTS_KEY} missing from its front matter)")
        raise ExportError(f"exported oracle {where}: the model card {CARD} {what}, but "
                          f"{WEIGHTS} is {weights[:12]}...: its metrics do not describe these "
                          "weights; export the run again with `cli.py export RUN --out DIR "
                          "--force` to write the card of these weights")
