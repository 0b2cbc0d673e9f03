"""Logical towers on however many devices a job holds: grow and shrink that keep the result.

Under data parallelism the gradients of N towers are averaged: their sum is taken in
tower order, so a program that builds one tower per device computes a different sum
(different floating-point rounding) after a grow or a shrink changes its device count,
and its variables drift from those of an uninterrupted run. A program that instead
builds a fixed number of *logical* towers (the most devices it may ever hold) and
places them on the devices it holds now, several to a device after a shrink, computes
exactly the same graph whatever the device count: the same towers, the same feeds per
tower, the same sum in the same order. Only where each op runs changes, and with
deterministic kernels of one device type that does not change a bit (tested on CPU
devices: tests/tf_runtime/test_tfr_grow_shrink.py).

    from tf_runtime.towers import tower_devices, visible_device_count

    towers = 4                                   # the job's maximum, fixed for its life
    devices = visible_device_count(default=1)    # what the helper gave this launch
    for i, device in enumerate(tower_devices(towers, devices, kind="gpu")):
        with tf.device(device), tf.compat.v1.variable_scope(f"tower_{i}"):
            ...

The checkpoint holds one copy of the replicated variables (docs/tf_runtime.md), so a
checkpoint from any device count restores into any other. Nothing here imports
TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def visible_device_count(default: int, environ: Mapping[str, str] | None = None) -> int:
    """How many devices this launch holds: the entries of CUDA_VISIBLE_DEVICES, which
    the Migration Helper sets to the job's GPUs (also virtual ones); `default` when it
    is unset or empty."""
    value = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES", "").strip()
    entries = [v for v in value.split(",") if v.strip()] if value else []
    return len(entries) or default


def tower_devices(towers: int, devices: int, kind: str = "gpu") -> list[str]:
    """The device of each of `towers` logical towers on `devices` devices of `kind`
    (round robin: tower i on device i mod devices). More devices than towers leaves
    the rest idle."""
    if towers < 1:
        raise ValueError(f"towers: {towers}; a program needs at least one tower")
    if devices < 1:
        raise ValueError(f"devices: {devices}; a launch holds at least one device")
    if kind not in ("gpu", "cpu"):
        raise ValueError(f"kind: {kind!r}; expected 'gpu' or 'cpu'")
    return [f"/{kind}:{i % devices}" for i in range(towers)]


__all__ = ["tower_devices", "visible_device_count"]
