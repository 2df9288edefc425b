"""torchrun / DDP plumbing: one process per device, initialised from torchrun's environment."""
from __future__ import annotations

import gc
import json
import os
import socket
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.distributed as tdist

from cache.runs import RunError
from pipeline.core.options import check_device


class EveryRankError(RunError):
    """An error every process raises alike (they agreed on it through a collective): rank 0
    prints it, the others exit quietly, so torchrun's output holds one message."""
    quiet_off_rank0 = True


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def info() -> DistInfo:
    """This process's place under torchrun (or the single-process default), without initialising."""
    return DistInfo(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                    int(os.environ.get("LOCAL_RANK", "0")))


def local_world() -> int:
    """Processes on this host (torchrun's LOCAL_WORLD_SIZE), which share its cores."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", info().world))


def init(device_arg: str | None) -> tuple[DistInfo, torch.device]:
    """Read torchrun's RANK/WORLD_SIZE/LOCAL_RANK (absent = single process) and pick the device:
    ``cuda:LOCAL_RANK`` under torchrun on GPUs, else ``--device`` or the best available.  Under
    torchrun, over one node or several, a process without a GPU of its own is refused with the
    ranks and the fix (``check_gpus``), never an NCCL error."""
    me = info()
    world = me.world
    device = check_device(device_arg)
    if device.type == "cuda":
        index = me.local_rank if world > 1 else (device.index or 0)
        if index >= torch.cuda.device_count():
            raise RunError(f"rank {me.rank} (local rank {me.local_rank} on host {host()}): this "
                           f"node has {torch.cuda.device_count()} GPU(s), so local rank "
                           f"{me.local_rank} has none. Launch at most "
                           f"{torch.cuda.device_count()} process(es) on this node (torchrun "
                           "--nproc-per-node), or give each its GPU (CUDA_VISIBLE_DEVICES)")
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    if world > 1 and not tdist.is_initialized():
        tdist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if world > 1 and device.type == "cuda":
        check_gpus(me, device)
    return me, device


def host() -> str:
    return socket.gethostname()


def check_gpus(me: DistInfo, device: torch.device) -> None:
    """Every process on its own GPU: two processes of one host on one device (nodes started by
    hand with the same LOCAL_RANK, or CUDA_VISIBLE_DEVICES naming one GPU twice) refuse together
    (``EveryRankError``), naming the ranks, before NCCL's first collective would stop them with
    "Duplicate GPU detected".  The check runs over a gloo group, which talks over TCP."""
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", device.index))
    where = gather_objects(me, (host(), uuid, str(device)),
                           tdist.new_group(backend="gloo"))
    taken: dict[tuple, list[int]] = {}
    for rank, (name, gpu, _) in enumerate(where):
        taken.setdefault((name, gpu), []).append(rank)
    shared = [(key, ranks) for key, ranks in taken.items() if len(ranks) > 1]
    if shared:
        (name, _), ranks = shared[0]
        raise EveryRankError(
            f"ranks {', '.join(map(str, ranks))} share one GPU ({where[ranks[0]][2]} of host "
            f"{name}): each process needs its own. Start one torchrun per node with "
            "--nproc-per-node at most its GPUs (each process takes cuda:LOCAL_RANK), and give "
            "each node its own --node-rank; processes started by hand need distinct LOCAL_RANK "
            "(or CUDA_VISIBLE_DEVICES) on one host")


def agree(me: DistInfo, what: str, settings: Mapping[str, Any]) -> None:
    """Every process runs with the same ``settings`` (a command's resolved options): nodes
    launched with different command lines refuse together (``EveryRankError``), naming each
    setting that differs and the ranks that have it."""
    if not me.enabled:
        return
    views = gather_objects(me, json.loads(json.dumps(dict(settings), sort_keys=True,
                                                     default=str)))
    diffs = [k for k in sorted(set().union(*views)) if len({repr(v.get(k)) for v in views}) > 1]
    if diffs:
        lines = []
        for k in diffs[:6]:
            ranks: dict[str, list[str]] = {}
            for r, v in enumerate(views):
                ranks.setdefault(repr(v.get(k)), []).append(str(r))
            lines.append(f"{k}: " + "; ".join(f"{value} on rank(s) {', '.join(rs)}"
                                              for value, rs in ranks.items()))
        raise EveryRankError(f"the processes were launched with different {what}:\n  "
                             + "\n  ".join(lines) + "\nStart every node with the same command "
                             "(only torchrun's --node-rank and its rendezvous may differ)")


def barrier(info: DistInfo) -> None:
    if info.enabled:
        tdist.barrier()


def _reduce(value, dtype: torch.dtype, op=tdist.ReduceOp.SUM) -> torch.Tensor:
    """One number all-reduced over ranks (on the device under NCCL, which needs CUDA tensors)."""
    t = torch.tensor([value], dtype=dtype)
    if tdist.get_backend() == "nccl":
        t = t.cuda()
    tdist.all_reduce(t, op=op)
    return t


def all_ok(info: DistInfo, ok: bool) -> bool:
    """True when every rank reports ok (so one rank's failure stops all of them cleanly)."""
    if not info.enabled:
        return ok
    return int(_reduce(0 if ok else 1, torch.int64).item()) == 0


def sum_int(info: DistInfo, value: int) -> int:
    """Sum of ``value`` over ranks (also a barrier: every rank must have finished its part)."""
    if not info.enabled:
        return value
    return int(_reduce(value, torch.int64).item())


def max_float(info: DistInfo, value: float) -> float:
    """The largest ``value`` over ranks (a collective: every rank calls it)."""
    if not info.enabled:
        return value
    return float(_reduce(value, torch.float64, tdist.ReduceOp.MAX).item())


def gather_objects(info: DistInfo, value, group=None) -> list:
    """Every rank's ``value`` (picklable), in rank order (a collective: every rank calls it;
    ``group``: another process group than the default, e.g. a gloo one)."""
    if not info.enabled:
        return [value]
    out: list = [None] * info.world
    tdist.all_gather_object(out, value, group=group)
    return out


def mean_flat(tensors: list[torch.Tensor], world: int) -> list[torch.Tensor]:
    """The mean over ranks of ``tensors`` (one dtype), as views of one flat buffer: one
    all-reduce (NCCL's fastest form, and capturable in a CUDA graph).  Divided by ``world``
    before the sum, as DDP divides its buckets."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    flat.div_(world)
    tdist.all_reduce(flat)
    return [v.view_as(t) for v, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


@torch.no_grad()
def broadcast_flat(tensors: list[torch.Tensor], src: int = 0) -> None:
    """Overwrite ``tensors`` with rank ``src``'s values, one broadcast per dtype."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in group])
        tdist.broadcast(flat, src)
        torch._foreach_copy_(group, [v.view_as(t) for v, t in
                                     zip(flat.split([t.numel() for t in group]), group)])


def global_mean(info: DistInfo, values: torch.Tensor) -> torch.Tensor:
    """Mean over ranks (every rank has the same number of rows per step)."""
    if info.enabled:
        values = values.clone()
        torch.distributed.all_reduce(values)
        values /= info.world
    return values


def global_sum(info: DistInfo, values: torch.Tensor) -> torch.Tensor:
    if info.enabled:
        values = values.clone()
        torch.distributed.all_reduce(values)
    return values


def shutdown(info: DistInfo) -> None:
    if info.enabled and tdist.is_initialized():
        tdist.destroy_process_group()


def close_after(err: BaseException | None) -> None:
    """Destroy the process group after an error every process raised alike (``EveryRankError``
    or an error marked ``quiet_off_rank0``), freeing first what the error's frames hold.

    The processes agreed on the error through a collective, so none is inside another one and
    destroying the group cannot hang.  A process that exits with gloo's threads alive can abort
    in interpreter teardown ("terminate called without an active exception",
    pytorch/pytorch#190489), and a DDP model kept by the traceback holds the group: the
    tracebacks of the error and of those it was raised from are dropped first.  Not for one
    process's own error: the others may be mid-collective, where destroying could hang
    (pytorch/torchtitan#1342), and torchrun stops them."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        err.__traceback__ = None
        err = err.__context__
    gc.collect()
    shutdown(info())
