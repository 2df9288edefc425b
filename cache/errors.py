"""TrustOraclesError: the base class of every error a user can fix.

In the bottom package and importing nothing, so that every package can derive its errors from it
and ``cli.py`` can catch them all without loading the modules that raise them (``--help`` and
``report`` load no torch).
"""
from __future__ import annotations


class TrustOraclesError(Exception):
    """An error a user can fix: bad input data, an option value, a missing, damaged or foreign
    cache or run, a model or weights file, an unreachable hub, a missing optional library.  Its
    message names the thing and the fix, so the command line prints it as one line
    (``error: MESSAGE``) without a traceback and exits with ``exit_code``; the Python API raises
    the same class with the same message (``except trust_oracles.TrustOraclesError``).

    A subclass keeps its built-in base beside this one (``class DataError(TrustOraclesError,
    ValueError)``), so ``except ValueError`` still catches it.  A subclass may set its own
    ``exit_code``; one set ``quiet_off_rank0`` is raised alike by every process under torchrun
    and printed by rank 0 only (``pipeline.core.dist.EveryRankError``).
    """

    exit_code: int = 1            # the command line's exit status for it
    quiet_off_rank0: bool = False
