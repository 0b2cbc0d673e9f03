"""TF1 code written from scratch: a recurrent cell trained by truncated backpropagation
through time, its state carried from one mini-batch to the next in Python (as language
models do: `state = sess.run(final_state, {initial_state: state, ...})`). The inputs come from
the global step it read, so the loop itself resumes; the carried state lives only in the
process. `--fetch tuple`: the state is an `LSTMStateTuple`-like pair fetched as a structure
and fed back leaf by leaf, with the loss in a dict of fetches. `--fetch variable`: the way to
make such a program migratable, the state kept in non-trainable variables that the training
run assigns (so the checkpoint holds it), nothing fed back; with `--reset-every K` the state
is zeroed at the top of the loop every K steps (a new sequence) by its initializer run again
(`sess.run(variables_initializer([c, h]))`, `--reset init`) or by an assign of zeros to the
first row's state only (`c[0].assign(...)`, a sliced assign, `--reset row`)."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
UNITS, BATCH = 5, 8


def extra(p):
    p.add_argument("--fetch", choices=["array", "tuple", "variable"], default="array")
    p.add_argument("--reset-every", type=int, default=0)
    p.add_argument("--reset", choices=["init", "row"], default="init")


args, gs, x, y = _base.start(extra)
if args.fetch == "variable":
    c0 = v1.get_variable("c", [BATCH, UNITS], initializer=v1.zeros_initializer(), trainable=False)
    h0 = v1.get_variable("h", [BATCH, UNITS], initializer=v1.zeros_initializer(), trainable=False)
else:
    c0 = v1.placeholder(tf.float32, [BATCH, UNITS])
    h0 = v1.placeholder(tf.float32, [BATCH, UNITS])
with v1.variable_scope("cell"):
    w = v1.get_variable("w", initializer=np.random.RandomState(6).standard_normal(
        (_base.DIM + UNITS, UNITS)).astype(np.float32) * 0.3)
    out = v1.get_variable("out", initializer=np.random.RandomState(7).standard_normal(
        (UNITS, _base.CLASSES)).astype(np.float32) * 0.3)
c1 = 0.5 * c0 + 0.5 * tf.tanh(tf.matmul(tf.concat([x, h0], 1), w))
h1 = tf.tanh(c1)
logits = tf.matmul(h1, out)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
train = v1.train.AdamOptimizer(0.05).minimize(loss, global_step=gs)
if args.fetch == "variable":
    with tf.control_dependencies([train]):
        train = tf.group(c0.assign(c1), h0.assign(h1))

with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    state = (np.zeros((BATCH, UNITS), np.float32), np.zeros((BATCH, UNITS), np.float32))
    reset = None
    if args.reset_every:
        reset = v1.variables_initializer([c0, h0]) if args.reset == "init" else tf.group(
            c0[0].assign(c0[0] * 0.0 + 0.1), h0[0].assign(h0[0] * 0.5))
    step = sess.run(gs)
    while step < args.steps:
        if reset is not None and step % args.reset_every == 0 and step:
            sess.run(reset)
        bx, by = _base.batch(step, BATCH)
        if args.fetch == "variable":
            sess.run(train, {x: bx, y: by})
        elif args.fetch == "array":
            _, c, h = sess.run([train, c1, h1], {x: bx, y: by, c0: state[0], h0: state[1]})
            state = (c, h)
        else:
            got = sess.run({"train": train, "loss": loss, "state": (c1, h1)},
                           {x: bx, y: by, c0: state[0], h0: state[1]})
            state = got["state"]
        step = sess.run(gs)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
