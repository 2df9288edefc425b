"""``cli.py sweep``: a grid over SS's alpha+/alpha- (or other numeric loss options), one oracle per
point (head-only by default), chosen on held-out validation rows; the paper's Fig. 4b/c.

command.py  the click command (train-oracle's options pass through)
grid.py     the paper's coordinate protocol or a full grid; the choice criterion
run.py      stages -> points as ordinary train-oracle runs -> metrics -> choice -> command
report.py   the table (md/csv/json) and the Fig. 4b/c PNGs
"""
