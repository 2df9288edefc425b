"""``cli.py demo``: the whole pipeline on the embedded Fashion-MNIST, run as the ``cli.py``
commands a user would type (each a subprocess, printed before it runs).

command.py  the click command: options -> DemoConfig -> run
steps.py    DemoConfig, a Step (one command), the caches and adversarial split of a model
plan.py     the plan: fit-classifier, extract, attack, train-oracle grid, predict, sweep, report
run.py      runs the plan's commands, skipping done steps; demo.json, the report's main table
jobs.py     the plan as a job list in waves (--job-list), one job of it run (--job)
pretrained.py  --pretrained-oracle: the pretrained study (Lite0, Lite2; O = C and cross pairs)
"""
