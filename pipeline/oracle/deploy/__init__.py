"""A finished run's chosen oracle on new data: predict.py (labelled splits ->
outputs/<tag>.h5), images.py (``predict --images``: new image files -> a table of trust answers),
rebuild.py (the run's classifier and oracle rebuilt, weights checked by hash), threshold.py (the
trust threshold: given, or picked on the run's held-out rows), exported.py (the chosen oracle as
an exported folder's weights and record, both models rebuilt from such a folder or an hf-hub: id)."""
