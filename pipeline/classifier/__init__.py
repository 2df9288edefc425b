"""``cli.py fit-classifier``: train a base classifier (the embedded dataset's stand-ins for hub
weights, or any timm model on an ImageFolder) and save a checkpoint ``extract`` loads; ``cli.py
import-weights``: another implementation's weights file as such a checkpoint.

command.py  the click command: options -> FitConfig -> fit
fit.py      what is fitted, on which rows, saved where; checkpoint.py: the checkpoint and its meta
recipe.py   the training recipe (augmentation, schedule, epochs), held-out accuracy
imported.py import-weights: another implementation's weights file -> a project checkpoint
"""
