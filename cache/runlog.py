"""log.jsonl's lines: each written as strict JSON (``log_line``), read back with a torn last line
(a write cut short by a crash or a full disk) dropped with a note (``read_log``).  Torch-free;
``cache.runs.RunDir`` names the file and appends to it."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping

from cache.runfile import RunError


def read_log(path: Path) -> list[tuple[str, dict]]:
    """(line, entry) of every line of log.jsonl.  A last line that is not JSON is the trace of a
    write cut short (full disk, kill -9): it is dropped with a note, and the run resumes from its
    checkpoint, which is older.  A damaged line before the last is not explained by that and
    is refused naming the line."""
    out = []
    lines = Path(path).read_text(errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append((line, json.loads(line)))
        except json.JSONDecodeError as err:
            if number < len(lines):
                raise RunError(f"{path} line {number} is not JSON ({err}); the log is damaged: "
                               "delete the run directory to start over") from None
            print(f"note: {path}: dropped a torn last line ({len(line)} characters, not JSON: "
                  "a write cut short by a crash or a full disk); the run resumes from its "
                  "last checkpoint", file=sys.stderr, flush=True)
    return out


def log_line(entry: Mapping[str, Any]) -> str:
    """One log.jsonl line of ``entry``: strict JSON (``finite``), keys sorted.  The per-step entry
    ``{"step": int, "loss": float}`` -- a sweep's bank writes one per step and head, millions in
    an ImageNet-sized sweep -- is formatted directly, as ``json.dumps`` formats it (a float as its
    ``repr``, NaN/inf as null) in a tenth of its time."""
    if len(entry) == 2 and type(entry.get("loss")) is float and type(entry.get("step")) is int:
        loss = entry["loss"]
        return f'{{"loss": {repr(loss) if math.isfinite(loss) else "null"}, "step": {entry["step"]}}}'
    return json.dumps(finite(dict(entry)), sort_keys=True)


def finite(value: Any) -> Any:
    """Strict JSON: undefined numbers (NaN, inf) are written as null."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
