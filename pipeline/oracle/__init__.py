"""Stage 2, ``cli.py train-oracle`` and ``predict``: train oracles on cached classifier targets.

command.py  the click commands   config.py  TrainConfig   defaults.py  what a run's data decides
prepare.py  caches, rows, loss, run dir   targets.py  samples + their cache   train.py  one run
sampler.py  deterministic order, flips, held-out rows   loop.py  the one loop; log.py its log
model.py    backbone + head   heads.py  linear / ConfidNet heads, logit stats   losses.py  on z
finetune.py fine-tuned runs   step.py  one optimizer step   graph.py  that step as a CUDA graph
headonly.py --head-only runs  bank.py  P heads at once  headgraph.py  their step as a CUDA graph
capture.py  what both graphs share   features.py feature caches   checkpoint.py   outputs.py
predict.py  the run's oracle over cached splits -> outputs/<tag>.h5; deploy.py, threshold.py"""
