"""Training recipes: each task module builds the model, batches, loss and metrics for one problem."""
