"""Deterministic training order: which rows, flipped or not, at every optimizer step.

Everything random in training is a pure function of (seed, step[, rank]), never of a stateful
generator that runs through the epoch: the row order of epoch e, the flip decisions of step s and
the torch RNG seed of step s.  Resuming at step s therefore replays exactly what an uninterrupted
run would have done, whatever the number of processes or DataLoader workers.

A global batch of B rows is split into W ranks x A accumulation micro-batches of B / (W A) rows:
rank r owns positions [r B/W, (r+1) B/W) of the batch, in A consecutive micro-batches.
"""
from __future__ import annotations

import hashlib
import queue
import threading
from dataclasses import dataclass, field, replace

import numpy as np


def derive_seed(*parts) -> int:
    """A 63-bit seed from any tuple of ints/strings (stable across processes and Python runs)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def carve_rows(rows: np.ndarray, val_fraction: float, limit: int | None,
               split_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, held-out validation rows), both sorted, from the usable rows of a split.

    ``limit`` first keeps a seeded subset of ``limit`` rows; the validation rows are then a seeded
    ``val_fraction`` of what remains.  Seeded by ``split_seed`` (not the run seed) so all seeds of
    a group see the same held-out rows.
    """
    rng = np.random.default_rng(derive_seed(split_seed, "rows"))
    perm = rng.permutation(np.asarray(rows, np.int64))
    if limit is not None:
        perm = perm[:limit]
    n_val = int(round(len(perm) * val_fraction))
    if val_fraction > 0 and n_val == 0:
        n_val = 1
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


@dataclass
class StepSchedule:
    rows: np.ndarray            # training rows (global indices)
    batch_size: int             # global batch B
    epochs: int
    seed: int
    flip: bool
    _perm_cache: dict = field(default_factory=dict, repr=False)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.rows) // self.batch_size      # the last partial batch is dropped

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._perm_cache:
            self._perm_cache = {epoch: np.random.default_rng(
                derive_seed(self.seed, "order", epoch)).permutation(self.rows)}
        return self._perm_cache[epoch]

    def batch_rows(self, step: int) -> np.ndarray:
        """(B,) global row indices of optimizer step ``step`` (0-based)."""
        epoch, k = divmod(step, self.steps_per_epoch)
        return self._order(epoch)[k * self.batch_size:(k + 1) * self.batch_size]

    def batch_flips(self, step: int) -> np.ndarray:
        """(B,) bool: horizontally flip position i of step ``step``'s batch."""
        if not self.flip:
            return np.zeros(self.batch_size, bool)
        return np.random.default_rng(derive_seed(self.seed, "flip", step)).random(self.batch_size) < 0.5


def micro_slices(batch_size: int, world: int, rank: int, accum: int) -> list[slice]:
    """Positions of ``rank``'s ``accum`` micro-batches inside a global batch."""
    if batch_size % (world * accum):
        raise ValueError(f"--batch-size {batch_size} is not divisible by {world} process(es) x "
                         f"--accum-steps {accum}; choose a batch size that is")
    per_rank, micro = batch_size // world, batch_size // (world * accum)
    start = rank * per_rank
    return [slice(start + a * micro, start + (a + 1) * micro) for a in range(accum)]


def loader_batches(schedule: StepSchedule, start_step: int, slices: list[slice]) -> list[list[int]]:
    """The DataLoader's batch_sampler for this rank from ``start_step`` to the end of training."""
    out = []
    for step in range(start_step, schedule.total_steps):
        rows = schedule.batch_rows(step)
        out.extend(rows[s].tolist() for s in slices)
    return out


def batches(schedule: StepSchedule, steps: range) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows (steps, B) and flips (steps, B) bool (None without flips) of ``steps``."""
    rows = np.stack([schedule.batch_rows(k) for k in steps])
    return rows, np.stack([schedule.batch_flips(k) for k in steps]) if schedule.flip else None


class Ahead:
    """The table positions of the views shown (``FeatureTable.index``'s: row + N where flipped)
    of every step from ``start`` on, in chunks of at most ``chunk`` steps within an epoch,
    computed by a background thread: an epoch's flips take ~0.9 s of numpy on the host, done
    while the host waits for the device at the loop's sync points instead of before step 0."""

    def __init__(self, schedule: StepSchedule, start: int, num_rows: int, chunk: int):
        self.queue: queue.Queue = queue.Queue(maxsize=4)
        self.stop = threading.Event()
        # its own copy: StepSchedule caches an epoch's order in itself
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       args=(replace(schedule), start, num_rows, chunk))
        self.thread.start()

    def _run(self, schedule: StepSchedule, k: int, num_rows: int, chunk: int) -> None:
        try:
            while k < schedule.total_steps and not self.stop.is_set():
                end = min(k + chunk, k - k % schedule.steps_per_epoch + schedule.steps_per_epoch,
                          schedule.total_steps)
                rows, flips = batches(schedule, range(k, end))
                self._put((k, rows if flips is None else rows + flips.astype(np.int64) * num_rows))
                k = end
        except BaseException as err:       # raised again by next(), in the training thread
            self._put(err)

    def _put(self, item) -> None:
        while not self.stop.is_set():
            try:
                return self.queue.put(item, timeout=0.1)
            except queue.Full:
                continue

    def next(self) -> tuple[int, np.ndarray]:
        """(first step, positions (steps, B)) of the next chunk."""
        item = self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
