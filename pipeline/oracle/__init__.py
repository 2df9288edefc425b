"""Stage 2, ``cli.py train-oracle`` and ``predict``: train oracles on cached classifier targets,
then score new data with them.  Sub-packages by job, each importing only those above it here:

nets/      the networks: backbone + head (model.py), the head family (heads.py), losses on z
settings/  what a run is: TrainConfig (config.py), defaults, its splits, rows and order, prepare
loop/      what every run shares: the one loop (fit.py), its log, schedule, outputs, capture
finetune/  fine-tuned runs on images (train.py; objects, step, graph: its CUDA graph)
headonly/  head-only runs on cached features (train.py; bank of heads, graph, features)
deploy/    a finished run's oracle over new splits (predict.py) and images (images.py)
command.py the click commands"""
