"""Shared by the renderers of bench/doc_tables.py: reading a JSON of bench/results/ and writing
what every generated table states (device, date, command) and its markdown."""
from __future__ import annotations

import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


class Stale(Exception):
    """A marker without its end, an unknown block name, or a missing JSON: exit 1."""


def load(name: str) -> dict:
    path = RESULTS / name
    if not path.is_file():
        raise Stale(f"{path} is missing")
    return json.loads(path.read_text())


def n0(x) -> str:
    return f"{x:,.0f}"


def device_name(d: dict) -> str:
    """``"cuda (NVIDIA H100 80GB HBM3)"`` -> the name in brackets; else the device as recorded."""
    m = re.fullmatch(r"cuda \((.+)\)", d["device"])
    return d.get("device_name") or (m.group(1) if m else d["device"])


def source(d: dict) -> str:
    """What every table states: device, date, command."""
    return f"{device_name(d)}, {d['date']}: `{d['command']}`."


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)

