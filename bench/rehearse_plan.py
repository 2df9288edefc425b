"""What bench/rehearse_imagenet.py needs besides running the runbook: the disk it will take
(refused up front when the disk is too small), the step each measured cli.py command belongs to,
and each step scaled to full ImageNet and to the paper's grid."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from cache.schema import CLASSIFIER_COLUMNS, FLIP_COLUMNS

N_TRAIN, N_VAL, HELD_OUT = 1_281_167, 50_000, 0.05     # ImageNet-1k; the 5% held out by default
K = 1000
SIZE = {"int64": 8, "uint8": 1, "float32": 4}
# bytes/row from the cache schema, as docs/IMAGENET.md "Disk" (logits fp16, XXH3-128 hash)
ROW = sum(SIZE[t] for c, t in CLASSIFIER_COLUMNS.items() if c != "logits") + 2 * K + 16
FLIP_ROW = ROW + sum(SIZE[CLASSIFIER_COLUMNS[c]] for c in FLIP_COLUMNS if c != "logits") + 2 * K
FEATURES = {"vit": 768, "resnet": 2048}      # pooled features, fp16, both views
JPEG, C_JPEG, PNG = 110e3, 30e3, 0.3e6       # a generated JPEG (~95 KB), ImageNet-C's 224-px q85
RUN = {"vit": 1.03e9, "resnet": 0.28e9}      # a fine-tuned run's checkpoints (docs: Disk)
TINY_RUN = 20e6
# the paper's grid as the runbook's settings block writes it
SLICE_STEPS = ("attack val", "extract adversarial", "predict adversarial")   # on --attack-rows
PAPER = {"seeds": 3, "classifiers": ("vit", "resnet"), "oracles": ("vit", "resnet"),
         "losses": 4, "broadcast": 2, "corruptions": 4, "reports": 4}


def disk_needed(s: dict) -> dict:
    """Bytes per part for the settings ``s`` (sizes, grid, tiny)."""
    clfs, oracles = s["grid"]["CLASSIFIERS"].split(), s["grid"]["ORACLES"].split()
    runs_per_pair = len(s["grid"]["SEEDS"].split()) * (
        len(s["grid"]["LOSSES"].split()) + len(s["grid"]["BROADCAST_LOSSES"].split()))
    rows, val, adv = s["train"] + s["val"], s["val"], min(s["attack_rows"], s["val"])
    sets = len(s["grid"]["CORRUPTIONS_C"].split())
    caches = sum(rows * FLIP_ROW + val * ROW * (1 + sets) + adv * ROW
                 + rows * (FLIP_ROW + 4 * FEATURES.get(c, 2048)) for c in clfs)
    runs = sum(runs_per_pair * (TINY_RUN if s["tiny"] else RUN.get(o, RUN["vit"]))
               for _ in clfs for o in oracles)
    parts = {"jpegs": rows * JPEG, "caches": caches, "runs": runs,
             "imagenet_c": val * C_JPEG * sets, "adversarial": adv * PNG * len(clfs)}
    parts["total"] = 1.1 * sum(parts.values()) + 50e6        # 10% + 50 MB for logs and reports
    return parts


def free_bytes(path: Path) -> tuple[Path, int]:
    """The nearest existing folder of ``path`` and the free bytes of its file system."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path, shutil.disk_usage(path).free


def count_files(folder: Path) -> int:
    """Files of a split folder, hidden folders (an attack's .attack/ records) left out."""
    total = 0
    for parent, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        total += sum(not f.startswith(".") for f in files)
    return total


def option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def classify(args: list[str], s: dict) -> dict:
    """A measured command -> its step: name, model, rows processed, rows at ImageNet scale."""
    cmd, data = args[0], option(args, "--data") or ""
    model = option(args, "--oracle" if cmd in ("train-oracle", "sweep") else "--classifier") or ""
    splits = [args[i + 1] for i, a in enumerate(args) if a == "--split"]
    trained = round(s["train"] * (1 - HELD_OUT))
    full_trained = round(N_TRAIN * (1 - HELD_OUT))
    role = ("adversarial" if "adversarial" in data else "imagenet-c" if "imagenet-c" in data
            else "imagenet")
    if cmd in ("extract", "predict", "corrupt", "attack"):
        rows = sum(count_files(Path(data) / sp) for sp in splits or ["val"])
        full = sum(N_TRAIN if sp == "train" else N_VAL for sp in splits or ["val"])
        if cmd == "attack":
            rows = min(rows, s["attack_rows"])
        flags = [f for f in ("--flip-view", "--features", "--corruption") if f in args]
        what = "+".join(splits) if role == "imagenet" else role
        step = " ".join([cmd, what, *flags])
        return {"step": step, "model": model if cmd != "corrupt" else "", "rows": rows,
                "full_rows": full, "scale": "by images", "disk_fixed": False}
    if cmd == "train-oracle" and "--head-only" not in args:      # --max-samples holds out 5% too
        rows = round(min(s["train"], s["train_rows"] or s["train"]) * (1 - HELD_OUT))
        return {"step": "train-oracle (fine-tuned)", "model": model, "rows": rows,
                "full_rows": full_trained, "scale": "by rows trained (start-up and scoring "
                "included: an upper bound)", "disk_fixed": True}
    if cmd in ("train-oracle", "sweep"):
        step = "train-oracle --head-only" if cmd == "train-oracle" else "sweep (head-only bank)"
        return {"step": step, "model": model, "rows": trained, "full_rows": full_trained,
                "scale": "by rows trained", "disk_fixed": True}
    step = "report --export fd-shifts" if "--export" in args else cmd
    return {"step": step, "model": "", "rows": s["val"], "full_rows": N_VAL,
            "scale": "by val rows", "disk_fixed": True}


def oracle_of(args: list[str]) -> str:
    """The oracle preset of `predict --run DIR`: run directories are named <oracle>-<classifier>_...
    (the runbook's own `runs/*-${clf}_*/` relies on it)."""
    return Path(option(args, "--run") or "").name.split("-")[0]


def startups(records: list[dict]) -> dict[str, float]:
    """{oracle: seconds}: the shortest `predict` on the attack's slice (a few hundred rows: its
    wall is almost all start-up -- interpreter, model, caches, loader), per oracle preset."""
    out: dict[str, float] = {}
    for r in records:
        if r["argv"][0] == "predict" and "adversarial" in (option(r["argv"], "--data") or ""):
            o = oracle_of(r["argv"])
            out[o] = min(out.get(o, r["wall_s"]), r["wall_s"])
    return out


def inference_ratio(s: dict) -> float:
    """Images a fine-tuned run scores at ImageNet scale over those it scored in the rehearsal:
    4 validations of the held-out 5%, then val and the runbook's --eval-split (val-sized)."""
    held = round(min(s["train"], s["train_rows"] or s["train"]) * HELD_OUT)
    return (4 * round(N_TRAIN * HELD_OUT) + 2 * N_VAL) / (4 * held + 2 * s["val"])


def project_training(g: dict, s: dict, rate: float, source: str, startup: float) -> None:
    """A fine-tuned run at ImageNet scale: training by rows at the run's steady rate, the rest of
    its wall (validation, scoring) by the images scored, the start-up once."""
    per_cmd = g["wall_s"] / g["commands"]
    train_s = g["rows"] / g["commands"] / rate
    rest = max(0.0, per_cmd - train_s - startup)
    full_s = startup + g["full_rows"] / g["commands"] / rate + rest * inference_ratio(s)
    g["full_min"] = full_s / 60
    g["train_img_per_s"] = round(rate, 1)
    g["scale"] = (f"training by rows at {rate:,.0f} img/s ({source}), validation and scoring by "
                  f"images, start-up {startup:.0f} s once: an upper bound")


def steps(records: list[dict], s: dict, rates: dict[str, tuple[float, str]] | None = None
          ) -> list[dict]:
    """Commands grouped by (step, model): summed rows, wall and disk; peaks; the projection.
    ``rates``: {oracle preset: (img/s, source)}, the steady training rate of a fine-tuned run
    where its commands recorded none (rehearsals before the shim read the run's log)."""
    groups: dict[tuple, dict] = {}
    for r in records:
        c = classify(r["argv"], s)
        g = groups.setdefault((c["step"], c["model"]), {**c, "commands": 0, "rows": 0,
                              "full_rows": 0, "wall_s": 0.0, "disk_bytes": 0,
                              "rss_peak_bytes": 0, "pss_peak_bytes": 0,
                              "gpu_peak_bytes": None})
        g["commands"] += 1
        g["rows"] += c["rows"]
        g["full_rows"] += c["full_rows"]
        g["wall_s"] += r["wall_s"]
        g["disk_bytes"] += r["disk_bytes"]
        g["rss_peak_bytes"] = max(g["rss_peak_bytes"], r["rss_peak_bytes"])
        # None where a command measured none (older rehearsals, a kernel without smaps_rollup)
        g["pss_peak_bytes"] = None if g["pss_peak_bytes"] is None or r.get("pss_peak_bytes") is \
            None else max(g["pss_peak_bytes"], r["pss_peak_bytes"])
        if r["gpu_peak_bytes"] is not None:
            g["gpu_peak_bytes"] = max(g["gpu_peak_bytes"] or 0, r["gpu_peak_bytes"])
    return project(list(groups.values()), records, s, rates)


def project(groups: list[dict], records: list[dict], s: dict,
            rates: dict[str, tuple[float, str]] | None = None) -> list[dict]:
    """Each group's rate and its projection to ImageNet (time, disk), in place; also re-projects
    a stored rehearsal's groups with this model (bench/rehearse_imagenet.py --replan)."""
    logged: dict[str, list[float]] = {}       # fine-tuned runs' own rates, by oracle preset
    for r in records:
        if r.get("train_img_per_s") and r["argv"][0] == "train-oracle":
            logged.setdefault(classify(r["argv"], s)["model"], []).append(r["train_img_per_s"])
    start = startups(records)
    for g in groups:
        g["rows_per_s"] = g["rows"] / g["wall_s"]
        g["full_min"] = g["wall_s"] * g["full_rows"] / g["rows"] / 60 / g["commands"]
        own = sorted(logged.get(g["model"], []))
        rate = (own[len(own) // 2], "the run's log") if own else (rates or {}).get(g["model"])
        if g["step"] == "train-oracle (fine-tuned)" and rate:
            project_training(g, s, *rate, start.get(g["model"], 0.0))
        if g["step"] in SLICE_STEPS:
            g["scale"] = (f"by images from a {g['rows'] // g['commands']:,}-row slice: start-up "
                          "scaled too, an upper bound")
        # checkpoints and report files do not grow with the rows; caches and images do
        g["full_disk_bytes"] = g["disk_bytes"] / g["commands"] * (
            1 if g["disk_fixed"] else g["full_rows"] / g["rows"])
    return groups


def grid(measured: list[dict]) -> dict:
    """The paper's grid (section 0's settings: 72 fine-tuned runs, ...) from the per-command
    projections: minutes per part; the total only when every part was measured."""
    per = {(m["step"], m["model"]): m["full_min"] for m in measured}
    runs = PAPER["seeds"] * (PAPER["losses"] + PAPER["broadcast"])
    clfs, oracles = PAPER["classifiers"], PAPER["oracles"]
    parts = {}

    def add(name: str, count: int, step: str, model: str = "") -> None:
        value = per.get((step, model))          # a part with one unmeasured piece: unmeasured
        parts[name] = None if value is None or parts.get(name, 0) is None else \
            parts.get(name, 0) + count * value

    for c in clfs:
        add("extract train+val --flip-view", 1, "extract train+val --flip-view", c)
        add("extract val --corruption", 1, "extract val --corruption", c)
        add("extract ImageNet-C sets", PAPER["corruptions"], "extract imagenet-c", c)
        add("attack val (from the slice: an upper bound)", 1, "attack val", c)
        # 50,000 adversarial images: extracted at the ImageNet-C extract's projection (val-sized)
        add("extract adversarial", 1, "extract imagenet-c" if (
            "extract imagenet-c", c) in per else "extract adversarial", c)
        for o in oracles:
            add("train-oracle (fine-tuned)", runs, "train-oracle (fine-tuned)", o)
    n_runs = runs * len(clfs) * len(oracles)
    add("corrupt", PAPER["corruptions"], "corrupt val --corruption")
    # every predict of the grid scores 50,000 images: the 10,000-row ImageNet-C predict's
    # projection stands for the adversarial one too (the attack's slice is mostly start-up)
    predict = per.get(("predict imagenet-c", ""), per.get(("predict adversarial", "")))
    parts["predict"] = None if predict is None else n_runs * (PAPER["corruptions"] + 1) * predict
    add("report", PAPER["reports"], "report")
    total = None if any(v is None for v in parts.values()) else sum(parts.values())
    return {"runs": n_runs, "minutes": parts, "total_h": None if total is None else total / 60,
            "missing": sorted(k for k, v in parts.items() if v is None)}


def bench_rates(bench: dict) -> dict[str, tuple[float, str]]:
    """{oracle preset: (img/s, source)} from bench/bench_train.py's JSON: the graphed step at the
    paper's batch of 40 with its loader (train-oracle's default path), for the presets it timed."""
    from pipeline.core.presets import IMAGENET_PRESETS
    out = {}
    for preset, name in IMAGENET_PRESETS.items():
        res = bench["results"].get(name.split(".")[0])
        if res and "graph" in res["steps"]["paper"]:
            out[preset] = (res["steps"]["paper"]["graph"]["e2e"],
                           f"bench_train.py, graphed, batch 40, {bench['date']}")
    return out


def replan(result: dict, rates: dict[str, tuple[float, str]] | None) -> dict:
    """A stored rehearsal's steps and grid under this module's projection (the measured walls,
    rows, peaks and disk as they were; the fine-tuned rows as classify() counts them now)."""
    s, records = result["settings"], [r for r in result["commands"] if r["rc"] == 0]
    keep = ("step", "model", "rows", "full_rows", "scale", "disk_fixed", "commands", "wall_s",
            "disk_bytes", "rss_peak_bytes", "gpu_peak_bytes")
    groups = [{**{k: m[k] for k in keep}, "pss_peak_bytes": m.get("pss_peak_bytes")}
              for m in result["steps"]]
    for g in groups:
        if g["step"] == "train-oracle (fine-tuned)":
            one = next(r for r in records if r["argv"][0] == "train-oracle"
                       and "--head-only" not in r["argv"])
            c = classify(one["argv"], s)
            g.update(rows=c["rows"] * g["commands"], scale=c["scale"])
    measured = project(groups, records, s, rates)
    return {**result, "steps": measured, "grid": grid(measured)}


def stored(path: Path, option: str, keys: tuple[str, ...]) -> dict:
    """A JSON a rehearsal or bench_train.py wrote; ValueError naming the option and the file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{option} {path}: cannot read it as JSON ({err})") from None
    missing = [k for k in keys if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{option} {path}: no {', '.join(missing)}; expected the JSON of "
                         + ("bench/bench_train.py --json" if option == "--train-bench"
                            else "a rehearsal (bench/rehearse_imagenet.py --json)"))
    return data


def replan_files(path: Path, bench: Path | None) -> dict:
    """``replan`` of the rehearsal JSON ``path``, with bench_train.py's JSON ``bench``'s rates."""
    rates = bench_rates(stored(bench, "--train-bench", ("results", "date"))) if bench else None
    return replan(stored(path, "--replan", ("settings", "steps", "commands")), rates)


def table(result: dict) -> str:
    """The rehearsal's per-step table and grid line, as printed at its end."""
    env, s = result["environment"], result["settings"]
    lines = [f"\n## The runbook rehearsed ({env['device_name']}, {env['date']}, torch {env['torch']}, "
             f"{s['train']:,} train / {s['val']:,} val, LAUNCH={s['launch']})\n",
             "| step | model | cmds | rows | wall s | rows/s | peak RSS sum / PSS sum GB | peak GPU GB "
             "| disk MB | ImageNet min (scaling) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for m in result["steps"]:
        gpu = "n/a" if m["gpu_peak_bytes"] is None else f"{m['gpu_peak_bytes'] / 1e9:.1f}"
        pss = "n/a" if m.get("pss_peak_bytes") is None else f"{m['pss_peak_bytes'] / 1e9:.2f}"
        lines.append(f"| {m['step']} | {m['model']} | {m['commands']} | {m['rows']:,} | "
                     f"{m['wall_s']:.1f} | {m['rows_per_s']:,.1f} | {m['rss_peak_bytes'] / 1e9:.2f} / "
                     f"{pss} | {gpu} | {m['disk_bytes'] / 1e6:.1f} | {m['full_min']:.1f} "
                     f"({m['scale']}) |")
    g = result["grid"]
    total = "not measured" if g["total_h"] is None else f"{g['total_h']:.1f} h"
    lines.append(f"\nThe paper's grid ({g['runs']} fine-tuned runs, one device): {total}"
                 + (f" (not measured: {', '.join(g['missing'])})" if g["missing"] else ""))
    return "\n".join(lines)

