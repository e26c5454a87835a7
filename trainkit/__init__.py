"""trainkit: a configurable training loop for MindSpore."""
from trainkit.ema import ExponentialMovingAverage
from trainkit.wrapper import TrainingWrapper

__all__ = ["TrainingWrapper", "ExponentialMovingAverage"]
__version__ = "0.1.0"
