"""Datasets as data modules: `prepare()` checks (or downloads) the files, then `train_dataset()` / `eval_dataset()`."""
from trainkit.data.cifar10 import Cifar10Data
from trainkit.data.digits import DigitsData
from trainkit.data.values import check_values, num_classes_of

__all__ = ["Cifar10Data", "DigitsData", "check_values", "num_classes_of"]
