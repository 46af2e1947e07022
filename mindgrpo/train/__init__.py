"""Training: the trainer, its compiled step pieces, optimizer, checkpoints, metrics and process groups."""
