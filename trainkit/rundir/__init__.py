"""What a run directory holds, and how it is read and written safely.

``checkpoint`` (training checkpoints: contents, durable writes, finding and checking one to resume), ``weights``
(a network's weights from any trainkit checkpoint, strict loading, atomic writes), ``parameter_fit`` (whether named
values fit a network) ``command`` (the command line and Hydra files that made a run, and the one that continues
it) and ``held_log`` (log lines held until the input is accepted, so a refusal leaves ``train.log`` as it was).

Import rule: imports the step library (the names of its state) and the foundation (``errors``, ``checks``) only;
never the callbacks, the app, the bridge or the tools.
"""
