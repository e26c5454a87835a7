"""Datasets as data modules: `prepare()` checks (or downloads) the files, then `train_dataset()` / `eval_dataset()`.

What the app and the tools may read of a data module besides its datasets:

- ``class_names: Optional[List[str]]`` -- index i names class i (None or absent: no names, or a regression). The
  app stores them in the run directory and in every checkpoint it writes (:mod:`trainkit.rundir.class_names`).
- ``predict_samples(inputs: Sequence[str]) -> Iterator[Tuple[str, Optional[np.ndarray], Optional[str]]]`` (the
  image-folder and table modules) -- for each input (an image file, or a table whose rows are the inputs): its
  id (the file's path, or the row's number), the sample prepared as the evaluation set's are (never with the
  training augmentations; a table with the training split's stored statistics) or None, and a one-line error
  for an input that cannot be read (None otherwise). One bad input does not stop the others.
"""
from trainkit.data.cifar10 import Cifar10Data
from trainkit.data.digits import DigitsData
from trainkit.data.values import check_values, num_classes_of

__all__ = ["Cifar10Data", "DigitsData", "check_values", "num_classes_of"]
