"""Stage 3, ``cli.py report``: tables, separability, figures and baselines from run directories
and classifier caches.  Imports only ``cache``, core's torch-free modules and itself.
command.py  the click command    run.py  plan -> evaluate in workers -> aggregate -> write
inputs.py   find and check runs and caches, plan   evaluate.py  the workers: one output or cache
scoring.py  every number of one split of one score   bootstrap.py  paired bootstrap intervals
aggregate.py  seeds -> rows   compare.py  seed-mean intervals, SS-vs-other   separability.py  A4
baselines.py  the post-hoc baselines' table   calibrate.py  fit T, p, REL-U   heldout.py  on which rows
tables.py   md/csv/tex/json writers   markdown.py  report.md   export.py  fd-shifts input files
figplan.py  which figures, what each shows   figures.py  draws histograms (Fig. 3), risk-coverage
appendix.py  ImageNet-C, gradients, inference time   trustscore.py  TrustScore rows (knn.py: search)
"""
