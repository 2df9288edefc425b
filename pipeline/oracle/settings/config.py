"""A train-oracle run's configuration: every setting declared once, as a field of ``TrainConfig``
with the option that sets it and the part of the run it belongs to.

    cfg = config_from_params(ctx.params)        # given.py: train-oracle's (or the API's) options
    cfg, origin = resolve_protocol(cfg, embedded=True)   # presets fill what was not given
    record = as_record(cfg)                     # record.py: run.json's config, the group hash

Parts (field metadata ``part``): ``run`` settings define what is trained and enter the group hash;
``seed`` (runs differing only in it share a group); ``where`` inputs and outputs live (replaced in
the hash by the training cache's identity); ``runtime`` (how fast, how often logged; never what is
trained).  ``fine_tune_only`` settings are refused with --head-only; ``bank_free`` ones may differ
between the head-only runs trained as one bank.  Everything that lists settings derives from these
fields: the options, the same-run comparison, the group hash, the loss options.  How a field and
its option are declared: ``fields.py``.  Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from pipeline.core.losses import HEAD_ARCHS, HEADS, loss_params, names
from pipeline.core.options import (BATCH, BATCH_SIZE, CLASSIFIER, DATA, DEVICE, FRACTION, LABELS,
                                   MODEL_KWARGS, NO_PROGRESS, NON_NEGATIVE, PRECISION, PREPROCESS,
                                   RANDOM_INIT, SEED_OPT, WEIGHTS, WORKERS, Choice, IntRange, Opt,
                                   PathValue, positive)
from pipeline.core.presets import EMBEDDED_ORACLE, PAPER_LOSS, PAPER_ORACLE
from pipeline.oracle.settings.fields import loss_param, param_option, preset_default, setting

HEAD_INPUTS = ("features", "stacked")
PATH = PathValue()


@dataclass(frozen=True)
class TrainConfig:
    """A training run's settings, one field per option of ``cli.py train-oracle`` (the field's
    option and its help are declared with it; docs/CLI.md lists them all).  Built from options
    by ``trust_oracles.settings`` or the command line, the same parsing and defaults; run.json
    records it.

    Attributes
    ----------
    classifier, oracle : str
        The classifier whose cache holds the targets, and the oracle's backbone (None: the
        classifier's), presets or timm names.
    loss : str
        ce, focal, tcp or ss (the paper's steep slope), or a registered loss of your own.
    data, cache, out, runs_root : str
        Where the data, the caches and the run directory are.
    train_split, eval_splits
        The cache tag trained on, and the tags scored after training.
    head_only : bool
        A head on the classifier's cached features instead of a fine-tuned oracle.
    epochs, batch_size, lr, seed
        The protocol's (the dataset's preset fills what is not given); every other field: the
        ``train-oracle`` option of the same name.
    """

    # what is trained on, by which classifier
    classifier: str = setting("vit", CLASSIFIER.but(help="The classifier whose cache holds the "
                              "targets: preset (vit, resnet) or timm name, as given to extract."))
    oracle: str | None = setting(None, Opt(("--oracle",), group="model", help="Oracle backbone: "
                                 "preset or timm name.", default_text="the classifier's name (on "
                                 "Fashion-MNIST vit/resnet = the fitted small models)"))
    loss: str = setting(PAPER_LOSS, Opt(("--loss",), type=Choice(names()), group="protocol",
                                  help="The oracle's loss: cross-entropy, focal, TCP (ConfidNet's) "
                                  "or SS (the paper's steep slope)."), loss=True)
    data: str | None = setting(None, DATA, "where")          # None: the embedded Fashion-MNIST
    cache: str = setting("artifacts/fashion-mnist/cache", Opt(("--cache",), type=PATH,
                         group="data", help="Cache root given to extract.",
                         default_text="artifacts/<dataset>/cache"), "where")
    out: str | None = setting(None, Opt(("--out",), type=PATH, group="output", metavar="DIR",
                              help="Run directory; a complete run there is skipped, an "
                              "incomplete one resumed.", default_text="artifacts/<dataset>/runs/"
                              "<oracle>-<classifier>_<loss>[_<variant>]_seed<N>_<group>"),
                              "where", bank_free=True)
    runs_root: str | None = setting(None, Opt(("--runs-root",), type=PATH, group="output",
                                    metavar="DIR", help="Parent of the default run directory "
                                    "(e.g. one root per preprocessing, for `report --runs-root`).",
                                    default_text="artifacts/<dataset>/runs"),
                                    "where", bank_free=True)
    labels_file: str | None = setting(None, LABELS, "where")
    train_split: str = setting("train", Opt(("--train-split",), group="data",
                                            help="Cache tag to train on."))
    eval_splits: tuple[str, ...] = setting((), Opt(("--eval-split", "eval_splits"), multiple=True,
                                           group="data", help="Extra cache tag(s) to score "
                                           "after training (repeatable), e.g. "
                                           "test-defocus_blur-5; the dataset's test (embedded) / "
                                           "val split is always scored.", default_text="none"),
                                           "where")
    seed: int = setting(0, SEED_OPT.but(help="Seed of the oracle's initialisation, data order "
                                        "and augmentation; runs that differ only in it make one "
                                        "group."), "seed")
    # the oracle backbone and its head
    weights: str | None = setting(None, WEIGHTS.but(help="Oracle backbone weights file.",
                                                    default_text="the classifier's file for an "
                                                    "oracle of its architecture (see "
                                                    "--hub-weights), else the hub's"))
    # the --weights file's identity, filled by prepare: its sha256 stands for the path in the
    # group hash, so ./k3.pth and k3.pth are one group and a file changed in place is another
    weights_sha256: str | None = setting(None, None)
    random_init: bool = setting(False, RANDOM_INIT.but(help="Random oracle backbone (tests, "
                                                            "benchmarks)."))
    # Where an oracle of the classifier's architecture starts without --weights/--random-init:
    # the weights file the classifier cache recorded (prepare fills ``weights`` with it), or the
    # hub's.  ``weights``/``weights_sha256`` record the outcome (the group hash), so the flag is
    # not itself part of the group: the same weights make the same group however chosen.
    hub_weights: bool = setting(False, Opt(("--hub-weights",), is_flag=True, group="model",
                                help="Start the oracle from timm's hub weights even when it has "
                                "the classifier's architecture. Without --weights, --random-init "
                                "or this, such an oracle starts from the weights file the "
                                "classifier's cache recorded (`extract --weights`), checked "
                                "against the cache by content; any other oracle from the hub."),
                                "where")
    model_kwargs: dict = setting(opt=MODEL_KWARGS.but(help="JSON for the oracle's "
                                                      "timm.create_model."), factory=dict)
    preprocess: str | None = setting(None, PREPROCESS.but(default=None, help="Oracle "
                                     "preprocessing (model or paper, as for extract).",
                                     default_text="the classifier cache's"))
    z: str | None = setting(None, Opt(("--ss-distance", "z"), aliases=("--z",),
                            type=Choice(HEADS), group="protocol", help="SS only: what its "
                            "slopes act on: hyperplane = the signed distance (w.x+b)/(|w|+1e-7) "
                            "(the authors'), linear = the plain w.x+b ('linear z' in the "
                            "report).", default_text="hyperplane"), loss=True)
    # the loss (None / False = not given: the loss's resolve fills the defaults).  Its own
    # parameters, given ones only, by name: their options come from pipeline.core.losses, here
    loss_params: dict = setting(opt=None, factory=dict, loss=True, bank_free=True)
    class_balanced: bool = setting(False, Opt(("--class-balanced",), is_flag=True,
                                   group="protocol", help="ce/focal/ss: Cui et al. "
                                   "effective-number weights from the training rows' "
                                   "correctness."), loss=True, bank_free=True)
    cb_beta: float | None = loss_param("cb_beta")
    pos_weight: float | None = loss_param("pos_weight")
    neg_weight: float | None = loss_param("neg_weight")
    broadcast: bool = setting(False, Opt(("--authors-broadcast", "broadcast"), is_flag=True,
                              group="protocol", help="ce/focal: reproduce the authors' shape bug "
                              "((B,1) outputs x (B,) labels -> mean over all BxB pairs)."),
                              loss=True)
    # optimisation.  None = not given: resolve_protocol fills these from presets.PAPER_ORACLE
    # (the paper's protocol) or, on the embedded dataset, presets.EMBEDDED_ORACLE; --help shows
    # both (preset_default)
    lr: float | None = setting(None, Opt(("--lr",), type=positive(), group="protocol",
                               help="Peak LR of SGD's OneCycle schedule.",
                               default_text=preset_default("lr", "")))
    weight_decay: float | None = setting(None, Opt(("--weight-decay",), type=NON_NEGATIVE,
                                                   group="protocol", help="SGD weight decay.",
                                                   default_text=preset_default("weight_decay",
                                                                               "")))
    momentum: float | None = setting(None, Opt(("--momentum",), type=FRACTION, group="protocol",
                                               help="SGD momentum, 0 <= m < 1.",
                                               default_text=preset_default("momentum", "")))
    warmup_steps: int | None = setting(None, Opt(("--warmup-steps",), type=IntRange(0),
                                       group="protocol", help="OneCycle warm-up (capped at 30% "
                                       "of short runs).",
                                       default_text=preset_default("warmup_steps", "")))
    cycle_momentum: bool = setting(False, Opt(("--cycle-momentum",), is_flag=True,
                                   group="protocol", help="OneCycleLR's momentum cycling "
                                   "0.85-0.95, which overrode --momentum in the authors' runs "
                                   "(the authors' code, luoyan407/predict_trustworthiness)."))
    batch_size: int | None = setting(None, BATCH_SIZE.but(help="Global batch (all GPUs).",
                                                          group="protocol",
                                                          default_text=preset_default(
                                                              "batch_size", "")))
    accum_steps: int = setting(1, Opt(("--accum-steps",), type=IntRange(1),
                               group="runtime", help="Micro-batches per optimizer step and GPU "
                               "(same global batch)."), fine_tune_only=True)
    epochs: int | None = setting(None, Opt(("--epochs",), type=IntRange(1),
                                 group="protocol", help="Training epochs. A split too small for "
                                 "the paper's one epoch (< 100 optimizer steps) trains the fewest "
                                 "epochs that reach 100 steps, at most 50, with a note.",
                                 default_text=preset_default("epochs", "")))
    flip: bool = setting(True, Opt(("--flip/--no-flip",), group="protocol",
                                   help="Random horizontal flip."))
    # which rows
    train_limit: int | None = setting(None, Opt(("--max-samples", "train_limit"),
                                      aliases=("--train-limit",), type=IntRange(0),
                                      group="data", help="Train on a seeded subset of N training "
                                      "rows; 0 = every row.",
                                      default_text=preset_default("train_limit", "every row")))
    val_fraction: float = setting(0.05, Opt(("--val-fraction",), type=FRACTION, group="protocol",
                                  help="Held-out rows carved from the training split to choose "
                                  "the checkpoint (0: keep the final model); under 100 rows (or "
                                  "10 right or wrong ones) warns."))
    val_every: int | None = setting(None, Opt(("--val-every",), type=IntRange(1),
                                    group="protocol", help="Validate every N steps and at the "
                                    "end.", default_text=preset_default("val_every",
                                                                        "4 times per run")))
    split_seed: int = setting(0, SEED_OPT.but(decls=("--split-seed",), hidden=True, help="Seed "
                              "of --max-samples and the held-out rows (shared by every --seed)."))
    # numerics and runtime
    precision: str | None = setting(None, PRECISION.but(default_text=preset_default(
        "precision", "bf16 on a CUDA device, fp32 on the CPU")), fine_tune_only=True)
    channels_last: bool = setting(True, Opt(("--channels-last/--no-channels-last",),
                                            group="runtime", hidden=True, help="The oracle in "
                                            "the channels_last memory format (faster "
                                            "convolutions on GPUs)."), fine_tune_only=True)
    compile: bool = setting(False, Opt(("--compile", "compile"), is_flag=True, group="runtime",
                            help="torch.compile the training step: the oracle (fine-tuned), or "
                            "the head's forward and the loss (--head-only: fewer kernels a "
                            "step, not bit for bit the eager step; compiling takes seconds, more "
                            "than one epoch of ImageNet's head-only steps saves). Inside the "
                            "CUDA graph where there is one."), "runtime")
    cuda_graph: str = setting("auto", Opt(("--cuda-graph",), type=Choice(("auto", "on",
                              "off")), group="runtime", hidden=True, help="Capture the whole "
                              "training step (optimizer and schedule included) in one CUDA "
                              "graph: auto = where possible (one CUDA process, no --accum-steps, "
                              "bf16/fp32; with or without --compile; --head-only: any CUDA "
                              "device), else eager with a note; on = refuse where impossible. "
                              "run.json's step_path says which ran."), "runtime")
    device: str | None = setting(None, DEVICE, "runtime")
    workers: int | None = setting(None, WORKERS, "runtime", fine_tune_only=True)
    eval_batch_size: int = setting(256, Opt(("--eval-batch-size",), type=BATCH, group="runtime",
                                   hidden=True, help="Rows per batch of the evaluation passes "
                                   "(held-out rows, scored splits)."), "runtime",
                                   fine_tune_only=True)
    ckpt_every: int = setting(2000, Opt(("--ckpt-every",), type=IntRange(1),
                              group="runtime", hidden=True, help="Write a resumable checkpoint "
                              "every N steps."), "runtime", fine_tune_only=True)
    log_every: int = setting(10, Opt(("--log-every",), type=IntRange(1), group="runtime",
                             hidden=True, help="Log the training loss every N steps."),
                             "runtime")
    stop_at_step: int | None = setting(None, Opt(("--stop-at-step",), type=IntRange(1),
                                       group="runtime", help="Stop cleanly after step N "
                                       "(checkpoint written), e.g. to fit a job's time limit; "
                                       "re-run to continue.", default_text="the last step"),
                                       "runtime", fine_tune_only=True)
    resume: bool = setting(False, Opt(("--resume",), is_flag=True, group="runtime",
                           help="Require a checkpoint to continue from (an incomplete run is "
                           "resumed anyway; this refuses to start afresh)."), "runtime",
                           fine_tune_only=True)
    # head-only: the frozen oracle backbone's cached features (pipeline.oracle.headonly.train)
    head_only: bool = setting(False, Opt(("--head-only",), is_flag=True, group="model",
                              help="Freeze the oracle backbone and train its head on cached "
                              "features: `extract --features --flip-view` of the ORACLE's model "
                              "on the same splits (seconds per run). Writes an ordinary run "
                              "directory."), later=True)
    features_cache: str | None = setting(None, Opt(("--features-cache",), type=PATH,
                                         group="data", help="--head-only: cache root holding the "
                                         "oracle's feature caches.", default_text="--cache"),
                                         "where")
    head_arch: str = setting("linear", Opt(("--head-arch",), type=Choice(HEAD_ARCHS),
                             group="model", help="--head-only: one linear layer, or ConfidNet's "
                             "MLP (docs/TRAINING.md)."), head_only=True, later=True)
    head_inputs: str = setting("features", Opt(("--head-inputs",), type=Choice(HEAD_INPUTS),
                               group="model", help="--head-only: the features, or them and 6 "
                               "statistics of the classifier's logits."),
                               head_only=True, later=True)
    progress: bool = setting(True, NO_PROGRESS, "runtime", invert=True)
    artifacts: str = setting("artifacts/fashion-mnist", None, "where")   # <artifacts>/runs/<name>


def _meta(key: str, value=True) -> tuple[str, ...]:
    return tuple(f.name for f in fields(TrainConfig) if f.metadata[key] == value)


NOT_IN_GROUP = tuple(f.name for f in fields(TrainConfig) if f.metadata["part"] != "run")
FINE_TUNE_ONLY = _meta("fine_tune_only")
HEAD_ONLY = _meta("head_only")
LATER = _meta("later")
BANK_FREE = _meta("bank_free")
LOSS_OPTIONS = tuple(n for n in _meta("loss") if n != "loss")


def option_of(name: str) -> Opt:
    return TrainConfig.__dataclass_fields__[name].metadata["opt"]


def train_options() -> list[Opt]:
    """train-oracle's click options, in --help order: the losses' own parameters where
    ``loss_params`` is declared."""
    out = []
    for f in fields(TrainConfig):
        if f.name == "loss_params":
            out += [param_option(p) for p in loss_params().values()]
        elif f.metadata["opt"] is not None:
            out.append(f.metadata["opt"])
    return out


def resolve_protocol(cfg: TrainConfig, embedded: bool) -> tuple[TrainConfig, dict]:
    """Fill every protocol option left at None from the preset of the dataset (the one place
    where defaults are chosen).  Returns the resolved config and what was taken from where."""
    name = "EMBEDDED_ORACLE" if embedded else "PAPER_ORACLE"
    preset = EMBEDDED_ORACLE if embedded else PAPER_ORACLE
    given = {k: getattr(cfg, k) for k in preset}
    filled = {k: preset[k] if v is None else v for k, v in given.items()}
    if filled["train_limit"] == 0:        # explicit "every row" (the embedded preset has a limit)
        filled["train_limit"] = None
    origin = {"preset": f"pipeline.presets.{name}",
              "from_preset": sorted(k for k, v in given.items() if v is None)}
    return replace(cfg, **filled), origin
