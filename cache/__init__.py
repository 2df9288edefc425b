"""Versioned on-disk formats: classifier caches (stage 1) and oracle outputs (stage 2).

errors.py     TrustOraclesError: the base of every error a user can fix (exit code, one line)
schema.py     the schema version, columns, identity attributes, CacheError
shards.py     HDF5 shard writer/reader: column hashes, identity and size checks, load_split
columns.py    one column of a whole cache read by threads, verified, into an array or a sink
claim.py      an output folder claimed (new, resumed, complete, or refused naming what differs)
manifest.py   identity.json / manifest.json, the cache directory's claim rule, damaged shards
reader.py     ClassifierCache: the API later stages read a complete cache with
outputs.py    oracle output files (one per evaluated split of a run); MadeOn, what made scores
runs.py       run directories (RunDir): the one module naming their files
runfile.py    run.json, typed (RunFile)
runlog.py     log.jsonl's lines: written as strict JSON, read with a torn last line dropped
runcache.py   the classifier cache a run trained on, found from any folder, checked by identity
predictions.py  predict --images' tables
export.py     an exported oracle's folder (Hugging Face Hub layout): its version, written whole,
              every file checked by sha256, the model card's weights hash
integrity.py  checksums (XXH3) and the one "disk full" error
atomic.py     every file written under a temporary name, then renamed over the old one; JSON records
lock.py       DIR/.lock: one writing process per cache or run directory
"""
