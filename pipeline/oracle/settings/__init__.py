"""What a run is, resolved before anything trains: config.py (TrainConfig and its options;
fields.py: how a field and its option are declared), given.py (options given by name -> a
TrainConfig, for the command line and the API alike), record.py (run.json's config, the group
hash), defaults.py (what the data decides: presets, epochs of small runs, the classifier's
weights), targets.py (a split: its samples joined to its classifier cache), sampler.py (the
deterministic order: held-out rows, batches, flips, seeds), prepare.py (caches checked, rows
carved, loss resolved, the run directory named)."""
