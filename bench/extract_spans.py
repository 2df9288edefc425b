"""The main thread's time in a real ``extract()``, step by step (bench/profile_extract.py's part
4): the names extract's loop looks up are patched with wrappers that time what they wrap
(perf_counter, no synchronisation added), and ``Spans`` sums each step's exclusive time over the
steady part of the run."""
from __future__ import annotations

import contextlib
import time
from unittest import mock

from pipeline.data.images import GpuNormalize
from pipeline.extract import forward as fwd, run, sink as sink_mod


class Spans:
    """The main thread's exclusive perf_counter time per step (a nested step's time is taken out
    of its parent's), counted from extract's steady start: the second batch's arrival."""

    def __init__(self):
        self.total, self.stack, self.batches, self.start, self.end = {}, [], 0, None, None

    def wrap(self, name: str, fn):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            self.stack.append(0.0)   # the time of the steps nested in this one
            try:
                return fn(*a, **kw)
            finally:
                dt, inner = time.perf_counter() - t0, self.stack.pop()
                if self.stack:
                    self.stack[-1] += dt
                if self.start is not None and t0 >= self.start:
                    self.total[name] = self.total.get(name, 0.0) + dt - inner
        return timed

    def batches_of(self, it):
        """The loader iterator, timing each wait for a batch; closed by closing_loop's stop."""
        spans = self

        class Timed:
            def __iter__(self):
                return self

            def __next__(self):
                batch = spans.wrap("loader_wait", next)(it)
                spans.batches += 1
                spans.start = time.perf_counter() if spans.batches == 2 else spans.start
                return batch

            def _shutdown_workers(self):   # after the sink's last write; extract's steady
                spans.wrap("loader_shutdown", it._shutdown_workers)()   # time includes it
                spans.end = time.perf_counter()
        return Timed()


def instrumented(spans: Spans):
    """Patches of the names extract's loop looks up, each timing what it wraps."""
    real_loader, real_forward, real_sink = run.make_loader, run.forward_fn, run.ShardSink

    class Normalize(GpuNormalize):
        __call__ = spans.wrap("h2d_copy_normalize", GpuNormalize.__call__)

    class Sink(real_sink):
        push = spans.wrap("sink_push_launch", real_sink.push)

        def flush(self):   # the wait for the previous batch's outputs: the device's time
            if self.pending is not None and self.pending[3] is not None:
                spans.wrap("device_wait_in_sink", self.pending[3].synchronize)()
            spans.wrap("sink_host_put", real_sink.flush)(self)

    def loader(*a, **kw):
        real = real_loader(*a, **kw)
        return type("TimedLoader", (), {"__iter__": lambda _: spans.batches_of(iter(real))})()
    stack = contextlib.ExitStack()
    for module, name, value in [
            (run, "make_loader", loader), (run, "GpuNormalize", Normalize), (run, "ShardSink", Sink),
            (run, "forward_fn", lambda *a: spans.wrap("forward", real_forward(*a))),
            (fwd, "classify", spans.wrap("output_columns", fwd.classify)),
            (sink_mod, "write_shard", spans.wrap("hdf5_write_shard", sink_mod.write_shard))]:
        stack.enter_context(mock.patch.object(module, name, value))
    return stack
