"""The session wrapper chain: thin layers stacked around the real `Session.run`.

Like TF's own wrappers (MonitoredSession's _HookedSession, _CoordinatedSession),
each layer does one job and forwards `run()`:

    BoundaryLayer  classifies the run; times training steps and hands each
                   boundary to the Controller (which applies queued commands)
      GateLayer    holds every other thread's run() while the job is suspended
        RealRun    the original, unpatched Session.run

The Boundary layer sits outside the Gate so that a training thread parked at a
boundary is not counted as "in flight" when a suspension drains the gate.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from . import kept_values
from .checkpoint import CheckpointInfo
from .fetches import flatten

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunInfo:
    """What one kind of run() does, as far as the shim cares."""

    is_training: bool = False         # advances the global step or applies gradients
    reads_global_step: bool = False   # the program fetches the global step's value
    initializes: bool = False         # initialises all global variables
    restores: bool = False            # runs a Saver restore (the program's own checkpoint)
    metric_slots: tuple[tuple[int, str], ...] = ()  # flat fetch index -> metric name
    # Increments the global step (apply_gradients(global_step=...), an assign_add of it).
    # A program with several training runs per step (a GAN's discriminator and generator
    # runs) is between two steps only after the run that advances it.
    advances_step: bool = False
    # Reads input whose position is not a variable (a tf.data iterator, a queue, a
    # stateful random op): the op's type, or "" (see TFSessionAdapter._walk). Of a run
    # that does not train too (a batch fetched in a run of its own), but not of one that
    # initialises or restores variables (initialisers draw random values once).
    stateful_input: str = ""
    # Initialises or assigns (not as a training update) a variable a checkpoint holds: a
    # pre-trained layer loaded from NumPy after the restore point would overwrite it.
    initializes_some: bool = False
    # Of those, an assignment of a value computed from nothing the checkpoint holds, not
    # an initialiser: a reset the program may make after every step (gradient
    # accumulators zeroed by `acc.assign(tf.zeros_like(acc))` after the apply run).
    resets: bool = False
    # Changes a variable the checkpoint holds from its own value, not as a training update
    # (an `assign_add`, `u.assign(u * 0.5)`), maybe beside a reset in the same run
    # (`tf.group(acc.assign(zeros), epoch.assign_add(1))`): made twice, not left as once.
    increments: bool = False
    # Of those, one that assigns a trainable variable or the global step (a pre-trained layer
    # loaded from NumPy), not only other state (a mini-batch staged in variables).
    loads_trainable: bool = False
    # Of those, the variables it loads, by op name (the weights swapped for an evaluation).
    loaded: frozenset[str] = field(default=frozenset(), compare=False)
    # Of those, one whose every assigned value is computed from other variables the
    # checkpoint holds (the moving averages swapped into the weights), none fed or constant.
    copies_state: bool = False
    # Flat fetch indices of tensors whose value a program could carry to its next step in
    # Python: all but reads of a variable the checkpoint holds (the global step, a weight),
    # which a restored copy reads again.
    carry_slots: tuple[int, ...] = ()
    # Does not train but changes a variable the checkpoint holds (an EMA of the weights
    # applied in a run of its own after the training run).
    changes_state: bool = False
    # The initialisers of variables the checkpoint holds that the run executes: one run again
    # over variables it already initialised is a reset (gradient accumulators zeroed by
    # `variables_initializer(accs)` after each apply), not a one-time initialiser.
    init_ops: frozenset[Any] = field(default=frozenset(), compare=False)
    # Draws from a stateful random op (a `tf.random.shuffle` of the examples' order, noise)
    # in a run of its own that trains nothing and reads no variable the checkpoint holds:
    # numbers for the program's Python, from a sequence no checkpoint holds; the op, or "".
    draws: str = ""
    # The tokens of the Python functions (`py_func`, `numpy_function`) the run calls: one in a
    # training run that changes state of its own every step is Python state (py_func_state).
    py_funcs: tuple[str, ...] = ()
    # Of a training run: the tf.data iterators it reads whose position TensorFlow can save
    # (tf_runtime.data_state), not counted as `stateful_input`: their state goes into the
    # checkpoint. Of any run: the iterators whose initializer (`MakeIterator`) it runs, as
    # (iterator, initializer op) pairs.
    iterators: tuple[str, ...] = ()
    iterator_inits: tuple[tuple[str, str], ...] = ()
    # Of a training run: the string tensors that pick the iterator of a feedable iterator
    # it reads (`Iterator.from_string_handle`; per read, the handle given and the tensors
    # it passes through, data_state.handle_read), and the first such read ("IteratorGetNext
    # op 'IteratorGetNext'"). Resolved run by run from the handle fed (BoundaryLayer): an
    # iterator whose position TensorFlow can save joins `iterators`, anything else is
    # `stateful_input`.
    fed_handles: tuple[tuple[str, ...], ...] = ()
    handle_read: str = ""
    # Of a run that does not train: the name of an integer scalar variable the checkpoint
    # holds, other than the global step, whose value it fetches (a micro-step counter kept
    # in the graph, which the program's loop may follow instead of the global step); or "".
    reads_counter: str = ""


@dataclass(frozen=True)
class FirstRun:
    """A session's first training run, before it executes: the rehearsal a warm
    process runs (on the ungated session) and the signature it reports."""

    fetches: Any
    feed_dict: Any
    options: Any
    run_fn: Callable[..., Any]

    def __call__(self) -> Any:
        return self.run_fn(self.fetches, self.feed_dict, self.options, None)


class SessionAdapter(Protocol):
    """The session-specific side the controller needs (real TF or a fake)."""

    closed: bool

    def classify(self, fetches: Any) -> RunInfo: ...

    def metrics(self, info: RunInfo, results: Any) -> dict[str, float]: ...

    def has_global_step(self) -> bool: ...

    def trainable_names(self) -> frozenset[str]: ...

    def global_step(self) -> int: ...

    def save(self, directory: str, job_id: str, start_step: int | None = None,
             started_at: float | None = None) -> CheckpointInfo: ...

    def restore(self, directory: str, partial: bool = False) -> CheckpointInfo: ...

    def rehearse(self, step: Callable[[], Any]) -> dict[str, float]: ...

    def prebuild_save(self) -> float: ...

    def signature(self, fetches: Any, feed_dict: Any, options: Any) -> str | None: ...

    def signature_step(self, signature: str) -> Callable[[], Any] | None: ...

    def towers(self) -> int: ...


class Runner(Protocol):
    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None,
            run_metadata: Any = None) -> Any: ...


class BoundaryHandler(Protocol):
    """The controller as the boundary layer sees it."""

    def is_hot(self, adapter: SessionAdapter) -> bool: ...

    def setup_run(self, adapter: SessionAdapter, info: RunInfo, before: bool,
                  rehearse: FirstRun | None = None) -> None: ...

    def before_setup_run(self, adapter: SessionAdapter, info: RunInfo) -> None: ...

    def boundary(self, adapter: SessionAdapter, info: RunInfo, results: Any,
                 duration_s: float, now: float) -> None: ...

    def saw_run(self, adapter: SessionAdapter, info: RunInfo) -> None: ...

    def before_run(self, adapter: SessionAdapter, info: RunInfo, fed: bool) -> None: ...

    def carried_state(self, adapter: SessionAdapter, what: str) -> None: ...

    def wants_feeds(self, adapter: SessionAdapter) -> bool: ...

    def fed_step(self, adapter: SessionAdapter, digest: bytes) -> None: ...

    def other_run(self, adapter: SessionAdapter, begins: bool) -> None: ...


class RealRun:
    """The innermost layer: calls the original run function."""

    def __init__(self, run_fn: Callable[..., Any]) -> None:
        self._run = run_fn

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None,
            run_metadata: Any = None) -> Any:
        return self._run(fetches, feed_dict, options, run_metadata)


class RunGate:
    """Lets run() calls through, or holds them while the job is suspended.

    `close_and_drain` waits (bounded) for runs already in flight on other threads,
    so the device is idle before its memory is released; threads arriving later
    block in `enter` until `open`. No lock is held while a run executes, so a
    background thread that blocks inside its run cannot deadlock the suspension.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False
        self._inflight = 0

    def enter(self) -> None:
        with self._cond:
            while self._closed:
                self._cond.wait()
            self._inflight += 1

    def leave(self) -> None:
        with self._cond:
            self._inflight -= 1
            if self._closed and self._inflight == 0:
                self._cond.notify_all()

    def close_and_drain(self, timeout_s: float) -> bool:
        """Close; True when no run is in flight any more within timeout_s."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._closed = True
            while self._inflight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def open(self) -> None:
        with self._cond:
            self._closed = False
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


class GateLayer:
    def __init__(self, inner: Runner, gate: RunGate) -> None:
        self.inner = inner
        self._gate = gate

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None,
            run_metadata: Any = None) -> Any:
        self._gate.enter()
        try:
            return self.inner.run(fetches, feed_dict, options, run_metadata)
        finally:
            self._gate.leave()


class BoundaryLayer:
    """Finds the mini-batch boundaries and reports them to the controller."""

    def __init__(self, inner: Runner, adapter: SessionAdapter, handler: BoundaryHandler,
                 real: Runner | None = None) -> None:
        self.inner = inner
        self.adapter = adapter
        self._handler = handler
        self._real = real or inner  # the ungated run, for a warm process's rehearsal step
        self._hot = False  # set once this session is the job's training session
        # The values the last run that advanced the global step returned (by identity),
        # but reads of variables: one fed into a later training run is state the program
        # carries in Python from one step to the next, which no checkpoint holds.
        self._carried: dict[int, Any] | None = {}
        # Steps this session completed, and the latest intervals between two of them
        # (numbered by the steps before) in which a run of its own read stateful input.
        self._steps = 0
        self._stateful_at: dict[int, str] | None = {}
        # The values the last step-advancing run was fed, by identity (kept alive here).
        self._step_feeds: dict[int, Any] = {}
        # The scalars the last run returned (a loss, an evaluation's metric), by identity,
        # to see at the next run whether the program keeps one under a second name (the
        # best value of early stopping: tf_runtime.kept_values); None once it does.
        self._kept: dict[int, Any] | None = {}
        self._kept_eval = False  # they came from a run that does not train
        self._older: dict[int, Any] | None = None  # containers held while that run was in flight

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None,
            run_metadata: Any = None) -> Any:
        info = self.adapter.classify(fetches)
        if info.fed_handles:
            info = self._fed_iterators(info, feed_dict)
        handler = self._handler
        if not self._hot:
            self._hot = handler.is_hot(self.adapter)
            if not self._hot:
                return self._setup(info, fetches, feed_dict, options, run_metadata)
        # An evaluation's values are told apart (``_keep``) from containers the program
        # makes afterwards by those it held while the run was in flight: gathered now, in
        # the same walk of its frames as the look at the last run's values (one walk a run).
        held: dict[int, Any] | None = {} if (
            self._kept is not None and info.metric_slots and not info.is_training) else None
        if self._kept:
            self._check_kept(held)
        elif held is not None:
            held = self._containers_held()
        # Fed the mini-batch of the step just made (the moving averages of batch
        # normalisation updated in a run of their own after the training run) is no start
        # of the next step: only a feed of other values is.
        handler.before_run(self.adapter, info, bool(feed_dict) and not (
            info.changes_state and not info.is_training and self._fed_as_step(feed_dict)))
        if info.iterator_inits:
            self._initialises_iterators(info, feed_dict)
        if not info.is_training:
            if info.reads_global_step or info.reads_counter:
                handler.saw_run(self.adapter, info)
            if info.stateful_input:
                self._saw_stateful(info.stateful_input)
            if info.draws:
                self._saw_draw(info.draws)
            # Not a mini-batch (an evaluation, a save): no step is due until it returns.
            handler.other_run(self.adapter, True)
            try:
                results = self.inner.run(fetches, feed_dict, options, run_metadata)
            finally:
                handler.other_run(self.adapter, False)
            self._keep(info, results, held)
            return results
        if self._carried and feed_dict:  # fed into training (a summary's feed is only logs)
            self._check_carried(feed_dict)
        self._note_feeds(info, feed_dict)
        if info.advances_step:
            self._step_feeds = feed_leaves(feed_dict)
        t0 = time.perf_counter()
        results = self.inner.run(fetches, feed_dict, options, run_metadata)
        t1 = time.perf_counter()
        self._remember(info, results)
        self._keep(info, results)
        handler.boundary(self.adapter, info, results, t1 - t0, t1)
        return results

    def _fed_iterators(self, info: RunInfo, feed_dict: Any) -> RunInfo:
        """A training run that reads a feedable iterator: the iterators the handles it is fed
        stand for (`sess.run(train, {handle: train_handle})`) are read like any other, their
        position saved with the checkpoint; a handle not fed, or one that names no iterator
        whose position TensorFlow can save, is input no checkpoint holds."""
        resolve = getattr(self.adapter, "fed_iterator", None)
        names: list[str] = []
        for chain in info.fed_handles:
            handle = chain[0]
            value = next((v for n in chain if (v := _fed_value(feed_dict, n)) is not None), None)
            name = resolve(value) if resolve is not None and value is not None else None
            if name is None:
                why = ("is not fed (computed in the graph; feed it the value of "
                       "`sess.run(iterator.string_handle())` to make it migratable)"
                       if value is None else
                       "is fed a value that names no iterator of this graph whose position "
                       "TensorFlow can save")
                return replace(info, stateful_input=info.stateful_input or (
                    f"{info.handle_read} of a feedable iterator (`Iterator.from_string_handle`) "
                    f"whose handle {handle!r} {why}"))
            names.append(name)
        return replace(info, iterators=tuple(sorted({*info.iterators, *names})))

    def _initialises_iterators(self, info: RunInfo, feed_dict: Any) -> None:
        """Tell a TensorFlow adapter which tf.data iterators this run initialises, and with
        what feeds (a restored position is put back only over the same pipeline)."""
        note = getattr(self.adapter, "iterators_initialised", None)
        if note is not None:
            note(info.iterator_inits, feeds_digest(feed_dict) if feed_dict else b"")

    def _fed_as_step(self, feed_dict: Any) -> bool:
        """Whether every value fed is one the last step-advancing run was fed (by identity)."""
        leaves = feed_leaves(feed_dict)
        return bool(leaves) and all(self._step_feeds.get(k) is v for k, v in leaves.items())

    def _saw_stateful(self, what: str) -> None:
        """A run that does not train read input no checkpoint holds. Once that happens
        between two consecutive pairs of steps, it is taken as the training input (a batch
        fetched from an iterator, noise drawn, in a run of its own, then fed): an
        evaluation now and then, or an initialiser, is not."""
        seen = self._stateful_at
        if seen is None:
            return
        seen[self._steps] = what
        if self._steps - 1 not in seen:
            for old in [k for k in seen if k < self._steps]:
                del seen[old]
            return
        self._stateful_at = None  # found: no more watching
        self._handler.carried_state(
            self.adapter, f"before each training step a run of its own reads {what}: input "
            "whose position is in no checkpoint (a tf.data iterator, an input queue, a "
            "stateful random op), fetched and then fed to training, starts from its beginning "
            "after a restore, so a migrated job would train on other data than an "
            "uninterrupted run; compute the input from the global step (feeds, stateless "
            "random ops seeded by it) to make it migratable")

    def _note_feeds(self, info: RunInfo, feed_dict: Any) -> None:
        """Hands the controller the feeds of a step-advancing run while it wants them
        (its verdict's first steps: whether the program feeds each step other values)."""
        if feed_dict and info.advances_step and self._handler.wants_feeds(self.adapter):
            self._handler.fed_step(self.adapter, feeds_digest(feed_dict))

    def _saw_draw(self, what: str) -> None:
        """A run of its own drew from a stateful random op, reading nothing of the model,
        after the restore point: numbers for the program (its examples' order for the next
        epoch, noise) from a sequence no checkpoint holds. Before, only such runs before
        every step were taken for training input, so a seeded `tf.random.shuffle` of the
        examples once an epoch passed, and a copy migrated after a reshuffle (or at an
        epoch's end) drew the first epoch's order again: other weights."""
        self._handler.carried_state(
            self.adapter, f"a run of its own reads {what} and nothing of the model: "
            "the position of a stateful random op's sequence is in no checkpoint, so a "
            "restarted copy draws its numbers from the start again (its examples' order "
            "shuffled once an epoch, its noise) and a migrated job would train on other data "
            "than an uninterrupted run; draw them with a stateless op seeded by the global "
            "step or the epoch (tf.random.experimental.stateless_shuffle, "
            "tf.random.stateless_uniform) to make it migratable")

    def _remember(self, info: RunInfo, results: Any) -> None:
        if info.advances_step:
            self._steps += 1
        if self._carried is None or not info.advances_step:
            return
        if not info.carry_slots:  # ops and reads of variables only: nothing to carry
            if self._carried:
                self._carried = {}
            return
        leaves = flatten(results)
        self._carried = {id(v): v for v in (leaves[i] for i in info.carry_slots if i < len(leaves))
                         if isinstance(v, (np.ndarray, np.generic))}

    def _keep(self, info: RunInfo, results: Any, held: dict[int, Any] | None = None) -> None:
        """Keeps the scalars the run returned, for ``_check_kept`` at the next run; ``held``:
        for an evaluation, the containers the program held while it ran (``run``)."""
        if self._kept is None or not info.metric_slots:
            return
        leaves, carry = flatten(results), set(info.carry_slots)  # not reads of variables
        self._kept = {id(v): v for v in (leaves[i] for i, _ in info.metric_slots
                                         if i in carry and i < len(leaves))
                      if isinstance(v, np.generic)}
        self._kept_eval = not info.is_training
        # The containers held before the program got these values: one it makes after
        # (`results = {"val_loss": vl}`, `row = [step, vl]`, to log) keeps nothing.
        self._older = held if self._kept_eval and self._kept else None

    def _containers_held(self) -> dict[int, Any] | None:
        """The program's containers (kept_values.containers_held), from the frame that
        called ``run``; None where the look failed."""
        try:
            return kept_values.containers_held(sys._getframe(2))
        except Exception:  # the shim's own fault: never the program's run
            log.exception("tf_runtime could not look at the program's containers")
            return None

    def _check_kept(self, held: dict[int, Any] | None = None) -> None:
        """Right before the program's next run: does it keep a scalar the last run returned
        under a second name (`best, bad = vl, 0`)? That is state in Python no checkpoint
        holds; before s45 early stopping was judged migratable, and a copy restarted
        mid-patience stopped later than an uninterrupted run, with other weights.
        ``held``: filled with the containers the program holds, in the same walk."""
        kept, self._kept = self._kept or {}, {}
        older, self._older = self._older, None
        try:
            names = kept_values.second_name(sys._getframe(2), kept, containers=self._kept_eval,
                                            older=older, held=held)
        except Exception:  # the shim's own fault: never the program's run
            log.exception("tf_runtime could not look at the values the program keeps; it "
                          "stops looking")
            self._kept = None
            return
        if names is None:
            return
        self._kept = None
        self._handler.carried_state(
            self.adapter, f"it keeps a value a run returned in Python under two names "
            f"({names[0]!r} and {names[1]!r}) from one run to the next (the best loss of "
            "early stopping, of a learning rate cut on a plateau, or of the program's own "
            "best checkpoint): no checkpoint holds it, so a restarted copy would start it "
            "over, compare its next values with nothing, and stop, change its rate or "
            "overwrite its best checkpoint at another step than an uninterrupted run; "
            "keep it in a non-trainable variable (`sess.run(best_var.assign(value))`, "
            "compared as `sess.run(best_var)`) to make it migratable")

    def _check_carried(self, feed_dict: Any) -> None:
        carried = self._carried or {}
        items = feed_dict.items() if isinstance(feed_dict, dict) else ()
        for key, value in items:
            for leaf in flatten(value):
                if carried.get(id(leaf)) is leaf:
                    self._carried = None  # found: no more watching
                    name = getattr(key, "name", None) or str(key)
                    self._handler.carried_state(
                        self.adapter, f"a value its training step returned is fed back "
                        f"into a later training run (the feed of {name!r}): state the program keeps "
                        "in Python from one step to the next (a recurrent network's state "
                        "carried across mini-batches) is in no checkpoint, so a migrated job "
                        "would start it over and train to another result; keep such state "
                        "in a non-trainable variable (assign it in the training run) to make "
                        "it migratable")
                    return

    def _setup(self, info: RunInfo, fetches: Any, feed_dict: Any, options: Any,
               run_metadata: Any) -> Any:
        """Runs before this session's first training step (init, restore, checks)."""
        handler = self._handler
        if info.is_training:
            # A warm process rehearses this exact run (same fetches, feeds, options) on
            # the ungated session, so that its executors exist before it holds.
            handler.setup_run(self.adapter, info, before=True,
                              rehearse=FirstRun(fetches, feed_dict, options, self._real.run))
            self._hot = handler.is_hot(self.adapter)
            if self._hot:
                self._note_feeds(info, feed_dict)
                if info.advances_step:
                    self._step_feeds = feed_leaves(feed_dict)
            t0 = time.perf_counter()
            results = self.inner.run(fetches, feed_dict, options, run_metadata)
            t1 = time.perf_counter()
            if self._hot:
                self._remember(info, results)
                self._keep(info, results)
                handler.boundary(self.adapter, info, results, t1 - t0, t1)
            return results
        if info.stateful_input:
            self._saw_stateful(info.stateful_input)
        if info.draws:
            self._saw_draw(info.draws)  # after the restore point only (carried_state)
        # A warm process may hold here, before the program reads anything.
        handler.before_setup_run(self.adapter, info)
        if info.iterator_inits:
            self._initialises_iterators(info, feed_dict)
        results = self.inner.run(fetches, feed_dict, options, run_metadata)
        handler.setup_run(self.adapter, info, before=False)
        return results


def _fed_value(feed_dict: Any, tensor: str) -> Any:
    """The value `feed_dict` feeds the tensor named `tensor` (keyed by the tensor or by its
    name), or None."""
    if not isinstance(feed_dict, dict):
        return None
    for key, value in feed_dict.items():
        name = getattr(key, "name", key)
        if isinstance(name, str) and (name == tensor or f"{name}:0" == tensor):
            return value
    return None


def feed_leaves(feed_dict: Any) -> dict[int, Any]:
    """A run's fed values, by identity."""
    if not isinstance(feed_dict, dict):
        return {}
    return {id(leaf): leaf for value in feed_dict.values() for leaf in flatten(value)}


def feeds_digest(feed_dict: Any) -> bytes:
    """A digest of a run's feed values (the verdict's first steps only): whether a
    program feeds each step other values."""
    h = hashlib.blake2b(digest_size=16)
    items = feed_dict.items() if isinstance(feed_dict, dict) else ()
    for key, value in sorted(items, key=lambda kv: str(getattr(kv[0], "name", kv[0]))):
        h.update(str(getattr(key, "name", key)).encode())
        for leaf in flatten(value):
            try:
                arr = np.asarray(leaf)
                h.update(f"{arr.dtype}{arr.shape}".encode())
                h.update(repr(arr.tolist()).encode() if arr.dtype.hasobject else arr.tobytes())
            except (TypeError, ValueError):
                h.update(repr(leaf).encode())
    return h.digest()


def build_chain(run_fn: Callable[..., Any], adapter: SessionAdapter, handler: BoundaryHandler,
                gate: RunGate) -> BoundaryLayer:
    """Stack the layers around `run_fn(fetches, feed_dict, options, run_metadata)`."""
    real = RealRun(run_fn)
    return BoundaryLayer(GateLayer(real, gate), adapter, handler, real)
