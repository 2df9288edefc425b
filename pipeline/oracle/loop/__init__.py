"""What every oracle run shares, fine-tuned or head-only: fit.py (the one training loop: sync
points, validation, best checkpoints, stopping), state.py (its settings, its state, the session
protocol), window.py (a sync on the host: a window collected, then settled: NaN check, counts,
log lines), validation.py (the held-out metrics
that choose each head's best), log.py (log.jsonl and the running
counts), schedule.py (SGD + OneCycle, built one way, and the loop's settings), outputs.py (how a
run ends: its scores written per split), rundir.py (the run directory claimed, its extras
written), capture.py (what both CUDA-graphed steps share)."""
