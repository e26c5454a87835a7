"""Tools on checkpoints and runs: ``evaluate`` (weights without training) and ``export`` (the network alone).

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): may import the app and every wing
below it, never the bridge; only the layers above (the ``python -m trainkit.<tool>`` entry points,
``trainkit.project``, ``trainkit.new``) may import it.
"""
