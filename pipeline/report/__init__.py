"""Stage 3, ``cli.py report``: tables, separability, figures and baselines from run directories
and classifier caches.  Imports only ``cache``, core's torch-free modules and itself.
command.py  the click command    run.py  plan -> evaluate in workers -> aggregate -> write
inputs.py   find/check runs and caches, plan   heldout.py  which rows   calibrate.py  T, p, REL-U
evaluate.py  workers: an output or a cache   scoring.py  every number of a score on a split
bootstrap.py  paired bootstrap intervals   aggregate.py  seeds -> rows   separability.py  A4
compare.py  seed-mean CIs, paired deltas   verdicts.py  fits+seeds+rows (significance.py: p, Holm)
baselines.py  post-hoc   tables.py  md/csv/tex/json   markdown.py  report.md   export.py  fd-shifts
smallscale.py  paper's small-scale table   figplan.py  which figures   figures.py  histograms, RC
appendix.py  ImageNet-C, gradients, time   trustscore.py  TrustScore rows (knn.py: its search)
"""
