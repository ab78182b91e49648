"""Training infrastructure: the trainer, run directories, checkpoints, statistics and plots."""
