"""Callbacks for `mindspore.train.Model`: progress, metrics, evaluation, checkpoints."""
