"""trainkit's Hydra launcher, ``hydra/launcher=trainkit`` (trainkit's default). Hydra instantiates launchers only
from the ``hydra_plugins`` namespace package; the work is done in :mod:`trainkit.app.sweep.launcher`."""
from trainkit.app.sweep.launcher import RepeatingLauncher


class TrainkitLauncher(RepeatingLauncher):
    """Hydra's basic launcher with ``sweep.repeats`` and a stopped sweep that ``trainer.resume=auto`` continues."""
