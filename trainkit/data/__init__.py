"""Datasets as data modules: `prepare()` checks (or downloads) the files, then `train_dataset()` / `eval_dataset()`.

What the app and the tools may read of a data module besides its datasets:

- ``class_names: Optional[List[str]]`` -- index i names class i (None or absent: no names, or a regression). The
  app stores them in the run directory and in every checkpoint it writes (:mod:`trainkit.rundir.class_names`).
- ``predict_samples(inputs: Sequence[str]) -> Iterator[Tuple[str, Optional[np.ndarray], Optional[str]]]`` (the
  image-folder, table and text modules) -- for each input (an image file, a folder standing for its images, a
  table whose rows are the inputs, a sentence): its id (the file's path; a row's number, ``path:row`` with several
  tables; a sentence itself), the sample prepared as the evaluation set's are (never with the training
  augmentations; a table with the training split's statistics, texts with the run's tokenizer, which
  ``load_state_dict`` gives a fresh module) or None, and a one-line error for an input that cannot be read (None
  otherwise). One bad input does not stop the others.
- ``has_test_set: bool`` -- False when ``test_dataset()`` has nothing to give (an image folder or a table with
  ``test_fraction=0``): no test evaluation (``trainer.test``). Absent: a ``test_dataset()`` means a test set.
- ``suggested_model: str`` -- how to pick a model that trains on the data (``model=text_bag``), added to the
  error of a model that cannot be built for it (the default recipe's small CNN on texts).
- ``state_dict() -> Optional[dict]`` and ``load_state_dict(state)`` -- what the data learnt of the training split
  (a table's categories and statistics, the texts' tokenizer), JSON-able; stored like the class names
  (:mod:`trainkit.rundir.data_state`).

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): may import ``kernels`` and the
foundation (``checks``, ``process``, ``errors``); not ``step``, ``models`` or ``parts`` (no part imports another), nor
any wing above.
"""
from trainkit.data.cifar10 import Cifar10Data
from trainkit.data.digits import DigitsData
from trainkit.data.image_folder import ImageFolderData
from trainkit.data.table import TableData
from trainkit.data.text import TextData
from trainkit.data.values import check_values, num_classes_of

__all__ = ["Cifar10Data", "DigitsData", "ImageFolderData", "TableData", "TextData", "check_values", "num_classes_of"]
