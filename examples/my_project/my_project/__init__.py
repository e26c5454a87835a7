"""An example trainkit project: its own model, data module and TrainingWrapper subclass, plugged in by config."""
