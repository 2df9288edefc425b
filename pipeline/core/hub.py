"""Pretrained weights from timm's sources, offline first and failing in seconds without a network.

timm reaches the Hugging Face hub through huggingface_hub, which retries an unreachable hub for
about a minute (five retries with back-off) before it gives up; a run waited that long, holding
its run directory, for an error whose fix is ``--weights FILE``.  Here the weights are looked up
in the local caches first (the hub's in offline mode, torch.hub's checkpoint folder for URL
sources); only when they are not there is the source's host reached once, with a short timeout,
and only then does timm download them.
"""
from __future__ import annotations

import socket
from contextlib import contextmanager
from urllib.parse import urlparse

import timm
from huggingface_hub import constants as hf
from timm.models._hub import check_cached_file
from torch import nn

from pipeline.core.errors import HubUnreachable

PROBE_TIMEOUT_S = 3.0


def create_pretrained(name: str, kwargs: dict) -> nn.Module:
    """``timm.create_model(name, pretrained=True, **kwargs)``, from a local cache when the
    weights are there; else HubUnreachable within seconds when their source is unreachable."""
    cfg = timm.models.get_pretrained_cfg(name)
    hub_id = getattr(cfg, "hf_hub_id", None)
    url = getattr(cfg, "url", None)
    if hub_id:
        try:
            with _hub_offline():
                return timm.create_model(name, pretrained=True, **kwargs)
        except Exception as err:  # noqa: BLE001 - not cached (its error class varies by version)
            if hf.HF_HUB_OFFLINE:      # the user's own offline mode: nothing more to try
                raise HubUnreachable(f"HF_HUB_OFFLINE is set and {hub_id} is not in the local "
                                     f"hub cache ({type(err).__name__})") from None
        source = hf.ENDPOINT
    elif url and not check_cached_file(url):      # timm's own look-up in torch.hub's cache
        source = url
    else:                               # a local file, or a URL already downloaded
        return timm.create_model(name, pretrained=True, **kwargs)
    why = unreachable(source)
    if why:
        raise HubUnreachable(f"{hub_id or url} is not in the local cache and {source} cannot be "
                             f"reached ({why})")
    return timm.create_model(name, pretrained=True, **kwargs)


@contextmanager
def _hub_offline():
    """huggingface_hub's offline mode (HF_HUB_OFFLINE, read by the library at import time) for
    the duration of one call: cached files only, no request."""
    before = hf.HF_HUB_OFFLINE
    hf.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        hf.HF_HUB_OFFLINE = before


def unreachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why ``url``'s host cannot be reached (one TCP connection, ``timeout`` seconds), or None."""
    parts = urlparse(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout):
            return None
    except OSError as err:
        return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
