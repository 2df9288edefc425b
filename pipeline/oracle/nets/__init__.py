"""The networks of an oracle: model.py (a timm backbone + one scalar head: built to train, or a
finished run's rebuilt to score), heads.py (linear / hyperplane and ConfidNet's MLP heads, on
features or stacked inputs), losses.py (CE, focal, TCP, SS on z, per head of a bank; a user's
own loss), checkpoint.py (training checkpoints, written atomically, read weights-only),
patchgemm.py (a ViT's patch embedding as one GEMM: the convolution's weights and outputs)."""
