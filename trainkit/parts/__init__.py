"""The parts a run's config builds beyond networks and data: ``losses`` (``loss`` group: cross-entropy with label
smoothing), ``metrics`` (the evaluation loss as a mean over samples) and ``lr_schedule`` (``lr_schedule`` group: one
learning rate per update). Each is a ``_target_`` of a config group, like the models and data modules, and none is
part of the step Cells, so they sit beside ``models``, ``data`` and ``step`` rather than in one of them.

Nothing is exported here: ``trainkit.parts.losses.CrossEntropy`` and ``trainkit.parts.lr_schedule.cosine`` are the
``_target_``s the configs name (``trainkit.losses`` and ``trainkit.lr_schedule`` still import, with a warning, until
0.3.0), and importing the schedules needs no MindSpore.

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): may import ``kernels`` and the
foundation (``checks``, ``process``, ``errors``); independent of ``step``, ``models`` and ``data`` (neither imports
the other); nothing above (rundir, distributed, callbacks, app, tools, bridge).
"""
