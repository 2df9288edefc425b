"""What every stage shares (``cache`` and itself only); this file imports nothing, so ``report``
can use the torch-free modules (metrics, counts, selective, presets, options, losses, artifacts).
models.py     timm factory: presets, weights files, hub (hub.py: caches first), DataConfig
precision.py  bf16/fp16/fp32: the one default rule, autocast context, GradScaler (torch lazily)
dist.py  torchrun / DDP plumbing; stop.py  Ctrl-C as a request a loop honours at safe points; timing.py  model-only inference time; presets.py  named
              models, the paper's protocol and the embedded dataset's settings
metrics.py    trustworthiness metrics, pure numpy (oracle validation and report)
selective.py  e-AUGRC, working points, ECE;  counts.py  every rank metric, from counts, vectorised
options.py    every shared option declared once (Opt, bundles); losses.py  which losses exist
catalog.py    which metrics the report shows (pure Python); artifacts.py  artifacts/<dataset> roots
"""
