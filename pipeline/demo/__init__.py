"""``cli.py demo``: the whole pipeline on the embedded Fashion-MNIST, run as the ``cli.py``
commands a user would type (each a subprocess, printed before it runs).

command.py  the click command: options -> DemoConfig -> run
run.py      the plan (fit-classifier, extract, train-oracle grid, report), skipping done steps
"""
