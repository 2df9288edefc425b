"""Stage 1, ``cli.py extract``: run a frozen classifier over a split once and cache its outputs.

command.py  the click command: options -> splits.py (an ExtractConfig per split) -> their runs
run.py      resolve config -> claim the cache directory -> loader -> model -> sink -> manifest
forward.py  the classifier's passes per batch (flipped view, MC-Dropout); finish.py  the manifest
claim.py    the cache directory locked and claimed; shards already there checked, also against
            the images' stamps (damaged ones and those of changed images removed: recomputed)
sink.py     per-shard buffers filled by global index (non-finite logits refused), written as
            HDF5 shards with the images' hashes when full
mcdropout.py  --mc-dropout: T seeded passes with only the dropout active, summarised per row
"""
