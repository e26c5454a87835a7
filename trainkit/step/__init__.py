"""The step library: the Cells a user composes or subclasses to take one training step.

``wrapper`` (TrainingWrapper; ``running_totals``, what it logs without a read per step), ``ema`` (the shadow
weights), ``loss_scale`` (static/dynamic scaling), ``grad_ops`` (the per-tensor maps and grouped reductions the
wrapper runs), ``mixed_precision`` (AMP levels) and ``in_place`` (a value written into the memory compiled graphs
read).

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): may import ``kernels`` and the
foundation (``checks``, ``process``, ``errors``) only, none of the other parts (``models``, ``data``, ``parts``); a
user's loop can use it without the app, the callbacks or Hydra.
"""
