"""Head-only runs: the oracle backbone frozen, its head trained on cached features.  train.py
(a group of runs that differ only in loss parameters, trained at once), bank.py (P heads as one
module, its session), graph.py (the bank's step as one CUDA graph), features.py (the feature
caches: which, joined to the classifier's rows, checked), staging.py (their columns onto the
device, on a GPU through pinned buffers), arrays.py (one head on features held in
memory, without a cache or a run directory: the public API's train_head)."""
