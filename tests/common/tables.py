"""A small animals table (age, colour, height, species) written as CSV, for data=table's tests."""
import csv

import numpy as np

COLOURS = ["red", "green", "blue"]


def rows(count=60, seed=0):
    """(age, colour, height, species): species is 'bee' for red rows, so the colour predicts it."""
    rng = np.random.default_rng(seed)
    return [[int(rng.integers(20, 60)), COLOURS[i % 3], round(float(rng.normal(170, 10)), 1),
             "bee" if i % 3 == 0 else "ant"] for i in range(count)]


def write_csv(path, table, header=("age", "colour", "height", "species")):
    with open(path, "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(header)
        writer.writerows(table)
    return path
