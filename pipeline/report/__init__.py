"""Stage 3, ``cli.py report``: tables, separability, figures and baselines from run directories
and classifier caches.  Imports only ``cache``, core's torch-free modules and itself.
command.py  the click command    run.py  plan -> evaluate in workers -> aggregate -> write
inputs.py   find/check runs and caches, plan   evaluate.py  workers: an output or a cache
scoring.py  every number of one split of one score   bootstrap.py  paired bootstrap intervals
aggregate.py  seeds -> rows   compare.py  seed-mean intervals, paired deltas   separability.py  A4
verdicts.py  fits+seeds+rows, Holm   baselines.py  post-hoc baselines   calibrate.py  T, p, REL-U
heldout.py  which rows   tables.py  md/csv/tex/json   markdown.py  report.md   export.py  fd-shifts
smallscale.py  paper's small-scale table   figplan.py  which figures   figures.py  histograms, RC
appendix.py  ImageNet-C, gradients, time   trustscore.py  TrustScore rows (knn.py: its search)
"""
