"""What every stage shares (``cache`` and itself only); this file imports nothing, so ``report``
can use its torch-free modules (metrics, counts, selective, losses, presets, options).

models.py     timm factory: presets, weights files, hub download, DataConfig (preprocessing)
precision.py  bf16/fp16/fp32 chosen once: autocast context, GradScaler on or off (torch lazily)
dist.py       torchrun / DDP plumbing;  losses.py  the oracle losses described without torch
presets.py    named models, the paper's protocol and the embedded dataset's settings
metrics.py    trustworthiness metrics, pure numpy (oracle validation and report)
selective.py  e-AUGRC, working points, ECE;  counts.py  every rank metric, from counts, vectorised
options.py    click helpers shared by the commands; timing.py  model-only inference time
"""
