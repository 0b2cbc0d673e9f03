"""The shim's look at Python's global random generators between two steps
(tf_runtime/python_rng.py): draws from one stream are found however many words a step
takes (up to the search's ~160,000), a reseed or no draw is not."""

from __future__ import annotations

import random
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_runtime.python_rng import TWISTS, Watch, continued, snapshot

WORDS = st.integers(min_value=1, max_value=(TWISTS - 1) * 624)


def _draw_numpy(words: int) -> None:
    np.random.randint(0, 2**32, size=words, dtype=np.uint32)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), words=WORDS, gauss=st.booleans())
def test_numpy_draws_from_one_stream_are_found(seed: int, words: int, gauss: bool) -> None:
    np.random.seed(seed)
    before = snapshot()
    _draw_numpy(words)
    if gauss:  # any kind of draw: normals keep a cached value beside the block
        np.random.normal(size=3)
    assert continued(before, snapshot()) == "numpy.random"


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), draws=st.integers(1, 40_000))
def test_python_draws_from_one_stream_are_found(seed: int, draws: int) -> None:
    random.seed(seed)
    before = snapshot()
    for _ in range(draws):
        random.random()
    assert continued(before, snapshot()) == "random"


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), step=st.integers(0, 10**6), words=WORDS)
def test_a_reseed_every_step_or_no_draw_is_not_a_stream(seed: int, step: int, words: int) -> None:
    np.random.seed(seed)
    random.seed(seed)
    before = snapshot()
    assert continued(before, snapshot()) == ""
    np.random.seed(step)  # reseeded from the global step, as a restarted copy does
    random.seed(step)
    _draw_numpy(words)
    random.random()
    # A reseed to the very state it had is no reseed; any other is.
    assert continued(before, snapshot()) == ("" if step != seed else "numpy.random")


def test_the_watch_compares_each_look_with_the_last() -> None:
    np.random.seed(0)
    random.seed(0)
    watch = Watch(first=3, every=8)
    found = []
    for n in range(1, 40):
        if n >= 20:  # a program that starts drawing after a warm-up
            np.random.uniform(size=5)
        found.append((n, watch.step(n)))
    # Steps 1-3 looked at (nothing drawn), then two consecutive steps in every 8: 24 is the
    # first look after step 20 (compared with 17).
    assert [n for n, what in found if what] == [24, 25, 32, 33]
    assert all(what == "numpy.random" for _, what in found if what)


def test_a_draw_once_an_epoch_is_found_at_the_next_look() -> None:
    """Examples shuffled once an epoch (every 5 steps), never reseeded: no draw falls
    between two consecutive steps the watch compares, but one falls between its looks,
    and a look when a migration is asked for finds it. One reseeded from the step at every
    step and drawn on is not taken for a stream, across a gap either."""
    np.random.seed(5)
    order = np.arange(40)
    watch = Watch(first=3, every=128)
    found = []
    for n in range(1, 13):
        if n % 5 == 0:
            np.random.shuffle(order)
        found.append(watch.step(n))
    assert found == [""] * 12  # looked at steps 1-3 only
    assert watch.look(12) == "numpy.random"  # a checkpoint or migration asked for now

    watch = Watch(first=3, every=8)
    for n in range(1, 40):
        np.random.seed(n)
        np.random.uniform(size=5)
        assert watch.step(n) == "", n
    assert watch.look(40) == ""


@pytest.mark.parametrize("kind", ["numpy", "python"])
def test_a_reseed_to_the_start_seed_is_not_taken_for_a_stream(kind: str) -> None:
    """A program seeds 7 at its start and reseeds from the global step in every step; a
    migration restores it at step 7 (in CI, once, under load): its first step reseeds to
    7 and draws, as one drawing from its start seed does. Before, that first step was taken
    for a stream (refused as not migratable); now the next step tells. One seeded once and
    drawn on from the first step is still found, at the second step; a migration asked for
    right after the first, before any next step, is refused (it cannot tell) unless the
    program's own seed call came between (counted): then it is a reseed."""
    def seed(value: int) -> None:
        np.random.seed(value) if kind == "numpy" else random.seed(value)

    def draw() -> None:
        if kind == "numpy":
            np.random.uniform(-1, 1, [8, 4])
        else:
            [random.uniform(-1, 1) for _ in range(32)]

    label = "numpy.random" if kind == "numpy" else "random"
    for start in (7, 0):  # restored at step 7; a fresh start at step 0 after seed(0)
        seed(start)
        watch = Watch()
        assert watch.look(0) == ""  # the session bound: the restore point
        for n, step in enumerate(range(start, start + 12), 1):
            seed(step)
            draw()
            assert watch.step(n) == "", (start, n)
        assert watch.look(12) == ""  # a migration asked for
    # A migration right after the first step (a job started at step 0 after seed(0),
    # suspended after one step): the program's seed call tells the reseed (it used to be
    # refused, "cannot tell", for good).
    seed(0)
    watch = Watch()
    assert watch.look(0) == ""
    seed(0)
    draw()
    assert watch.step(1) == ""
    assert watch.look(1) == ""
    seed(1)
    draw()
    assert watch.step(2) == ""

    seed(7)  # seeded once, drawn on in every step
    watch = Watch()
    assert watch.look(0) == ""
    draw()
    assert watch.step(1) == ""  # drawn on, or reseeded to 7: not yet told
    assert watch.look(1) == label  # a migration now: refused
    watch = Watch()
    seed(7)
    watch.look(0)
    found = []
    for n in range(1, 4):
        draw()
        found.append(watch.step(n))
    assert found == ["", label, label]
    watch = Watch()  # drawn on once after its seed, never again: refused at the next step
    seed(7)
    watch.look(0)
    draw()
    assert [watch.step(1), watch.step(2)] == ["", label]


class _Trainer:
    def __init__(self) -> None:
        self.rng = np.random.RandomState(3)

    def step(self, look: Any) -> Any:
        self.rng.uniform(size=4)
        return look()


def test_the_programs_own_generators_are_found_in_its_frames() -> None:
    """A Generator in a function's locals, a RandomState kept as `self.rng`: drawn on
    between two steps, named; one made anew every step (seeded by the step) is not the same
    object, so not a stream; the global generators untouched here are not named."""
    watch = Watch(first=10)

    def look(n: int) -> Any:
        return lambda: watch.step(n, sys._getframe(1))

    def loop(kind: str) -> list[str]:
        rng = np.random.default_rng(5)  # found through this frame
        trainer = _Trainer()
        found = []
        for n in range(1, 4):
            if kind == "generator":
                rng.normal(size=3)
                found.append(look(n)())
            elif kind == "trainer":
                found.append(trainer.step(look(n)))
            else:
                fresh = np.random.RandomState(n)  # a new one every step
                fresh.uniform(size=3)
                found.append(look(n)())
        return found

    state = snapshot()
    assert loop("generator")[1:] == ["the np.random.Generator in rng"] * 2
    watch._last = None
    assert loop("trainer")[1:] == ["the np.random.RandomState in self.rng"] * 2
    watch._last = None
    assert loop("fresh") == ["", "", ""]
    assert continued(state, snapshot()) == ""
