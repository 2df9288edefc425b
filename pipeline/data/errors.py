"""The errors every data module raises for a user's data problem (printed without a traceback);
no torch here, so a caller can catch them without loading what raises them."""
from __future__ import annotations

from cache.errors import TrustOraclesError


class DataError(TrustOraclesError, ValueError):
    """The data root, a split, a class folder or a labels file is missing or inconsistent."""


class BadImageError(TrustOraclesError, RuntimeError):
    """An image file could not be decoded; the message names the file and its row index."""


def worker_message(err: BaseException) -> str:
    """A DataLoader re-raises a worker's error with the worker's traceback in its text: the
    original message (its last line), as a user should see it."""
    text = str(err)
    if "Original Traceback" in text:
        return [line for line in text.splitlines() if line.strip()][-1].split(": ", 1)[-1]
    return text
