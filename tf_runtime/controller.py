"""The per-process controller: the command queue and what happens at a boundary.

The stream thread `enqueue()`s commands at any time; the training thread applies
them only at the next training-step boundary (`boundary()`), in arrival order.
A suspended training thread waits here for the next command while the run gate
holds every other thread's run(). Exits (stop-for-migration, kill) first deliver
the ack, then leave with `os._exit` so that non-daemon background threads of the
program (Supervisor, queue runners) cannot keep the process alive.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from . import py_func_state, python_rng
from .chain import FirstRun, RunGate, RunInfo, SessionAdapter
from .checkpoint import CheckpointError, CheckpointInfo, TowersChanged
from .commands import Ack, Command, Kind
from .errors import error_summary
from .gpu_release import CpuBackend, GpuReleaseBackend, ReleaseError
from .lease import Lease
from .pipes import StatusPipe, read_activation
from .progress import ProgressMeter

log = logging.getLogger(__name__)

EXIT_MIGRATED = 75
# A restore refused before any training step: the checkpoint holds another number of
# tower copies than this launch's graph (one tower per device, after a grow or shrink).
EXIT_TOWERS_CHANGED = 76
EXIT_KILLED = 143

# How long a suspension waits for other threads' runs to finish before releasing.
DRAIN_TIMEOUT_S = 2.0
# How often a copy held by its helper's expired lease looks again (tf_runtime.lease).
LEASE_POLL_S = 0.05
# Steps (runs that advance the global step) after which a program is judged: one that never
# read the global step is not migratable; one that reads it is, unless its second step is
# fed a value its first returned (state carried in Python).
JUDGE_AFTER_BOUNDARIES = 2
# Training runs after which a program none of whose runs advanced the global step is
# judged (a GAN runs several training runs per step, only one of which advances it); one
# that advances it later after all (a WGAN's 100 critic runs before its first generator
# run) is judged again.
ADVANCE_WITHIN_RUNS = 16
# Steps at whose ends the state of the training runs' Python functions is compared.
PY_FUNC_STEPS = 3


class Channel(Protocol):
    """The control stream as the controller sees it (tf_runtime.client)."""

    def send_ack(self, ack: Ack) -> None: ...

    def send_migratability(self, migratable: bool, reason: str) -> None: ...

    def send_train_signature(self, signature: str) -> None: ...

    def send_towers(self, towers: int, checkpoint_towers: int, devices: int, reason: str) -> None: ...

    def close(self, timeout_s: float) -> None: ...


@dataclass
class Settings:
    """Per-process configuration, normally from the helper's environment."""

    job_id: str = ""
    restore_dir: str | None = None
    warm: bool = False
    control_fd: int | None = None
    # Warm mode: rehearse the first training step before holding, so the held process
    # has built every executor (GANDIVA_WARM_STEP=0 holds at the restore point instead).
    warm_step: bool = False
    # Warm mode: the source's first training run (TrainSignature JSON), rehearsed when
    # the program reads something before its first training run (see before_setup_run).
    warm_signature: str = ""
    # After the first training step, save once into scratch space so that the first
    # real save (a migration's) does not build the save op's executors.
    prebuild_save: bool = False
    # Warm mode: the tower copies in the source's graph (0: unknown). Another number in
    # this graph: refuse before holding (one tower per device: a grow or shrink).
    source_towers: int = 0
    # The helper's lease file (GANDIVA_LEASE_FILE; "": no helper, nothing to hold for).
    lease_file: str = ""


_NOT_THE_PROGRAM = ("tf_runtime", "tensorflow", "keras", "runpy", "importlib")


# TensorFlow code that reads the global step for itself, never for the program's loop.
_SERVICES = ("tensorflow.python.training.supervisor",)
_MONITORED = ("tensorflow.python.training.monitored_session",)
_HOOK_CALLS = frozenset({"begin", "after_create_session", "before_run", "after_run", "end"})


def _hook_at(frame: Any) -> Any:
    """The MonitoredSession hook whose callback made this run (StopAtStepHook reading the
    step after the session is created, a hook of the program's own), or None: a run made
    by the program's loop."""
    hook = tf_hook_class()
    while frame is not None:
        if frame.f_code.co_name in _HOOK_CALLS and hook is not None and \
                isinstance(frame.f_locals.get("self"), hook):
            return frame.f_locals["self"]
        frame = frame.f_back
    return None


def _fed_by_hooks(frame: Any) -> bool:
    """Whether a MonitoredSession run's feeds all come from its hooks' `before_run`
    (`SessionRunArgs(feed_dict=...)`): the program's own `run` call passed none."""
    while frame is not None:
        context = frame.f_locals.get("run_context") if frame.f_code.co_name == "run" else None
        if context is not None and str(frame.f_globals.get("__name__", "")).startswith(_MONITORED):
            return not getattr(getattr(context, "original_args", None), "feed_dict", None)
        frame = frame.f_back
    return False


def tf_hook_class() -> Any:
    """TensorFlow's SessionRunHook, if TensorFlow is loaded (the controller runs without it
    in the fake world)."""
    module = sys.modules.get("tensorflow.python.training.session_run_hook")
    return getattr(module, "SessionRunHook", None)


def _called_from(frame: Any, modules: tuple[str, ...]) -> bool:
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith(modules):
            return True
        frame = frame.f_back
    return False


# The program's loop (the frames that make each step-advancing run from one line) stays
# as it is while the loop runs: read again this often, and at once while none is known.
LOOP_RECHECK_STEPS = 32
# A step advances the global step in at most this many runs from one line (a GAN updating
# its generator twice, `for _ in range(2): sess.run(g_optim)`): a larger count between two
# runs that train without advancing it is taken for a loop of steps (no waiting), and
# before a count is known (the process's first such runs), commands wait for at most this
# many such runs.
ADVANCES_PER_STEP_MAX = 8
_PROGRAM_CODE: dict[Any, bool] = {}  # code object -> whether it is the program's own


def program_site(frame: Any) -> tuple[tuple[int, Any], int] | None:
    """The innermost of the program's frames from `frame` out, as ((identity, code), line):
    where in the program's own code a run was called from (a few frames: cheap enough to
    read at every step-advancing run)."""
    stack = program_stack(frame, limit=1)
    return stack[0] if stack else None


def program_stack(frame: Any, limit: int = 8) -> tuple[tuple[tuple[int, Any], int], ...]:
    """The program's frames (not TensorFlow's or the shim's), innermost first, as
    ((identity, code), line): where in the program's own code a run was called from."""
    out: list[tuple[tuple[int, Any], int]] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        mine = _PROGRAM_CODE.get(code)
        if mine is None:
            mine = _PROGRAM_CODE[code] = not str(frame.f_globals.get("__name__", "")).startswith(
                _NOT_THE_PROGRAM)
        if mine:
            out.append(((id(frame), code), frame.f_lineno))
        frame = frame.f_back
    return tuple(out)


def _unsaved_variables(adapter: SessionAdapter) -> tuple[str, ...]:
    """The variables in no collection the adapter's training runs update (a TF session's)."""
    found: tuple[str, ...] = getattr(adapter, "unsaved_variables", tuple)()
    return found


def _no_global_step(counters: tuple[str, ...]) -> str:
    """Why a graph without a global step is not migratable, naming the step counter of the
    program's own its training run increments, if any (`minimize(global_step=iterations)`):
    the advice to pass a counter to `minimize` is no help to a program that already does."""
    if counters:
        name = counters[0]  # an op's name (no ":0")
        return (f"the graph has no global step: its training run counts in {name!r}, a "
                "variable of its own, which the shim cannot take for the step a restarted "
                "program resumes from; make it the graph's global step "
                f"(tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.GLOBAL_STEP, {name}) "
                "after creating it, or create it with "
                "tf.compat.v1.train.get_or_create_global_step()) to make the job migratable")
    return ("the graph has no global step, so a restarted program cannot know where to "
            "resume (create its step counter with tf.compat.v1.train.get_or_create_global_step() "
            "and pass it to the optimizer's minimize(global_step=...))")


def _ignore(*_: Any) -> None:
    """What an adapter without tf.data iterators (a fake one) does with them."""


class Controller:
    """Applies scheduler commands at mini-batch boundaries."""

    def __init__(self, settings: Settings, *, channel: Channel | None = None,
                 status: StatusPipe | None = None, backend: GpuReleaseBackend | None = None,
                 exit_fn: Callable[[int], None] = os._exit,
                 on_activate: Callable[[int], None] | None = None,
                 on_first_training: Callable[[int], None] | None = None,
                 on_exit: Callable[[int], None] | None = None,
                 after_training: str = "") -> None:
        self.settings = settings
        self.channel = channel
        self.status = status
        self.backend = backend or CpuBackend()
        self.meter = ProgressMeter()
        self.gate = RunGate()
        self.lease = Lease(settings.lease_file)
        self._exit_fn = exit_fn
        self._on_activate = on_activate  # starts the stream once a warm process is activated
        # A secondary process's stream starts at its first training run (tf_runtime.runtime).
        self._on_first_training = on_first_training
        # Called with the status right before an exit on Gandiva's command (tf_runtime.launch).
        self._on_exit = on_exit
        # Why this process cannot be suspended, checkpointed or moved while it has not
        # trained: it started after its launch's training ended (tf_runtime.launch).
        self.after_training = after_training
        self._queue: collections.deque[Command] = collections.deque()
        self._cond = threading.Condition()
        self.adapter: SessionAdapter | None = None  # the training session, once known
        self.trained = False
        self.suspended = False
        self.boundaries = 0
        self.restored_step = 0
        self.migratable: bool | None = None
        self._read_global_step = False
        # The program read the global step in a run of its own before its first training
        # run (`step = sess.run(gs)`, StopAtStepHook): its loop can start from the step.
        self._read_step_first = False
        # The program itself read the step in a run of its own (not only a MonitoredSession's
        # hooks), and whether the feeds of its first step-advancing runs differ (fed_step).
        self._own_read = False
        # Training steps judged "counts in Python" before the program's first read of the
        # step (a warm-up loop `for i in range(n)` before a loop on the step), or 0.
        self._counted_in_python = 0
        # An integer variable other than the global step that the program read in a run of
        # its own (its loop may count on it; see _first_boundaries), by name.
        self._counter_read = ""
        # A session that read the step before any session was bound (its variables not yet
        # all initialised): that read comes before a restarted copy's restore.
        self._read_unbound: weakref.ref[Any] | None = None
        self._feeds: set[bytes] = set()
        self._judged_no_advance = False  # judged before any run advanced the global step
        # A hook of the program's own (not TensorFlow's) read the global step in a run of
        # its own, and whether the program fed a step itself rather than through hooks.
        self._program_hook_read = False
        self._fed_by_program = False
        self._advances_seen = False  # a training run of the bound session advanced the step
        self._steps_seen = 0  # boundaries of runs that advanced it
        self._stateful_input = ""  # what a training run read that no checkpoint holds
        # tf.data iterators the training runs read, tried for saving once each; the first
        # whose position cannot be saved (TensorFlow's reason), which refuses migration.
        self._iterators_checked: set[str] = set()
        self._unsaved_iterator = ""
        # Runs after the step-advancing one that update the training state (before_run):
        # seen once (_trailing), commands wait after each step (_cut_pending) for them.
        self._after_advance = False
        self._trailing = False
        self._cut_pending = False
        self._cut_thread: int | None = None  # the thread whose step-advancing run ended last
        # The trainable variables such runs overwrote with values from elsewhere (the moving
        # averages swapped in for an evaluation) that no run has put back yet.
        self._swapped: frozenset[str] = frozenset()
        # The global step before a run after training that assigns a trainable variable or
        # the step (a load): read again at the next step's end, in case it was set back.
        self._step_before_load: int | None = None
        # Initialisers of checkpointed variables the program has run: one run again is a reset.
        self._initialised: set[Any] = set()
        # Runs of that kind made before the first training step (an average updated before
        # each training run, `sess.run(ema_op); sess.run(train)`): they begin a step.
        self._prelude: dict[int, RunInfo] = {}
        # Such a run (or an increment beside a reset) made since the restore point (a
        # micro-batch's gradients accumulated): the first training run does not begin the
        # first step (_suspend_if_told).
        self._step_begun = False
        # The program's frames at the last step-advancing run, and per kind of such update
        # run whether the program makes it after that run (_after_training).
        self._train_stack: tuple[tuple[tuple[int, Any], int], ...] = ()
        # Of those frames, the ones that made the last two such runs from the same line:
        # the program's loop (a sequence of calls written out, as in a test, has none).
        self._loop_lines: dict[tuple[int, Any], int] = {}
        # Advancing runs since the frames were last read: once the loop is found, they are
        # read again only every LOOP_RECHECK_STEPS (walking them costs ~25 us a step).
        self._stack_age = 0
        self._order_unknown = False  # a training run came after the advancing run, loop unseen
        # Where the program made its last step-advancing run (program_site), and whether it
        # advances the step in several runs of one step (_advances_again).
        self._advance_site: tuple[tuple[int, Any], int] | None = None
        # Per frame (identity, code), the last time its step-advancing runs came round from
        # a line to the same or an earlier one (its loop): (from line, to line).
        self._advance_wraps: dict[tuple[int, Any], tuple[int, int]] = {}
        self._warned_advances_again = False
        # Step-advancing runs since the last training run that leaves the step alone (a
        # GAN's discriminator run; None before any), and their count before it (None
        # until one came after such runs): how many one step makes from one line.
        self._advances_now: int | None = None
        self._advances_per_step: int | None = None
        self._order: dict[int, tuple[RunInfo, bool | None]] = {}
        self._carried_state = ""  # how the program carries Python state between steps
        self._rng_watch = python_rng.Watch()
        # Python functions the first training steps call, and their state at the last look.
        self._py_funcs: set[str] = set()
        self._py_func_look: dict[str, tuple[str, bytes]] | None = None
        self._warned_second = False
        # Sessions other than the training one that made a training run while it was open
        # (a second model: an online teacher in a graph of its own), and the verdict's
        # reason once one is still open at a boundary of the training session.
        self._other_trainers: list[SessionAdapter] = []
        self._second_model = ""
        self._not_migratable_reason = ""
        self._restored_into: SessionAdapter | None = None
        # Initialisers run so far in each session not yet bound (_initialised_in_pieces).
        self._pieces: weakref.WeakKeyDictionary[Any, frozenset[Any]] = \
            weakref.WeakKeyDictionary()
        self._read_since_restore = False  # the program read the step after that restore
        self._restore_again = False
        self._restore_at_training = False  # the same for values copied from restored state
        # Files the program's own Savers wrote since the restore, and whether one of them is
        # being restored now (tf_runtime.shim): values of the restored state, as a copy is.
        self.saved_since_restore: set[str] = set()
        self.restoring_own_save = False
        # A restore that failed into a session bound before the first training step (an
        # evaluation session initialised first): fatal only if that session trains.
        self._unfit: CheckpointError | None = None
        # The global step the job's first process started training at (carried in every
        # checkpoint): StopAtStepHook(num_steps=N) counts from it, not from a restore.
        self.job_start_step: int | None = None
        # When the job's first process started (wall-clock; carried in every checkpoint): the
        # program's own checkpoints written since are the job's (tf_runtime.own_checkpoints).
        self.job_started_at: float | None = time.time()
        # Warm with rehearsal: hold before the next run after the restore point.
        self._warm_pending = False
        self._warm_armed = False  # the session to hold in is bound
        # The thread rehearsing and holding for it (until the restore is done), and how
        # many other threads' reads and training runs wait for that (see _wait_for_warm).
        self._warm_thread: threading.Thread | None = None
        self._warm_done = threading.Condition()
        self._warm_waiting = 0
        # Whether the save op's executors exist (a rehearsal or a save built them).
        self._save_built = not settings.prebuild_save
        self._lock = threading.Lock()  # serialises binding and command application
        self._pid = os.getpid()  # a forked child's training runs are not the job's steps

    @property
    def in_forked_child(self) -> bool:
        """Running in a child the program forked (os.fork, a multiprocessing pool): its
        training runs are not the job's steps, and the stream and pipes are the parent's."""
        return os.getpid() != self._pid

    # -- commands from the stream thread ------------------------------------------------
    def enqueue(self, cmd: Command) -> None:
        if self.after_training and cmd.kind is not Kind.KILL and (
                not self.trained or cmd.kind in (Kind.CHECKPOINT, Kind.STOP_FOR_MIGRATION)):
            # Before it trains, no training boundary will come to apply it at: answered at
            # once. Once it trains (the second program of `python pretrain.py; python
            # finetune.py`), suspended and resumed in place, but never checkpointed: a
            # restart runs the launch's first program, which would be given this graph's
            # checkpoint (s46: migrated at step 163 of the second program, the first one
            # failed on it at the destination and again at the source; the job FAILED).
            if cmd.kind is Kind.RESUME:
                self._ack(Ack(cmd.id, True, "not suspended", step=self.meter.steps))
            else:
                verb = {Kind.SUSPEND: "cannot suspend", Kind.CHECKPOINT: "cannot checkpoint"}.get(
                    cmd.kind, "not migratable")
                self._ack(Ack(cmd.id, False, f"{verb}: {self.after_training}", step=self.meter.steps))
            return
        with self._cond:
            self._queue.append(cmd)
            self._cond.notify_all()

    # -- chain callbacks ----------------------------------------------------------------
    def is_hot(self, adapter: SessionAdapter) -> bool:
        return self.trained and adapter is self.adapter

    def before_run(self, adapter: SessionAdapter, info: RunInfo, fed: bool) -> None:
        """A run of the training session is about to execute. Right after a run that
        advanced the step, a run that does not train, is fed nothing and changes a variable
        the checkpoint holds (an EMA of the weights, `sess.run(ema_op)` after
        `sess.run(train)`) finishes that step: a checkpoint taken before it would lack that
        update, and a restored copy, resuming at the next step, would never make it. So
        commands wait after each step for such runs, through runs that change nothing (a
        read of the step, an evaluation), and are applied before the next run that trains,
        reads input of its own or changes state otherwise. (A fed one, an accumulation of
        the next mini-batch, begins the next step.)"""
        self._hold_while_lease_out(adapter)
        again = self._initialises_again(adapter, info)
        if info.init_ops and self._advances_seen and adapter is self.adapter:
            self._step_initialised_again(adapter, info)
        if info.loads_trainable and self._advances_seen and adapter is self.adapter and \
                self._step_before_load is None:
            self._step_before_load = adapter.global_step()
        if not (self._after_advance or self._cut_pending) or adapter is not self.adapter or (
                threading.get_ident() != self._cut_thread and not info.is_training):
            # Another thread's run (an evaluation beside the loop, a Supervisor's summary)
            # ends no step; its training run (the next step from a thread pool) begins one.
            return
        # Not an initialiser, a restore or a load: those happen once, not in every step. A
        # reset is no load (accumulators zeroed after each apply): before, a checkpoint was
        # taken between the apply and the reset, and a restored copy added its next
        # micro-batches onto the previous step's sums. Nor is an initialiser run again over
        # variables it already initialised (`sess.run(variables_initializer(accs))` after
        # each apply, which was taken for a one-time initialiser the same way).
        once = (info.initializes_some and not (info.resets or again)) or info.initializes or \
            info.restores
        if info.restores:
            # The program's own Saver swapping weights (the averages restored into them by
            # `Saver(ema.variables_to_restore())` for an evaluation, then its weights back):
            # a swap as the assignments below are. Before, an evaluation reading an iterator
            # of its own between the two ended the wait, and a checkpoint held the averages.
            self._swapped = self._swapped ^ info.loaded
        if (not info.is_training and (once or not info.changes_state)
                and not info.stateful_input):
            # A run that changes nothing (the step read, a summary, an evaluation), or
            # initialises what the program just created (the save counter of its first
            # `tf.compat.v1.train.Checkpoint.save`): the step may still end with an update
            # after it (`sess.run(train); step = sess.run(gs); sess.run(ema_op)`), also
            # after another (`sess.run(train); sess.run(ema_op); step = sess.run(gs); if
            # step % 2 == 0: sess.run(decay)`: a read after the first update used to end
            # the wait, the cut came between the two, and a restored copy, resuming at the
            # next step, never made the second; s51, other weights).
            return
        # A training run that does not advance the step ends it only when the program
        # calls it after the advancing run (a discriminator updated after the generator
        # that advances the step); an update that does not train, unless called before it.
        if self._swapped and not info.is_training and not info.changes_state:
            # An evaluation on weights swapped in after the step (`w.assign(ema.average(w))`
            # after `backup.assign(w)`): the state is whole again only once the program puts
            # its weights back. Before, commands were applied here: a checkpoint held the
            # averages as the weights, and a restored copy trained on from them. (Only an
            # evaluation that reads input of its own gets here: any other read waited above.)
            return
        trailing = (not once and not info.advances_step and id(info) not in self._prelude and (
            self._after_training(info) is True if info.is_training else
            info.changes_state and not fed and
            self._after_training(info, idempotent=(info.resets or again) and
                                 not info.increments) is not False)) or (
            info.advances_step and bool(self._queue) and self._advances_again())
        if trailing and info.loaded:
            # The swap back loads the same variables again; an overwrite the program keeps
            # (back to its best weights) is part of the step: the next training run ends it.
            self._swapped = self._swapped ^ info.loaded
        if self._after_advance:
            self._after_advance = False
            if trailing and not self._trailing:
                self._trailing = True
                log.info("a run after the training step updates the training state (an "
                         "average of the weights, say): commands wait for it")
                self._cut_pending = True  # this step's commands too
        if self._cut_pending and not trailing:
            self._cut_pending = False
            if self._queue:
                self._apply_queued(adapter)
            elif not self._save_built:
                self._prebuild_save(adapter)

    def _step_initialised_again(self, adapter: SessionAdapter, info: RunInfo) -> None:
        """A run after training that initialises the global step again (a sweep of trials
        in one job, each from `global_variables_initializer()`; a phase started over from
        step 0): the step goes back, and the program's place is in its Python loop (which
        trial), which no checkpoint holds. It used to be migratable: a restored copy
        started at its first trial with the restored step and weights, trained that trial's
        rest on them, and reported other results for it (the sweep's last trial, from
        scratch, ended the same)."""
        step_init = getattr(adapter, "step_initializer", lambda: None)()
        if step_init is None or step_init not in info.init_ops:
            return
        self.carried_state(adapter, (
            "it initialises its global step again after training (the next trial of a sweep "
            "in one job, or a phase started over from step 0): the step goes back, and where "
            "the program is (which trial, which phase) is kept in Python, which no checkpoint "
            "holds, so a restarted copy would start over at its first trial with the "
            "restored step and weights; submit each trial as a job of its own to make it "
            "migratable"))

    def _step_set_back(self, adapter: SessionAdapter, before: int) -> None:
        """At the end of the step after a run that assigned a trainable variable or the
        global step (`before`: the step then): whether the step went back
        (`sess.run(gs.assign(0))` for a second phase). Its progress follows the step; a
        restarted copy would start the program's loop over at the restored step (its first
        phase), which used to be allowed."""
        now = adapter.global_step()
        if now > before:
            return
        self.meter.set_steps(now)
        self.carried_state(adapter, (
            f"it set its global step back after training (from {before} to {now - 1}, "
            "an assignment such as `sess.run(global_step.assign(0))` for a second phase): "
            "which phase the program is in is kept in Python, which no checkpoint holds, so "
            "a restarted copy would start its loop over at its first phase with the restored "
            "step and weights; submit each phase as a job of its own (or keep counting the "
            "step up) to make it migratable"))

    def _initialised_in_pieces(self, adapter: SessionAdapter, info: RunInfo) -> bool:
        """Whether this run completes the initialisation of all global variables begun in
        earlier runs of a session not yet bound (`variables_initializer(model_vars)`, then
        the optimizer's; each variable's `initializer`): the restore point, as the run of
        one initialiser is. Before, such a session was bound only at its first training
        run: a restarted copy read its step before the restore (from 0), and the first
        training run's was taken for the program's first read (not migratable, "reads the
        global step only after its first training run")."""
        if not info.init_ops or adapter is self.adapter:
            return False
        done = self._pieces[adapter] = self._pieces.get(adapter, frozenset()) | info.init_ops
        covers = getattr(adapter, "initializes_all", None)
        if covers is None or not covers(done):
            return False
        self._initialised |= done  # an initialiser of these run again is a reset
        return True

    def _initialises_again(self, adapter: SessionAdapter, info: RunInfo) -> bool:
        """Whether the run initialises only variables whose initialisers the program ran
        before (a reset of gradient accumulators, not a one-time initialiser of variables it
        just created, such as a second optimizer's slots); notes its initialisers."""
        if not info.init_ops or adapter is not self.adapter:
            return False
        again = info.init_ops <= self._initialised
        self._initialised |= info.init_ops
        return again

    def _after_training(self, info: RunInfo, idempotent: bool = False) -> bool | None:
        """Whether the program makes this run after its step-advancing run in its loop
        (True), or before it (False: `if step % 5 == 0 and step: sess.run(decay)` at the
        top of the loop, which a restored copy makes again; a GAN's discriminator run before
        the generator's): the innermost frame of the program's the two calls share, and the
        line of each in it, among the frames that made the last two advancing runs from one
        line (the program's loop; a sequence of calls written out, as in a test, has none).
        Same line everywhere, or no such frame: None. Decided once a kind, from the second
        step on. `idempotent`: an update that sets what it changes to the same values
        again if made twice (a reset of accumulators), which a cut after it keeps right in
        either order."""
        hit = self._order.get(id(info))
        if hit is None:
            trained_at = self._loop_lines
            if not trained_at:
                # No loop seen yet (the first step): not decided. Saves wait for the loop
                # (_apply_commands) after a training run, or an update that a restored
                # copy making it again would not leave as it was: in a copy restored one
                # step before `if step % 4 == 0 and step: sess.run(next_epoch)` at the top
                # of its loop, that run was taken for the end of step 4 and a checkpoint
                # asked for meanwhile cut after it, so a copy restored from that checkpoint
                # incremented the epoch again (s50: other weights). A reset may be cut
                # after in either order: a copy resetting again leaves it as it was.
                self._order_unknown = self._order_unknown or info.is_training or (
                    info.changes_state and not idempotent)
                return None
            after = None
            if info.is_training:
                self._order_unknown = False  # decided here (_apply_queued)
            for key, line in program_stack(sys._getframe(2)):  # innermost first
                other = trained_at.get(key)
                if other is not None and other != line:
                    after = line > other
                    log.info("a run that %s comes %s the step-advancing run in the "
                             "program's loop (line %d, that run's %d): it %s", "trains" if
                             info.is_training else "updates the training state",
                             "after" if after else "before", line, other,
                             "ends the step" if after else "begins a step")
                    break
            hit = self._order[id(info)] = (info, after)
        return hit[1]

    def _advances_again(self) -> bool:
        """Whether this step-advancing run, called right after another one, is part of the
        same step: the program calls it from a later line of the same frame, and that
        frame's loop has come round from this line (or a later one) to the other's (or an
        earlier one), as a GAN updates its generator twice a step, each run advancing the
        step (`sess.run(g_optim)` written twice after `sess.run(d_optim)`). Before,
        commands were applied between the two, and a restored copy, reading the step
        advanced once, began a new step there (its discriminator run, other noise): other
        weights. One called from the same line or an earlier one begins the next step, and
        so does each of a sequence of calls written out (no loop came round over them)."""
        site, last = program_site(sys._getframe(2)), self._advance_site
        if site is None or last is None or site[0] != last[0]:
            return False
        if self._advances_now and (site[1] == last[1] or site[0] not in self._advance_wraps):
            return self._advances_again_in_group()
        if site[1] <= last[1]:
            return False
        wrap = self._advance_wraps.get(site[0])
        if wrap is None or wrap[0] < site[1] or wrap[1] > last[1]:
            return False
        if not self._warned_advances_again:
            self._warned_advances_again = True
            log.info("the program advances the global step again later in the same step "
                     "(line %d, after line %d): commands wait for the step's last such run",
                     site[1], last[1])
        return True

    def _advances_again_in_group(self) -> bool:
        """Whether this step-advancing run, made right after another one of the same
        frame with no training run between, from the same line (`for _ in range(2):
        sess.run(g_optim)` after `sess.run(d_optim)`) or from another before that frame's
        loop came round (the first step), is part of that step: the step's runs that train
        without advancing it (the discriminator's) come between its groups of such runs,
        and this group has fewer than the last one had (before one is known, fewer than
        ADVANCES_PER_STEP_MAX). Before, commands were applied between the two generator
        runs, and a restored copy, reading the step advanced once, began a new step there
        (other weights). Waiting never cuts where the program's step is not whole: the
        group ends before such a run, where commands were applied anyway."""
        per_step, now = self._advances_per_step, self._advances_now or 0
        if per_step is None and self._steps_seen >= ADVANCES_PER_STEP_MAX:
            return False  # such runs every so many steps (an extra update now and then)
        if now >= (ADVANCES_PER_STEP_MAX if per_step is None else per_step):
            return False
        if not self._warned_advances_again:
            self._warned_advances_again = True
            log.info("the program advances the global step in several runs of one step "
                     "(between its runs that train without advancing it): commands wait "
                     "for the step's last such run")
        return True

    def _count_advances(self, info: RunInfo) -> None:
        """Count a training run into the groups of step-advancing runs that the runs
        training without advancing the step delimit (_advances_again_in_group)."""
        if info.advances_step:
            if self._advances_now is not None:
                self._advances_now += 1
        elif info.is_training:
            self._end_advance_group()

    def _end_advance_group(self) -> None:
        if self._advances_now:
            now = self._advances_now
            self._advances_per_step = now if now <= ADVANCES_PER_STEP_MAX else 1
        self._advances_now = 0

    def saw_run(self, adapter: SessionAdapter, info: RunInfo) -> None:
        # Not a read the Supervisor makes for itself (its step counter thread, the session
        # log it writes at the start: whatever loop the program runs): only the program's
        # own reads tell that its loop resumes from the step.
        # Which read came first: one in a run of its own before the first training run (the
        # loop starts from the step), or one fetched with a training run (only logged).
        # (Whose read it is matters only until the program's own read is seen: the frame
        # walk is not made for every later read of a loop that reads the step each step.)
        hook = _hook_at(sys._getframe(1)) if not info.is_training and not self._own_read and \
            info.reads_global_step and adapter is self.adapter else None
        if hook is not None and not type(hook).__module__.startswith("tensorflow"):
            self._program_hook_read = True
        if not info.is_training and not self._own_read and info.reads_global_step and \
                adapter is self.adapter and hook is None and \
                not _called_from(sys._getframe(1), _SERVICES):
            self._own_read = True
            if self._counted_in_python:
                self._warm_up_counted_in_python()
        elif not info.is_training and info.reads_global_step and self.adapter is None and \
                not _called_from(sys._getframe(1), _SERVICES):
            self._read_unbound = weakref.ref(adapter)  # before the restore point
        if info.reads_counter and adapter is self.adapter and not self._counter_read:
            self._counter_read = info.reads_counter
        if info.reads_global_step and not info.is_training and adapter is self.adapter and \
                self._advances_seen and self._cut_thread in (None, threading.get_ident()):
            # The program's loop reads the step where its steps begin (`step =
            # sess.run(gs); for _ in range(2): sess.run(train, batch(step))`): that read
            # delimits the step's advancing runs as a discriminator run does. Before, with
            # no training run between the steps, commands were applied between the two.
            # Not a read before any advance: `step = sess.run(gs)` once, then `for i in
            # range(n): sess.run(train)`, has no groups to count.
            self._end_advance_group()
        if info.reads_global_step and adapter is self.adapter and not self._read_step_first \
                and not (self._read_global_step and self.boundaries) \
                and not _called_from(sys._getframe(1), _SERVICES):
            self._read_global_step = True
            # A MonitoredSession's hooks (StopAtStepHook) fetch it with every training
            # run and stop the loop at a step: its loop follows the step too.
            self._read_step_first = self.boundaries == 0 and (
                not info.is_training or _called_from(sys._getframe(1), _MONITORED))

    def wants_feeds(self, adapter: SessionAdapter) -> bool:
        """Whether the feeds of the next step-advancing run matter to the verdict: only
        a MonitoredSession's hooks have read the step so far, and it is not judged yet."""
        return self.migratable is None and not self._own_read and adapter is self.adapter

    def fed_step(self, adapter: SessionAdapter, digest: bytes) -> None:
        """The feeds of a step-advancing run, as a digest of their values."""
        if adapter is self.adapter and len(self._feeds) < 2:
            self._feeds.add(digest)
            self._fed_by_program = self._fed_by_program or not _fed_by_hooks(sys._getframe(1))

    def carried_state(self, adapter: SessionAdapter, what: str) -> None:
        """The program carries state in Python from one step to the next, which no
        checkpoint holds (`what` says which and why): it feeds a value a training step
        returned into a later run, or draws from a global random generator every step."""
        if adapter is not self.adapter or self._carried_state:
            return
        self._carried_state = what
        if self.migratable:  # found after the verdict: judge again
            self.migratable = None

    def other_run(self, adapter: SessionAdapter, begins: bool) -> None:
        """A run of the training session that is not a training step begins or ends (an
        evaluation, the program's own save): the scheduler does not count it against the
        job's mini-batch time when it looks for jobs that make no progress."""
        if adapter is not self.adapter or self.in_forked_child:
            return
        if begins:
            self.meter.begin_other()
        else:
            self.meter.end_other()

    def before_setup_run(self, adapter: SessionAdapter, info: RunInfo) -> None:
        """A warm process holds before the first run after its restore point that is
        not a training run: that run may read the global step (or any variable) into
        the program, which must see the restored value, never the warm process's own.

        Holding here means the program's first training run is not known yet: the
        source's signature (GANDIVA_WARM_SIGNATURE), when given, is rehearsed instead.
        """
        if self._restore_again and adapter is self._restored_into and not self.trained and \
                self.settings.restore_dir and not (
                    info.initializes or info.initializes_some or info.restores):
            # The program overwrote restored variables (its own checkpoint restored after
            # initialising, a layer loaded from NumPy) and now reads: restore again before
            # this run, so it sees the restored step, not its own checkpoint's.
            self._restore_again = self._restore_at_training = False
            self._restore(adapter, self.settings.restore_dir, partial=True)
        if info.reads_global_step or info.is_training:
            self._wait_for_warm()
        if not self._take_warm_pending(adapter):
            return
        step = None
        if self.settings.warm_signature:
            step = adapter.signature_step(self.settings.warm_signature)
        if step is None:
            log.info("warm: holding before the program's first read, without a rehearsal "
                     "(no usable signature of its training run)")
        self._warm_first_step(adapter, step)

    def setup_run(self, adapter: SessionAdapter, info: RunInfo, before: bool,
                  rehearse: FirstRun | None = None) -> None:
        """A run before the first training step: bind the session at the restore point.

        The restore point is right after the run that initialises the variables, or
        right before the first training step when no such run was seen (a program
        that restores its own checkpoint, MonitoredSession restoring from its dir).
        `rehearse` runs this very training run on the ungated session (warm mode).
        """
        if before and info.is_training:
            self._wait_for_warm()
            if not self.trained:
                self._kill_if_told(adapter)
        self.saw_run(adapter, info)
        update = not before and info.changes_state and not (
            info.initializes_some or info.initializes or info.restores)
        if update:
            self._prelude[id(info)] = info  # classifications are cached: one object per kind
        if (update or (not before and info.increments)) and adapter is self.adapter:
            self._step_begun = True  # the first step began before its training run
        if self.trained:
            if before and info.is_training:
                self._training_elsewhere(adapter)
            return  # a second model or an evaluation session: not the job's training
        if info.reads_global_step and self._restored_into is adapter:
            self._read_since_restore = True
        # A mini-batch the program stages in variables of their own after it read the
        # restored step (`sess.run(batch_var.assign(x), {x: batch(step)})`, then the
        # training run reads them) is its next step's input, not state to take back: a
        # restore again over it used to put back the previous step's batch (other weights).
        # So is state the program resets at the start of a step by running its initialiser
        # again (a recurrent state zeroed at each new sequence, `sess.run(variables_initializer(
        # [c, h]))` when `step % K == 0`): a restore again used to undo that reset.
        reset = info.resets or (bool(info.init_ops) and info.init_ops <= self._initialised)
        staged = reset and not (info.loads_trainable or info.restores) and \
            self._read_since_restore
        overwrote = (info.initializes or info.initializes_some or info.restores) and \
            self._restored_into is adapter and not staged
        if overwrote and (info.copies_state or (info.restores and self.restoring_own_save)):
            # Values copied from the restored state into the weights (the moving averages
            # swapped in for a final evaluation, made at once by a copy restored at its last
            # step; or restored by the program's own Saver from a file it saved since the
            # restore): restored over only at the first training run, if one comes. Before,
            # they were restored over before the evaluation's first run: that copy
            # evaluated, and ended with, the trained weights instead of the averages.
            self._restore_at_training = True
        elif overwrote:
            # The program overwrote variables after our restore (e.g. it restored a
            # pre-trained backbone), or created and initialised new ones the checkpoint
            # holds (an optimizer it builds once it reads a step past a phase switch):
            # restore again before its first training step.
            self._restore_again = True
        elif (before and info.is_training) or (
                (info.initializes or info.restores or self._initialised_in_pieces(adapter, info))
                and not self._keeps_the_bound_session(adapter)):
            self._bind(adapter, training=before and info.is_training)
        self._initialises_again(adapter, info)  # noted once bound: the restore point's too
        if not before and info.iterator_inits:
            # The program initialised a tf.data iterator: after the restore, its position
            # comes back from the checkpoint now, before the first training run reads it.
            getattr(adapter, "restore_iterators", _ignore)([n for n, _ in info.iterator_inits])
        if before and info.is_training and adapter is self.adapter:
            if self.settings.restore_dir and self._restored_into is not adapter and \
                    self._unfit is not None:
                if isinstance(self._unfit, TowersChanged):
                    self._refuse_towers(self._unfit)
                raise self._unfit  # never train from the program's own start
            if self._take_warm_pending(adapter):
                # Nothing ran since the restore point: the program's own first training
                # run is rehearsed exactly, and it read nothing the restore changes.
                self._warm_first_step(adapter, rehearse)
            elif (self._restore_again or self._restore_at_training) and self.settings.restore_dir:
                self._restore(adapter, self.settings.restore_dir, partial=True)
            self._restore_again = self._restore_at_training = False
            if self._on_first_training is not None:  # (a secondary process connects now)
                self._on_first_training(self.meter.steps)
            if rehearse is not None:  # after any warm hold: the stream is open by now
                self._report_signature(adapter, rehearse)
            self._report_towers(adapter)
            if self.job_start_step is None and adapter.has_global_step():
                self.job_start_step = adapter.global_step()
            left: list[str] = getattr(adapter, "iterators_restored", list)()
            if left:
                log.warning("the checkpoint's position of tf.data iterator(s) %s was not put "
                            "back: the program did not initialise them before its first "
                            "training run", ", ".join(left))
            self.trained = True
            self.meter.pause()
            self._suspend_if_told(adapter)

    def boundary(self, adapter: SessionAdapter, info: RunInfo, results: Any,
                 duration_s: float, now: float) -> None:
        """A training run returned: measure it, then apply queued commands."""
        if adapter is not self.adapter or self.in_forked_child:
            return
        self._hold_while_lease_out(adapter)
        if self._other_trainers:
            self._other_model_trains()
        if info.py_funcs and self._steps_seen < PY_FUNC_STEPS:
            self._py_funcs.update(info.py_funcs)
        if info.advances_step:
            if not self._advances_seen and self.boundaries:
                # Runs before it were counted as mini-batches: count from the step again.
                self.meter.set_steps(adapter.global_step() - 1)
                self._judge_again_after_late_advance()
            self._advances_seen = True
            self._steps_seen += 1
            if not self._carried_state:
                self._watch_generators(adapter)
            if not self._carried_state and self._py_funcs:
                self._watch_py_funcs(adapter)
        if info.advances_step or not self._advances_seen:
            # One of several training runs of a step (a GAN's discriminator run) is not a
            # mini-batch of its own: the step ends with the run that advances the step.
            self.meter.step(duration_s, now)
        self._count_advances(info)
        if self._step_before_load is not None and info.advances_step:
            self._step_set_back(adapter, self._step_before_load)
            self._step_before_load = None
        if info.metric_slots:
            self.meter.add_metrics(adapter.metrics(info, results))
        if info.reads_global_step:
            self._read_global_step = True
        if info.stateful_input and not self._stateful_input:
            self._stateful_input = info.stateful_input
            if self.migratable:  # a later run reads it: judge again
                self.migratable = None
        if info.iterators:
            getattr(adapter, "iterators_read", _ignore)(info.iterators)
            if not self._iterators_checked.issuperset(info.iterators):
                self._check_iterators(adapter, info.iterators)
        self.boundaries += 1
        if self.boundaries == 1:
            self._event("first_step_done", step=self.meter.steps, t=time.time())
        if self.migratable is None:
            self._first_boundaries(adapter)
        if not self._between_steps(adapter, info):
            return  # commands wait for the run that completes this step
        if info.advances_step:
            self._after_advance = True
            self._swapped = frozenset()
            site, last = program_site(sys._getframe(1)), self._advance_site
            if site is not None and last is not None and site[0] == last[0] and site[1] <= last[1]:
                self._advance_wraps[site[0]] = (last[1], site[1])
            self._advance_site = site
            self._stack_age += 1
            if not self._loop_lines or self._stack_age >= LOOP_RECHECK_STEPS:
                self._stack_age = 0
                stack = program_stack(sys._getframe(1))
                before = dict(self._train_stack)
                self._loop_lines = {key: line for key, line in stack if before.get(key) == line}
                self._train_stack = stack
            # Commands wait for the program's next run in this thread (before_run): the step
            # may end with updates in runs of their own (an average of the weights every
            # step, an epoch counter's `assign_add` once an epoch). Before, they waited only
            # once such a run had been seen: a checkpoint taken at the first epoch's end, the
            # counter's run not yet seen, lacked its increment, and a restored copy, reading
            # the step already advanced, never made it (other examples, other weights).
            self._cut_pending = True
            self._cut_thread = threading.get_ident()
            return
        if self._queue:
            self._apply_queued(adapter)
        elif not self._save_built:
            self._prebuild_save(adapter)

    def _check_iterators(self, adapter: SessionAdapter, names: tuple[str, ...]) -> None:
        """A training run read tf.data iterators not tried yet: their position goes into
        every checkpoint if TensorFlow can save it (the adapter tries now, once each);
        one that cannot be saved (a `from_generator` pipeline) makes the job not
        migratable, with TensorFlow's reason."""
        self._iterators_checked.update(names)
        check = getattr(adapter, "check_iterators", None)
        why = check(names) if check is not None else ""
        if why and not self._unsaved_iterator:
            self._unsaved_iterator = why
            if self.migratable:  # a later run reads it: judge again
                self.migratable = None

    def _watch_py_funcs(self, adapter: SessionAdapter) -> None:
        """At the verdict's steps: whether a Python function a training run calls changed
        state of its own since the last step (a call counter, a running mean). Before, such
        a program was migratable and its migrated copy started that state over (other
        weights)."""
        if self._steps_seen > PY_FUNC_STEPS:
            self._py_funcs.clear()
            return
        try:
            now = py_func_state.digest(self._py_funcs)
        except Exception:  # the shim's own fault: never the program's run
            log.exception("tf_runtime could not look at the program's py_func state; "
                          "it stops looking")
            self._py_funcs.clear()
            return
        before, self._py_func_look = self._py_func_look, now
        what = py_func_state.changed(before, now) if before is not None else ""
        if what:
            self.carried_state(adapter, (
                f"its Python function {what}, called by py_func/numpy_function in its "
                "training run, changes state of its own every step, which no checkpoint "
                "holds: a restarted copy starts it over and trains on other data; compute "
                "it from the step (pass the global step in) or keep it in variables to make "
                "it migratable"))

    def _watch_generators(self, adapter: SessionAdapter, now: bool = False) -> None:
        """Look at the program's random generators at a step (`now`: at a checkpoint or
        migration about to be taken, whatever the step)."""
        if now and (self._carried_state or self._rng_watch.first < 0):
            return
        try:
            watch = self._rng_watch
            drawn = (watch.look if now else watch.step)(self._steps_seen, sys._getframe(1))
        except Exception:  # the shim's own fault: never the program's run
            log.exception("tf_runtime could not look at the program's random generators; "
                          "it stops looking")
            self._rng_watch.every = 0
            self._rng_watch.first = -1
            return
        if drawn:
            self.carried_state(adapter, (
                f"it draws from {python_rng.describe(drawn)} between its steps, never "
                "reseeded (every step, or once an epoch to shuffle its examples): a "
                "restarted copy draws other numbers, so a migrated job would train on "
                "other data than an uninterrupted run; draw from a generator seeded by the "
                "global step (np.random.RandomState(step), or reseed with it every step) "
                "to make it migratable"))

    def _between_steps(self, adapter: SessionAdapter, info: RunInfo) -> bool:
        """Whether the training state is whole here: a checkpoint taken now holds what
        a restarted program expects at the global step it will read. After a run that
        leaves the global step alone, in a program whose step advances in another of
        its runs, it is not: a discriminator run already applied, the step not yet
        counted, would be applied a second time after a restore."""
        if info.advances_step or not adapter.has_global_step():
            return True
        # Until a run advanced it, wait for the verdict (at most ADVANCE_WITHIN_RUNS runs).
        return not self._advances_seen and self.migratable is not None

    def cut_here(self, adapter: SessionAdapter) -> None:
        """No update of the last step can come after this point: the program closes the
        training session (it ends, or trains on in a new one), or begins a partial run on a
        new handle (TensorFlow runs the handle's update as soon as its inputs are fed, in a
        call that may fetch only the loss). Commands waiting for the next run after the
        last step (before_run) are applied now, the state whole."""
        if adapter is not self.adapter or not self._cut_pending or self.in_forked_child:
            return
        self._cut_pending = False
        if self._queue:
            self._apply_queued(adapter)

    def finish(self) -> None:
        """The program ended: answer commands that will never reach a boundary."""
        while (cmd := self._next(block=False)) is not None:
            self._ack(Ack(cmd.id, False, "the program finished before its next training step",
                          step=self.meter.steps))

    def _keeps_the_bound_session(self, adapter: SessionAdapter) -> bool:
        """Whether a session initialised before the first training run stays unbound: its
        graph has no global step while the session bound already (still open) has one. A
        distillation program initialises its student, then the teacher's graph (inference
        only) in a session of its own: binding the teacher used to take the student's read
        of the step for another session's (judged not migratable, "reads the global step
        only after its first training run"), and a warm copy tried the source's training
        run in the teacher's graph. An evaluation session initialised first is still
        bound in turn, the training session after it."""
        bound = self.adapter
        if bound is None or bound is adapter or bound.closed or not bound.has_global_step() \
                or adapter.has_global_step():
            return False
        log.info("a session whose graph has no global step was initialised after the "
                 "training session's: left unbound (an evaluation or a teacher model)")
        return True

    def _other_model_trains(self) -> None:
        """At a boundary of the training session: whether a session that made a training
        run since it was bound is still open. Its model's variables are in no checkpoint
        (one session's are saved), so a restarted copy would start that model over: an
        online teacher trained beside its student, each in a graph of its own, was
        migrated, and both ended with other weights. A session that trained and was closed
        between two steps (a probe model trained from scratch each time) keeps nothing."""
        self._other_trainers = [a for a in self._other_trainers if not a.closed]
        if not self._other_trainers:
            return
        self._second_model = (
            "it trains a second model in another session that stays open (a graph of its "
            "own, such as an online teacher beside its student): a checkpoint holds the "
            "variables of one session, so a restarted copy would start the other model over "
            "from its initial values; build both models in one graph and train them in one "
            "session to make it migratable")
        self._other_trainers = []
        if self.migratable is not None:  # found after the verdict: judge again
            self.migratable = None

    def _another_model_after(self, old: SessionAdapter, new: SessionAdapter) -> None:
        """Training went on in a new session after the program closed its training session:
        if the new graph lacks trainable variables of the old one, it trains another model
        (distillation's recipe in one script: the teacher trained and closed, then the
        student). A restarted copy runs the program from its start: the first model's
        session, initialised first, cannot take this model's checkpoint, and the restart
        used to fail there ("Key teacher/w1 not found in checkpoint") after a migration
        was made. The same model rebuilt in a new graph (Estimator-style cycles, a session
        reopened) or grown (a second phase adding variables) goes on as before."""
        gone = sorted(old.trainable_names() - new.trainable_names())
        if not gone or self._second_model:
            return
        self._second_model = (
            f"it trains another model after the one it trained first, in a session it "
            f"closed (whose trainable variables such as {gone[0]!r} are not in this one's "
            f"graph): a restarted copy would run the program from its start, train that "
            f"model again and fail to restore this model's checkpoint into it; train each "
            f"model as a job of its own (the first saving what the second loads) to make it "
            f"migratable")
        if self.migratable is not None:  # found after the verdict: judge again
            self.migratable = None

    def _training_elsewhere(self, adapter: SessionAdapter) -> None:
        """A training run in another session after training began. When the training
        session was closed, the program goes on training in this one (it closed its
        session and opened a new one, restoring its own checkpoint): commands follow it
        there. Otherwise (a second model) it is not the job's training, said once, and the
        job is not migratable if that session is still open at the next boundary."""
        with self._lock:
            old = self.adapter
            if old is not None and old.closed:
                self.adapter = adapter
                # Its tf.data iterators are this session's to save, though named as the
                # old one's (Estimator-style cycles build the same pipeline in a new graph):
                # before, they were taken as checked and left out of every checkpoint.
                self._iterators_checked.clear()
                log.info("the training session was closed; training goes on in a new session, "
                         "whose steps are now the boundaries")
                self._another_model_after(old, adapter)
                return
            if not self._second_model and adapter not in self._other_trainers:
                self._other_trainers.append(adapter)
        if not self._warned_second:
            self._warned_second = True
            log.warning("a training run in a second session while the first is still open: "
                        "only the first session's steps are boundaries (close the old session "
                        "before training in a new one)")

    # -- binding, restore, warm hold ---------------------------------------------------------
    def _bind(self, adapter: SessionAdapter, training: bool = False) -> None:
        with self._lock:
            if adapter is self.adapter:
                return
            first = self.adapter is None
            self.adapter = adapter
            self._iterators_checked.clear()  # (see _training_elsewhere)
            if first:
                self._event("session_ready", t=time.time())
            # A warm process holds in the first session bound whose graph has a global
            # step: a job's step before training (a preprocessing script run before the
            # trainer, a session of its own with variables of its own) used to hold, be
            # activated in place of the trainer and leave the trainer waiting for an
            # activation that never came.
            if self.settings.warm and not self._warm_armed and adapter.has_global_step():
                self._warm_armed = True
                if not self.settings.warm_step and self.settings.source_towers:
                    self._check_source_towers(adapter)  # it holds right here
                if self.settings.warm_step:
                    if self.settings.control_fd is None:
                        raise RuntimeError("GANDIVA_WARM=1 needs GANDIVA_CONTROL_FD "
                                           "(the helper's control pipe)")
                    self._warm_pending = True  # hold at the first training step instead
                else:
                    self._warm_hold()
            if self.settings.restore_dir:
                self._restore_at_bind(adapter, training)
            elif adapter.has_global_step():
                self.meter.set_steps(adapter.global_step())
            if first:
                # The generators at the restore point: a draw before the first step (an
                # epoch's shuffle of the examples) is one of a stream too, which a restarted
                # copy makes again from the start. Before, the first look came after step 1,
                # so a copy migrated at the end of the first epoch shuffled its second epoch
                # as the first: other weights.
                self._watch_generators(adapter, now=True)

    def _restore_at_bind(self, adapter: SessionAdapter, training: bool) -> None:
        """Restore into the session at its restore point. Before the first training run it
        is not yet known which session trains: a program may create and initialise an
        evaluation session (another graph) first. A checkpoint that does not fit such a
        session is then not fatal; it is if that session goes on to train."""
        try:
            self._restore(adapter, self.settings.restore_dir,  # type: ignore[arg-type]
                          tentative=not training)
        except CheckpointError as exc:  # TowersChanged too
            if training:
                raise
            self._unfit = exc
            log.warning("the checkpoint does not fit the session initialised first (%s); "
                        "restoring into the session that trains instead, if it fits that one",
                        str(exc).splitlines()[0])
        else:
            self._unfit = None

    def _report_signature(self, adapter: SessionAdapter, first: FirstRun) -> None:
        if self.channel is None:
            return
        try:
            signature = adapter.signature(first.fetches, first.feed_dict, first.options)
        except Exception:  # never break the program's first step
            log.exception("could not describe the first training run")
            return
        if signature:
            self.channel.send_train_signature(signature)

    def _report_towers(self, adapter: SessionAdapter) -> None:
        """Tell the scheduler how many tower copies this graph has: a pre-warmed
        destination of a grow or shrink compares its own with them."""
        if self.channel is None:
            return
        try:
            towers = adapter.towers()
        except Exception:  # never break the program's first step
            log.exception("could not count the graph's towers")
            return
        self._send_towers(towers, 0, "")

    def _send_towers(self, towers: int, checkpoint_towers: int, reason: str) -> None:
        """A TowerReport, with the devices this launch was given (none without a stream)."""
        if self.channel is None:
            return
        from .towers import visible_device_count

        self.channel.send_towers(towers, checkpoint_towers, visible_device_count(default=0), reason)

    def _check_source_towers(self, adapter: SessionAdapter) -> None:
        """Warm mode: refuse, before holding, a graph whose tower count differs from the
        source's. Nothing is stopped yet: the source trains on, unchanged."""
        towers = adapter.towers()
        if towers != self.settings.source_towers:
            self._refuse_towers(TowersChanged("the launch this one would replace",
                                              self.settings.source_towers, towers))

    def _take_warm_pending(self, adapter: SessionAdapter) -> bool:
        """Whether this thread is the one to rehearse and hold (once per process): it
        then holds the others' reads and training runs until the restore is done."""
        with self._warm_done:
            if not self._warm_pending or adapter is not self.adapter or self.trained:
                return False
            self._warm_pending = False
            self._warm_thread = threading.current_thread()
            return True

    def _wait_for_warm(self) -> None:
        """Another thread's read of the step or training run waits while a warm process
        rehearses and holds. Before, only the gate held them, closed once the rehearsal
        was over: a program whose evaluation thread ran first after the restore point
        (so that thread held) read the warm process's own step 0 in its training thread
        meanwhile, and its migrated copy trained on the first mini-batches again (other
        weights). Runs that only feed input (queue runners) go on: the rehearsal may
        need them."""
        with self._warm_done:
            if self._warm_thread is None or self._warm_thread is threading.current_thread():
                return
            self._warm_waiting += 1
            try:
                while self._warm_thread is not None:
                    self._warm_done.wait()
            finally:
                self._warm_waiting -= 1

    def _warm_first_step(self, adapter: SessionAdapter, rehearse: Callable[[], Any] | None) -> None:
        try:
            self._rehearse_and_hold(adapter, rehearse)
        finally:
            with self._warm_done:
                self._warm_thread = None
                self._warm_done.notify_all()

    def _rehearse_and_hold(self, adapter: SessionAdapter, rehearse: Callable[[], Any] | None) -> None:
        """Warm mode: rehearse the first training run, hold, restore, go on.

        Called right before the program's first training run when nothing ran since
        the restore point (`rehearse` is that very run), or before the first other run
        after it (`rehearse` is the source's signature, or None: no rehearsal).

        The first run of the training fetches builds the session's executors (graph
        optimisation, partitioning over the replicas' devices): seconds for large
        models, most of a migration's first step. The rehearsal runs that exact step
        once between a snapshot save and its restore (so the save and restore ops'
        executors are built too, and the global variables are back as they were);
        then the process holds. On activation the checkpoint is restored over all
        training state and the program's own first step runs on warm executors.
        Other threads keep running during the rehearsal (queue runners must be able to
        feed it); the gate holds them from the hold until the restore is done.
        """
        if self.settings.source_towers:
            # Here, in the session about to hold, not in the first one initialised (an
            # evaluation session may have another tower count than the training graph).
            self._check_source_towers(adapter)
        timings: dict[str, float] = {}
        if rehearse is not None:
            try:
                timings = adapter.rehearse(rehearse)
            except Exception as exc:  # noqa: BLE001  (never break the program's own start)
                # CheckpointError, OSError, or the run itself failing where the program
                # had not yet set up its input (an iterator it initialises after the
                # restore point): the snapshot is restored; the first real step builds.
                log.warning("warm: no rehearsal of the first step (%s); holding without it",
                            error_summary(exc))
            else:
                self._save_built = True
                log.info("warm: first step rehearsed %s",
                         {k: round(v, 3) for k, v in timings.items()})
        self.gate.close_and_drain(DRAIN_TIMEOUT_S)
        try:
            self._warm_hold(**{k: round(v, 6) for k, v in timings.items()})
            if self.settings.restore_dir:
                self._restore(adapter, self.settings.restore_dir)
        finally:
            self.gate.open()

    def _warm_hold(self, **fields: Any) -> None:
        fd = self.settings.control_fd
        if fd is None:
            raise RuntimeError("GANDIVA_WARM=1 needs GANDIVA_CONTROL_FD (the helper's control pipe)")
        self._event("warm_ready", **fields)
        log.info("warm: holding before the first training step")
        activation = read_activation(fd)
        if activation.exit:
            log.info("warm: told to exit without training")
            self._exit(0)
            return
        self.settings.restore_dir = activation.restore_checkpoint
        if self._on_activate is not None:
            self._on_activate(self._peek_restored_step(activation.restore_checkpoint))

    @staticmethod
    def _peek_job_start(directory: str) -> tuple[int | None, float | None]:
        """The job's start step and start time (wall-clock) that the checkpoint carries."""
        from .checkpoint import validate

        manifest = validate(directory)
        start, started = manifest.get("start_step"), manifest.get("started_at")
        return (int(start) if isinstance(start, int) else None,
                float(started) if isinstance(started, (int, float)) and not isinstance(started, bool) else None)

    @property
    def restored(self) -> bool:
        """Whether this process restored a checkpoint of Gandiva's (a migration, a restart)."""
        return self._restored_into is not None

    @staticmethod
    def _peek_restored_step(directory: str | None) -> int:
        if not directory:
            return 0
        from .checkpoint import validate

        return int(validate(directory)["global_step"])

    def _restore(self, adapter: SessionAdapter, directory: str, partial: bool = False,
                 tentative: bool = False) -> None:
        """`tentative`: a session that may not be the one that trains; a checkpoint of
        another tower count is then raised to the caller, not refused at once."""
        try:
            # CheckpointError: refuse to start from step 0
            info = adapter.restore(directory, partial=partial)
        except TowersChanged as exc:
            if not tentative:
                self._refuse_towers(exc)
            raise  # only where exit_fn returns (tests): the process is gone otherwise
        self._restored_into = adapter
        self._read_since_restore = False
        self.restored_step = info.step
        self.job_start_step, self.job_started_at = self._peek_job_start(directory)
        self.meter.set_steps(info.step)
        self._event("restored", step=info.step, restore_s=round(info.seconds, 6))
        log.info("restored step %d from %s in %.3f s", info.step, directory, info.seconds)

    def _refuse_towers(self, exc: TowersChanged) -> None:
        """Leave without training a step: tell the scheduler (which stops growing and
        shrinking the job, and restarts it where the checkpoint came from) and exit."""
        log.error("%s", exc)
        self._event("restore_refused", reason=str(exc), towers=exc.towers,
                    checkpoint_towers=exc.checkpoint_towers)
        if self.channel is None and self._on_activate is not None:
            self._on_activate(0)  # a warm process opens its stream only to say why
        self._send_towers(exc.towers, exc.checkpoint_towers, str(exc))
        self._exit(EXIT_TOWERS_CHANGED)

    def _first_boundaries(self, adapter: SessionAdapter, final: bool = False) -> None:
        if self.migratable is not None:
            return
        if self._second_model:
            self._judge(False, self._second_model)
        elif not adapter.has_global_step():
            self._judge(False, _no_global_step(getattr(adapter, "step_counters", tuple)()))
        elif unsaved := _unsaved_variables(adapter):  # op names (no ":0")
            self._judge(False, f"its training run updates {unsaved[0]!r}, a variable in no collection "
                               "of the graph (tf.Variable(..., collections=[])), which no "
                               "checkpoint holds: a restarted copy would start it from its "
                               "initial value and train on to other weights; create it in a "
                               "collection (tf.Variable's and get_variable's default, or "
                               "LOCAL_VARIABLES) to make the job migratable")
        elif self._stateful_input:
            self._judge(False, f"its training run reads {self._stateful_input}: input whose "
                               "position is not in any checkpoint (a tf.data iterator, an "
                               "input queue, a stateful random op or a Python function "
                               "given no tensor) starts from its "
                               "beginning after a restore, so a migrated job would train on "
                               "other data than an uninterrupted run; compute the input from "
                               "the global step (feeds, stateless random ops seeded by it) "
                               "to make it migratable")
        elif self._unsaved_iterator:
            self._judge(False, f"its training run reads {self._unsaved_iterator}; a restarted "
                               "copy would read that pipeline from its beginning and train on "
                               "other data than an uninterrupted run; build it from datasets "
                               "whose state TensorFlow can save (Dataset.range, "
                               "from_tensor_slices, shuffle with a seed, map of graph ops; not "
                               "from_generator, py_function or numpy_function), or compute the "
                               "input from the global step, to make it migratable")
        elif self._carried_state:
            self._judge(False, self._carried_state)
        elif not self._advances_seen:
            if self.boundaries >= ADVANCE_WITHIN_RUNS or final:
                self._judged_no_advance = True
                self._judge(False, "no training run advances the global step, so a restarted "
                                   "program cannot know where to resume (pass it to the "
                                   "optimizer's minimize(global_step=...))")
        elif self._read_global_step and not self._read_step_first:
            early = self._read_unbound is not None and self._read_unbound() is adapter
            if early and (self._steps_seen >= JUDGE_AFTER_BOUNDARIES or final):
                self._judge(False, "the program reads the global step before it has "
                                   "initialised all its variables (the restore point), so a "
                                   "restarted copy would read the step from before its "
                                   "restore; read it after initialising every variable (or "
                                   "initialise them in one run) to make it migratable")
            elif self._steps_seen >= JUDGE_AFTER_BOUNDARIES or final:
                self._judge(False, "the program reads the global step only after its first "
                                   "training run (fetched with the training op, to log it), "
                                   "never before it: its loop does not start from the step "
                                   "(`for i in range(steps)` counts in Python from 0), so a "
                                   "restarted copy would redo its steps on other mini-batches; "
                                   "read it before the loop (`step = sess.run(global_step)`) "
                                   "and loop from it (`while step < steps`) to make it "
                                   "migratable")
        elif self._read_global_step:
            # Not before its second step: that is where a value the first returned would
            # first be fed back (carried_state).
            if self._steps_seen < JUDGE_AFTER_BOUNDARIES and not final:
                return
            if not self._own_read and len(self._feeds) > 1 and not (
                    self._program_hook_read and not self._fed_by_program):
                # `while not sess.should_stop(): sess.run(train, batch(i)); i += 1` under
                # StopAtStepHook: used to be judged migratable (the hook reads the step),
                # and a restored copy fed its batches from 0 again, other weights.
                self._judge(False, "only its MonitoredSession's hooks read the global step "
                                   "(StopAtStepHook), never the program, which feeds each "
                                   "training run other values: its mini-batches follow a "
                                   "counter of its own, which a restarted copy starts over, so "
                                   "it would redo its steps on other mini-batches; read the "
                                   "step in the loop (`step = sess.run(global_step)`) and feed "
                                   "the mini-batch of that step to make it migratable")
            else:
                # A hook of the program's own that reads the step when the session is made
                # and feeds every step through `SessionRunArgs` (an input hook) resumes from
                # the step: before, its read was taken for TensorFlow's StopAtStepHook and
                # the job refused as feeding "a counter of its own".
                self._judge(True, "the program reads the global step")
        elif (self._steps_seen >= JUDGE_AFTER_BOUNDARIES or final) and self._counter_read:
            # Its loop may follow that counter, which the checkpoint holds: "counts in
            # Python" was not true of it (accumulation on a micro-step variable, s44).
            self._judge(False, f"the program never reads the global step; it reads "
                               f"{self._counter_read!r}, a counter kept in a variable, which "
                               "the checkpoint holds, but the shim resumes a job from the "
                               "global step and cannot tell whether the loop follows that "
                               "counter or one in Python; read the global step in the loop "
                               "too (`step, count = sess.run([global_step, counter])`) and "
                               "go on from what it reads to make it migratable")
        elif self._steps_seen >= JUDGE_AFTER_BOUNDARIES or final:
            self._counted_in_python = self.boundaries
            self._judge(False, "the program never reads the global step: its loop counts "
                               "in Python (from 0, or from a count of its own such as its "
                               "checkpoint's file name), so after a restore it would not go "
                               "on from the restored step; read the step in the loop "
                               "(`step = sess.run(global_step)`) and feed the mini-batch of "
                               "that step to make it migratable")

    def _warm_up_counted_in_python(self) -> None:
        """The program reads the step at last, after training steps judged "counts in
        Python": a warm-up loop (`for i in range(warmup): sess.run(train, ...)`) before its
        loop on the step. Still not migratable (a restarted copy runs the warm-up again on
        top of the restored weights), but "never reads the global step" is no longer true:
        a user asking for a migration at step 129 of such a program was told it (s46)."""
        steps, self._counted_in_python = self._counted_in_python, 0
        self._judge(False, f"its first training steps (at least {steps}) counted in Python "
                           "without reading the global step (a warm-up loop `for i in "
                           "range(n)`), and only then does it read the step: a restarted "
                           "copy would run those steps again on top of the restored "
                           "weights and end with other weights than an uninterrupted run; "
                           "loop on the step there too (`while sess.run(global_step) < n`) "
                           "to make it migratable")

    def _judge_again_after_late_advance(self) -> None:
        """The first run that advances the global step came after ADVANCE_WITHIN_RUNS
        training runs that did not (a WGAN trains its critic 100 times before its first
        generator run, each critic run followed by a run that clips its weights): the job
        was judged not migratable for want of one, and stayed so for good, though its loop
        resumes from the step ("cannot resume from a checkpoint" to a user asking for a
        migration). Judge it again from here, as at the job's start."""
        if not self._judged_no_advance:
            return
        self._judged_no_advance = False
        log.info("a training run advances the global step after all, after %d that did not: "
                 "judging whether the job is migratable again", self.boundaries)
        self.migratable = None

    def _judge(self, migratable: bool, reason: str) -> None:
        if self.after_training:  # whatever its loop: see enqueue
            migratable, reason = False, self.after_training
        self.migratable = migratable
        log.info("migratable=%s: %s", migratable, reason)
        self._not_migratable_reason = "" if migratable else reason
        if self.channel is not None:
            self.channel.send_migratability(migratable, "" if migratable else reason)

    # -- applying commands -------------------------------------------------------------------
    def _next(self, block: bool) -> Command | None:
        with self._cond:
            while block and not self._queue:
                self._cond.wait()
            return self._queue.popleft() if self._queue else None

    def _apply_queued(self, adapter: SessionAdapter) -> None:
        # A checkpoint's save, a suspension: no mini-batch is due meanwhile.
        self.meter.begin_other()
        try:
            self._apply_commands(adapter)
        finally:
            self.meter.end_other()
        self.meter.pause()

    def _apply_commands(self, adapter: SessionAdapter) -> None:
        with self._lock:
            while (cmd := self._next(block=False)) is not None:
                saves = cmd.kind in (Kind.STOP_FOR_MIGRATION, Kind.CHECKPOINT)
                if (cmd.kind is Kind.STOP_FOR_MIGRATION and self.migratable is None
                        and self.boundaries) or (
                        (saves or cmd.kind is Kind.SUSPEND) and self._order_unknown
                        and self._steps_seen < 3):
                    # Not known yet whether the loop resumes from the global step: wait
                    # (at most JUDGE_AFTER_BOUNDARIES steps) rather than risk a restart from 0
                    # (before its first training run, suspended there, it saves the restore
                    # point: _stop_for_migration).
                    # Or a training run (or an update a copy could not make twice)
                    # followed the step-advancing one before the program's loop was seen:
                    # whether it ends that step or begins the next is known from the third
                    # step on (_after_training). A suspension too: a checkpoint or a stop
                    # for migration is served while suspended, at the suspension's cut (a
                    # copy suspended in its first step right after `if step % 4 == 0 and
                    # step: sess.run(next_epoch)` at the top of its loop, then moved, was
                    # restored past the increment and made it again: other weights).
                    with self._cond:
                        self._queue.appendleft(cmd)
                    break
                self._apply(adapter, cmd)

    def _apply(self, adapter: SessionAdapter, cmd: Command) -> None:
        waited = time.monotonic() - cmd.received_at
        if cmd.kind is Kind.SUSPEND:
            if self.suspended:
                self._ack(Ack(cmd.id, True, "already suspended", step=self.meter.steps))
            else:
                self._suspend(adapter, cmd, waited)
        elif cmd.kind is Kind.RESUME:
            self._ack(Ack(cmd.id, True, "not suspended", step=self.meter.steps))
        elif cmd.kind is Kind.CHECKPOINT:
            self._checkpoint(adapter, cmd, waited)
        elif cmd.kind is Kind.STOP_FOR_MIGRATION:
            self._stop_for_migration(adapter, cmd, waited)
        elif cmd.kind is Kind.KILL:
            self._ack(Ack(cmd.id, True, "killed", step=self.meter.steps,
                          durations_s={"wait_boundary": waited}))
            self._exit(EXIT_KILLED)

    def _hold_while_lease_out(self, adapter: SessionAdapter) -> None:
        """The helper's lease has run out (tf_runtime.lease): its host froze and woke
        before the helper could freeze this process again, or the helper hangs. No run, no
        step's end, no command (a periodic checkpoint sent before the freeze would be
        written over the restore point the job's new copy resumed from) until the helper
        renews it; a KILL arriving meanwhile (the job was placed elsewhere) ends this copy."""
        if self.lease.holds():
            return
        log.warning("the helper's lease has run out (its host stalled, or the helper hangs): "
                    "holding until it is renewed")
        while not self.lease.holds():
            self._kill_if_told(adapter, "killed while its helper's lease had run out")
            time.sleep(LEASE_POLL_S)
        log.warning("the helper's lease is renewed: going on")

    def _kill_if_told(self, adapter: SessionAdapter, why: str = "killed before its first mini-batch") -> None:
        """A KILL received while the job still started is applied before its first
        training run, not at that run's end as other commands are: the copy is stale (its
        helper hung, the job placed elsewhere) or killed, and its first mini-batch could
        train beside the job's new copy. The commands queued before it are answered as
        not done."""
        with self._cond:
            kill = next((c for c in self._queue if c.kind is Kind.KILL), None)
            if kill is None:
                return
            queued = list(self._queue)
            self._queue.clear()
        before = queued[:queued.index(kill)]
        for cmd in before:
            self._ack(Ack(cmd.id, False, f"not done: {why}", step=self.meter.steps))
        self._apply(adapter, kill)

    def _suspend_if_told(self, adapter: SessionAdapter) -> None:
        """A SUSPEND queued when the program reaches its first training run (after the
        restore point, any restore done) is applied before that run, with the commands
        queued with it, as at a step's end: the job holds there, its step acked, and trains
        its first mini-batch only once resumed. Before, it trained that mini-batch first,
        beside the running job of the time-slice group it was placed into, holding memory
        on the same GPU. A warm copy (activated for a migration) is left as it was.
        Neither is a program whose step began with runs of its own that changed the training
        state (micro-batches' gradients accumulated, `sess.run(accumulate, feed)` a few
        times, then `sess.run(apply)`): a hold there is within the step, and a checkpoint or
        a stop for migration served while suspended saved the sums and the micro-step count
        without the apply, which a restored copy, reading the counter at the top of its
        loop, never made (other weights). Its commands wait for the step's end."""
        if self.settings.warm:
            return
        with self._cond:
            if not any(c.kind is Kind.SUSPEND for c in self._queue):
                return
        if self._step_begun:
            log.info("not suspended before the first training run: the step began with "
                     "runs that changed the training state; commands wait for its end")
            return
        log.info("suspended before its first training run")
        self._apply_queued(adapter)

    def _suspend(self, adapter: SessionAdapter, cmd: Command, waited: float) -> None:
        if not self.backend.releases_memory and cmd.checkpoint_dir and self.migratable:
            # GPU memory cannot be released in place: checkpoint and exit instead (the
            # ack says why if that fails; the job then keeps running).
            self._stop_for_migration(adapter, cmd, waited)
            return
        t0 = time.monotonic()
        drained = self.gate.close_and_drain(DRAIN_TIMEOUT_S)
        t1 = time.monotonic()
        try:
            self.backend.release()
        except ReleaseError as exc:
            self.gate.open()
            self._ack(Ack(cmd.id, False, f"suspend failed: {exc}", step=self.meter.steps))
            return
        t2 = time.monotonic()
        self.suspended = True
        msg = "suspended" if drained else "suspended; another thread's run() was still in flight"
        if not self.backend.releases_memory:
            msg += f"; GPU memory held ({getattr(self.backend, 'reason', 'no release backend')})"
        self._ack(Ack(cmd.id, True, msg, step=self.meter.steps,
                      durations_s={"wait_boundary": waited, "drain": t1 - t0, "release": t2 - t1},
                      step_at=self.meter.went_on_at(self.meter.steps)))
        try:
            self._suspended_loop(adapter)
        finally:
            self.suspended = False
            self.gate.open()

    def _suspended_loop(self, adapter: SessionAdapter) -> None:
        raised: Exception | None = None
        while True:
            try:
                cmd = self._next(block=True)
            except Exception as exc:  # noqa: BLE001 - the program's signal handler's
                # A handler of the program's raised in the hold (`signal.alarm` of a
                # wall-clock budget raising TimeUp): it used to leave the hold at once, and
                # the program went on while the scheduler showed the job suspended (s46).
                # Raised where the job resumes instead; KeyboardInterrupt and SystemExit
                # (not Exceptions) still end it at once.
                log.info("the program's %s arrived while suspended: raised when resumed",
                         type(exc).__name__)
                raised = raised or exc
                continue
            assert cmd is not None
            if cmd.kind is Kind.RESUME:
                t0 = time.monotonic()
                self.backend.reacquire()
                self._ack(Ack(cmd.id, True, "resumed", step=self.meter.steps,
                              durations_s={"reacquire": time.monotonic() - t0}, step_at=time.time()))
                if raised is not None:
                    raise raised
                return
            if cmd.kind is Kind.SUSPEND:
                self._ack(Ack(cmd.id, True, "already suspended", step=self.meter.steps))
                continue
            if cmd.kind is Kind.KILL:
                self._apply(adapter, cmd)
                return
            # Checkpoint and stop-for-migration need the device memory back.
            self.backend.reacquire()
            self._apply(adapter, cmd)
            self.backend.release()

    def _prebuild_save(self, adapter: SessionAdapter) -> None:
        """Build the save op's executors off a migration's critical path (once).

        The first save in a session builds them (0.3-0.9 s for 8 ResNet-50-sized
        replicas on two cores): a save into scratch space at a quiet boundary, deleted
        at once, takes that out of the first stop-for-migration's save.
        """
        self._save_built = True
        try:
            seconds = adapter.prebuild_save()
        except (CheckpointError, OSError) as exc:
            log.warning("could not pre-build the save op (%s); the first save will", exc)
            return
        log.info("save op pre-built in %.3f s", seconds)
        self.meter.pause()

    def _save(self, adapter: SessionAdapter, directory: str) -> CheckpointInfo:
        self._save_built = True
        info = adapter.save(directory, self.settings.job_id, start_step=self.job_start_step,
                            started_at=self.job_started_at)
        self.meter.set_steps(info.step)
        self._event("checkpoint", path=info.path, save_s=round(info.seconds, 6), step=info.step)
        return info

    def _checkpoint(self, adapter: SessionAdapter, cmd: Command, waited: float) -> None:
        self._watch_generators(adapter, now=True)  # a verdict that changes is reported
        try:
            info = self._save(adapter, cmd.checkpoint_dir)
        except (CheckpointError, OSError) as exc:
            self._ack(Ack(cmd.id, False, f"checkpoint failed: {exc}", step=self.meter.steps))
            return
        self._ack(Ack(cmd.id, True, "checkpointed", info.path, info.step,
                      {"wait_boundary": waited, "save": info.seconds}))

    def _stop_for_migration(self, adapter: SessionAdapter, cmd: Command, waited: float) -> None:
        self._watch_generators(adapter, now=True)  # drawn since its last look: judged again
        if self.migratable is None and (self.boundaries or not adapter.has_global_step()):
            # Suspended before the verdict: judge on what was seen. Held before its first
            # training run (_suspend_if_told), it trained nothing since its restore point,
            # which is what the checkpoint holds: a copy restarted from it does what this
            # one would do (judged on no step, it would be "no training run advances the
            # global step", refused for good). A graph without a global step is refused.
            self._first_boundaries(adapter, final=True)
        if self.migratable is False:
            self._ack(Ack(cmd.id, False, f"not migratable: {self._not_migratable_reason}",
                          step=self.meter.steps))
            return
        try:
            info = self._save(adapter, cmd.checkpoint_dir)
        except (CheckpointError, OSError) as exc:
            self._ack(Ack(cmd.id, False, f"checkpoint failed, not stopping: {exc}",
                          step=self.meter.steps))
            return
        self._ack(Ack(cmd.id, True, "checkpointed, exiting for migration", info.path, info.step,
                      {"wait_boundary": waited, "save": info.seconds}))
        self._exit(EXIT_MIGRATED)

    # -- outputs ------------------------------------------------------------------------------
    def _ack(self, ack: Ack) -> None:
        log.info("command %s: ok=%s %s", ack.command_id, ack.ok, ack.message)
        if self.channel is not None:
            self.channel.send_ack(ack)

    def _event(self, event: str, **fields: Any) -> None:
        if self.status is not None:
            self.status.event(event, **fields)

    def _exit(self, code: int) -> None:
        """Deliver what is queued on the stream, then leave the process at once."""
        if self.channel is not None:
            self.channel.close(timeout_s=2.0)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            # (None: a program started with it closed, `python train.py >&-`: test_tfr_closed_stdout)
            except (OSError, ValueError, AttributeError):
                pass
        for handler in logging.getLogger().handlers:
            handler.flush()
        if self._on_exit is not None:
            try:
                self._on_exit(code)
            except Exception:  # the exit itself must happen
                log.warning("ending the launch's wrappers failed", exc_info=True)
        self._exit_fn(code)
