"""Stage 2, ``cli.py train-oracle`` and ``predict``: train an oracle on cached classifier targets
and write its outputs.  config.py  TrainConfig: every setting and its option   command.py  the CLI
prepare.py  caches, rows, loss, run dir, claim   loop.py  THE loop   log.py  log.jsonl/TensorBoard
train.py fine-tuned runs: finetune.py session (step.py, graph.py)   headonly.py head-only runs:
bank.py session on features.py   losses.py  HeadLoss (P heads)   model.py  backbone + Head
outputs.py  how every run ends (outputs, digests)   predict.py  new splits   checkpoint.py
targets.py  samples + their cache   sampler.py  deterministic order, flips, held-out rows
"""
