"""``cli.py fit-classifier``: train a base classifier (the embedded dataset's stand-ins for hub
weights, or any timm model on an ImageFolder) and save a checkpoint ``extract`` loads.

command.py  the click command: options -> FitConfig -> fit
fit.py      the training recipe, held-out accuracy; checkpoint.py: the checkpoint and its metadata
"""
