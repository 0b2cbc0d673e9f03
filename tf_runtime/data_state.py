"""The position of the tf.data pipelines a training run reads, saved with the variables.

A TF1 program reads its mini-batches through an iterator (`IteratorGetNext`) whose
position lives in the session, not in a variable. TensorFlow can write the whole
pipeline's state (range, shuffle with its buffer and seeds, repeat, batch, map,
prefetch's buffer, ...) as one value: `SerializeIterator`, which
`tf.data.experimental.make_saveable_from_iterator` builds on, and `DeserializeIterator`
puts it back. The shim adds both ops for each iterator (a one-shot one, an initializable
or reinitializable one: the iterator resource ops below) and carries the value as bytes
(`SerializeTensor` of the variant), so that a checkpoint holds exactly the iterators the
training run reads, whatever other iterators (an evaluation's) the graph has.

With `external_state_policy=FAIL` a pipeline whose state TensorFlow cannot save
(`Dataset.from_generator`, `py_function`/`numpy_function` in a `map`) fails to
serialize: the shim keeps refusing to migrate such a job, with TensorFlow's reason.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import gen_dataset_ops

from .errors import error_summary

log = logging.getLogger(__name__)

# Iterator resources whose state can be saved: a one-shot iterator, an initializable or
# reinitializable one (`Iterator.from_structure`). A multi-device one is not: reading it
# stays input whose position is in no checkpoint (tf_session._stateful_node).
ITERATOR_RESOURCES = frozenset({"OneShotIterator", "IteratorV2", "Iterator"})
ITERATOR_READS = frozenset({"IteratorGetNext", "IteratorGetNextSync",
                            "IteratorGetNextAsOptional"})
# A feedable iterator (`Iterator.from_string_handle`): which iterator it reads is decided
# by the string handle each run feeds it (`sess.run(it.string_handle())` of one of the
# resources above), so a read through it is resolved run by run (fed_iterator).
HANDLE_ITERATORS = frozenset({"IteratorFromStringHandle", "IteratorFromStringHandleV2"})
_FAIL = 2  # tf.data.experimental.ExternalStatePolicy.FAIL: refuse, never drop state


def read_iterator(op: Any) -> str | None:
    """The name of the iterator resource op whose state a read `op` advances, when that
    state can be saved (None: not a read, or an iterator of another kind)."""
    if op.type not in ITERATOR_READS or not op.inputs:
        return None
    source = op.inputs[0].op
    return source.name if source.type in ITERATOR_RESOURCES else None


def handle_read(op: Any) -> tuple[str, ...] | None:
    """The names of the string tensors that pick the iterator a read `op` of a feedable
    iterator (`Iterator.from_string_handle`) advances: the handle it is given, then, when
    that passes another tensor through (`from_string_handle(tf.identity(handle))`), that
    one, and so on; a run may feed any of them (the first fed counts, as in TensorFlow).
    None when `op` is no such read. Before, only the first was looked for in the run's
    feeds, so a handle fed through `tf.identity` was taken for one computed in the graph
    and the job refused as not migratable."""
    if op.type not in ITERATOR_READS or not op.inputs:
        return None
    source = op.inputs[0].op
    if source.type not in HANDLE_ITERATORS or not source.inputs:
        return None
    names, tensor = [source.inputs[0].name], source.inputs[0]
    while tensor.op.type in _PASS_THROUGH and tensor.op.inputs and len(names) < 16:
        tensor = tensor.op.inputs[0]
        names.append(tensor.name)
    return tuple(names)


# Ops that pass their input through unchanged (`tf.identity`, and its snapshot form).
_PASS_THROUGH = frozenset({"Identity", "Snapshot"})


def fed_iterator(graph: tf.Graph, handle: Any) -> str | None:
    """The name of the iterator resource op of `graph` that a fed string `handle` (what
    `sess.run(iterator.string_handle())` returned, in this process or another) stands for,
    when its state can be saved; None otherwise (not a handle, another graph's iterator).
    A handle is a serialized ResourceHandleProto: its name is the op's `shared_name`, or
    `_<N>_<op name>` for an iterator made without one (TensorFlow's unique name)."""
    from tensorflow.core.framework import resource_handle_pb2

    try:
        value = np.asarray(handle).item()
        if isinstance(value, str):
            value = value.encode()
        proto = resource_handle_pb2.ResourceHandleProto.FromString(bytes(value))
    except Exception:  # noqa: BLE001 - whatever was fed, it names no iterator
        return None
    name = proto.name
    head, _, rest = name[1:].partition("_")
    if name.startswith("_") and head.isdigit() and rest:  # `_<N>_<op name>`: no shared_name
        op = _operation(graph, rest)
        if op is not None and op.type in ITERATOR_RESOURCES and not _shared_name(op):
            return op.name
    if not name:
        return None
    # An iterator given a shared_name of its own: the op of that name first.
    for op in (_operation(graph, name), *graph.get_operations()):
        if op is not None and op.type in ITERATOR_RESOURCES and _shared_name(op) == name:
            return op.name
    return None


def _operation(graph: tf.Graph, name: str) -> Any:
    try:
        return graph.get_operation_by_name(name)
    except (KeyError, ValueError):
        return None


def _shared_name(op: Any) -> str:
    try:
        value = op.get_attr("shared_name")
    except ValueError:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def initialised_iterator(op: Any) -> tuple[str, str] | None:
    """(iterator resource op, initializer op) when `op` is a `MakeIterator` (an iterator's
    initializer, which starts it over on one dataset: a reinitializable iterator has one
    per dataset), else None."""
    if op.type != "MakeIterator" or len(op.inputs) < 2:
        return None
    source = op.inputs[1].op
    return (source.name, op.name) if source.type in ITERATOR_RESOURCES else None


@dataclass(frozen=True)
class IteratorOps:
    """Ops added to the graph for one iterator: its state as a string, and its restore."""

    save: Any      # string scalar: SerializeTensor(SerializeIterator(iterator))
    feed: Any      # string placeholder for a saved state
    restore: Any   # DeserializeIterator(iterator, ParseTensor(feed))


_OPS: weakref.WeakKeyDictionary[tf.Graph, dict[str, IteratorOps]] = weakref.WeakKeyDictionary()
# Re-entrant: re-finalizing a graph runs the shim's Graph.finalize, which calls
# ensure_ops again (finding every op built).
_LOCK = threading.RLock()


def _build(graph: tf.Graph, name: str) -> IteratorOps:
    op = graph.get_operation_by_name(name)
    scope = "gandiva_checkpoint/iterators/" + name.replace(":", "_")
    with graph.as_default(), tf.name_scope(scope), tf_ops.colocate_with(op):
        handle = op.outputs[0]
        state = gen_dataset_ops.serialize_iterator(handle, external_state_policy=_FAIL)
        save = tf.io.serialize_tensor(state)
        feed = tf.compat.v1.placeholder(tf.string, [], name="state")
        restore = gen_dataset_ops.deserialize_iterator(handle, tf.io.parse_tensor(feed, tf.variant))
    return IteratorOps(save, feed, restore)


def ensure_ops(graph: tf.Graph, names: Any = None) -> dict[str, IteratorOps]:
    """The ops of the iterators `names` (None: every iterator of the graph), built once. Built
    for all of them when a session is created and before the graph is finalized; one made
    later is added then (the graph briefly unfinalized, as for the shim's saver)."""
    with _LOCK:
        have = _OPS.setdefault(graph, {})
        if names is None:
            if graph.finalized:
                return dict(have)
            names = [op.name for op in graph.get_operations() if op.type in ITERATOR_RESOURCES]
        missing = [n for n in names if n not in have]
        if missing:
            finalized = graph.finalized
            if finalized:
                log.info("unfinalizing the graph briefly to save the position of tf.data "
                         "iterator(s) %s", ", ".join(missing))
                graph._unsafe_unfinalize()
            try:
                for n in missing:
                    have[n] = _build(graph, n)
            finally:
                if finalized:
                    graph.finalize()
        return {n: have[n] for n in names}


class IteratorStateError(RuntimeError):
    """An iterator's state could not be saved or put back (TensorFlow's reason in the text)."""


def save_states(run: Any, graph: tf.Graph, names: list[str]) -> dict[str, bytes]:
    """The current state of each iterator in `names`, as bytes (one run for all)."""
    if not names:
        return {}
    ops = ensure_ops(graph, names)
    try:
        values = run([ops[n].save for n in names], None, None, None)
    except tf.errors.OpError as exc:
        raise IteratorStateError(error_summary(exc)) from exc
    return {n: bytes(v) for n, v in zip(names, values)}


def unsaveable(run: Any, graph: tf.Graph, name: str) -> str:
    """Why the state of iterator `name` cannot be saved (TensorFlow's reason), or ""."""
    try:
        state = save_states(run, graph, [name])[name]
    except IteratorStateError as exc:
        return str(exc)
    if b"::FileCache" in state:
        # TensorFlow saves it, but a restored copy goes on writing (or reading) the cache
        # files the source left: after a kill their lockfile stops it ("There appears to be
        # a concurrent caching iterator running"), so the job would not restart at all.
        return ("it caches into a file (`Dataset.cache(filename)`), whose files and lockfile "
                "the restored copy would need as the source left them")
    return ""


def restore_state(run: Any, graph: tf.Graph, name: str, state: bytes) -> bool:
    """Put iterator `name` back to `state`. False when it is not initialised yet (the
    program's initializer has not run: restore it after that run); IteratorStateError
    when the state does not fit this graph's pipeline."""
    try:
        ops = ensure_ops(graph, [name])
    except KeyError as exc:
        raise IteratorStateError(f"this graph has no iterator {name!r}") from exc
    one = ops[name]
    try:
        run(one.restore, {one.feed: np.array(state, dtype=object)}, None, None)
    except tf.errors.FailedPreconditionError as exc:
        if "not been initialized" in str(exc.message):
            return False
        raise IteratorStateError(error_summary(exc)) from exc
    except tf.errors.OpError as exc:
        raise IteratorStateError(error_summary(exc)) from exc
    return True
