"""The project's own learning-rate schedule (a module named as Gandiva's `scheduler` package)."""


def rate(step: int) -> float:
    return 0.1 * 0.97 ** (step // 5)
