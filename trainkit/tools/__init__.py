"""Tools on checkpoints and runs: ``evaluate`` (weights without training) and ``export`` (the network alone).

Import rule: may import the app, the run directory and the wings below; nothing of trainkit imports the tools
except their ``python -m trainkit.<tool>`` entry points.
"""
