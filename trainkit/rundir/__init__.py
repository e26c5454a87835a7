"""What a run directory holds, and how it is read and written safely.

``checkpoint_file`` (training checkpoints: contents, durable writes, CRC32, finding one; ``checkpoint`` keeps the
old names), ``stateful_parts`` (the registry of the parts that save and restore themselves), ``stored_config`` and
``trust`` (a config read from a file is data: no interpolation, trusted targets only), ``weights`` (a network's
weights from any trainkit checkpoint, strict loading), ``parameter_fit`` (whether named values fit a network),
``command`` (the command line and Hydra files that made a run, and the one that continues it), ``lock`` (one run per
directory), ``output_file`` (written whole or not at all) and ``held_log`` (log lines held until the input is
accepted, so a refusal leaves ``train.log`` as it was).

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): may import the parts
(``step``, ``models``, ``data``, ``parts``), ``kernels`` and the foundation (``checks``, ``process``,
``errors``); never ``distributed``, the callbacks, the app, the bridge or the tools.
"""
