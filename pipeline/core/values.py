"""What an option accepts, without click: each value type converts a given value into the setting
or raises ``OptionValueError`` saying what it received and what it expects.  The command line
(``pipeline.core.commandline`` hands them to click) and the Python API (``trust_oracles``'
settings) convert through the same objects, so both accept and refuse the same values.

    IntRange(1).convert("3")                 # 3
    FloatRange(0, 1, max_open=True).convert(1.0)   # OptionValueError: 1.0 is not in the range 0<=x<1.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from cache.errors import TrustOraclesError


class OptionValueError(TrustOraclesError, ValueError):
    """A value an option does not accept (the message says what it expects; exit 2, as the
    command line's usage errors)."""
    exit_code = 2


class Value:
    """An option's value type.  ``as_text``: the command line shows and parses it as text, then
    converts it (a JSON object, a device name); otherwise click gets an equivalent type."""
    as_text = False

    def convert(self, value: Any) -> Any:
        raise NotImplementedError

    def missing(self) -> Any:
        """The setting of an option not given and without a default."""
        return None


@dataclass(frozen=True)
class Choice(Value):
    choices: tuple[str, ...]

    def convert(self, value: Any) -> str:
        if value not in self.choices:
            raise OptionValueError(f"{value!r} is not one of {', '.join(map(repr, self.choices))}.")
        return value


def _range_words(lo, hi, lo_open: bool, hi_open: bool) -> str:
    """click's range notation: x>=1, 0<=x<1, 0<x."""
    left = "" if lo is None else f"{lo}{'<' if lo_open else '<='}"
    right = "" if hi is None else f"{'<' if hi_open else '<='}{hi}"
    if lo is not None and hi is None:
        return f"x{'>' if lo_open else '>='}{lo}"
    return f"{left}x{right}"


@dataclass(frozen=True)
class IntRange(Value):
    min: int | None = None
    max: int | None = None

    def convert(self, value: Any) -> int:
        try:
            n = int(value)
            if isinstance(value, float) and n != value or isinstance(value, bool):
                raise ValueError
        except (TypeError, ValueError):
            raise OptionValueError(f"{value!r} is not a valid integer.") from None
        if (self.min is not None and n < self.min) or (self.max is not None and n > self.max):
            raise OptionValueError(f"{n} is not in the range "
                                   f"{_range_words(self.min, self.max, False, False)}.")
        return n


@dataclass(frozen=True)
class FloatRange(Value):
    """A finite float in the range (nan and inf refused: every comparison with nan is False)."""
    min: float | None = None
    max: float | None = None
    min_open: bool = False
    max_open: bool = False

    def convert(self, value: Any) -> float:
        try:
            x = float(value)
            if isinstance(value, bool):
                raise ValueError
        except (TypeError, ValueError):
            raise OptionValueError(f"{value!r} is not a valid float.") from None
        if not math.isfinite(x):
            raise OptionValueError(f"{value!r} is not a finite number.")
        below = self.min is not None and (x <= self.min if self.min_open else x < self.min)
        above = self.max is not None and (x >= self.max if self.max_open else x > self.max)
        if below or above:
            raise OptionValueError(f"{x} is not in the range "
                                   f"{_range_words(self.min, self.max, self.min_open, self.max_open)}.")
        return x


def usable_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity mask: a container's or taskset's share);
    empty where the platform has no affinity (macOS)."""
    try:
        return os.sched_getaffinity(0)
    except AttributeError:
        return set()


def usable_cores() -> int:
    """How many cores this process may run on (``usable_cpus``; macOS: every core)."""
    return len(usable_cpus()) or os.cpu_count() or 1


@dataclass(frozen=True)
class Workers(IntRange):
    """0 .. the usable cores: more loader workers than cores only adds processes competing for
    them (and their prefetched batches' memory), never speed."""
    min: int | None = 0

    def convert(self, value: Any) -> int:
        n = super().convert(value)
        cores = usable_cores()
        if n > cores:
            raise OptionValueError(f"{n} workers, but this process may use {cores} core(s): give "
                                   f"at most --workers {cores} (or leave it out: the usable cores "
                                   "/ local ranks, minus one)")
        return n


@dataclass(frozen=True)
class PathValue(Value):
    """A file or folder path, kept as given (a string)."""

    def convert(self, value: Any) -> str:
        if not isinstance(value, (str, os.PathLike)):
            raise OptionValueError(f"{value!r} is not a path.")
        return os.fspath(value)


@dataclass(frozen=True)
class JSONObject(Value):
    """A JSON object (e.g. timm.create_model's keyword arguments) -> dict; {} when empty."""
    as_text = True

    def missing(self) -> dict:
        return {}

    def convert(self, value: Any) -> dict:
        if isinstance(value, dict):
            return dict(value)
        if not value:
            return {}
        try:
            out = json.loads(value)
        except (TypeError, json.JSONDecodeError) as err:
            raise OptionValueError(f"not valid JSON ({err}): {value!r}") from None
        if not isinstance(out, dict):
            raise OptionValueError(f"expected a JSON object, got {value!r}")
        return out


def positive(max_open_one: bool = False) -> FloatRange:
    """> 0 (learning rates, loss weights and slopes), or in (0, 1) with ``max_open_one``."""
    return FloatRange(0, 1 if max_open_one else None, min_open=True, max_open=max_open_one)


NON_NEGATIVE = FloatRange(0)                          # weight decay, focal gamma
FRACTION = FloatRange(0, 1, max_open=True)            # momentum, held-out share: [0, 1)
SEED = IntRange(0)                                    # numpy refuses negative seeds
BATCH = IntRange(1)
