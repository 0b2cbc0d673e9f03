"""The TensorFlow side: classifying runs, and saving/restoring the training state.

`TFSessionAdapter` wraps one tf.compat.v1 Session for the chain and controller.
`Checkpointer` holds the ops the shim adds to a graph: a Saver over one copy of each
variable (replicas grouped by tf_runtime.replicas) and a single RestoreV2 that is
assigned to every replica. They must exist before the graph is finalized, so the
shim builds them when a session is created or when `Graph.finalize` is called
(MonitoredSession and Supervisor finalize before creating their session).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import io_ops

from . import data_state
from .chain import FirstRun, RunInfo
from .checkpoint import (
    PREFIX,
    CheckpointError,
    CheckpointInfo,
    check_towers,
    iterator_entries,
    read_iterator_states,
    remove_stale_temporaries,
    validate,
    write_atomically,
    write_iterator_states,
)
from .errors import error_summary
from .fetches import fetch_key, flatten
from .graph_walk import FunctionScan, Inside, through
from .replicas import Group, VarSpec, group_replicas, strip_output

log = logging.getLogger(__name__)

_TRAIN_PREFIXES = ("Apply", "ResourceApply", "SparseApply", "ResourceSparseApply")
_STEP_UPDATES = {"AssignAdd", "AssignAddVariableOp", "AssignSub", "AssignSubVariableOp"}
# What sets the global step in a training run: its increment, or `gs.assign(gs + 1)`.
_STEP_SETS = _STEP_UPDATES | {"Assign", "AssignVariableOp"}
# Sparse updates of a variable's rows (an embedding trained by hand:
# `tf.compat.v1.scatter_sub(table, ids, rate * grad.values)`): in place, computed from the
# rows they change, like AssignAdd; or rows set to a value, like Assign.
_SCATTER_UPDATES = frozenset(f"{kind}Scatter{how}" for kind in ("", "Resource") for how in (
    "Add", "Sub", "Mul", "Div", "Min", "Max", "NdAdd", "NdSub", "NdMin", "NdMax"))
_SCATTER_SETS = frozenset({"ScatterUpdate", "ResourceScatterUpdate", "ScatterNdUpdate",
                           "ResourceScatterNdUpdate"})
# Every op that changes a variable in place (the variable is its first input, the value
# its last).
_INCREMENTS = frozenset(_STEP_UPDATES) | _SCATTER_UPDATES
_CHANGES = frozenset(_STEP_SETS) | _SCATTER_UPDATES | _SCATTER_SETS
_READS = {"ReadVariableOp", "Identity", "Cast", "AssignAdd", "AssignAddVariableOp", "Snapshot"}
_RESTORES = {"RestoreV2", "Restore", "RestoreSlice"}
# Input whose position lives in the process, not in a variable: a tf.data iterator, an
# input queue or reader, a stateful random op (dropout, random crops). A restored copy
# starts it from its beginning, so its training data differs from an uninterrupted run's.
_STATEFUL_INPUTS = frozenset({
    "IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional",
    "QueueDequeue", "QueueDequeueV2", "QueueDequeueMany", "QueueDequeueManyV2",
    "QueueDequeueUpTo", "QueueDequeueUpToV2", "ReaderRead", "ReaderReadV2",
    "ReaderReadUpTo", "ReaderReadUpToV2",
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2", "RandomCrop", "NonDeterministicInts",
    # The negative classes of tf.nn.nce_loss / sampled_softmax_loss (word2vec), random
    # crops of Inception's preprocessing, fractional pooling: generators in the kernel too.
    "LogUniformCandidateSampler", "UniformCandidateSampler", "FixedUnigramCandidateSampler",
    "LearnedUnigramCandidateSampler", "ThreadUnsafeUnigramCandidateSampler",
    "AllCandidateSampler", "SampleDistortedBoundingBox", "SampleDistortedBoundingBoxV2",
    "FractionalMaxPool", "FractionalAvgPool"})
# Of those, the random ops: a run of its own that draws from one and reads no variable
# hands the program numbers from a sequence no checkpoint holds (RunInfo.draws). Iterators
# and queues read alone are left to the before-every-step rule (an evaluation's own input).
_RANDOM_OPS = _STATEFUL_INPUTS - {
    "IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional",
    "QueueDequeue", "QueueDequeueV2", "QueueDequeueMany", "QueueDequeueManyV2",
    "QueueDequeueUpTo", "QueueDequeueUpToV2", "ReaderRead", "ReaderReadV2",
    "ReaderReadUpTo", "ReaderReadUpToV2"}
_CACHE_LIMIT = 512
_LOADS = frozenset({"Assign", "AssignVariableOp"}) | _SCATTER_SETS
# A sliced assignment (`c[0].assign(...)`, `w[:, 1].assign(...)`) changes part of a variable.
_SLICE_SETS = frozenset({"StridedSliceAssign", "ResourceStridedSliceAssign"})
# State the checkpoint holds that changes by other ops than assignments: a mutable lookup
# table's inserts and removals (the table is the op's first input), and the draws of a
# `tf.random.Generator`, which advance its state variable (the op's first input) as they read
# it. A run of its own that makes one changes the training state as an assignment does.
_TABLE_CHANGES = frozenset({"LookupTableInsert", "LookupTableInsertV2", "LookupTableRemoveV2",
                            "LookupTableImport", "LookupTableImportV2"})
_GENERATOR_DRAWS = frozenset({
    "RngReadAndSkip", "RngSkip", "StatefulUniform", "StatefulUniformInt",
    "StatefulUniformFullInt", "StatefulStandardNormal", "StatefulStandardNormalV2",
    "StatefulTruncatedNormal", "StatefulRandomBinomial"})
# The ops that change the variable that is their first input.
_CHANGES_ANY = _CHANGES | _LOADS | _INCREMENTS | _SLICE_SETS | _GENERATOR_DRAWS
_DEPENDS_LIMIT = 200_000  # ops an assign's value is searched through for its own variable


# A staging area's takes and puts (`StagingArea.get()`/`peek()`, `put()`; the map staging
# areas'), one area named by the ops' container and shared_name attributes.
_STAGING_TAKES = frozenset({"Unstage", "StagePeek", "MapUnstage", "MapUnstageNoKey", "MapPeek",
                            "OrderedMapUnstage", "OrderedMapUnstageNoKey", "OrderedMapPeek"})
_STAGING_PUTS = frozenset({"Stage", "MapStage", "OrderedMapStage"})


def _staging_area(op: Any) -> tuple[Any, Any]:
    """The staging area a take or put op works on: (container, shared_name)."""
    try:
        return op.get_attr("container"), op.get_attr("shared_name")
    except ValueError:
        return None, op.name


_PY_FUNCS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
_CONSTANT_INPUTS = frozenset({"Const", "HostConst"})


def _stateful_node(kind: str, inputs: list[str]) -> bool:
    """Whether an op of type `kind`, its inputs of the types `inputs`, reads input whose
    position no checkpoint holds (the same rule for graph ops and function nodes): one of
    `_STATEFUL_INPUTS`, or a Python function in the graph that takes nothing from it
    (`tf.numpy_function(lambda: next(batches), [], ...)`), whose values come from the
    program's Python state (an iterator, a file position, numpy's global generator). One
    given a tensor (the global step, a placeholder, the weights) is taken to compute from it."""
    return kind in _STATEFUL_INPUTS or (
        kind in _PY_FUNCS and all(t in _CONSTANT_INPUTS for t in inputs))


def _py_func_tokens(ops: Any) -> tuple[str, ...]:
    """The registry tokens of the Python functions among `ops`."""
    out = []
    for op in ops:
        if op.type in _PY_FUNCS:
            try:
                token = op.get_attr("token")
            except (ValueError, TypeError):
                continue
            out.append(token.decode() if isinstance(token, bytes) else str(token))
    return tuple(sorted(out))


def _tables_prefix(prefix: str) -> str:
    """Where the lookup tables go, beside the variables' files (`model` -> `tables`)."""
    return str(Path(prefix).with_name("tables"))


def _state_key(graph: tf.Graph, variables: list[Any]) -> tuple[str, ...]:
    """What a checkpointer covers: the variables' names and the saveable objects'."""
    tables = [getattr(t, "name", str(id(t)))
              for t in graph.get_collection(tf_ops.GraphKeys.SAVEABLE_OBJECTS)]
    return tuple(sorted(v.name for v in variables)) + tuple(sorted(f"table:{n}" for n in tables))


_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable", "AutoReloadVariable"})
_LOCAL_KEYS = (tf_ops.GraphKeys.LOCAL_VARIABLES, tf_ops.GraphKeys.METRIC_VARIABLES)


def _state_variables(graph: tf.Graph) -> tuple[list[Any], list[Any]]:
    """The graph's variables, as (model, local): every variable of any collection. The
    model's are the global variables and those a program keeps in collections of its own
    (`get_variable(..., collections=["model", TRAINABLE_VARIABLES])`, which
    `global_variables()` misses); the local ones (streaming metrics' accumulators, an input
    producer's epoch counter) are those only in LOCAL_VARIABLES or METRIC_VARIABLES. Each
    variable once, in the order its collections list it."""
    local_ids = {id(v) for key in _LOCAL_KEYS for v in graph.get_collection(key)}
    model: dict[str, Any] = {}
    local: dict[str, Any] = {}
    keys = [tf_ops.GraphKeys.GLOBAL_VARIABLES, *sorted(
        k for k in graph.get_all_collection_keys()
        if isinstance(k, str) and k != tf_ops.GraphKeys.GLOBAL_VARIABLES)]
    for key in keys:
        for v in graph.get_collection(key):
            # A variable itself: not what `assign` returns on a resource variable (an
            # unread variable, which UPDATE_OPS holds for a moving average's update).
            if not isinstance(v, tf.Variable) or v.op.type not in _VARIABLE_OPS or \
                    v.name in model or v.name in local:
                continue
            (local if id(v) in local_ids and key != tf_ops.GraphKeys.GLOBAL_VARIABLES
             else model)[v.name] = v
    return list(model.values()), list(local.values())


def _shape(variable: Any) -> tuple[int | None, ...] | None:
    """A variable's static shape; None when not even its rank is known (a variable made
    with `validate_shape=False`, or `shape=tf.TensorShape(None)`, whose shape may change
    as it trains: a history grown by `tf.concat`)."""
    return None if variable.shape.rank is None else tuple(variable.shape.as_list())


def _assign(variable: Any, value: Any) -> Any:
    """The restore of one variable: the saved value whatever its shape when the variable's
    own is not fully known (a grown variable's saved value is longer than the initial one
    a restarted copy holds, which a reference variable's checked assign refuses)."""
    if variable.shape.is_fully_defined():
        return variable.assign(value, read_value=False)
    return tf.compat.v1.assign(variable, value, validate_shape=False).op


def _locals_prefix(prefix: str) -> str:
    """Where the local variables go, beside the variables' files (`model` -> `locals`)."""
    return str(Path(prefix).with_name("locals"))


class Checkpointer:
    """Save and restore ops for one graph's training state."""

    def __init__(self, graph: tf.Graph, split: frozenset[str] = frozenset()) -> None:
        variables, local = _state_variables(graph)
        if not variables:
            raise CheckpointError("the graph has no global variables to checkpoint")
        self.key = _state_key(graph, variables + local)
        by_name = {strip_output(v.name): v for v in variables}
        specs = [VarSpec(n, _shape(v), v.dtype.base_dtype.name) for n, v in by_name.items()]
        self.groups: list[Group]
        self.groups, self.replicas = group_replicas(specs, split)
        # Whether each grouped name's copies hold the same values (`differing`): names
        # say a variable is one tower's copy, only its values say it is a replica.
        self.split = split
        self._same: Any = None
        self._same_names: tuple[str, ...] = ()
        unchecked: set[str] = set()
        checks, names = [], []
        with graph.as_default(), tf.name_scope("gandiva_checkpoint/same"):
            for g in self.groups:
                if len(g.members) < 2:
                    continue
                try:
                    first = by_name[g.members[0]]
                    checks.append(tf.reduce_all(tf.stack(
                        [tf.reduce_all(tf.equal(first, by_name[m])) for m in g.members[1:]])))
                    names.append(g.canonical)
                except (TypeError, ValueError):  # a dtype tf.equal does not take: not trusted
                    unchecked.add(g.canonical)
            if checks:
                self._same, self._same_names = tf.stack(checks), tuple(names)
        if unchecked:
            self.split = split | unchecked
            self.groups, self.replicas = group_replicas(specs, self.split)
        with graph.as_default(), tf.name_scope("gandiva_checkpoint"), tf.device("/cpu:0"):
            self.saver = tf.compat.v1.train.Saver(
                var_list={g.canonical: by_name[g.members[0]] for g in self.groups},
                sharded=False, allow_empty=False, save_relative_paths=True,
                max_to_keep=None, write_version=tf.compat.v1.train.SaverDef.V2,
                name="saver")
            self._prefix = tf.compat.v1.placeholder(tf.string, [], name="restore_prefix")
            dtypes = [by_name[g.members[0]].dtype.base_dtype for g in self.groups]
            values = io_ops.restore_v2(self._prefix, [g.canonical for g in self.groups],
                                       [""] * len(self.groups), dtypes, name="restore_v2")
        assigns = []
        with graph.as_default(), tf.name_scope("gandiva_checkpoint/assign"):
            for g, value in zip(self.groups, values):
                for member in g.members:
                    assigns.append(_assign(by_name[member], value))
            self.restore_op = tf.group(*assigns, name="restore_all")
        self._save_tensor = self.saver.saver_def.save_tensor_name
        self._filename = self.saver.saver_def.filename_tensor_name
        # Training state that is not a variable: mutable lookup tables (MutableHashTable,
        # DenseHashTable) register savers of their own, which the program's Saver uses.
        tables = graph.get_collection(tf_ops.GraphKeys.SAVEABLE_OBJECTS)
        self.tables: Any = None
        if tables:
            with graph.as_default(), tf.name_scope("gandiva_checkpoint"), tf.device("/cpu:0"):
                self.tables = tf.compat.v1.train.Saver(
                    var_list=tables, sharded=False, save_relative_paths=True,
                    max_to_keep=None, write_version=tf.compat.v1.train.SaverDef.V2,
                    name="tables_saver").saver_def
        # Local variables (a streaming metric's total and count, updated in the training
        # run) in a file of their own: a program may leave them uninitialised until it
        # evaluates, and a checkpoint must not fail for them.
        self.locals: Any = None
        if local:
            with graph.as_default(), tf.name_scope("gandiva_checkpoint"), tf.device("/cpu:0"):
                self.locals = tf.compat.v1.train.Saver(
                    var_list={strip_output(v.name): v for v in local}, sharded=False,
                    save_relative_paths=True, max_to_keep=None,
                    write_version=tf.compat.v1.train.SaverDef.V2, name="locals_saver").saver_def
        self._locals_unsaved = ""
        self._graph, self._by_name = graph, by_name
        self._subset: tuple[tuple[str, ...], tuple[Any, Any]] | None = None

    def differing(self, run: Callable[..., Any]) -> frozenset[str]:
        """The grouped names whose copies hold different values now (a save of one copy
        would overwrite the others at the restore)."""
        if self._same is None:
            return frozenset()
        same = run(self._same, None, None, None)
        return frozenset(n for n, ok in zip(self._same_names, same) if not ok)

    def save(self, run: Callable[..., Any], prefix: str) -> None:
        """Save into `prefix`. A write that fails (the ramdisk full, a read-only or lost
        mount) is a CheckpointError: the command that asked for it fails, saying why,
        and the program trains on (TensorFlow's own error used to leave the program's
        run() and end it: a periodic checkpoint into a full ramdisk killed the job)."""
        try:
            self._save(run, prefix)
        except tf.errors.OpError as exc:
            raise CheckpointError(f"could not write the checkpoint {Path(prefix).parent}: "
                                  f"{error_summary(exc)}") from exc

    def _save(self, run: Callable[..., Any], prefix: str) -> None:
        run(self._save_tensor, {self._filename: prefix}, None, None)
        if self.tables is not None:
            run(self.tables.save_tensor_name,
                {self.tables.filename_tensor_name: _tables_prefix(prefix)}, None, None)
        if self.locals is not None:
            try:
                run(self.locals.save_tensor_name,
                    {self.locals.filename_tensor_name: _locals_prefix(prefix)}, None, None)
            except (tf.errors.FailedPreconditionError, tf.errors.NotFoundError) as exc:
                # not initialised (yet): a reference variable's error, a resource one's
                reason = error_summary(exc)
                if reason != self._locals_unsaved:
                    self._locals_unsaved = reason
                    log.info("local variables not in this checkpoint: not all initialised "
                             "(%s); a restored copy initialises them as the program does",
                             reason)

    def restore(self, run: Callable[..., Any], prefix: str) -> None:
        run(self.restore_op, {self._prefix: prefix}, None, None)
        self._restore_tables(run, prefix)
        self._restore_locals(run, prefix)

    def _restore_locals(self, run: Callable[..., Any], prefix: str) -> None:
        if self.locals is None or not Path(_locals_prefix(prefix) + ".index").exists():
            return  # none saved: they keep the values the program gave them
        try:
            run(self.locals.restore_op_name,
                {self.locals.filename_tensor_name: _locals_prefix(prefix)}, None, None)
        except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as exc:
            log.warning("the checkpoint's local variables do not fit this graph's (%s): "
                        "they keep the values the program gave them",
                        error_summary(exc))

    def _restore_tables(self, run: Callable[..., Any], prefix: str) -> None:
        if self.tables is None:
            return
        tables = _tables_prefix(prefix)
        if not Path(tables + ".index").exists():
            log.warning("the checkpoint holds no lookup tables (written before they were "
                        "saved, or by a graph without them): the tables keep their values")
            return
        run(self.tables.restore_op_name, {self.tables.filename_tensor_name: tables}, None, None)

    def restore_present(self, run: Callable[..., Any], prefix: str) -> None:
        """Restore the variables the checkpoint at `prefix` holds; the others keep their
        values. Its ops are built for this set of names once (the graph is briefly
        unfinalized if it must be, as in `ensure_checkpointer`)."""
        held = {name for name, _ in tf.train.list_variables(prefix)}
        present = tuple(g.canonical for g in self.groups if g.canonical in held)
        missing = [g.canonical for g in self.groups if g.canonical not in held]
        if not missing:
            self.restore(run, prefix)
            return
        log.info("restoring %d of %d variables; the checkpoint lacks %s (they keep the values "
                 "the program gave them)", len(present), len(self.groups), ", ".join(missing[:5]))
        if not present:
            return
        if self._subset is None or self._subset[0] != present:
            self._subset = (present, self._build_restore(present))
        placeholder, op = self._subset[1]
        run(op, {placeholder: prefix}, None, None)
        self._restore_tables(run, prefix)
        self._restore_locals(run, prefix)

    def _build_restore(self, names: tuple[str, ...]) -> tuple[Any, Any]:
        groups = [g for g in self.groups if g.canonical in names]
        with _BUILD_LOCK:
            finalized = self._graph.finalized
            if finalized:
                self._graph._unsafe_unfinalize()
            try:
                with self._graph.as_default(), tf.name_scope("gandiva_checkpoint_subset"):
                    with tf.device("/cpu:0"):
                        prefix = tf.compat.v1.placeholder(tf.string, [], name="restore_prefix")
                        values = io_ops.restore_v2(
                            prefix, [g.canonical for g in groups], [""] * len(groups),
                            [self._by_name[g.members[0]].dtype.base_dtype for g in groups])
                    assigns = [_assign(self._by_name[m], v)
                               for g, v in zip(groups, values) for m in g.members]
                    return prefix, tf.group(*assigns)
            finally:
                if finalized:
                    self._graph.finalize()


# ConditionalAccumulator takes: they wait for the program's own applies.
_ACCUMULATOR_TAKES = frozenset({"AccumulatorTakeGradient", "ResourceAccumulatorTakeGradient",
                                "SparseAccumulatorTakeGradient",
                                "ResourceSparseAccumulatorTakeGradient"})


def _scratch_dir(kind: str) -> Path:
    """A fresh scratch directory for one throw-away save (a rehearsal's snapshot, a
    pre-built save), in RAM-backed /dev/shm where there is one.

    They live in a per-user parent and are named like checkpoint temporaries
    (`.KIND.tmp-PID-RAND`), so those of processes killed mid-save are removed here.
    """
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    parent = base / f"gandiva-scratch-{os.getuid()}"
    parent.mkdir(mode=0o700, exist_ok=True)
    remove_stale_temporaries(parent)
    return Path(tempfile.mkdtemp(prefix=f".{kind}.tmp-{os.getpid()}-", dir=parent))


_CHECKPOINTERS: weakref.WeakKeyDictionary[tf.Graph, Checkpointer] = weakref.WeakKeyDictionary()
# Re-entrant: a rebuild in a finalized graph (copies found to differ, a subset restore)
# re-finalizes it through the shim's Graph.finalize, which calls ensure_checkpointer again
# on the same thread (it finds the checkpointer current). With a plain Lock that call
# waited for itself: the training thread hung at the save, for good.
_BUILD_LOCK = threading.RLock()


def ensure_checkpointer(graph: tf.Graph, split: frozenset[str] | None = None) -> Checkpointer | None:
    """The graph's checkpointer, (re)built while the graph can still take ops.

    Returns None when the graph has no variables yet (a throw-away session).
    A finalized graph whose checkpointer is missing or stale is briefly
    unfinalized, as a last resort, to add the ops. `split`: the grouped names to save
    one entry per copy (None: those of the current checkpointer, if still current).
    """
    with _BUILD_LOCK:
        current = _CHECKPOINTERS.get(graph)
        variables, local = _state_variables(graph)
        if not variables:
            return current
        key = _state_key(graph, variables + local)
        fresh = current is not None and current.key == key
        if split is None:
            split = current.split if fresh and current is not None else frozenset()
        if fresh and current is not None and current.split == split:
            return current
        finalized = graph.finalized
        if finalized:
            if current is not None and current.key == key:
                log.info("unfinalizing the graph briefly to save %d variable(s) one copy "
                         "per tower", len(split))
            else:
                log.warning("graph finalized before the shim could add its saver; "
                            "unfinalizing briefly")
            graph._unsafe_unfinalize()
        try:
            ckpt = Checkpointer(graph, split)
        finally:
            if finalized:
                graph.finalize()
        _CHECKPOINTERS[graph] = ckpt
        return ckpt


def _describe(fetches: Any) -> str:
    names = []
    for leaf in flatten(fetches)[:4]:
        names.append(str(getattr(leaf, "name", leaf)))
    return ", ".join(names) or "no fetches"


def find_global_step(graph: Any) -> Any:
    """The graph's global step as `tf.compat.v1.train.get_global_step` finds it, without
    its TypeError on a hand-made one: `tf.Variable(0, name="global_step")` as a resource
    variable (in no collection) makes `global_step:0` its handle, which TensorFlow's lookup
    by name refuses, though the program trains fine with it. Then the integer variable
    named `global_step`; None when there is none."""
    try:
        return tf.compat.v1.train.get_global_step(graph)
    except TypeError:
        pass
    for v in graph.get_collection(tf_ops.GraphKeys.GLOBAL_VARIABLES):
        if v.op.name == "global_step" and v.dtype.base_dtype.is_integer:
            return v
    return None


def _computed_from(value: Any, variable: Any) -> bool:
    """Whether the op `value` is computed from the variable op `variable` (its data inputs,
    searched breadth first, nearest first: `w - rate * grad` reads `w` two ops up, while
    `grad` leads through the whole backward graph; at most _DEPENDS_LIMIT ops)."""
    return _computed_from_any(value, frozenset({variable}))


def _computed_from_any(value: Any, variables: frozenset[Any]) -> bool:
    """Whether the op `value` is computed from any of the variable ops `variables`."""
    seen = {value}
    queue = collections.deque([value])
    while queue and len(seen) < _DEPENDS_LIMIT:
        cur = queue.popleft()
        if cur in variables:
            return True
        for x in cur.inputs:
            if x.op not in seen:
                seen.add(x.op)
                queue.append(x.op)
    return False


class TFSessionAdapter:
    """One tf.compat.v1 Session, as the chain and the controller see it."""

    def __init__(self, session: Any, run_fn: Callable[..., Any]) -> None:
        self.graph: tf.Graph = session.graph
        self._run = run_fn  # the original, unwrapped run bound to the session
        self._cache: dict[Any, tuple[Any, RunInfo]] = {}
        self.closed = False
        self._gs: Any = None
        self._gs_op: Any = None
        self.has_global_step()  # looks it up now; again later while the graph lacks one
        self._init_ops: frozenset[Any] | None = None
        self._some_init_ops: frozenset[Any] = frozenset()
        self._state_ops: frozenset[Any] = frozenset()
        self._watched_key: tuple[str, ...] | None = None
        self._warned_racy_read = False
        self.rehearsing = False  # inside `rehearse`'s step (a partial run is not made there)
        # The tf.data iterators the training runs read whose state serializes: saved in
        # every checkpoint (in order of discovery).
        self.iterators: dict[str, None] = {}
        # The iterator each string handle fed to a feedable iterator stands for (or None).
        self._fed_iterators: dict[bytes, str | None] = {}
        # A restored checkpoint's iterator states and the initializer each was made by
        # ("" for a one-shot iterator), kept until the first training run: put back again
        # after each run of that initializer before then.
        self._iterator_states: dict[str, tuple[bytes, str, str]] = {}
        self._iterators_put_back: set[str] = set()
        # The initializer last run on each iterator, and the iterators (re)initialised since
        # a training run last read them (an evaluation's dataset on a reinitializable
        # iterator, a new epoch): their position is no training position.
        self._made_by: dict[str, str] = {}
        self._reinitialised: set[str] = set()
        # The digest of the feeds of each iterator's last initializer run ("" unfed).
        self._init_feeds: dict[str, str] = {}
        # Integer scalar variables other than the global step that training runs increment
        # (a program's own step counter: `minimize(global_step=iterations)`), by name.
        self._counters: dict[str, None] = {}
        self._unsaved: dict[str, None] = {}  # variables in no collection training updates

    # -- classification ---------------------------------------------------------------
    def classify(self, fetches: Any) -> RunInfo:
        key = fetch_key(fetches)
        hit = self._cache.get(key)
        if hit is not None:
            return hit[1]
        try:
            info = self._classify(fetches)
        except Exception:  # the shim's own fault: never the program's run
            log.exception("tf_runtime could not classify a run of %s; it runs as a plain run, "
                          "not a mini-batch boundary (please report this with the program)",
                          _describe(fetches))
            info = RunInfo()
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        # Keep the fetches alive so the ids in the key cannot be reused.
        self._cache[key] = (fetches, info)
        return info

    def initializes_all(self, init_ops: frozenset[Any]) -> bool:
        """Whether `init_ops` (initialisers run so far, over several runs) cover every
        global variable."""
        self._refresh_graph_facts()
        return bool(self._init_ops) and self._init_ops is not None and self._init_ops <= init_ops

    def _refresh_graph_facts(self) -> None:
        variables, local = _state_variables(self.graph)
        key = tuple(v.name for v in variables + local)
        if key != self._watched_key:
            self._watched_key = key
            # The restore point is the run that initialises the global variables (as
            # `global_variables_initializer()` does); one initialising any variable the
            # checkpoint holds after the restore (a collection of the program's own, the
            # local variables of MonitoredSession's local_init_op) makes the shim restore
            # again before the first training step.
            in_global = {id(v) for v in self.graph.get_collection(
                tf_ops.GraphKeys.GLOBAL_VARIABLES)}
            self._init_ops = frozenset(v.initializer for v in variables if id(v) in in_global)
            self._some_init_ops = frozenset(v.initializer for v in variables + local)
            self._state_ops = frozenset(v.op for v in variables + local)
            self.has_global_step()
            self._trainable_ops = frozenset(
                v.op for v in self.graph.get_collection(tf_ops.GraphKeys.TRAINABLE_VARIABLES))

    def _classify(self, fetches: Any) -> RunInfo:
        self._refresh_graph_facts()
        roots, metric_slots, carry_slots, reads_gs, plain_read = [], [], [], False, False
        counter = ""
        for i, leaf in enumerate(flatten(fetches)):
            try:
                el = self.graph.as_graph_element(leaf, allow_tensor=True, allow_operation=True)
            except (TypeError, ValueError, KeyError):
                continue  # Session.run reports it; not ours to judge
            op = el if isinstance(el, tf.Operation) else el.op
            roots.append(op)
            if isinstance(el, tf.Tensor) and el.shape.rank == 0 and el.dtype.is_floating:
                metric_slots.append((i, op.name))
            # Only a fetched tensor's value reaches the program: fetching the op that
            # increments the step (what `minimize(loss, global_step=gs)` returns) reads
            # nothing, so a `for i in range(n): sess.run(train)` loop never reads it.
            read = self._global_step_read(op) if isinstance(el, tf.Tensor) else None
            if read is not None:
                reads_gs = True
                plain_read = plain_read or read == "plain"
            held = self._state_read(op) if isinstance(el, tf.Tensor) and read is None else None
            if isinstance(el, tf.Tensor) and read is None and held is None:
                carry_slots.append(i)
            elif held is not None and el.shape.rank == 0 and el.dtype.is_integer:
                counter = counter or held.name  # a loop counter kept in a variable, maybe
        inside, reached = self._walk(roots)
        training = inside.training
        loaded: frozenset[str] = frozenset()
        if training:
            self._note_counters(reached)
            self._note_unsaved(reached)
        initializes = bool(self._init_ops) and self._init_ops is not None and self._init_ops <= reached
        # A run that is not training but loads a variable the checkpoint holds: a layer
        # loaded from NumPy (`sess.run(w.assign(array))`) after the restore point. Not an
        # update computed from the variable (an accumulation, `acc.assign_add(grad)`, run
        # before the first training run of a step, is part of that step).
        assigns = not training and any(
            op.type in _LOADS and len(op.inputs) > 1 and
            through(op.inputs[0].op) in self._state_ops and
            not _computed_from(op.inputs[-1].op, through(op.inputs[0].op))
            for op in reached)
        initializes_some = bool(self._some_init_ops & reached) or assigns
        copies_state = False
        if assigns:
            loaded = frozenset(
                target.name for op in reached if op.type in _LOADS and len(op.inputs) > 1 and
                ((target := through(op.inputs[0].op)) in self._trainable_ops or target is self._gs_op))
            copies_state = bool(loaded) and not self._some_init_ops & reached and all(
                _computed_from_any(op.inputs[-1].op, self._state_ops - {target})
                for op in reached if op.type in _LOADS and len(op.inputs) > 1 and
                (target := through(op.inputs[0].op)) in self._state_ops)
        # A run that does not train but changes a variable the checkpoint holds (an EMA of
        # the weights, `ema.apply(...)`, run after the training run).
        # Or a table the checkpoint holds, or draws from a generator whose state it holds
        # (`sess.run(table.insert(ids, counts), feed)`, `z = sess.run(gen.normal(...))`
        # before the training run): before, such a run was taken to change nothing, so a
        # checkpoint was taken after it, and a restored copy made it again (its ids counted
        # twice, the next noise drawn).
        changes_state = not training and any(
            op.inputs and (
                op.type in _CHANGES_ANY and through(op.inputs[0].op) in self._state_ops or
                op.type in _TABLE_CHANGES and through(op.inputs[0].op) in self._table_ops())
            for op in reached)
        restores = any(op.type in _RESTORES for op in reached)
        # Of those, a change computed from the variable itself (as a training update is:
        # _updates), or a generator's draw.
        increments = changes_state and any(
            op.type in _CHANGES_ANY and op.inputs and (
                op.type in _GENERATOR_DRAWS and through(op.inputs[0].op) in self._state_ops or
                self._updates(op, self._state_ops))
            for op in reached)
        # The step's op itself, or behind v1 control flow's Enter/Switch (a loop, a cond),
        # or an update in a function of v2 control flow (`inside`).
        advances = self._gs_op is not None and (inside.advances or any(
            op.type in _STEP_SETS and op.inputs and through(op.inputs[0].op) is self._gs_op
            for op in reached))
        # In a training run, or in a run of its own whose values the program may feed to
        # training (chain.BoundaryLayer judges which); an initialiser's random ops are not.
        # A load is no initialiser: the mini-batch staged in a variable in a run of its own
        # (`sess.run(batch_var.assign(next_element))`; SyncReplicasOptimizer assigns the
        # token it dequeues to its local step) was taken for one, its input unseen.
        # A training run's read of a tf.data iterator whose state TensorFlow can save is
        # not such input: that state goes into the checkpoint (data_state; whether it
        # really serializes is tried at the run's boundary, Controller._check_iterators).
        # A read of a feedable iterator is resolved run by run from the handle fed
        # (BoundaryLayer._fed_iterators), so it is not judged here.
        iterators = tuple(sorted({n for op in reached if (n := data_state.read_iterator(op))})) \
            if training else ()
        handle_reads = {op: h for op in sorted(reached, key=lambda o: o.name)
                        if (h := data_state.handle_read(op))} if training else {}
        stateful = "" if (not training and (self._some_init_ops & reached or restores)) else next(
            (f"{op.type} op {op.name!r}" for op in sorted(reached, key=lambda o: o.name)
             if _stateful_node(op.type, [t.op.type for t in op.inputs]) and
             not (training and (data_state.read_iterator(op) or op in handle_reads))),
            inside.stateful)
        if training and not stateful:
            stateful = self._staged_input(reached)
        # Numbers for the program (an epoch's order of its examples), not an evaluation's
        # dropout or a GAN's sample images, which read the model.
        draws = "" if (training or initializes_some or restores or self._state_ops & reached) \
            else next((f"{op.type} op {op.name!r}" for op in sorted(reached, key=lambda o: o.name)
                       if op.type in _RANDOM_OPS), "")
        if advances and plain_read and not self._warned_racy_read:
            self._warned_racy_read = True
            log.warning(
                "a training run fetches the global step together with the op that increments "
                "it (e.g. sess.run([train, global_step])): TensorFlow does not order the two, so "
                "the value read is the step before or after the increment depending on its "
                "executor's timing, and a migrated (or a second plain) run may read other values "
                "than this one; fetch the increment's own value to read a deterministic step "
                "(docs/tf_runtime.md)")
        return RunInfo(training, reads_gs, initializes, restores, tuple(metric_slots),
                       advances_step=advances, stateful_input=stateful,
                       initializes_some=initializes_some, carry_slots=tuple(carry_slots),
                       resets=assigns and not self._some_init_ops & reached,
                       increments=increments,
                       loads_trainable=bool(loaded), loaded=loaded, copies_state=copies_state,
                       changes_state=changes_state,
                       init_ops=frozenset(self._some_init_ops & reached), draws=draws,
                       reads_counter="" if training else counter,
                       py_funcs=_py_func_tokens(reached) if training else (),
                       fed_handles=tuple(sorted(set(handle_reads.values()))),
                       handle_read=next((f"{op.type} op {op.name!r}" for op in handle_reads), ""),
                       iterators=iterators, iterator_inits=tuple(sorted(
                           {pair for op in reached if (pair := data_state.initialised_iterator(op))})))

    def _staged_input(self, reached: set[Any]) -> str:
        """A batch a training run takes from a staging area (`StagingArea.get()`, as
        tf_cnn_benchmarks stages its input one step ahead) whose puts read input of the
        process's own (a tf.data iterator, a queue, a stateful random op): the staged batch
        is in no checkpoint, and a restored copy's first put reads the input's next batch
        (the iterator's saved position is already past the staged one), so it would skip a
        batch. "Unstage op 'name' ..." of the first such take, or "". A staging area put
        fed from Python (the batch of the step read) is the program's to stage again."""
        for op in sorted(reached, key=lambda o: o.name):
            if op.type not in _STAGING_TAKES:
                continue
            area = _staging_area(op)
            puts = [p for p in self.graph.get_operations()
                    if p.type in _STAGING_PUTS and _staging_area(p) == area]
            _, upstream = self._walk(puts) if puts else (None, set())
            source = next((f"{u.type} op {u.name!r}" for u in sorted(upstream, key=lambda o: o.name)
                           if _stateful_node(u.type, [t.op.type for t in u.inputs])), "")
            if source:
                return (f"{op.type} op {op.name!r}, a batch staged ahead in a staging area "
                        f"from {source} (the staged batch is in no checkpoint, and a restored "
                        "copy would stage the next one)")
        return ""

    def _note_counters(self, reached: set[Any]) -> None:
        """Remember the integer scalar variables (not the global step, not trainable) that a
        training run increments: a step counter of the program's own."""
        for op in reached:
            if op.type in _STEP_UPDATES and len(op.inputs) > 1 and \
                    op.inputs[-1].dtype.base_dtype.is_integer and op.inputs[-1].shape.rank == 0:
                target = through(op.inputs[0].op)
                if target in self._state_ops and target is not self._gs_op and \
                        target not in self._trainable_ops:
                    self._counters[target.name] = None

    def _note_unsaved(self, reached: set[Any]) -> None:
        """Remember the variables a training run updates that are in no collection of the
        graph (`tf.Variable(0.0, collections=[])`): the checkpoint, made of the collections'
        variables, cannot hold them."""
        for op in reached:
            if op.inputs and (op.type in _CHANGES_ANY or op.type.startswith(_TRAIN_PREFIXES)):
                target = through(op.inputs[0].op)
                if target.type in _VARIABLE_OPS and target not in self._state_ops:
                    self._unsaved[target.name] = None

    def unsaved_variables(self) -> tuple[str, ...]:
        """The variables in no collection that training runs update (names)."""
        return tuple(self._unsaved)

    def step_counters(self) -> tuple[str, ...]:
        """The step counters of the program's own that its training runs increment (names)."""
        return tuple(self._counters)

    def _table_ops(self) -> set[Any]:
        """The ops of the mutable lookup tables the checkpoint holds (Checkpointer.tables)."""
        return {handle.op for t in self.graph.get_collection(tf_ops.GraphKeys.SAVEABLE_OBJECTS)
                if (handle := getattr(getattr(t, "op", None), "resource_handle", None))
                is not None and hasattr(handle, "op")}

    def _global_step_read(self, op: Any) -> str | None:
        """How fetching `op` reads the global step: "ordered" (the value of its increment,
        or a read ordered by control inputs), "plain" (the variable itself), None (not)."""
        if any(getattr(t, "op", None) is op
               for t in self.graph.get_collection("global_step_read_op_cache")):
            # MonitoredSession hooks' read (StopAtStepHook, CheckpointSaverHook):
            # `cond(is_variable_initialized(gs), gs.read_value, ...) + 0`, which the walk
            # below does not follow: a loop whose only read it is was judged "never reads
            # the global step", not migratable, though it stops at the step.
            return "ordered"
        updated = False
        for _ in range(4):  # gs, gs/read, a cast of it, the value of an increment...
            if op is self._gs_op:
                return "ordered" if updated else "plain"
            if op.type not in _READS or not op.inputs:
                return None
            # The increment's value, or a read ordered by control inputs (a resource
            # variable's assign_add(read_value=True), tf.control_dependencies([train])).
            updated = updated or op.type in _STEP_UPDATES or bool(op.control_inputs)
            op = op.inputs[0].op
        return None

    def _state_read(self, op: Any) -> Any:
        """The variable the checkpoint holds that fetching `op` reads (the variable, its
        read, a cast of it, the value of an update of it), or None."""
        for _ in range(4):
            if op in self._state_ops:
                return op
            if op.type not in _READS or not op.inputs:
                return None
            op = op.inputs[0].op
        return None

    def _walk(self, roots: list[Any]) -> tuple[Inside, set[Any]]:
        """The ops a run of `roots` reaches, and whether it trains: applies gradients or
        updates a trainable variable or the global step, in the graph or in a function
        its control flow calls (a v2 `tf.while_loop` of several updates per run)."""
        seen: set[Any] = set()
        stack = list(roots)
        targets = self._trainable_ops | ({self._gs_op} if self._gs_op is not None else set())
        inside = Inside()
        functions = FunctionScan(self.graph, self._gs_op, targets, _INCREMENTS, _CHANGES,
                                 _TRAIN_PREFIXES, _stateful_node)
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            seen.add(op)
            t = op.type
            if t.startswith(_TRAIN_PREFIXES) or (
                    t in _CHANGES and op.inputs and self._updates(op, targets)):
                inside.training = True
            functions.scan(op, inside)
            stack.extend(x.op for x in op.inputs)
            stack.extend(op.control_inputs)
        return inside, seen

    @staticmethod
    def _updates(op: Any, targets: frozenset[Any] | set[Any]) -> bool:
        """Whether an assignment is a training update of a trainable variable or the global
        step: an increment (`assign_add`, `assign_sub`, a `scatter_sub` of some rows), or an
        `assign` (`scatter_update`) whose value is computed from the variable itself
        (gradient descent written by hand, `tf.compat.v1.assign(w, w - rate * grad)`;
        `gs.assign(gs + 1)`). An assign of a value from elsewhere (a NumPy array, a
        pre-trained checkpoint) loads, not trains."""
        target = through(op.inputs[0].op)
        if target not in targets:
            return False
        return op.type in _INCREMENTS or (
            len(op.inputs) > 1 and _computed_from(op.inputs[-1].op, target))

    def metrics(self, info: RunInfo, results: Any) -> dict[str, float]:
        flat = flatten(results)
        out = {}
        for i, name in info.metric_slots:
            try:
                out[name] = float(flat[i])
            except (IndexError, TypeError, ValueError):
                continue
        return out

    # -- state ------------------------------------------------------------------------------
    def trainable_names(self) -> frozenset[str]:
        """The names of the graph's trainable variables (which model this session trains)."""
        return frozenset(v.name for v in self.graph.get_collection(
            tf_ops.GraphKeys.TRAINABLE_VARIABLES))

    def has_global_step(self) -> bool:
        if self._gs is None:
            self._gs = find_global_step(self.graph)
            self._gs_op = self._gs.op if self._gs is not None else None
        return self._gs is not None

    def global_step(self) -> int:
        if not self.has_global_step():
            return 0
        return int(self._run(self._gs, None, None, None))

    def step_initializer(self) -> Any:
        """The global step's initialiser op (None without one)."""
        return getattr(self._gs, "initializer", None) if self.has_global_step() else None

    def checkpointer(self) -> Checkpointer:
        ckpt = ensure_checkpointer(self.graph)
        if ckpt is None:
            raise CheckpointError("the training graph has no variables to checkpoint")
        return ckpt

    def checked_checkpointer(self) -> Checkpointer:
        """The checkpointer for the values the variables hold now: tower copies found to
        differ (distinct variables named alike) are saved one entry per copy from now on."""
        ckpt = self.checkpointer()
        differ = ckpt.differing(self._run)
        if differ:
            log.info("the tower copies of %s hold different values: not replicas, each "
                     "copy is saved on its own", ", ".join(sorted(differ)[:5]))
            rebuilt = ensure_checkpointer(self.graph, ckpt.split | differ)
            if rebuilt is None:  # the variables are gone: nothing of ours to save
                raise CheckpointError("the training graph has no variables to checkpoint")
            ckpt = rebuilt
        return ckpt

    def save(self, directory: str, job_id: str, start_step: int | None = None,
             started_at: float | None = None) -> CheckpointInfo:
        """A checkpoint of the training state; `start_step`, the global step the job's
        first process started training at, and `started_at`, when that process started
        (wall-clock), go into the manifest with it."""
        t0 = time.perf_counter()  # the copies' comparison is part of the save's cost
        ckpt = self.checked_checkpointer()
        step = self.global_step()
        states = self._iterator_states_now()
        entries = iterator_entries(states, self._made_by, self._init_feeds)

        def fill(tmp: Path) -> None:
            ckpt.save(self._run, str(tmp / PREFIX))
            write_iterator_states(tmp, states, entries)

        path, size = write_atomically(
            directory, fill,
            {"job_id": job_id, "global_step": step, "replicas": ckpt.replicas,
             "variables": len(ckpt.groups),
             **({"split": sorted(ckpt.split)} if ckpt.split else {}),
             **({"iterators": entries} if entries else {}),
             **({"start_step": start_step} if start_step is not None else {}),
             **({"started_at": started_at} if started_at is not None else {})})
        return CheckpointInfo(str(path), step, ckpt.replicas, size, time.perf_counter() - t0)

    def rehearse(self, step: Callable[[], Any]) -> dict[str, float]:
        """Run `step` (a training run) once and undo it; returns phase timings.

        Everything a checkpoint holds (weights, optimizer slots, global step, local
        variables once initialised, lookup tables) is saved to a scratch directory first
        and restored after, which also builds the save and restore ops' executors. What
        no checkpoint holds is not undone: input iterators and queues (one batch
        consumed), stateful random ops (their sequence advanced once).
        """
        taken = self._takes_from_accumulator(getattr(step, "fetches", None))
        if taken:
            # A take blocks until the program's own runs applied enough gradients (an empty
            # accumulator in a warm process: it used to block there for good, never ready),
            # and what it takes is in no checkpoint, so the rehearsal could not undo it.
            raise RuntimeError(f"the training run takes from a ConditionalAccumulator "
                               f"({taken}), which only the program's own runs fill")
        ckpt = self.checked_checkpointer()
        scratch = _scratch_dir("rehearsal")
        try:
            prefix = str(scratch / PREFIX)
            t0 = time.perf_counter()
            ckpt.save(self._run, prefix)
            # The iterators the step reads, put back after it (an activation without a
            # checkpoint goes on from them); one not initialised yet has nothing to undo.
            fetches = getattr(step, "fetches", None)
            names = list(self.classify(fetches).iterators) if fetches is not None else []
            try:
                positions = data_state.save_states(self._run, self.graph, names)
            except data_state.IteratorStateError:
                positions = {}
            t1 = time.perf_counter()
            self.rehearsing = True
            try:
                step()
            finally:
                self.rehearsing = False
                t2 = time.perf_counter()
                ckpt.restore(self._run, prefix)
                for name, state in positions.items():
                    data_state.restore_state(self._run, self.graph, name, state)
            t3 = time.perf_counter()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return {"snapshot_s": t1 - t0, "warm_step_s": t2 - t1, "unwind_s": t3 - t2}

    # -- the first training run as names (pre-warming a destination) ------------------
    def signature(self, fetches: Any, feed_dict: Any, options: Any) -> str | None:
        """The run as JSON names (fetches, feeds' dtypes and shapes, run options), or None
        when it cannot be named (a SparseTensor feed, a callable fetch...)."""
        names = []
        for leaf in flatten(fetches):
            try:  # what Session.run fetches for it (a variable: its value tensor)
                el = self.graph.as_graph_element(leaf, allow_tensor=True, allow_operation=True)
            except (TypeError, ValueError, KeyError):
                return None
            names.append(el.name)
        feeds: dict[str, Any] = {}
        for key, value in (feed_dict or {}).items():
            name = key if isinstance(key, str) else getattr(key, "name", None)
            if not isinstance(name, str) or not isinstance(key, (str, tf.Tensor)):
                return None
            arr = np.asarray(value)
            if arr.dtype.kind not in "biufc":
                return None
            feeds[name] = [arr.dtype.str, list(arr.shape)]
        opts = options.SerializeToString().hex() if options is not None else ""
        return json.dumps({"fetches": names, "feeds": feeds, "options": opts}, sort_keys=True)

    def signature_step(self, signature: str) -> Callable[[], Any] | None:
        """A run with `signature`'s fetches and zero-valued feeds on this session (None
        when its names do not resolve in this graph): building its executors is what
        matters, its values are undone by the rehearsal."""
        try:
            sig = json.loads(signature)
            fetches = [self.graph.as_graph_element(n, allow_tensor=True, allow_operation=True)
                       for n in sig["fetches"]]
            feeds = {self.graph.get_tensor_by_name(n): np.zeros(shape, np.dtype(dt))
                     for n, (dt, shape) in sig["feeds"].items()}
            options = None
            if sig.get("options"):
                options = config_pb2.RunOptions.FromString(bytes.fromhex(sig["options"]))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("warm: the training run's signature does not fit this graph (%s)", exc)
            return None
        return FirstRun(fetches, feeds, options, self._run)

    def _takes_from_accumulator(self, fetches: Any) -> str:
        """The accumulator take (`ConditionalAccumulator.take_grad`) a run of `fetches`
        reaches, as "type op 'name'", or ""."""
        if fetches is None:
            return ""
        roots = []
        for leaf in flatten(fetches):
            try:
                el = self.graph.as_graph_element(leaf, allow_tensor=True, allow_operation=True)
            except (TypeError, ValueError, KeyError):
                return ""
            roots.append(el if isinstance(el, tf.Operation) else el.op)
        _, seen = self._walk(roots)
        for op in sorted(seen, key=lambda o: o.name):
            if op.type in _ACCUMULATOR_TAKES:
                return f"{op.type} op '{op.name}'"
        return ""

    def prebuild_save(self) -> float:
        """Save once into a scratch directory (deleted) so the save op's executors exist."""
        ckpt = self.checked_checkpointer()
        scratch = _scratch_dir("prebuild")
        try:
            t0 = time.perf_counter()
            ckpt.save(self._run, str(scratch / PREFIX))
            return time.perf_counter() - t0
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def towers(self) -> int:
        """Tower copies of the variables in this graph (1: nothing replicated)."""
        return self.checkpointer().replicas

    def restore(self, directory: str, partial: bool = False) -> CheckpointInfo:
        """Restore every variable of this graph from the checkpoint in `directory`.
        `partial`: variables the checkpoint lacks keep their values (a restore again
        after the program created and initialised new ones; refused otherwise)."""
        t0 = time.perf_counter()
        manifest = validate(directory)
        ckpt = self.checkpointer()
        # Before any variable is touched: a checkpoint of another tower count is refused.
        check_towers(directory, manifest, ckpt.replicas)
        # Tower copies the writer saved one by one are restored one by one.
        split = frozenset(manifest.get("split") or ())
        if split != ckpt.split:
            rebuilt = ensure_checkpointer(self.graph, split)
            if rebuilt is not None:
                ckpt = rebuilt
        prefix = str(Path(directory) / manifest["prefix"])
        states = read_iterator_states(directory, manifest)  # a damaged one: nothing restored
        try:
            if partial:
                ckpt.restore_present(self._run, prefix)
            else:
                ckpt.restore(self._run, prefix)
        except tf.errors.DataLossError as exc:
            # Its sizes match its manifest (validate), its bytes do not match their CRCs: a
            # file changed after it was written (a bad disk or copy, an overwrite). Refused
            # before any variable is assigned, and said so: it does fit the graph.
            raise CheckpointError(f"checkpoint {directory} is damaged (a file changed after it was "
                                  f"written), nothing restored: {error_summary(exc)}") from exc
        except tf.errors.OpError as exc:
            raise CheckpointError(f"checkpoint {directory} does not fit this graph: {exc.message}") from exc
        if states:
            self._iterator_states = states
            self.restore_iterators()
        step = self.global_step()
        size = sum(f["size"] for f in manifest["files"])
        return CheckpointInfo(str(directory), step, ckpt.replicas, size, time.perf_counter() - t0)

    # -- tf.data iterators (data_state) --------------------------------------------------
    def fed_iterator(self, handle: Any) -> str | None:
        """The iterator a string handle fed to a feedable iterator stands for (its resource
        op's name), or None (data_state.fed_iterator); remembered by the handle's value."""
        try:
            key = bytes(np.asarray(handle).item() if not isinstance(handle, bytes) else handle)
        except (TypeError, ValueError):
            return data_state.fed_iterator(self.graph, handle)
        if key not in self._fed_iterators:
            if len(self._fed_iterators) >= _CACHE_LIMIT:
                self._fed_iterators.clear()
            self._fed_iterators[key] = data_state.fed_iterator(self.graph, key)
        return self._fed_iterators[key]

    def check_iterators(self, names: tuple[str, ...]) -> str:
        """Whether the state of each iterator in `names`, read by a training run, can be
        saved: those that can go into every checkpoint from now on; the first that cannot,
        described with TensorFlow's reason, or ""."""
        for name in names:
            if name in self.iterators:
                continue
            try:
                why = data_state.unsaveable(self._run, self.graph, name)
            except Exception as exc:  # noqa: BLE001  (the shim's ops: refused, never fatal)
                why = f"the shim could not add its save op ({error_summary(exc)})"
            if why:
                return (f"IteratorGetNext of the tf.data iterator {name!r}, whose position "
                        f"cannot be saved: {why}")
            self.iterators[name] = None
        return ""

    def _iterator_states_now(self) -> dict[str, bytes]:
        """The position of each iterator the training runs read. One (re)initialised since
        a training run last read it is left out: its position is not a training one (the
        start of a new epoch, or an evaluation's dataset on a reinitializable iterator),
        and a restarted copy, whose program runs that initializer before it trains, starts
        it over as the program does."""
        names = [n for n in self.iterators if n not in self._reinitialised]
        if len(names) < len(self.iterators):
            log.info("tf.data iterator(s) %s initialised again since the last training step: "
                     "not in this checkpoint (the program's own initializer starts them over)",
                     ", ".join(n for n in self.iterators if n in self._reinitialised))
        try:
            return data_state.save_states(self._run, self.graph, names)
        except data_state.IteratorStateError as exc:
            raise CheckpointError(f"could not save the position of the tf.data iterators "
                                  f"{', '.join(names)}: {exc}") from exc

    def iterators_initialised(self, inits: tuple[tuple[str, str], ...], feeds: bytes) -> None:
        """A run of this session is about to run the initializers `inits` ((iterator,
        initializer) pairs), fed values of digest `feeds` (b"": none). A restored
        position is put back after it (Controller.setup_run) if the source's iterator was
        made by the same initializer, fed the same values."""
        for name, made_by in inits:
            self._made_by[name] = made_by
            self._init_feeds[name] = feeds.hex()
            self._reinitialised.add(name)

    def iterators_read(self, names: tuple[str, ...]) -> None:
        """A training run read `names`: their position is a training position again."""
        self._reinitialised.difference_update(names)

    def restore_iterators(self, names: Any = None) -> None:
        """Put back the restored checkpoint's position of the iterators `names` (None: all
        it holds) that are initialised, by the initializer the source's was made by; the
        others are put back after the program runs that initializer (Controller.setup_run).
        A position that does not fit this graph's pipeline is a CheckpointError, as a
        variable's would be."""
        for name in list(self._iterator_states) if names is None else names:
            state, made_by, feeds = self._iterator_states.get(name, (b"", "", ""))
            if not state or (made_by and self._made_by.get(name) != made_by):
                continue
            if made_by and self._init_feeds.get(name, "") != feeds:
                # The program built another pipeline on purpose (a `skip` or seed fed from
                # the step it read, re-creating its position itself): left as it made it.
                # TensorFlow would refuse most such states ("the dataset definition has
                # changed") and could put some back over the other values.
                log.warning("tf.data iterator %r was initialised with other values than the "
                            "source's (its initializer's feeds differ): its position is left "
                            "as the program made it, not restored", name)
                del self._iterator_states[name]
                continue
            try:
                done = data_state.restore_state(self._run, self.graph, name, state)
            except data_state.IteratorStateError as exc:
                raise CheckpointError(f"the checkpoint's position of tf.data iterator {name!r} "
                                      f"does not fit this graph's pipeline: {exc}") from exc
            if done:
                self._iterators_put_back.add(name)
                self._reinitialised.discard(name)
                self.iterators.setdefault(name, None)
                log.info("restored the position of tf.data iterator %r", name)
            else:
                log.info("tf.data iterator %r is not initialised yet: its position is "
                         "restored after the program's initializer run", name)

    def iterators_restored(self) -> list[str]:
        """At the first training run: the checkpoint's iterators whose position was never
        put back (the program did not initialise them, or not with the source's dataset);
        the states are dropped, so the
        program's own re-initialisations from now on (a new epoch) are left alone."""
        left = [n for n in self._iterator_states if n not in self._iterators_put_back]
        self._iterator_states = {}
        return left
