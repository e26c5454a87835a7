"""trainkit: a configurable training loop for MindSpore.

``TrainingWrapper``, ``ExponentialMovingAverage``, ``Callback`` and ``CallbackState`` are imported on first
use, not with the package: importing MindSpore reads its log level (``GLOG_v``) once, and ``python -m trainkit``
sets that level before it imports anything of MindSpore (``trainkit/__main__.py``).
"""
import sys

if sys.argv[:1] == ["-m"]:  # python -m is importing the package before its __main__: route the signals first
    from trainkit.process import signals as _signals

    _signals.start_command("trainkit", "trainkit.export", "trainkit.predict", "trainkit.evaluate",
                           "trainkit.compare", "trainkit.convert", "trainkit.port")  # then process.tool_command

from trainkit.process import moved_modules as _moved_modules

_moved_modules.install()  # the module paths before 0.2 (trainkit.losses, ...) import, with a DeprecationWarning

__all__ = ["Callback", "CallbackState", "TrainingWrapper", "ExponentialMovingAverage"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    if name == "TrainingWrapper":
        from trainkit.step.wrapper import TrainingWrapper

        return TrainingWrapper
    if name == "ExponentialMovingAverage":
        from trainkit.step.ema import ExponentialMovingAverage

        return ExponentialMovingAverage
    if name in ("Callback", "CallbackState"):
        from trainkit.callbacks import base

        return getattr(base, name)
    raise AttributeError(f"module 'trainkit' has no attribute {name!r}")
