"""A finished run's chosen oracle on new data: predict.py (labelled splits ->
outputs/<tag>.h5), images.py (``predict --images``: new image files -> a table of trust answers),
threshold.py (the trust threshold: given, or picked on the run's held-out rows)."""
