"""``cli.py sweep``: sweep options + train-oracle's options (passed through) -> one call."""
from __future__ import annotations

from pathlib import Path

import click

from pipeline.core.losses import all_params, option_losses
from pipeline.core.commandline import Command, options
from pipeline.core.options import GROUPS, Opt, positive
from pipeline.oracle.settings.config import train_options
from pipeline.sweep.grid import CRITERIA, DEFAULT_VALUES


def _value_list(name: str) -> Opt:
    """The sweep's list of values of one numeric loss option of train-oracle: --<option>-values
    (the old name, the option's own flag, still works: a list here, one value in train-oracle)."""
    p, default = all_params()[name], DEFAULT_VALUES.get(name)
    return Opt((f"{p.flag}-values", name), aliases=(p.flag,), group="protocol",
               help=f"{'/'.join(option_losses(name))}: comma-separated values of train-oracle's "
               f"{p.flag} to sweep" + (" (implies --class-balanced)" if name == "cb_beta" else "")
               + ".", default_text=(f"{','.join(f'{v:g}' for v in default)} in an SS sweep given "
                                    "no value list" if default else "not swept"))


# train-oracle's options the sweep sets or refuses itself (the rest pass on to every point);
# --runs-root is accepted but each point's run goes under the sweep's --out (run.py)
SETS = ("--head-only", "--out", "--resume", "--stop-at-step")
OWN_RUNS_ROOT = "--runs-root"


def passed_on() -> tuple[str, list[tuple[str, str]]]:
    """sweep --help's last section: train-oracle's options it passes on, by group."""
    by_group: dict[str, list[str]] = {}
    for opt in train_options():
        if opt.hidden or opt.flag in (*SETS, OWN_RUNS_ROOT) or opt.name in all_params():
            continue
        by_group.setdefault(opt.group, []).append(opt.flag)
    rows = [(GROUPS[g].split()[0].lower(), ", ".join(flags)) for g, flags in
            sorted(by_group.items(), key=lambda kv: list(GROUPS).index(kv[0]))]
    return "Passed on to train-oracle (see train-oracle --help)", rows


@click.command("sweep", cls=Command, passes_on=passed_on(),
               context_settings={"ignore_unknown_options": True, "allow_interspersed_args": True})
@options(
    *(_value_list(name) for name in all_params()),
    Opt(("--fixed-alpha-pos",), type=positive(), group="protocol", help="alpha+ while alpha- "
        "is swept (paper protocol).", default_text="the oracle's preset (ViT 1, ResNet 2; other "
        "backbones: train-oracle's rule, presets.ss_slopes)"),
    Opt(("--fixed-alpha-neg",), type=positive(), group="protocol", help="alpha- while only "
        "alpha+ is swept.", default_text="the oracle's preset (ViT 3, ResNet 5; other backbones "
        "as for --fixed-alpha-pos)"),
    Opt(("--mode",), type=click.Choice(["paper", "grid"]), default="paper", group="protocol",
        help="paper: alpha- with alpha+ fixed, then alpha+ at the chosen alpha-, then each "
        "further option in turn; grid: every combination."),
    Opt(("--criterion",), type=click.Choice(list(CRITERIA)), default="tpr-tnr",
        group="protocol", help="What the choice maximises on the HELD-OUT validation rows: "
        "tpr-tnr = (TPR + TNR) / 2 (the paper's trade-off), or the chosen checkpoint's "
        "AUPR-Error (standard), AUC, AUPR-Success."),
    Opt(("--fine-tune",), is_flag=True, group="model", help="One ordinary (full fine-tuning) "
        "train-oracle run per point, resumable, instead of head-only oracles on cached "
        "features."),
    Opt(("--out",), type=click.Path(path_type=Path), group="output", metavar="DIR",
        help="Sweep directory (runs/, sweep.md/.csv/.json, figures/).",
        default_text="artifacts/<data folder>/sweeps/<oracle>-<classifier>_<loss>_"
        "<head-only|fine-tune>_seed<N>_<hash>"),
    Opt(("--no-figures",), is_flag=True, group="output", help="Skip the PNG figures."),
)
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
def sweep(fixed_alpha_pos, fixed_alpha_neg, mode, criterion, fine_tune, out, no_figures,
          train_args, **value_lists):
    """Choose loss parameters on held-out rows: one oracle per point (the paper's Figure 4b/c).

    Every other option is train-oracle's and is shared by all points, e.g.

        python cli.py sweep --classifier vit --oracle vit

    (SS, paper protocol, head-only oracles on `extract --features --flip-view` caches). Ends by
    printing the train-oracle command with the chosen values; re-running skips complete points.
    Given neither --data nor --cache, it takes the data folder whose caches the one artifacts
    root under ./artifacts holding caches was extracted from (named; several: refused, listed).
    """
    from cache.runs import RunError
    from pipeline.core.losses import LossOptionError
    from pipeline.oracle.command import check_head_only_options, config_of, train_oracle
    from pipeline.sweep.grid import SweepError, parse_values
    from pipeline.sweep.run import SweepConfig, default_fixed, run_sweep

    args = list(train_args)
    for flag in SETS:
        if flag in args:
            raise click.UsageError(f"{flag} is not a sweep option: the sweep "
                                   + ("sets it (--fine-tune for full runs)" if flag == "--head-only"
                                      else "names its runs under its own --out directory"))
    head = [] if fine_tune else ["--head-only"]
    ctx = train_oracle.make_context("train-oracle", args + head)
    if ctx.params["data"] is None and ctx.params["cache"] is None:
        data = data_worked_on()      # the caches under ./artifacts say which data; named
        if data is not None:
            args += ["--data", data]
            ctx = train_oracle.make_context("train-oracle", args + head)
    check_head_only_options(ctx)     # fine-tuned points refuse the head-only options too
    base = config_of(ctx.params)
    try:
        swept = {k: parse_values(v, k) for k, v in value_lists.items() if v}
        if not swept:        # the paper's ranges, for a loss they apply to (SS's slopes)
            swept = {k: v for k, v in DEFAULT_VALUES.items() if base.loss in option_losses(k)}
        fixed = default_fixed(base)
        fixed.update({k: v for k, v in (("alpha_pos", fixed_alpha_pos),
                                        ("alpha_neg", fixed_alpha_neg)) if v is not None})
        cfg = SweepConfig(base, tuple(args), swept, fixed, mode, criterion, fine_tune, out,
                          not no_figures)
        s = run_sweep(cfg, echo=click.echo)
    except (SweepError, LossOptionError) as err:
        raise click.UsageError(str(err)) from None
    except RunError as err:
        raise click.ClickException(str(err)) from None
    failed = [p for p in s["points"] if p["status"] != "complete"]
    click.echo(f"sweep: {len(s['points'])} point(s) in {s['elapsed_s']:.1f}s"
               + (f", {len(failed)} failed" if failed else "") + f"; {s['sweep_dir']}")
    for path in s["files"]:
        click.echo(f"  wrote {path}")
    click.echo("train the chosen oracle"
               + ("" if fine_tune else " (the sweep trained head-only oracles; add --head-only "
                  "for one)") + ":")
    click.echo(s["command"])


def data_worked_on() -> str | None:
    """``--data`` for a sweep given neither --data nor --cache: the data folder whose caches the
    one artifacts root under ./artifacts holding caches was extracted from (echoed); None, the
    embedded dataset, when that root is the embedded one's or no root holds caches (its missing
    cache is then named by train-oracle).  Several roots: refused, listed, never guessed."""
    from cache.manifest import read_json
    from pipeline.core.artifacts import ArtifactsError, cache_manifests, listing, roots_holding
    from pipeline.data.sources import default_artifacts

    found = roots_holding("cache")
    if len(found) > 1:
        raise ArtifactsError(f"no --data given, and several artifacts roots hold caches: "
                             f"{listing(found, 'cache')}; pick the data with --data DIR (the "
                             "folder extract read; --data fashion-mnist: the embedded dataset)")
    if not found:
        return None
    root = next(iter(found))
    datas = {read_json(p, "cache manifest")["config"].get("data") for p in cache_manifests(root)}
    datas = {d for d in datas if default_artifacts(d) == root}    # not e.g. an attack's split
    if len(datas) != 1:
        raise ArtifactsError(f"no --data given, and the caches of {root}/cache do not name one "
                             "data folder: pass --data DIR")
    data = datas.pop()
    click.echo(f"sweep: no --data given: {data or 'the embedded Fashion-MNIST'}, whose caches "
               f"are in {root}, the only artifacts root holding caches (pick another with --data)")
    return data
