"""Recognising replicated variables (one copy per tower/device) by name.

Data-parallel TF1 programs build one tower per device and give every tower its own
copy of each variable, under a per-tower name scope. A variable is taken as a
replica when its name is `<family><sep><index>/<rest>` with family one of
`tower`, `replica`, `clone`, `gpu`, `cpu` or `v` (tf_cnn_benchmarks' `v0/`), sep
`_` or nothing, and `<rest>` is the canonical name. A family is treated as
replicated only if every index holds exactly the same canonical names with the
same shapes and dtypes, and no canonical name clashes with an unprefixed
variable; otherwise its variables are kept as distinct variables (safe: nothing is
merged by mistake). A single tower (`tower_0/` only) is stripped too, so the saved
names do not depend on the replica count (which the manifest records: a restore into
a graph with another count is refused, tf_runtime.checkpoint.check_towers). Optimizer slots
(`tower_1/w/Momentum`) follow their primary variable automatically.

The checkpoint holds one entry per canonical name, taken from the lowest index;
restore writes that value into every replica. Names alone cannot tell replicas from
distinct variables built alike (a two-tower model's query and document towers in
`tower_0/` and `tower_1/`, each tower's own batch-norm statistics in a replicated
program), so before each save the shim compares the copies' values
(tf_runtime.tf_session): a canonical name whose copies differ is `split`, saved and
restored one entry per copy under its own name, and the manifest lists it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_REPLICA_RE = re.compile(r"^(tower|replica|clone|gpu|cpu|v)_?(\d+)/(.+)$")


@dataclass(frozen=True)
class VarSpec:
    """What grouping needs to know about one variable."""

    name: str  # without the ":0" suffix
    shape: tuple[int | None, ...] | None  # None: not even the rank is known
    dtype: str


@dataclass(frozen=True)
class Group:
    """One saved entry: its canonical name and the variables (replicas) it fills."""

    canonical: str
    members: tuple[str, ...]  # replica 0 first


def strip_output(name: str) -> str:
    """'tower_0/w:0' -> 'tower_0/w'."""
    return name.removesuffix(":0")


def group_replicas(specs: Sequence[VarSpec],
                   split: frozenset[str] = frozenset()) -> tuple[list[Group], int]:
    """Group variables into saved entries; returns (groups, replica count).

    The replica count is the largest number of copies any canonical name has (1 when
    nothing is replicated). A canonical name in `split` (copies found to differ) gives
    one entry per copy, each under the copy's own name; the count is unchanged.
    """
    by_family: dict[str, dict[int, dict[str, VarSpec]]] = defaultdict(lambda: defaultdict(dict))
    plain: list[VarSpec] = []
    for spec in specs:
        m = _REPLICA_RE.match(spec.name)
        if m:
            by_family[m.group(1)][int(m.group(2))][m.group(3)] = spec
        else:
            plain.append(spec)

    groups = [Group(s.name, (s.name,)) for s in plain]
    taken = {s.name for s in plain}
    replicas = 1
    for by_index in by_family.values():
        canon = set().union(*(t.keys() for t in by_index.values()))
        # A canonical name that clashes with a plain variable keeps the family unmerged.
        if _consistent(by_index.values()) and not (canon & taken):
            taken |= canon
            indices = sorted(by_index)
            for rest in sorted(by_index[indices[0]]):
                members = tuple(by_index[i][rest].name for i in indices)
                if rest in split:
                    groups.extend(Group(m, (m,)) for m in members)
                else:
                    groups.append(Group(rest, members))
            replicas = max(replicas, len(indices))
        else:
            for index in sorted(by_index):
                groups.extend(Group(s.name, (s.name,)) for s in by_index[index].values())
    groups.sort(key=lambda g: g.canonical)
    return groups, replicas


def _consistent(towers: Iterable[dict[str, VarSpec]]) -> bool:
    towers = list(towers)
    # A variable of unknown shape (one that may grow) is never taken for a replica: its
    # copies' values could not be compared, and one saved entry could not fill them all.
    if any(v.shape is None for t in towers for v in t.values()):
        return False
    first = {k: (v.shape, v.dtype) for k, v in towers[0].items()}
    return all({k: (v.shape, v.dtype) for k, v in t.items()} == first for t in towers[1:])

