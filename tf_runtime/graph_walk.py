"""What a run does where a walk of the graph's edges does not see it.

Two kinds of control flow hide a training run's updates from `TFSessionAdapter._walk`:

- v1 control flow (`tf.compat.v1.disable_v2_behavior()`, `tf.compat.v1.disable_control_flow_v2()`)
  passes a variable into a `tf.while_loop` through `Enter` (`RefEnter`) and into a `tf.cond`
  branch through `Switch`: the global step's `AssignAdd` inside the loop takes `Enter`, not the
  variable. `through` follows such pass-through ops back to the variable.
- v2 control flow (TensorFlow 2's default, also in graph mode) builds a loop or a branch as one
  functional op (`While`, `If`, `Case`, `PartitionedCall`...) whose body is a function in the
  graph's library: the updates are nodes of that function, not ops of the graph. `scan` reads
  the bodies, mapping each function argument to the graph op passed into it (a variable's handle),
  so an `AssignAddVariableOp` on the argument the global step's handle was passed into is seen
  to advance the step. Nested calls are followed the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Ops that pass a tensor (or a variable's reference or handle) on unchanged.
PASS_THROUGH = frozenset({"Enter", "RefEnter", "Switch", "RefSwitch", "Identity", "RefIdentity",
                          "Merge", "RefMerge", "NextIteration", "RefNextIteration"})
_MAX_DEPTH = 16
# Ops that call functions of the graph's library (v2 control flow, tf.function calls).
FUNCTIONAL = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
                        "PartitionedCall", "StatefulPartitionedCall"})


def through(op: Any) -> Any:
    """The op behind v1 control flow's pass-through ops (`Enter`, `Switch`, `Identity`)."""
    for _ in range(_MAX_DEPTH):
        if op.type not in PASS_THROUGH or not op.inputs:
            return op
        op = op.inputs[0].op
    return op


@dataclass
class Inside:
    """What the functions called by a run's ops do."""
    training: bool = False   # applies gradients, or updates a trainable variable or the step
    advances: bool = False   # sets the global step
    stateful: str = ""       # the first input op whose position no checkpoint holds, or ""


def function_names(attrs: Any) -> list[str]:
    """The functions an op (or a function's node) calls: `body`/`cond` of a While, the
    branches of an If or a Case, `f` of a call."""
    names = []
    for key in sorted(attrs):
        value = attrs[key]
        if value.HasField("func"):
            names.append(value.func.name)
        elif value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    return names


class FunctionScan:
    """Reads the function bodies a graph's functional ops call.

    `gs_op` is the global step's op, `targets` the trainable variables' ops and the
    step's; `is_stateful(type, inputs)` says whether a node of that type with those
    (non-control) input kinds reads input whose position no checkpoint holds.
    """

    def __init__(self, graph: Any, gs_op: Any, targets: frozenset[Any] | set[Any],
                 step_updates: Iterable[str], step_sets: Iterable[str],
                 train_prefixes: tuple[str, ...], stateful: Any) -> None:
        self.graph, self.gs_op, self.targets = graph, gs_op, targets
        self.step_updates, self.step_sets = frozenset(step_updates), frozenset(step_sets)
        self.train_prefixes, self.is_stateful = train_prefixes, stateful
        self._seen: set[tuple[str, tuple[int, ...]]] = set()

    def scan(self, op: Any, into: Inside) -> None:
        """Add what `op`'s functions do (nothing for an op that calls none)."""
        if op.type in FUNCTIONAL:
            names = function_names(op.node_def.attr)
        elif self._definition(op.type) is not None:  # a call of a `Defun` by its name
            names = [op.type]
        else:
            return
        outer = [t.op for t in op.inputs]
        for name in names:
            self._function(name, outer, into, 0)

    def _definition(self, name: str) -> Any:
        # A private lookup of TensorFlow's Graph (as `_unsafe_unfinalize`); without it the
        # bodies go unread, as before this module, and every run is still classified.
        lookup = getattr(self.graph, "_get_function", None)
        fn = lookup(name) if lookup is not None else None
        return getattr(fn, "definition", None) if fn is not None else None

    def _function(self, name: str, outer: list[Any], into: Inside, depth: int) -> None:
        key = (name, tuple(id(o) for o in outer))
        if depth > _MAX_DEPTH or key in self._seen:
            return
        self._seen.add(key)
        fdef = self._definition(name)
        if fdef is None:
            return
        params = list(fdef.signature.input_arg)
        # If and Case take their predicate or branch index first, the arguments after it.
        offset = len(outer) - len(params) if len(outer) - len(params) in (0, 1) else 0
        args = {p.name: (outer[i + offset] if i + offset < len(outer) else None)
                for i, p in enumerate(params)}
        nodes = {n.name: n for n in fdef.node_def}

        def resolve(ref: str) -> Any:
            """The graph op a node input comes from, through arguments and identities."""
            name = ref.split(":")[0]
            for _ in range(_MAX_DEPTH):
                if name in args:
                    return args[name]
                node = nodes.get(name)
                if node is None or node.op not in PASS_THROUGH or not node.input:
                    return None
                name = node.input[0].split(":")[0]
            return None

        for node in fdef.node_def:
            data = [i for i in node.input if not i.startswith("^")]
            if node.op.startswith(self.train_prefixes):
                into.training = True
            if node.op in self.step_sets and data:
                target = resolve(data[0])
                if target is not None and target is self.gs_op:
                    into.advances = True
                if node.op in self.step_updates and target is not None and \
                        target in self.targets:
                    into.training = True
            if not into.stateful:
                kinds = [self._kind(i, nodes, args) for i in data]
                if self.is_stateful(node.op, kinds):
                    into.stateful = f"{node.op} op {node.name!r} (in function {name!r})"
            for inner in function_names(node.attr):
                self._function(inner, [resolve(i) for i in data], into, depth + 1)

    @staticmethod
    def _kind(ref: str, nodes: dict[str, Any], args: dict[str, Any]) -> str:
        """An input's kind for the stateful check: "Const", "arg" or the node's op."""
        name = ref.split(":")[0]
        if name in args:
            return "arg"
        node = nodes.get(name)
        return node.op if node is not None else ""
