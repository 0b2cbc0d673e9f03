"""Real TensorFlow in process: steps made of several runs, cut at each run of a step.

Families of TF1 loops whose step is more than one training run: a GAN (the discriminator
with a step variable of its own, before or after the generator that advances the global
step; both advancing it, with or without a read of the step between them), a WGAN (critic
runs each followed by a run clipping its weights, more of them in the first steps; or the
clipping in the critic's op and the critic's steps counted in a variable of its own),
gradient accumulation in runs of their own (the global step advancing with every
micro-batch and the apply made every 4th step, or only the apply advancing it while the
loop reads its micro-step counter), and a learning rate computed in Python from the step
and fed, a `tf.cond` on the step in the graph and two optimizers on disjoint variables in
one run. Each job is cut twice (a stop for migration served while suspended, then a
checkpoint followed by a kill), at a given run of a given iteration, in a plain Session
loop and under MonitoredTrainingSession, and must end with the uninterrupted run's
variables, bit for bit. Every case is `full`: the mechanisms have default tests of their
own (test_tfr_accumulated_first_step.py: the only failure these families showed, s52;
test_tfr_step_twice.py, test_tfr_late_advance.py, test_tfr_tf_session.py for the others)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tf_runtime.commands import Command, Kind
from tf_runtime.controller import EXIT_MIGRATED
from tf_runtime.testing import Exited

from .test_tfr_restored_first_step import trained
from .test_tfr_tf_session import acks, shimmed

pytestmark = [pytest.mark.tf, pytest.mark.full]
tf = pytest.importorskip("tensorflow")

STEPS = 8
Ask = Callable[[int, int], None]  # (iteration of this process, run of that iteration)


class Killed(Exception):
    """The process lost (after its checkpoint), as a host's loss ends it."""


def _noise(ops: dict[str, Any], step: int, draw: int = 0) -> dict[Any, Any]:
    rng = np.random.RandomState(step * 7 + draw)
    return {ops["z"]: rng.standard_normal((4, 3)).astype(np.float32),
            ops["real"]: rng.standard_normal((4, 3)).astype(np.float32)}


def _gan(family: str) -> dict[str, Any]:
    gs = tf.compat.v1.train.get_or_create_global_step()
    z = tf.compat.v1.placeholder(tf.float32, [None, 3])
    real = tf.compat.v1.placeholder(tf.float32, [None, 3])
    gw = tf.compat.v1.get_variable("gen/w", initializer=tf.constant(
        np.random.RandomState(5).standard_normal((3, 3)).astype(np.float32) * 0.3))
    dw = tf.compat.v1.get_variable("disc/w", initializer=tf.constant(
        np.random.RandomState(6).standard_normal((3, 1)).astype(np.float32) * 0.3))
    fake = tf.tanh(tf.matmul(z, gw))
    d_loss = tf.reduce_mean(tf.nn.softplus(tf.matmul(fake, dw)) +
                            tf.nn.softplus(-tf.matmul(real, dw)))
    g_loss = tf.reduce_mean(tf.nn.softplus(-tf.matmul(fake, dw)))
    ops: dict[str, Any] = {"gs": gs, "z": z, "real": real}
    d_step = tf.compat.v1.get_variable("d_step", initializer=tf.constant(0, tf.int64),
                                       trainable=False)
    if family.startswith("gan_both"):
        ops["d"] = tf.compat.v1.train.RMSPropOptimizer(0.01).minimize(d_loss, var_list=[dw],
                                                                      global_step=gs)
    elif family == "wgan":
        ops["d"] = tf.compat.v1.train.RMSPropOptimizer(5e-3).minimize(-d_loss, var_list=[dw])
        ops["clip"] = dw.assign(tf.clip_by_value(dw, -0.2, 0.2))
    elif family == "wgan_d_step":
        with tf.control_dependencies([tf.compat.v1.train.RMSPropOptimizer(5e-3).minimize(
                -d_loss, var_list=[dw], global_step=d_step)]):
            ops["d"] = dw.assign(tf.clip_by_value(dw, -0.2, 0.2))
    else:
        ops["d"] = tf.compat.v1.train.RMSPropOptimizer(0.01).minimize(d_loss, var_list=[dw],
                                                                      global_step=d_step)
    ops["g"] = tf.compat.v1.train.AdamOptimizer(0.01).minimize(g_loss, var_list=[gw],
                                                               global_step=gs)
    return ops


def _gan_loop(family: str, sess: Any, ops: dict[str, Any], ask: Ask) -> None:
    step, it = int(sess.run(ops["gs"])), 0
    while step < STEPS * (2 if family.startswith("gan_both") else 1):
        k = iter(range(100))
        if family.startswith("wgan"):
            for i in range(4 if step < 3 else 2):
                ask(it, next(k))
                sess.run(ops["d"], _noise(ops, step, i + 1))
                if family == "wgan":
                    ask(it, next(k))
                    sess.run(ops["clip"])
            ask(it, next(k))
            sess.run(ops["g"], _noise(ops, step))
        else:
            first, second = ("g", "d") if family == "gan_d_step_after" else ("d", "g")
            ask(it, next(k))
            sess.run(ops[first], _noise(ops, step))
            mid = step
            if family == "gan_both_read_between":
                ask(it, next(k))
                mid = int(sess.run(ops["gs"]))
            ask(it, next(k))
            sess.run(ops[second], _noise(ops, mid))
        ask(it, next(k))
        step, it = int(sess.run(ops["gs"])), it + 1


def _accumulation(family: str) -> dict[str, Any]:
    gs = tf.compat.v1.train.get_or_create_global_step()
    x = tf.compat.v1.placeholder(tf.float32, [4, 3])
    w = tf.compat.v1.get_variable("w", initializer=tf.constant([[1.0], [-2.0], [0.5]]))
    opt = tf.compat.v1.train.AdamOptimizer(0.05)
    (grad, _), = opt.compute_gradients(tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0)), [w])
    acc = tf.compat.v1.get_variable("acc", initializer=tf.zeros([3, 1]), trainable=False)
    micro = tf.compat.v1.get_variable("micro", initializer=tf.constant(0, tf.int64),
                                      trainable=False)
    every_run = family == "accumulate_step_every_run"
    return {"gs": gs, "x": x, "micro": micro,
            "accumulate": tf.group(acc.assign_add(grad), tf.compat.v1.assign_add(
                gs if every_run else micro, 1)),
            "apply": opt.apply_gradients([(acc / 4.0, w)], global_step=None if every_run else gs),
            "zero": acc.assign(tf.zeros_like(acc))}


def _accumulation_loop(family: str, sess: Any, ops: dict[str, Any], ask: Ask) -> None:
    every_run = family == "accumulate_step_every_run"
    step, it = int(sess.run(ops["gs"])), 0
    while step < STEPS * (4 if every_run else 1):
        k = iter(range(100))
        m = step if every_run else int(sess.run(ops["micro"]))
        ask(it, next(k))
        sess.run(ops["accumulate"],
                 {ops["x"]: np.sin(np.arange(12, dtype=np.float32) + m).reshape(4, 3)})
        if (m + 1) % 4 == 0:
            ask(it, next(k))
            sess.run(ops["apply"])
            ask(it, next(k))
            sess.run(ops["zero"])
        ask(it, next(k))
        step, it = int(sess.run(ops["gs"])), it + 1


def _schedule(family: str) -> dict[str, Any]:
    gs = tf.compat.v1.train.get_or_create_global_step()
    x = tf.compat.v1.placeholder(tf.float32, [2, 3])
    rate = tf.compat.v1.placeholder(tf.float32, [])
    w = tf.compat.v1.get_variable("w", initializer=tf.constant([[1.0], [-2.0], [0.5]]))
    h = tf.compat.v1.get_variable("h", initializer=tf.constant([[0.3], [0.1], [0.2]]))
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + tf.matmul(x, h) - 1.0))
    loss = tf.cond(gs < 4, lambda: loss, lambda: 2.0 * loss)
    return {"gs": gs, "x": x, "rate": rate, "train": tf.group(
        tf.compat.v1.train.MomentumOptimizer(rate, 0.9).minimize(loss, var_list=[w],
                                                                 global_step=gs),
        tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, var_list=[h]))}


def _schedule_loop(family: str, sess: Any, ops: dict[str, Any], ask: Ask) -> None:
    step, it = int(sess.run(ops["gs"])), 0
    while step < STEPS:
        ask(it, 0)
        sess.run(ops["train"], {
            ops["x"]: np.cos(np.arange(6, dtype=np.float32) * (step + 1)).reshape(2, 3),
            ops["rate"]: 0.1 * 0.5 ** (step // 3)})
        ask(it, 1)
        step, it = int(sess.run(ops["gs"])), it + 1


FAMILIES = {name: (_gan, _gan_loop) for name in (
    "gan_d_step", "gan_d_step_after", "gan_both", "gan_both_read_between", "wgan",
    "wgan_d_step")} | {name: (_accumulation, _accumulation_loop) for name in (
        "accumulate_step_every_run", "accumulate_micro_step")} | {
    "fed_rate": (_schedule, _schedule_loop)}


def _process(family: str, mts: bool, restore: Path | None, ask: Callable[[Any, int, int], None],
             dump: dict[str, Any]) -> Any:
    build, loop = FAMILIES[family]
    with shimmed(restore) as ctl, tf.Graph().as_default() as g:
        ops = build(family)
        try:
            dump.update(trained(g, mts, lambda sess: loop(family, sess, ops, lambda it, k: ask(ctl, it, k))))
        except Exited as e:
            assert e.code == EXIT_MIGRATED
        except Killed:
            pass
    return ctl


def _run(family: str, mts: bool, cuts: list[tuple[str, int, int]], work: Path) -> dict[str, Any]:
    """The job through `cuts`, one a process: (kind, iteration, run) at which it is asked
    (at the first run of a later iteration where that run does not come): "suspended
    migrate" (a suspension, then a stop for migration served while suspended, as the
    scheduler moves a suspended job) or "checkpoint" (the process is killed 7 runs after
    it). Returns the last process's variables."""
    restore: Path | None = None
    for i, (kind, n, at) in enumerate(cuts):
        target, state = work / f"ck{i}", {"asked": False, "after": 0}

        def ask(ctl: Any, it: int, k: int, kind: str = kind, n: int = n, at: int = at,
                target: Path = target, i: int = i, state: dict[str, Any] = state) -> None:
            if (it == n and k == at or it > n) and not state["asked"]:
                state["asked"] = True
                if kind.startswith("suspended"):
                    ctl.enqueue(Command(f"s{i}", Kind.SUSPEND))
                ctl.enqueue(Command(f"c{i}", Kind.STOP_FOR_MIGRATION if kind.endswith("migrate")
                                    else Kind.CHECKPOINT, str(target)))
                if kind.startswith("suspended"):
                    ctl.enqueue(Command(f"r{i}", Kind.RESUME))
            if kind == "checkpoint" and any(a.ok and a.command_id == f"c{i}" for a in acks(ctl)):
                state["after"] += 1
                if state["after"] > 7:
                    raise Killed()

        dump: dict[str, Any] = {}
        ctl = _process(family, mts, restore, ask, dump)
        assert any(a.ok and a.command_id == f"c{i}" for a in acks(ctl)), (i, acks(ctl))
        if dump:
            return dump
        restore = target
    final: dict[str, Any] = {}
    _process(family, mts, restore, lambda ctl, it, k: None, final)
    return final


@pytest.mark.parametrize("mts", [False, True], ids=["session", "mts"])
@pytest.mark.parametrize("at", [0, 1, 2])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_step_of_several_runs_cut_at_any_of_them(family: str, mts: bool, at: int,
                                                   tmp_path: Path) -> None:
    reference: dict[str, Any] = {}
    _process(family, mts, None, lambda ctl, it, k: None, reference)
    final = _run(family, mts, [("suspended migrate", 2, at), ("checkpoint", 1, at + 1)], tmp_path)
    assert set(final) == set(reference)
    for name, value in reference.items():
        np.testing.assert_array_equal(final[name], value, err_msg=name)
