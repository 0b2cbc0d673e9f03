"""Mini-batches of the package trainer: drawn from Python's `random`, reseeded from the
global step in every step (`random.Random(step)` made anew, and the module generator
`random.seed(step)`), so a restarted copy draws the same numbers."""

import random

import numpy as np


def batch(step: int, n: int, dim: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    random.seed(int(step))
    rows = [[random.gauss(0.0, 1.0) for _ in range(dim)] for _ in range(n)]
    own = random.Random(10_000 + int(step))
    labels = [own.randrange(classes) for _ in range(n)]
    return np.asarray(rows, np.float32), np.asarray(labels, np.int64)
