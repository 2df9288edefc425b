"""Fine-tuned runs: the whole oracle trained on images.  train.py (one run, end to end),
objects.py (model, optimizer, scheduler, the image session the loop drives), step.py (one
optimizer step, eager), graph.py (that step captured in one CUDA graph, one process or several)."""
