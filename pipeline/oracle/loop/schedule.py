"""The optimizer and its OneCycle schedule, built one way for every run, and what the loop is
told: a fine-tuned run's SGD over the oracle's parameters and a head-only bank's SGD over its
heads come from ``sgd_onecycle``; run.json's ``schedule`` record from ``schedule_info``."""
from __future__ import annotations

from typing import Iterable, Mapping

import torch

from cache.runs import RunError
from pipeline.oracle.loop.state import LoopSettings
from pipeline.oracle.settings.prepare import Prepared

MAX_WARMUP_FRACTION = 0.3      # OneCycleLR's own default pct_start


def sgd_onecycle(params: Iterable, *, lr: float, momentum: float, weight_decay: float,
                 total_steps: int, pct_start: float, cycle_momentum: bool
                 ) -> tuple[torch.optim.SGD, torch.optim.lr_scheduler.OneCycleLR]:
    """SGD (momentum, weight decay) and OneCycleLR peaking at ``lr`` after ``pct_start`` of
    ``total_steps`` (paper, Sec. 4: SGD with a one-cycle learning rate)."""
    sgd = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return sgd, torch.optim.lr_scheduler.OneCycleLR(
        sgd, max_lr=lr, total_steps=total_steps, pct_start=pct_start,
        cycle_momentum=cycle_momentum)


def schedule_info(config: Mapping, total_steps: int, steps_per_epoch: int, world: int) -> dict:
    """The effective OneCycle schedule; warm-up is capped at 30% of a short run (noted).
    ``config``: batch_size, accum_steps, warmup_steps, cycle_momentum, momentum."""
    if total_steps < 3:
        raise RunError(
            f"{total_steps} optimizer step(s) are too few for the OneCycle schedule (>= 3 "
            "needed): use more training rows (--max-samples), more --epochs or a smaller "
            "--batch-size")
    if config["batch_size"] % (world * config["accum_steps"]):
        raise RunError(f"--batch-size {config['batch_size']} is not divisible by {world} "
                       f"process(es) x --accum-steps {config['accum_steps']}")
    warm = config["warmup_steps"]
    cap = max(2, int(MAX_WARMUP_FRACTION * total_steps))
    eff = min(max(warm, 2), cap, total_steps - 1)
    return {"total_steps": total_steps, "steps_per_epoch": steps_per_epoch,
            "warmup_steps": warm, "warmup_steps_effective": eff, "pct_start": eff / total_steps,
            "world_size": world,
            "micro_batch": config["batch_size"] // (world * config["accum_steps"]),
            "cycle_momentum": config["cycle_momentum"],
            "momentum": "0.85-0.95 (cycled)" if config["cycle_momentum"] else config["momentum"]}


def schedule_of(prep: Prepared, world: int) -> dict:
    """run.json's ``schedule``: the effective OneCycle schedule of this run."""
    cfg = prep.cfg
    return schedule_info({"batch_size": cfg.batch_size, "accum_steps": cfg.accum_steps,
                          "warmup_steps": cfg.warmup_steps, "cycle_momentum": cfg.cycle_momentum,
                          "momentum": cfg.momentum},
                         prep.schedule.total_steps, prep.schedule.steps_per_epoch, world)


def loop_settings(prep: Prepared, ckpt_every: int | None, desc: str) -> LoopSettings:
    cfg, total = prep.cfg, prep.schedule.total_steps
    val_every = (cfg.val_every or max(1, total // 4)) if len(prep.val_rows) else None
    return LoopSettings(total, prep.schedule.batch_size, max(1, cfg.log_every), val_every,
                        ckpt_every, cfg.stop_at_step if ckpt_every else None, cfg.progress, desc)
