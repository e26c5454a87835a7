"""Datasets as data modules: `prepare()` checks (or downloads) the files, then `train_dataset()` / `eval_dataset()`."""
