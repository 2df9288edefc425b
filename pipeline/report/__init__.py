"""Stage 3, ``cli.py report``: tables, separability, figures and baselines from run directories
and classifier caches.  Imports only ``cache``, core's torch-free modules and itself.
command.py  the click command      run.py       plan -> evaluate in workers -> write
inputs.py   find and check runs and caches; evaluate one output file or cache
scoring.py  every number of one split of one score   bootstrap.py  paired bootstrap intervals
compare.py  seed-mean intervals, SS-vs-other differences   separability.py  Table A4
baselines.py  MCP ... MaxLogit-pNorm   calibrate.py  fit T and p   heldout.py  on which rows
tables.py   md/csv/tex/json writers   markdown.py  report.md   export.py  fd-shifts input files
figures.py  histograms (Fig. 3), risk-coverage curves   appendix.py  ImageNet-C blocks, gradient
magnitudes, inference time (paper appendix)
"""
