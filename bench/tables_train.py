"""The renderers of docs/PERFORMANCE.md's training blocks (bench/doc_tables.py's ``BLOCKS``):
the fine-tuned step (bench_train.py, bench_vit_peak.py, bench_ddp.py), the ViT step against its
roofline (vit_roofline.py) and the head-only runs (bench_head.py, head_profile.py)."""
from __future__ import annotations

import json

from bench.grid_hours import grid_parts
from bench.table_format import RESULTS, device_name, load, n0, source, table

BF16_PEAK_TFLOPS = {"H100": 989.0}    # dense bf16, the H100 SXM datasheet's figure

TRAIN_PATHS = (("eager", "eager"), ("graph", "graph"), ("compiled", "compiled + graph"))
MODEL_NAMES = {"vit_base_patch16_384": "ViT-B/16@384 (`vit`)", "resnet50": "ResNet-50 (`resnet`)"}


def peak_for(device: str) -> float | None:
    return next((v for k, v in BF16_PEAK_TFLOPS.items() if k in device), None)


def train_step() -> str:
    d = load("bench_train.json")
    peak = peak_for(device_name(d))
    rows = []
    for model, res in d["results"].items():
        name = MODEL_NAMES.get(model, model)
        for key, label in TRAIN_PATHS:
            b40, b256 = res["steps"]["paper"][key], res["steps"]["fill"][key]
            tflops = b40["e2e"] * res["train_gflop_per_img"] / 1e3
            share = f" ({tflops / peak:.0%})" if peak else ""
            rows.append([name, label, f"{n0(b40['e2e'])} ({n0(b40['resident'])})",
                         f"{n0(b256['e2e'])} ({n0(b256['resident'])})",
                         f"{b40['e2e'] / b256['e2e']:.2f}", f"{tflops:,.0f}{share}"])
        a = res["authors"]
        rows.append([name, "authors' style (fp32, classifier forward every step)",
                     f"{n0(a['e2e'])} ({n0(a['resident'])})", "", "", ""])
    p = d["projection"]
    parts = grid_parts(d["results"], "paper", ("eager", "graph", "compiled"), p["models"])
    infer = "; ".join(f"{MODEL_NAMES.get(m, m)} {n0(r['infer'])} img/s"
                      for m, r in d["results"].items())
    labels = dict(TRAIN_PATHS)
    fastest = ", ".join(f"{labels.get(p['fastest_paths'][m], p['fastest_paths'][m])} for "
                        f"{MODEL_NAMES.get(m, m)}"
                        for m in p["models"])
    peak_note = f" (% of the {peak:,.0f} TFLOP/s dense bf16 peak)" if peak else ""
    return "\n".join([
        f"One {source(d)} {d['args']['workers']} loader workers, bf16, {d['args']['steps']} "
        f"timed steps after {d['args']['warmup']}; img/s end to end with the loader (in "
        f"brackets: on a batch already on the device), batch 40 (the paper's) and "
        f"{d['args']['fill_batch']}; TFLOP/s at batch 40{peak_note}.", "",
        table(["oracle", "step", "batch 40 img/s", f"batch {d['args']['fill_batch']} img/s",
               f"40 / {d['args']['fill_batch']}", "batch-40 TFLOP/s"], rows), "",
        f"The same run's bf16 inference (what one extraction costs per image, model only): "
        f"{infer}. The paper's {p['runs']}-run grid ({' and '.join(MODEL_NAMES.get(m, m) for m in p['models'])} "
        f"as oracles and classifiers, one epoch each, one seed, the extractions included) "
        f"projected from these rates: **{p['fastest_paper_h']:.2f} h** at batch 40 with the "
        f"fastest step per model ({fastest}), {p['graph_paper_h']:.2f} h graphed without "
        f"`--compile`, {p['eager_paper_h']:.2f} h eager; {p['fastest_fill_h']:.2f} h at batch "
        f"{d['args']['fill_batch']}; {p['authors_h']:.1f} h in the authors' style. Of the "
        f"{p['fastest_paper_h']:.2f} h: " + ", ".join(
            f"the {MODEL_NAMES.get(m, m)} oracles' {p['runs'] // len(p['models'])} runs "
            f"{h:.2f} h" for m, h in parts.items() if m != "extraction")
        + f", the extractions {parts['extraction']:.2f} h."])


def train_memory() -> str:
    d = load("bench_train.json")
    rows = []
    for model, res in d["results"].items():
        m, mb = res["memory"], res["max_batch_40gb"]
        cells = [f"{m[k]['40']:.1f} / {m[k]['256']:.1f} GB" for k in ("bf16/eager", "bf16/graph")]
        rows.append([MODEL_NAMES.get(model, model), *cells,
                     f"**{mb['batch']}** ({mb['gb_per_image']:.3f} GB per image"
                     f"{', verified' if mb['verified'] else ''})"])
    return "\n".join([
        f"Peak `torch.cuda.max_memory_allocated` over 3 steps on a resident batch, in the run of "
        f"the table above (one {device_name(d)}, {d['date']}).", "",
        table(["oracle", "bf16 eager, batch 40 / 256", "bf16 graph, batch 40 / 256",
               "largest batch on a 40 GB card (bf16, graph)"], rows)])


def sdpa() -> str:
    d = load("vit-peak-1xH100.json")
    by = {}
    for r in d["rows"]:
        by.setdefault(r["backend"], {})[r["compile"]] = r
    names = {"default": "default (PyTorch's choice)", "flash": "FlashAttention-2",
             "efficient": "memory-efficient", "cudnn": "cuDNN attention"}
    rows = [[names.get(b, b), *(f"{c[k]['img_per_s']:,.1f} ({c[k]['peak_share']:.1%})"
                                for k in (False, True))] for b, c in by.items()]
    return "\n".join([
        f"{d['model']}, graphed training step on one resident batch of {d['batch']} (no loader), "
        f"per SDPA backend; one {source(d)} % of the {d['peak_tflops']:,.0f} TFLOP/s bf16 peak at "
        f"{d['train_gflop_per_img']:.0f} GFLOP per training image.", "",
        table(["SDPA backend", "graph, img/s (% of peak)", "compiled + graph, img/s (% of peak)"],
              rows)])


def ddp() -> str:
    runs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("ddp-*.json"))]
    if not runs:
        return "Several GPUs (`bench/bench_ddp.py`): not measured."
    out = []
    for d in runs:
        rows = []
        for model, res in d["models"].items():
            for r in res["train"]:
                rows.append([model, "train-oracle",
                             f"{r['gpus']} × {r['per_gpu_batch']} (global {r['global_batch']})",
                             r["step_path"].replace("_", " "), n0(r["img_per_s"]),
                             f"{r['vs_one_gpu']:.2f}×"])
            ex = res["extract"]
            one, many = ex["one"], ex["many"]
            decode = f"{d.get('decode', 'cpu').upper()} decode"
            rows.append([model, "extract train --flip-view, from the split's start (loader "
                         "start-up included)", f"{one['gpus']} / {many['gpus']} processes",
                         decode, f"{n0(one['img_per_s'])} / {n0(many['img_per_s'])}",
                         f"{many['img_per_s'] / one['img_per_s']:.2f}×"])
            steady = all(ex[k].get("steady_scope") == "all processes" for k in ("one", "many"))
            if steady:
                rows.append([model, "extract, steady rate across processes",
                             f"{one['gpus']} / {many['gpus']} processes", decode,
                             f"{n0(one['steady_img_per_s'])} / {n0(many['steady_img_per_s'])}",
                             f"{ex['ratio']:.2f}×"])
        out += [f"{d['gpus']}× {d['device']} of one host, torch {d['torch']}, {d['date']}: "
                f"`{d['command']}` ({d['images']:,} generated JPEGs; training img/s = median of "
                f"the logged windows after the capture; one run).", "",
                table(["oracle", "command", "GPUs × batch per GPU", "step", "img/s",
                       "vs one GPU"], rows), ""]
    return "\n".join(out[:-1])


def ddp_summary() -> str:
    """docs/PERFORMANCE.md's one table of the multi-GPU runs (``ddp``, bench/NOTES.md: each run
    with its command): training img/s per GPU count and batch, and the extraction's ratio."""
    runs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("ddp-*.json"))]
    if not runs:
        return "Several GPUs (`bench/bench_ddp.py`): not measured."
    rows = []
    for d in runs:
        where = f"{d['gpus']}× {d['device']}"
        for model, res in d["models"].items():
            for r in res["train"]:
                if r["gpus"] > 1:
                    rows.append([where, model, f"train-oracle, {r['per_gpu_batch']} per GPU "
                                 f"(global {r['global_batch']})", n0(r["img_per_s"]),
                                 f"{r['vs_one_gpu']:.2f}×"])
            ex = res["extract"]
            if ex["many"].get("steady_scope") == "all processes" and \
                    ex["one"].get("steady_scope") == "all processes":
                rows.append([where, model, f"extract, steady, {d.get('decode', 'cpu').upper()} "
                             "decode", n0(ex["many"]["steady_img_per_s"]), f"{ex['ratio']:.2f}×"])
    dates = sorted({d["date"] for d in runs})
    return "\n".join([
        f"`python bench/bench_ddp.py --gpus N` on generated JPEGs, torch "
        f"{', '.join(sorted({d['torch'] for d in runs}))}, {dates[0]} to {dates[-1]}; one run "
        "each (the runs and their commands: bench/NOTES.md).", "",
        table(["GPUs", "oracle", "what", "img/s", "vs one GPU"], rows)])


def head_only_gpu() -> str:
    d = load("head-only-1xH200.json")
    rows = []
    for dim, res in d["dims"].items():
        for key, label in (("one_run", "one run"), ("grid", "α grid, one bank")):
            r = res[key]
            rows.append([f"{int(dim):,}", f"{label} ({r['heads']} head{'s' * (r['heads'] > 1)})",
                         f"{r['load_s']:.1f}", f"{r['train_s']:.1f}", f"{r['score_val_s']:.2f}",
                         f"**{r['total_s']:.1f}**", f"{r['steps']:,}",
                         r["step_path"]["mode"].replace("_", " ")])
    return "\n".join([
        f"{d['rows']:,} rows × D fp16 features of both views in shards of "
        f"{d['shard_rows']:,} rows (extract's default), batch {d['batch']}, one epoch "
        f"(5% held out, 4 validations), then {d['val_rows']:,} val rows scored; one "
        f"{source(d)}", "",
        table(["D", "what", "load s", "train s", "score val s", "total s", "steps", "step"],
              rows)])


def head_only_versus() -> str:
    """head_only_gpu's run against the tree of an earlier commit in the same call (bench/NOTES.md:
    what the loading and the loop gained)."""
    d = load("head-only-1xH200.json")
    b = load("head-only-2ecf2fc-1xH200.json")
    versus = []
    for dim, res in d["dims"].items():
        for key, label in (("one_run", "one run"), ("grid", "α grid, one bank")):
            new, old = res[key], b["dims"][dim][key]
            versus.append([f"{int(dim):,}", label] + [
                f"{old[k]:.1f} → {new[k]:.1f}" for k in ("load_s", "train_s")] + [
                f"{old['total_s']:.1f} → **{new['total_s']:.1f}**",
                f"**{old['total_s'] / new['total_s']:.2f}×**"])
    return "\n".join([
        f"Against the tree of commit 2ecf2fc in the same call, {b['note'].split(', ', 2)[2]}: "
        f"`{b['command']}` there.", "",
        table(["D", "what", "load s", "train s", "total s", "speed-up"], versus)])


def twin_rows(d: dict) -> list[tuple[list[str], dict]]:
    """bench_head.py's runs against their baseline twins (one run, the grid, per D): the row
    (D, what, baseline train s, train s, speed-up, best heads) and the run."""
    from bench.bench_head import best_heads_compared

    out = []
    for dim, res in d["dims"].items():
        for key, label in (("one_run", "one run"), ("grid", "α grid, one bank")):
            run, base = res[key], res["eager"][key]
            heads = f"{run['heads']} head{'s' * (run['heads'] > 1)}"
            out.append(([f"{int(dim):,}", f"{label} ({heads})", f"{base['train_s']:.1f}",
                         f"{run['train_s']:.1f}", f"**{base['train_s'] / run['train_s']:.2f}×**",
                         best_heads_compared(run, base)], run))
    return out


def head_only_compiled() -> str:
    """``--compile`` against the same graphed step uncompiled, in one bench_head run."""
    d = load("head-only-compiled-1xH100.json")
    rows = [row[:5] + [f"{run['total_s']:.1f}", row[5]] for row, run in twin_rows(d)]
    return "\n".join([
        f"The same rows and protocol, `--compile` against the same graphed step uncompiled in "
        f"one run (train s includes compiling); one {source(d)}", "",
        table(["D", "what", "train s, uncompiled", "train s, compiled", "speed-up", "total s",
               "best heads"], rows)])


def vit_roofline() -> str:
    """The ViT step against its roofline (bench/vit_roofline.py), eager graph and compiled."""
    rows = []
    for name, label in (("vit-roofline-eager-1xH100.json", "graph"),
                        ("vit-roofline-1xH100.json", "compiled + graph")):
        d = load(name)
        b, g = d["bound"]["parts_ms"], d["profile"]["groups_ms"]
        idle = d["step_ms"] - d["profile"]["kernels_ms"]
        rows.append([label, f"{d['step_ms']:.1f} ({n0(d['img_per_s'])} img/s)",
                     f"{b['gemm']:.1f} + {b['attention']:.1f} + {b['memory']:.1f} = "
                     f"{d['bound']['total_ms']:.1f}", f"**{d['ratio']:.2f}**",
                     f"{g.get('gemm', 0):.1f} / {g.get('attention', 0):.1f} / "
                     f"{g.get('other', 0):.1f} / {idle:.1f}"])
    first = load("vit-roofline-1xH100.json")        # the compiled step: the command to quote
    b = first["bound"]
    return "\n".join([
        f"{first['model']}, batch {first['batch']}, bf16, SDPA {first['backend']}, one "
        f"{source(first)[:-1]} (the graph row: `--compile off`). Per step: "
        f"{b['gflop']['gemm']:,.0f} GFLOP of GEMMs and {b['gflop']['attention']:,.0f} of "
        f"attention; the other ops move {b['other_bytes'] / 1e9:.1f} GB, priced at the measured "
        f"{b['copy_bandwidth_gb_s']:,.0f} GB/s copy bandwidth. Milliseconds per step.", "",
        table(["step", "step ms", "bound: GEMMs + attention + memory", "step / bound",
               "kernels: GEMM / attention / other / idle"], rows)])


def head_profile() -> str:
    """The head-only step's kernels (bench/head_profile.py), per optimizer step."""
    rows, notes = [], []
    for name in ("head-profile-eager-1xH100.json", "head-profile-1xH100.json",
                 "head-profile-compiled-1xH100.json", "head-profile-bank100-1xH100.json"):
        d = load(name)
        step = d["step_path"]["mode"].replace("_", " ") + (", compiled" if d.get("compiled")
                                                           else "")
        plain = d.get("unprofiled_us_per_step")
        rows.append([d["date"], f"{d['heads']}", step, f"{d['kernels_per_step']:.0f}",
                     f"{d['gpu_busy_us_per_step']:.0f}", f"{d['wall_us_per_step']:.0f}",
                     f"**{plain:.0f}**" if plain else "not timed"])
        notes += [f"`{d['command']}`" + (f" ({d['note']})" if d.get("note") else "")]
    d = load("head-profile-1xH100.json")
    return "\n".join([
        f"D {d['dim']}, batch {d['batch']}, {d['steps']:,} steps of one epoch, one "
        f"{device_name(d)}; kernels and GPU time under torch.profiler (which slows "
        f"the host: its wall column is not the step's time), the step's own wall time from a "
        f"pass without it. Rows: " + "; ".join(notes) + ".", "",
        table(["date", "heads", "step", "kernels per step", "GPU busy µs per step",
               "wall µs per step (profiled)", "wall µs per step"], rows)])


def head_replay() -> str:
    """The head-only graphs replayed back to back against the loop's wall time per step
    (bench/head_profile.py's bare replays), the loop's syncs, and bench_head's runs at several
    steps a replay against one."""
    rows, notes = [], []
    for name in ("head-replay-1-1xH200.json", "head-sync-100-1xH200.json",
                 "head-replay-32-1xH200.json", "head-replay-1-bank100-1xH200.json",
                 "head-replay-32-bank100-1xH200.json"):
        d = load(name)
        bare = d.get("bare_replay_us_per_step") or {}
        rows.append([d["call"], f"{d['heads']}", "compiled" if d["compiled"] else "graph",
                     f"{d['per_replay']}", f"{d['log_every']}",
                     f"**{d['unprofiled_us_per_step']:.0f}**",
                     " / ".join(f"{v:.0f}" for v in bare.values()) or "not timed",
                     f"{d['gpu_busy_us_per_step']:.0f}", f"{d['kernels_per_step']:.0f}"])
        notes.append(f"`{d['command']}`")
    b = load("head-only-replay-1xH200.json")
    runs = [row for row, _ in twin_rows(b)]
    first = load("head-replay-1-1xH200.json")
    longest = next(iter(b["dims"].values()))["one_run"]["per_replay"]
    return "\n".join([
        f"D {first['dim']}, batch {first['batch']}, {first['steps']:,} steps of one epoch, one "
        f"{device_name(first)} per call (the call column: rows of one call ran on one machine). "
        "The loop's time per step: a pass without the profiler, its training time (the "
        "graphs' capture and 4 validations included) over its steps; then each of the "
        "trained bank's graphs replayed back to back for 3,000 steps (no loop, no sync), in "
        "µs a step for 1, 2, 4, ... steps a replay; GPU busy and kernels under torch.profiler. "
        "Rows: " + "; ".join(notes) + ".", "",
        table(["call", "heads", "step", "steps a replay, at most", "sync every", "loop µs per step",
               "graphs back to back, µs per step", "GPU busy µs per step", "kernels per step"],
              rows), "",
        f"ImageNet-sized, as the head-only table above: up to {longest} steps a replay against "
        f"one step a replay in one run; one {source(b)}", "",
        table(["D", "what", "train s, a step a replay", f"train s, up to {longest}", "speed-up",
               "best heads"], runs)])
