"""``cli.py attack``: an adversarial copy of a split against the frozen classifier (paper Table 2).

command.py  the click command: options -> AttackConfig -> one run
run.py      resolve config -> claim the output folder -> loader -> attack per batch -> PNGs +
            shard records -> manifest with accuracy on the stored images and attack success
methods.py  the attacks (torchattacks PGD L-inf / L2, ReColorAdv), defaults, option/input checks
recolor.py  ReColorAdv through its authors' package (the recoloradv extra), Luo et al.'s settings
store.py    the written split: claim, PNG files, per-shard records, listing checks
The split's on-disk format (read by every stage) is ``pipeline.data.attacked``.
"""
