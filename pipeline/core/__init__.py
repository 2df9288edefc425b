"""What every stage shares (``cache`` and itself only); this file imports nothing, so ``report``
can use torch-free ones (metrics, counts, selective, presets, options, losses, artifacts, logits).
models.py  timm factory, weights files, hub (hub.py), DataConfig; heldout.py  classes held out
precision.py  bf16/fp16/fp32: the one default rule, autocast context, GradScaler (torch lazily)
inference.py  a model made ready to score (eval, frozen): the one way; errors.py  ModelError
dist.py  torchrun / DDP plumbing; stop.py  Ctrl-C honoured at safe points; timing.py  model time
presets.py  named models, the protocols; metrics.py  trust metrics (ranked.py: the one sort)
selective.py  e-AUGRC, working points, ECE;  counts.py  ranks;  logits.py  logit statistics
options.py  shared options, declared once (values.py: what each accepts); commandline.py  as click's
catalog.py    which metrics the report shows, by name; artifacts.py  artifacts/<dataset> roots"""
