"""The PyTorch bridge: PyTorch weights in (``convert``), compared layer by layer (``compare``), read without running
code (``state_dict``), renamed by rules (``name_mapping``), and a PyTorch model's source ported to MindSpore
(``port``, a subpackage: the command and its parts).

Import rule: may import the app (to build a network as a run would), the run directory and the wings below;
nothing of trainkit imports the bridge except its ``python -m trainkit.<tool>`` entry points. No PyTorch at import.
"""
