"""Run a loader's batches through a chain of stages, one background thread per stage, each a
few batches ahead of the next (``extract --decode gpu|mixed``).

With the device decoder the work per batch is: receive it from the loader workers (unpickling,
shared memory), decode it with nvJPEG (blocks its thread; releases the GIL), resize it (a few
hundred kernel launches).  In one thread these add up and the model waits; as a pipeline each
runs concurrently with the others and with the model, and the slowest stage sets the pace.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator, Sequence

import torch

_END = object()


class StagedPrefetch:
    """Iterates ``stages[-1](...stages[0](batch))`` for the loader's batches, in loader order.

    Thread 0 receives batches from ``batches`` (a loader iterator); thread k applies
    ``stages[k-1]``; the queues between them hold ``depth`` items.  The last stage returns
    (images, rows, valid, event): the consumer's current stream waits for ``event`` and owns
    ``images`` from then on (``record_stream``).  An exception in any thread (a bad file) travels
    down the chain and is raised by the consumer at its batch's place, after the batches before
    it.  ``close()`` stops the threads, then the loader's workers.
    """

    def __init__(self, batches, stages: Sequence[Callable], device: torch.device, depth: int = 2):
        self.batches, self.device = batches, device
        if device.type == "cuda" and device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.stop = threading.Event()
        self.queues = [queue.Queue(maxsize=depth) for _ in range(len(stages) + 1)]
        jobs = [(lambda: iter(self.batches), None, self.queues[0])]
        jobs += [(lambda q=q: self._drain(q), fn, out)
                 for q, fn, out in zip(self.queues, stages, self.queues[1:])]
        self.threads = [threading.Thread(target=self._run, args=job, daemon=True,
                                         name=f"prefetch-{k}") for k, job in enumerate(jobs)]
        for thread in self.threads:
            thread.start()

    def _run(self, source: Callable[[], Iterator], fn: Callable | None, out: queue.Queue) -> None:
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # the current device is per thread
            with torch.inference_mode():
                for item in source():
                    if self.stop.is_set():
                        return
                    if isinstance(item, BaseException):  # from upstream: pass on, stop
                        self._put(out, item)
                        return
                    self._put(out, item if fn is None else fn(item))
            self._put(out, _END)
        except BaseException as err:  # noqa: BLE001 - handed down to the consumer
            self._put(out, err)

    def _put(self, q: queue.Queue, item) -> None:
        while not self.stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _drain(self, q: queue.Queue) -> Iterator:
        while not self.stop.is_set():
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is _END:
                return
            yield item

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        while True:
            try:
                item = self.queues[-1].get(timeout=1.0)
                break
            except queue.Empty:
                if not self.threads[-1].is_alive() and self.queues[-1].empty():
                    raise RuntimeError("the prefetch threads stopped without a result") from None
        if item is _END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        images, rows, valid, event = item
        if event is not None:
            stream = torch.cuda.current_stream(images.device)
            stream.wait_event(event)
            images.record_stream(stream)  # its block is not reused while the model reads it
        return images, rows, valid

    def close(self, timeout: float = 60.0) -> None:
        """Stop the threads (the receiving one finishes the batch it waits for), then the
        loader workers."""
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout)
        shutdown = getattr(self.batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
