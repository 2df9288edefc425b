"""The renderers of the blocks that come from bench/step_levers.py and bench/profile_extract.py
(bench/doc_tables.py's ``BLOCKS``): each lever on the fine-tuned step against the shipped step,
the paper's grid in hours from steps measured in the same call, and where one extraction process
spends its time."""
from __future__ import annotations

from bench.table_format import device_name, load, n0, source, table
from bench.tables_train import MODEL_NAMES

KERNEL_GROUPS = ("gemm", "attention", "other")


def _commit(d: dict) -> str:
    return f" The code of commit {d['commit']}." if d.get("commit") else ""


def _rounds(d: dict) -> int:
    return len(next(r["rounds_ms"] for by in d["results"].values() for res in by.values()
                    for r in res.values() if "rounds_ms" in r))


def _ratios(d: dict, model: str) -> dict[str, float]:
    """Batch-40 img/s over the largest batch's, per lever."""
    by = d["results"][model]
    fill = max(by, key=int)
    return {lv: r["img_per_s"] / by[fill][lv]["img_per_s"] for lv, r in by["40"].items()
            if "img_per_s" in r and "img_per_s" in by[fill].get(lv, {})}


def _lever_rows(d: dict, levers: dict[str, str]) -> list[list[str]]:
    rows = []
    for model, by_batch in d["results"].items():
        for batch, res in by_batch.items():
            for lever, r in res.items():
                if "error" in r:
                    rows.append([MODEL_NAMES.get(model, model), batch, f"`{lever}`",
                                 "cannot run", "", "", "", ""])
                    continue
                kernels = r.get("kernels", {}).get("groups_ms", {})
                kern = " / ".join(f"{kernels[g]:.2f}" if g in kernels else "–"
                                  for g in KERNEL_GROUPS)
                num = r.get("numerics") or {}
                rows.append([MODEL_NAMES.get(model, model), batch,
                             "shipped" if lever == "base" else f"`{lever}`: {levers[lever]}",
                             f"{r['step_ms']:.2f}", n0(r["img_per_s"]),
                             f"**{r['vs_base']:.3f}**", kern, f"{num.get('loss_rel', 0):.1e}"])
    return rows


HEAD = ["oracle", "batch", "step", "step ms", "img/s", "shipped ms / this ms",
        "kernels ms: GEMM / attention / other", "first-step loss Δ (relative)"]


def train_levers() -> str:
    """Every lever of both models (bench/step_levers.py's defaults), one call per model."""
    parts = []
    for name in ("step-levers-vit-1xH200.json", "step-levers-resnet-1xH200.json"):
        d = load(name)
        parts.append(f"One {source(d)}{_commit(d)}")
    d_vit, d_rn = load("step-levers-vit-1xH200.json"), load("step-levers-resnet-1xH200.json")
    rows = _lever_rows(d_vit, d_vit["levers"]) + _lever_rows(d_rn, d_rn["levers"])
    ratio = _ratios(d_rn, "resnet50")
    return "\n".join([
        " ".join(parts) + f" Median of {_rounds(d_vit)} alternating rounds of 20 steps; bf16, one resident batch, "
        "one CUDA graph; the ViT compiled, the ResNet not (as shipped).", "",
        table(HEAD, rows), "",
        "ResNet-50's batch-40 img/s over its batch-256 img/s, per step: " + ", ".join(
            f"{'shipped' if k == 'base' else k} {v:.2f}" for k, v in ratio.items()) + "."])


def train_grid() -> str:
    """The shipped step against its levers in the grid's call, and the grid in hours."""
    d = load("step-levers-grid-1xH200.json")
    g = d["grid"]
    rows = _lever_rows(d, d["levers"])
    return "\n".join([
        f"One {source(d)}{_commit(d)} Median of {_rounds(d)} alternating rounds; the extraction rates from `bench/profile_extract.py` in the same "
        "session (ResNet-50 " + n0(g["extract_img_per_s"].get("resnet50", 0)) + " img/s, "
        "ViT-B/16@384 " + n0(g["extract_img_per_s"].get("vit_base_patch16_384", 0)) + " img/s "
        "steady, `--decode cpu`) and the inference rates measured in this call.", "",
        table(HEAD, rows), "", grid_hours()])


def grid_hours() -> str:
    """The grid's hours from the step as shipped and with each oracle at its fastest lever."""
    d = load("step-levers-grid-1xH200.json")
    hours = d["grid"]["hours"]

    def parts(key: str) -> str:
        p = hours[key]["parts_h"]
        return ", ".join(f"{MODEL_NAMES.get(k, k)} {v:.2f} h" for k, v in p.items())
    steps = "; ".join(f"{MODEL_NAMES.get(m, m)} {by['40']['base']['step_ms']:.1f} ms "
                      f"({n0(by['40']['base']['img_per_s'])} img/s)"
                      for m, by in d["results"].items())
    return (f"The paper's 16-run grid (`bench/grid_hours.py`) from the batch-40 steps of one "
            f"{device_name(d)}, {d['date']} (`bench/results/step-levers-grid-1xH200.json`; the step "
            f"as shipped: {steps}): **{hours['base']['total_h']:.2f} h** ({parts('base')}); "
            f"**{hours['fastest']['total_h']:.2f} h** with the ResNet-50 oracles compiled too "
            f"({parts('fastest')}).")


def extract_profile() -> str:
    """bench/profile_extract.py: per-image worker costs, ceilings, the main thread's split."""
    d = load("profile-extract-1xH200.json")
    b = load("profile-extract-blocking-1xH200.json")
    rows = []
    for label, doc in (("", d), (" (blocking wait)", b)):
        for model, r in doc["models"].items():
            pi, ex = r["per_image"], r["extract"]
            frac = ex.get("fraction", {})
            two = r.get("two_procs", {}).get("summed_img_per_s")
            rows.append([MODEL_NAMES.get(model, model) + label,
                         f"{pi['decode']:.2f} / {pi['resize_crop']:.2f} / {pi['worker_total']:.2f}",
                         n0(pi["ceilings_img_per_s"]["worker_total"]),
                         n0(r["loader"]["img_per_s"]), n0(r["model_alone"]["resident_img_per_s"]),
                         f"**{n0(ex['steady_img_per_s'])}**",
                         " / ".join(f"{frac.get(k, 0):.0%}" for k in
                                    ("loader_wait", "device_wait_in_sink", "forward")),
                         n0(two) if two else ""])
    return "\n".join([
        f"One {source(d)}{_commit(d)} The second ResNet-50 row: one {source(b)}{_commit(b)} "
        f"{d['workers']} loader workers on {d['cpu_count']} cores, batch {d['batch_size']}, "
        f"{d['precision']}, {d['rows']:,} generated val JPEGs; img/s steady (after the first "
        "batch).", "",
        table(["classifier", "one worker, ms per image: decode / resize / all", "15 workers' "
               "ceiling", "loader alone", "model alone", "extract", "main thread: loader wait / "
               "device wait / forward", "two processes, summed"], rows)])
