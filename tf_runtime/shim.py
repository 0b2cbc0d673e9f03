"""Installing the shim into TensorFlow: patches of Session and Graph.finalize.

No user code changes: `BaseSession.__init__` gets a wrapper chain per session,
`BaseSession.run` goes through it, so do the callables of `BaseSession.make_callable`
and `_make_callable_from_options` (TensorFlow runs those without `run`: a program
training through one would otherwise never reach a mini-batch boundary the shim
sees), so do the calls of `BaseSession.partial_run` (routed through the chain, which hands
them back to TensorFlow's partial run of the program's handle), `BaseSession.close` marks the session closed (a throw-away session is then
forgotten) and, like `BaseSession.partial_run_setup`, first applies the commands waiting for
the cut after the last step (Controller.cut_here), `Graph.finalize` builds the shim's checkpoint ops while the graph
can still take them, and `StopAtStepHook(num_steps=N)` of a restored job counts its N
steps from where the job started (carried in the checkpoint), not from the restore. In a copy
that restores the job's checkpoint, `init_from_checkpoint` of a checkpoint that can no longer
be read (deleted by the program after its warm start) is skipped. Patching waits for the
program's own `import tensorflow` (a post-import hook), so environment settings
the program makes before importing TensorFlow still apply.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
from types import ModuleType
from typing import Any

from .controller import Controller

log = logging.getLogger(__name__)

_ORIG: dict[str, Any] = {}
_CONTROLLER: list[Controller] = []
# The partial run (session, handle) this thread's `partial_run` call is making: the chain's
# innermost run executes it instead of a plain `Session.run` of the same fetches.
_PARTIAL = threading.local()


def _patch_tensorflow() -> None:
    if _ORIG:
        return
    from tensorflow.python.checkpoint import checkpoint_management
    from tensorflow.python.client import session as tf_session_mod
    from tensorflow.python.framework import errors as tf_errors
    from tensorflow.python.framework import ops
    from tensorflow.python.training import basic_session_run_hooks as hooks_mod
    from tensorflow.python.training import checkpoint_utils
    from tensorflow.python.training import saver as saver_mod

    from . import chain, data_state, launch_devices, own_checkpoints, own_exports, tf_session
    from .errors import error_summary

    base = tf_session_mod.BaseSession
    orig_init, orig_run, orig_close = base.__init__, base.run, base.close
    orig_make, orig_make_opts = base.make_callable, base._make_callable_from_options
    orig_partial, orig_partial_setup = base.partial_run, base.partial_run_setup
    orig_finalize = ops.Graph.finalize
    stop_hook = hooks_mod.StopAtStepHook
    orig_stop_created, orig_stop_after_run = stop_hook.after_create_session, stop_hook.after_run
    saver_hook = hooks_mod.CheckpointSaverHook
    orig_saver_created, orig_saver_after_run = saver_hook.after_create_session, saver_hook.after_run
    orig_saver_save, orig_saver_restore = saver_mod.Saver.save, saver_mod.Saver.restore
    orig_warm_start = checkpoint_utils._init_from_checkpoint
    launch_devices.keep()  # the program's own CUDA_VISIBLE_DEVICES, set before its import
    _ORIG.update(init=orig_init, run=orig_run, close=orig_close, finalize=orig_finalize,
                 saver_save=orig_saver_save, saver_restore=orig_saver_restore, make=orig_make, make_opts=orig_make_opts, partial=orig_partial,
                 partial_setup=orig_partial_setup, stop_created=orig_stop_created,
                 stop_after_run=orig_stop_after_run, warm_start=orig_warm_start,
                 saver_created=orig_saver_created, saver_after_run=orig_saver_after_run)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if _CONTROLLER:
            launch_devices.keep()  # before TensorFlow starts CUDA for this session
        orig_init(self, *args, **kwargs)
        if not _CONTROLLER:
            return
        ctl = _CONTROLLER[0]

        def real_run(fetches: Any, feed_dict: Any, options: Any, run_metadata: Any) -> Any:
            return orig_run(self, fetches, feed_dict, options, run_metadata)

        if not self.graph.finalized:
            try:
                tf_session.ensure_checkpointer(self.graph)
                data_state.ensure_ops(self.graph)
            except Exception:  # never break the program's session creation
                log.exception("could not build the checkpoint ops at session creation")
        adapter = tf_session.TFSessionAdapter(self, real_run)

        def chain_run(fetches: Any, feed_dict: Any, options: Any, run_metadata: Any) -> Any:
            # The program's own run, at the chain's end: a call of `partial_run` is made
            # on its handle (the shim's own runs, its saves and restores, use `real_run`).
            pending = getattr(_PARTIAL, "call", None)
            if pending is None or pending[0] is not self:
                return orig_run(self, fetches, feed_dict, options, run_metadata)
            if adapter.rehearsing:  # a pre-warmed process's rehearsal: never the handle
                raise RuntimeError("a step made through Session.partial_run is not rehearsed")
            _PARTIAL.call = None
            return orig_partial(self, pending[1], fetches, feed_dict)

        self._gandiva_chain = chain.build_chain(chain_run, adapter, ctl, ctl.gate)

    def run(self: Any, fetches: Any, feed_dict: Any = None, options: Any = None,
            run_metadata: Any = None) -> Any:
        c = self.__dict__.get("_gandiva_chain")
        if c is None:
            return orig_run(self, fetches, feed_dict, options, run_metadata)
        return c.run(fetches, feed_dict, options, run_metadata)

    def make_callable(self: Any, fetches: Any, feed_list: Any = None,
                      accept_options: bool = False) -> Any:
        made = orig_make(self, fetches, feed_list, accept_options)  # checks the arguments
        if feed_list is not None or self.__dict__.get("_gandiva_chain") is None:
            return made  # TensorFlow's own callable with feeds calls `run`

        if accept_options:
            def through_run_with(options: Any = None, run_metadata: Any = None) -> Any:
                return run(self, fetches, None, options, run_metadata)
            return through_run_with

        def through_run() -> Any:
            return run(self, fetches)
        return through_run

    def make_callable_from_options(self: Any, callable_options: Any) -> Any:
        made = orig_make_opts(self, callable_options)
        if self.__dict__.get("_gandiva_chain") is None:
            return made
        routed = _routable(callable_options)
        if routed is None:
            log.warning("a callable with tensor connections or fixed devices runs outside "
                        "the shim: its runs are not mini-batch boundaries it can act at")
            return made
        fetch_names, target_names, feed_names, options = routed

        def through_run(*feed_values: Any, **kwargs: Any) -> Any:
            if len(feed_values) != len(feed_names):
                return made(*feed_values, **kwargs)  # TensorFlow's own error
            out = run(self, fetch_names + target_names, dict(zip(feed_names, feed_values)),
                      options, kwargs.get("run_metadata"))
            return out[:len(fetch_names)]
        return through_run

    def partial_run(self: Any, handle: Any, fetches: Any, feed_dict: Any = None) -> Any:
        # TensorFlow makes a partial run without `Session.run`: a program training through
        # one (`h = sess.partial_run_setup([loss, train_t], [x, y])`, then `partial_run(h,
        # loss, feed)` and `partial_run(h, train_t)`) reached no boundary the shim saw, so no
        # command (suspend, checkpoint, migration) was ever applied. Each call goes through
        # the chain like a run of its fetches: the one fetching the update is the step.
        c = self.__dict__.get("_gandiva_chain")
        if c is None:
            return orig_partial(self, handle, fetches, feed_dict)
        _PARTIAL.call = (self, handle)
        try:
            return c.run(fetches, feed_dict)
        finally:
            _PARTIAL.call = None

    def partial_run_setup(self: Any, *args: Any, **kwargs: Any) -> Any:
        # A new handle begins the next step: TensorFlow may run its update right here (what
        # needs no feed runs at once), so commands waiting for the cut are applied first.
        c = self.__dict__.get("_gandiva_chain")
        if c is not None and _CONTROLLER:
            _CONTROLLER[0].cut_here(c.adapter)
        return orig_partial_setup(self, *args, **kwargs)

    def close(self: Any) -> None:
        c = self.__dict__.get("_gandiva_chain")
        if c is not None:
            if _CONTROLLER:
                _CONTROLLER[0].cut_here(c.adapter)
            c.adapter.closed = True
        orig_close(self)

    def finalize(self: Any) -> None:
        if _CONTROLLER and not self.finalized:
            try:
                tf_session.ensure_checkpointer(self)
                data_state.ensure_ops(self)
            except Exception:
                log.exception("could not build the checkpoint ops before Graph.finalize")
        orig_finalize(self)

    def report_stop_step(hook: Any) -> None:
        # The program says at which step it stops: the scheduler shows progress and an
        # ETA against it (a user's --steps is only a guess of the same).
        last = getattr(hook, "_last_step", None)
        if _CONTROLLER and isinstance(last, int) and 0 < last != _CONTROLLER[0].meter.total_steps:
            _CONTROLLER[0].meter.total_steps = last
            _CONTROLLER[0].meter.version += 1

    def counted_from_the_job_start(hook: Any) -> None:
        start = _CONTROLLER[0].job_start_step if _CONTROLLER else None
        if start is not None and hook._last_step != start + hook._num_steps:
            # A restored job: N steps from where the job started, not from the restore
            # (its uninterrupted run stops there).
            hook._last_step = start + hook._num_steps
            log.info("StopAtStepHook(num_steps=%d): the job started at step %d, so it stops "
                     "at step %d", hook._num_steps, start, hook._last_step)

    def stop_after_create_session(self: Any, session: Any, coord: Any) -> None:
        counted = self._last_step is None and getattr(self, "_num_steps", None) is not None
        orig_stop_created(self, session, coord)
        if counted:
            self._gandiva_counted = True
            counted_from_the_job_start(self)
        report_stop_step(self)

    def stop_after_run(self: Any, run_context: Any, run_values: Any) -> None:
        if getattr(self, "_gandiva_counted", False):  # a warm process learns it on activation
            counted_from_the_job_start(self)
            report_stop_step(self)
        orig_stop_after_run(self, run_context, run_values)

    def job_saved_at(hook: Any) -> tuple[int, int] | None:
        # A CheckpointSaverHook(save_steps=N) saves when its session starts and every N
        # steps from its last save: in the job's uninterrupted run, every N steps from the
        # step the job started at. (The restored step, the last such step up to it), or
        # None (not restored, a hook by seconds).
        ctl = _CONTROLLER[0] if _CONTROLLER else None
        timer = getattr(hook, "_timer", None)
        every = getattr(timer, "_every_steps", None)
        if ctl is None or not ctl.restored or ctl.job_start_step is None or \
                not isinstance(every, int) or every <= 0 or \
                getattr(timer, "_every_secs", None) is not None:
            return None
        step, start = ctl.restored_step, ctl.job_start_step
        return (step, start + (step - start) // every * every) if step >= start else None

    def saver_after_create_session(self: Any, session: Any, coord: Any) -> None:
        # A process restored at a step the uninterrupted run saved nothing at: its
        # session's save there is not made (the run's own restart would make it).
        steps = job_saved_at(self)
        if steps is None or steps[0] == steps[1]:
            orig_saver_created(self, session, coord)
            return
        self._save = lambda *_: False
        try:
            orig_saver_created(self, session, coord)
        finally:
            del self._save

    def saver_after_run(self: Any, run_context: Any, run_values: Any) -> None:
        # Restored (a migration, a restart, a pre-warmed copy activated): the hook counted
        # its N steps from its session's start (the restored step, or the program's own
        # checkpoint restored before Gandiva's), so it saved at other steps than the
        # uninterrupted run (s52: 165, 175, ... for 160, 170, ...); now from the last step
        # the job saved at, once, at its first run after the restore.
        if not self.__dict__.get("_gandiva_aligned", False):
            steps = job_saved_at(self)
            if steps is not None:
                self._gandiva_aligned = True
                if self._timer.last_triggered_step() != steps[1]:
                    log.info("CheckpointSaverHook(save_steps=%d): the job saved at step %d, "
                             "so it saves next at step %d", self._timer._every_steps, steps[1],
                             steps[1] + self._timer._every_steps)
                    self._timer.update_last_triggered_step(steps[1])
        orig_saver_after_run(self, run_context, run_values)

    def saver_save(self: Any, sess: Any, save_path: Any, *args: Any, **kwargs: Any) -> Any:
        # The program's own Saver, first save in a process restored from Gandiva's
        # checkpoint: it takes up the checkpoints it wrote before (tf_runtime.own_checkpoints).
        if _CONTROLLER and _CONTROLLER[0].restored and \
                not self.__dict__.get("_gandiva_recovered") and isinstance(save_path, str):
            self._gandiva_recovered = True
            latest = kwargs.get("latest_filename", args[1] if len(args) > 1 else None)
            try:
                own_checkpoints.recover(self, save_path, latest,
                                        checkpoint_management.get_checkpoint_state,
                                        lambda p: next(iter(checkpoint_management.get_checkpoint_mtimes([p])),
                                                       None),
                                        _CONTROLLER[0].job_started_at)
            except Exception:  # never break the program's save
                log.exception("could not take up the program's earlier checkpoints")
        saved = orig_saver_save(self, sess, save_path, *args, **kwargs)
        if _CONTROLLER and _CONTROLLER[0].restored and isinstance(saved, str):
            _CONTROLLER[0].saved_since_restore.add(os.path.abspath(saved))
        return saved

    def saver_restore(self: Any, sess: Any, save_path: Any) -> Any:
        # A file this process saved after Gandiva's restore holds values of the restored
        # state (the weights saved, the averages restored into them for an evaluation):
        # not a pre-trained backbone's that the restore must go over again before reads.
        ctl = _CONTROLLER[0] if _CONTROLLER else None
        own = ctl is not None and isinstance(save_path, str) and \
            os.path.abspath(save_path) in ctl.saved_since_restore
        if ctl is not None and own:
            ctl.restoring_own_save = True
        try:
            return orig_saver_restore(self, sess, save_path)
        finally:
            if ctl is not None and own:
                ctl.restoring_own_save = False

    saver_save.__doc__ = orig_saver_save.__doc__
    saver_mod.Saver.save = saver_save
    saver_restore.__doc__ = orig_saver_restore.__doc__
    saver_mod.Saver.restore = saver_restore

    def warm_start(ckpt_dir_or_file: Any, assignment_map: Any) -> Any:
        # `init_from_checkpoint` of a file the program deleted once it had initialised (a
        # staged download): a copy that restores the job's checkpoint (restarted, or
        # pre-warmed) overwrites every variable the warm start sets, so the file is not
        # needed, and reading it would end the copy before its restore.
        ctl = _CONTROLLER[0] if _CONTROLLER else None
        if ctl is not None and (ctl.settings.restore_dir or ctl.settings.warm):
            try:
                checkpoint_utils.load_checkpoint(ckpt_dir_or_file)
            except (ValueError, tf_errors.OpError) as exc:
                log.warning("init_from_checkpoint(%r) skipped: it cannot be read (%s), and "
                            "this copy restores every variable from the job's checkpoint",
                            ckpt_dir_or_file, error_summary(exc)[:200])
                return None
        return orig_warm_start(ckpt_dir_or_file, assignment_map)

    checkpoint_utils._init_from_checkpoint = warm_start
    # The program's SavedModel exports of steps a restarted copy trains again.
    own_exports.patch(lambda: _CONTROLLER[0] if _CONTROLLER else None)
    run.__doc__ = orig_run.__doc__
    make_callable.__doc__ = orig_make.__doc__
    base.__init__, base.run, base.close = __init__, run, close
    partial_run.__doc__ = orig_partial.__doc__
    base.partial_run = partial_run
    partial_run_setup.__doc__ = orig_partial_setup.__doc__
    base.partial_run_setup = partial_run_setup
    base.make_callable, base._make_callable_from_options = (make_callable,
                                                            make_callable_from_options)
    ops.Graph.finalize = finalize
    stop_hook.after_create_session = stop_after_create_session
    stop_hook.after_run = stop_after_run
    saver_hook.after_create_session = saver_after_create_session
    saver_hook.after_run = saver_after_run
    log.debug("tf_runtime: TensorFlow sessions patched")


def _routable(opts: Any) -> tuple[list[str], list[str], list[str], Any] | None:
    """(fetch names, target names, feed names, run options or None) of a CallableOptions
    that `Session.run` can execute alike, or None where it cannot (tensor connections,
    fixed feed or fetch devices)."""
    if opts.tensor_connection or opts.feed_devices or opts.fetch_devices:
        return None
    options = opts.run_options if opts.HasField("run_options") else None
    return list(opts.fetch), list(opts.target), list(opts.feed), options


class _PostImportHook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs `_patch_tensorflow` right after the program imports `tensorflow`."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "tensorflow":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self._inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._inner.create_module(spec)  # type: ignore[attr-defined, no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)  # type: ignore[attr-defined]
        _remove_hook()
        _patch_tensorflow()


_HOOK = _PostImportHook()


def _remove_hook() -> None:
    if _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


def hook_spec(fullname: str, path: Any) -> Any:
    """The spec of `fullname` (tensorflow) through the post-import hook, for a finder
    that starts the runtime in the middle of that import (tf_runtime.autoload)."""
    return _HOOK.find_spec(fullname, path)


def install(controller: Controller) -> None:
    """Route every Session created from now on through `controller`."""
    _CONTROLLER[:] = [controller]
    if "tensorflow" in sys.modules:
        _patch_tensorflow()
    elif _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)


def uninstall() -> None:
    """Undo `install` (tests, benchmarks). Existing sessions go back to plain runs."""
    _CONTROLLER.clear()
    _remove_hook()
    if not _ORIG:
        return
    from tensorflow.python.client import session as tf_session_mod
    from tensorflow.python.framework import ops

    base = tf_session_mod.BaseSession
    base.__init__, base.run, base.close = _ORIG["init"], _ORIG["run"], _ORIG["close"]
    base.partial_run, base.partial_run_setup = _ORIG["partial"], _ORIG["partial_setup"]
    base.make_callable, base._make_callable_from_options = _ORIG["make"], _ORIG["make_opts"]
    ops.Graph.finalize = _ORIG["finalize"]
    from tensorflow.python.training import basic_session_run_hooks as hooks_mod

    hooks_mod.StopAtStepHook.after_create_session = _ORIG["stop_created"]
    hooks_mod.StopAtStepHook.after_run = _ORIG["stop_after_run"]
    hooks_mod.CheckpointSaverHook.after_create_session = _ORIG["saver_created"]
    hooks_mod.CheckpointSaverHook.after_run = _ORIG["saver_after_run"]
    from tensorflow.python.training import saver as saver_mod

    saver_mod.Saver.save = _ORIG["saver_save"]
    saver_mod.Saver.restore = _ORIG["saver_restore"]
    from tensorflow.python.training import checkpoint_utils

    checkpoint_utils._init_from_checkpoint = _ORIG["warm_start"]
    from . import own_exports

    own_exports.unpatch()
    _ORIG.clear()
