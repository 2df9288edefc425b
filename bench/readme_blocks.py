"""README.md's figures, generated from committed files so that they cannot drift from the
measurements and results they quote:

    python bench/readme_blocks.py            # rewrite README.md's generated blocks
    python bench/readme_blocks.py --check    # exit 1 when a block differs from what it would write

A block is the text between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->``
(bench/results_page.py's markers, read and written by its functions):

- ``headline``: the headline result's counts, from docs/results/summary.json through the
  functions that write docs/RESULTS.md's answers (bench/results_claims.py);
- ``demo-time``: how long `make demo` took, from bench/results/demo-2cpu.json (the JSON that
  docs/PERFORMANCE.md's demo table comes from, bench/doc_tables.py).

bench/results_page.py rewrites these blocks too when it extracts a new report;
tests/test_readme_blocks.py fails when one is stale.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.results_claims import learned_vs_mcp, ss_vs_losses, tnr_ranges  # noqa: E402
from bench.results_format import Refused, _split  # noqa: E402
from bench.results_page import blocks_of, load_summary, prepared, rewrite  # noqa: E402
from bench.table_format import Stale, device_name, load  # noqa: E402

README = ROOT / "README.md"


def _how_often(t) -> str:
    """``never: 0 of 64 (1 no clear difference, 63 worse)``: a word for the share of learned
    oracles better than MCP, then the counts it stands for."""
    n, better = sum(t.values()), t["better"]
    word = ("not tested" if n == 0 else "never" if better == 0 else "always" if better == n
            else "rarely" if better <= n / 4 else "mostly" if better > n / 2 else "sometimes")
    return f"{word}: {better} of {n} ({t['none']} no clear difference, {t['worse']} worse)"


def headline(s: dict) -> str:
    """The counts of docs/RESULTS.md's answers, in a paragraph."""
    test, shifted, adv = (_split(s, r) for r in ("test", "shifted", "adversarial"))
    per_sample, broadcast = ss_vs_losses(test)
    tnr, others = tnr_ranges(test)
    parts = [f"in distribution (`test`) {_how_often(learned_vs_mcp(test))}"]
    if shifted is not None:
        noise = shifted["shift"][0].replace("_", " ").replace("gaussian", "Gaussian")
        parts.append(f"under {noise} (severity {shifted['shift'][1]}) "
                     f"{_how_often(learned_vs_mcp(shifted))}")
    if adv is not None:
        parts.append(f"on PGD examples aimed at the classifier {_how_often(learned_vs_mcp(adv))}")
    return (f"How often a learned oracle (every loss, fine-tuned and head-only) beats the "
            f"classifier's own softmax (MCP) on AURC, by paired bootstrap intervals on the "
            f"embedded Fashion-MNIST: {'; '.join(parts)}. SS beats per-sample CE, focal and TCP "
            f"trained the same way on AUC in {per_sample['better']} of "
            f"{sum(per_sample.values())} pairs on `test` (the authors' broadcasting CE and focal "
            f"in {broadcast['better']} of {sum(broadcast.values())}) and rejects far more wrong "
            f"answers at the 0.5 threshold (TNR {tnr}% against {others}%).")


def demo_time() -> str:
    d = load("demo-2cpu.json")
    return (f"On a {d['clone']} clone, `make demo` took {d['total_min']:.1f} min on a "
            f"{device_name(d)} ({d['date']}): install {d['install_min']:.1f} min, then the "
            f"demo's {d['commands']} commands in {d['demo_min']:.1f} min, the fits, attacks and "
            f"fine-tuned runs {d['jobs']} at a time. The time varies with the machine and its load.")


def render(summary: dict | None = None) -> dict[str, str]:
    s = prepared(load_summary() if summary is None else summary)
    return {"headline": _wrap(headline(s)), "demo-time": _wrap(demo_time())}


def _wrap(text: str) -> str:
    return textwrap.fill(text, 100, break_long_words=False, break_on_hyphens=False)


def stale(text: str, rendered: dict[str, str]) -> list[str]:
    have = blocks_of(text, rendered, README)
    return [name for name, body in rendered.items() if have[name] != body]


def main(argv: list[str] | None = None, summary: dict | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a block is stale")
    args = ap.parse_args(argv)
    try:
        rendered = render(summary)
        text = README.read_text()
        if args.check:
            bad = stale(text, rendered)
            if bad:
                raise Refused(f"README.md: block(s) {', '.join(bad)} are stale: run python "
                              "bench/readme_blocks.py")
            return 0
        README.write_text(rewrite(text, rendered, README))
        return 0
    except (Refused, Stale) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
