"""Stage 2, ``cli.py train-oracle`` and ``predict``: train an oracle on cached classifier targets
and write its outputs for the evaluation splits.

command.py  the click commands      train.py   config -> run directory -> loop -> outputs
targets.py  samples + their cache   sampler.py deterministic order, flips, held-out rows
losses.py   CE, focal, TCP, SS      model.py   backbone + scalar head      loop.py  the loop
step.py     one optimizer step, validation, training state   graph.py  that step as a CUDA graph
checkpoint.py  atomic checkpoints   runs.py    run directories, run.json, log.jsonl
predict.py  a trained oracle over a split -> outputs/<tag>.h5 (``cache.outputs``)
headonly.py --head-only runs  head.py  P heads at once on features  features.py  feature caches
"""
