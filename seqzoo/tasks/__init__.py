"""Training recipes: each task module builds the model, batches, loss and metrics for one problem, and
registers itself by name (:func:`seqzoo.training.registry.register_task`); importing this package
registers the built-in ones."""

from seqzoo.tasks import absa, classification, lm, multitask, tagging, translation

__all__ = ["absa", "classification", "lm", "multitask", "tagging", "translation"]
