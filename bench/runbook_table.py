"""docs/IMAGENET.md's "Expected wall time" table and grid sentence, and the matching table of
docs/PERFORMANCE.md, generated from committed measurements (one source for those figures):

    python bench/runbook_table.py                     # rewrite both docs from bench/results/
    python bench/runbook_table.py --check             # exit 1 when the docs differ
    python bench/runbook_table.py --rehearsal R.json --train-bench T.json --launched D.json

Inputs (default: the files of bench/results/ when present): a GPU rehearsal of the runbook
(bench/rehearse_imagenet.py --json), the training benchmark (bench/bench_train.py --json), and a
rehearsal under torchrun (--launch ...), and bench/bench_ddp.py's JSONs (bench/results/ddp-*.json:
one GPU against several through the command line).  A figure without a measurement is written
"not measured"; CPU or --tiny JSONs are refused (they are test fixtures, never the docs' figures).
The text between the marker comments is replaced; everything else is left as it is.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOCS = {"IMAGENET": ROOT / "docs" / "IMAGENET.md", "PERFORMANCE": ROOT / "docs" / "PERFORMANCE.md"}
BEGIN, END = "<!-- runbook-time-table: begin (bench/runbook_table.py) -->", \
    "<!-- runbook-time-table: end -->"
DEFAULTS = {"rehearsal": RESULTS / "rehearsal.json", "train_bench": RESULTS / "bench_train.json",
            "launched": RESULTS / "rehearsal-torchrun.json"}
STEPS = [("extract train+val --flip-view", True), ("extract val --corruption", True),
         ("train-oracle (fine-tuned)", True), ("report", False), ("corrupt val --corruption", False),
         ("extract imagenet-c", True), ("predict imagenet-c", False), ("attack val", True),
         ("extract adversarial", True), ("predict adversarial", False),
         ("extract train+val --flip-view --features", True), ("train-oracle --head-only", True),
         ("sweep (head-only bank)", True), ("report --export fd-shifts", False)]
NM = "not measured"


class Refused(Exception):
    """Inputs that must not reach the docs (CPU/tiny JSONs, missing markers): exit 1."""


def load(path: Path | None, what: str) -> dict | None:
    if path is None or not path.is_file():
        return None
    data = json.loads(path.read_text())
    env = data.get("environment", {})
    cpu = env.get("device") == "cpu" or data.get("settings", {}).get("tiny") or \
        str(data.get("device", "")).startswith("cpu") or data.get("args", {}).get("tiny")
    if cpu:
        raise Refused(f"{path}: a CPU/--tiny {what} is a test fixture, not a figure for the docs")
    return data


def gb(value) -> str:
    return NM if value is None else f"{value / 1e9:.1f}"


def memory(m: dict) -> str:
    """The PSS sum where measured, else "≤ " and the RSS sum (shared pages once per process)."""
    if m.get("pss_peak_bytes") is not None:
        return gb(m["pss_peak_bytes"])
    return f"≤ {gb(m['rss_peak_bytes'])}"


def rehearsal_rows(r: dict | None) -> list[str]:
    measured = {(m["step"], m["model"]): m for m in (r or {}).get("steps", [])}
    rows = []
    for step, per_model in STEPS:
        for model in (("vit", "resnet") if per_model else ("",)):
            m = measured.get((step, model))
            if m is None:
                rows.append(f"| {step} | {model or '—'} | {NM} | {NM} | {NM} | {NM} | {NM} |")
                continue
            rows.append(f"| {step} | {model or '—'} | {m['rows_per_s']:,.0f} | "
                        f"{m['full_min']:,.1f} min ({m['scale']}) | {memory(m)} | "
                        f"{gb(m['gpu_peak_bytes'])} | {gb(m['full_disk_bytes'])} |")
    return rows


def train_rows(t: dict | None) -> list[str]:
    if t is None:
        return [f"| train-oracle, bench_train.py, batch 40 and fill batch | — | {NM} | {NM} | "
                f"{NM} | {NM} | {NM} |"]
    rows, held = [], 1_281_167 * 0.95
    for model, res in t["results"].items():
        for key, label in (("paper", "batch 40"), ("fill", f"batch {res['fill_batch']}")):
            path, best = max(res["steps"][key].items(), key=lambda kv: kv[1]["e2e"])
            rows.append(f"| train-oracle step only (bench_train.py, {label}, {path}) | {model} | "
                        f"{best['e2e']:,.0f} | {held / best['e2e'] / 60:,.1f} min per run "
                        f"(by rows) | {NM} | {NM} | {NM} |")
    return rows


def ddp_sentence(runs: list[dict]) -> str:
    """What bench_ddp.py measured, per file and model (several GPUs only as measured)."""
    said = []
    for b in runs:
        for model, res in b["models"].items():
            one, *many = res["train"]
            parts = [f"{r['gpus']} GPUs × {r['per_gpu_batch']} (global {r['global_batch']}, "
                     f"{r['step_path'].replace('_', ' ')}) {r['img_per_s']:,.0f} img/s = "
                     f"{r['vs_one_gpu']:.2f}×" for r in many]
            ex = res["extract"]
            steady = all(ex[k].get("steady_scope") == "all processes" for k in ("one", "many"))
            extract = (f"extract train+val --flip-view {ex['ratio']:.2f}× one GPU" if steady else
                       f"extract's rate across processes {NM} (that run recorded rank 0's)")
            said.append(f"{model} oracle on {b['gpus']}× {b['device']} ({b['date']}): one GPU × "
                        f"{one['per_gpu_batch']} {one['img_per_s']:,.0f} img/s; "
                        + "; ".join(parts) + f"; {extract}")
    if not said:
        return f"Several GPUs through `bench/bench_ddp.py`: {NM}."
    return ("Several GPUs, measured by `bench/bench_ddp.py` (training img/s, median of the logged "
            "windows, one run each): " + ". ".join(said) + ". Other models and GPU counts: "
            f"{NM}.")


def sentences(r: dict | None, t: dict | None, d: dict | None,
              ddp: list[dict] | None = None) -> list[str]:
    out = []
    if r and r["grid"]["total_h"] is not None:
        env = r["environment"]
        out.append(f"The paper's grid as section 0 sets it ({r['grid']['runs']} fine-tuned runs, the "
                   f"extractions, ImageNet-C, the attack as rehearsed, the reports), projected from "
                   f"the rehearsal on one {env['device_name']}: **{r['grid']['total_h']:.1f} h**.")
    else:
        out.append(f"The paper's grid (72 fine-tuned runs and the rest of sections 1–6) on one GPU: "
                   f"{NM} (run `bench/rehearse_imagenet.py` on the GPU and commit its JSON).")
    if t and t.get("projection"):
        p = t["projection"]
        out.append(f"`bench_train.py`'s {p['runs']}-run grid ({' × '.join(p['models'])}, one seed, "
                   f"extraction included): {p.get('fastest_paper_h', float('nan')):.1f} h at batch "
                   f"40, {p.get('fastest_fill_h', float('nan')):.1f} h at the fill batch, "
                   f"{p['authors_h']:.1f} h in the authors' style ({t['device']}, {t['date']}).")
    else:
        out.append(f"`bench_train.py`'s 16-run grid: {NM}.")
    if d and d["grid"]["total_h"] is not None:
        out.append(f"Several GPUs, measured with LAUNCH=\"{d['settings']['launch']}\": the grid "
                   f"projects to **{d['grid']['total_h']:.1f} h** ({d['environment']['gpus']} GPUs).")
    else:
        out.append(f"The rehearsal under `--launch \"torchrun ...\"`: {NM}.")
    out.append(ddp_sentence(ddp or []))
    return out


def render(r: dict | None, t: dict | None, d: dict | None, ddp: list[dict] | None = None) -> str:
    head = ("| step | model | measured rows/s | at ImageNet scale, per command | peak host memory GB "
            "(rehearsal: PSS summed over the command's processes; ≤: RSS summed, shared pages once per process, an upper bound) | peak GPU GB "
            "(rehearsal) | disk at ImageNet GB, per command |\n"
            "|---|---|---|---|---|---|---|")
    if r:
        e, s = r["environment"], r["settings"]
        source = (f"Measured by `bench/rehearse_imagenet.py` on {e['device_name']} ({e['cpus']} CPU "
                  f"cores, torch {e['torch']}, {e['date']}): {s['train']:,} train / {s['val']:,} "
                  f"val JPEGs, LAUNCH={s['launch']}, the runbook's commands as written.")
    else:
        source = f"The runbook's rehearsal on a GPU: {NM} yet."
    body = "\n".join([head, *rehearsal_rows(r), *train_rows(t)])
    return "\n".join([BEGIN, source, "", body, "", " ".join(sentences(r, t, d, ddp)), END])


def replace(text: str, block: str, where: Path) -> str:
    if BEGIN not in text or END not in text:
        raise Refused(f"{where}: no {BEGIN} ... {END} markers")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + block + text[end:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for key, path in DEFAULTS.items():
        p.add_argument(f"--{key.replace('_', '-')}", type=Path, default=path)
    p.add_argument("--ddp", type=Path, nargs="*", default=sorted(RESULTS.glob("ddp-*.json")),
                   help="bench_ddp.py JSONs (default: bench/results/ddp-*.json)")
    p.add_argument("--check", action="store_true", help="exit 1 when the docs differ")
    a = p.parse_args(argv)
    try:
        block = render(load(a.rehearsal, "rehearsal"), load(a.train_bench, "training benchmark"),
                       load(a.launched, "torchrun rehearsal"),
                       [load(p, "multi-GPU benchmark") for p in a.ddp])
        stale = []
        for path in DOCS.values():
            text = path.read_text()
            new = replace(text, block, path)
            if new != text:
                stale.append(path)
                if not a.check:
                    path.write_text(new)
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if a.check and stale:
        print("error: " + ", ".join(map(str, stale)) + " differ from bench/runbook_table.py's "
              "output: run python bench/runbook_table.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
