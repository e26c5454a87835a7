"""The PyTorch bridge: PyTorch weights in (``convert``), compared layer by layer (``compare``), read without running
code (``state_dict``), renamed by rules (``name_mapping``), and a PyTorch model's source ported to MindSpore
(``port``, a subpackage: the command and its parts).

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): may import the app (to build a
network as a run would) and every wing below it, never the tools; only the layers above (the ``python -m
trainkit.<tool>`` entry points, ``trainkit.project``, ``trainkit.new``) may import it. No PyTorch at import (the same
test imports every module without it).
"""
