"""Stage 1, ``cli.py extract``: run a frozen classifier over a split once and cache its outputs.

command.py  the click command: options -> ExtractConfig -> one run per split
run.py      resolve config -> claim the cache directory -> loader -> model -> sink -> manifest
claim.py    the cache directory locked and claimed; shards already there checked (and the
            damaged ones removed, so they are recomputed)
sink.py     per-shard buffers filled by global index, written as HDF5 shards when full
The files written are ``cache``'s classifier caches (docs/DATA_CONTRACT.md).
"""
