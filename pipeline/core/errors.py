"""The errors of models and weights, in a module that loads no torch: a caller can catch them
(``trust_oracles.errors``) without importing what raises them."""
from __future__ import annotations

from cache.errors import TrustOraclesError


class ModelError(TrustOraclesError, ValueError):
    """Unknown model name, unreadable weights file, or weights that do not fit the model."""


class HubUnreachable(TrustOraclesError, RuntimeError):
    """The weights are in no local cache and their source cannot be reached."""
