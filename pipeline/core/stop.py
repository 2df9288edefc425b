"""Ctrl-C / SIGTERM as a request, honoured where the work can stop cleanly.

Python raises KeyboardInterrupt wherever the main thread happens to be; inside a weakref callback
or a destructor it is printed as "Exception ignored" and lost (the run then carries on to the
end), and inside the DataLoader's batch handoff it breaks a worker's connection mid-handshake.
A long loop instead installs ``StopSignals`` and checks ``requested`` at its own safe points.
"""
from __future__ import annotations

import signal


class StopSignals:
    """SIGINT/SIGTERM set ``requested``; a second one raises KeyboardInterrupt at once.
    Install it before a DataLoader forks, so its workers inherit the handler and keep serving
    the batches the loop still takes."""

    def __enter__(self):
        self.requested = False
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, signum, frame):
        if self.requested:  # second signal: stop now
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False
