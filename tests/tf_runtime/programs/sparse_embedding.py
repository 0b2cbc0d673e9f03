"""TF1 code written from scratch: an embedding table trained by sparse updates. Each
mini-batch (ids and labels derived from the global step it read) looks up rows of the
table, averages them, and classifies. `--update scatter`: sparse gradient descent written
by hand (`tf.compat.v1.scatter_sub(table, ids, rate * grad.values)`, the dense layer by
`assign_sub`, the global step by `assign_add` in the same run; `--update scatter_apart`: the
table's rows in a run of their own before it, two training runs per step); `--update
adagrad` / `ftrl`:
the optimizer's sparse apply ops."""

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
VOCAB, WIDTH, IDS = 40, 5, 4


def extra(p):
    p.add_argument("--update", choices=["scatter", "scatter_apart", "adagrad", "ftrl"], default="scatter")
    # With `--update scatter` the run's backward pass reads a reference variable while its
    # own update writes it, unordered: such a program differs from itself run to run.
    p.add_argument("--ref", action="store_true", help="reference (non-resource) variables")


args = _base.parse(extra)
if args.ref:
    v1.disable_resource_variables()
gs = v1.train.get_or_create_global_step()
ids = v1.placeholder(tf.int64, [None, IDS])
y = v1.placeholder(tf.int64, [None])
table = v1.get_variable("table", initializer=np.random.RandomState(5).standard_normal(
    (VOCAB, WIDTH)).astype(np.float32) * 0.2)
w = v1.get_variable("w", initializer=np.zeros((WIDTH, _base.CLASSES), np.float32))
logits = tf.matmul(tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1), w)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
rows = None
if args.update.startswith("scatter"):
    g_table, g_w = tf.gradients(loss, [table, w])
    rows = v1.scatter_sub(table, g_table.indices, 0.5 * g_table.values)
    dense = v1.assign_sub(w, 0.5 * g_w)
    with tf.control_dependencies([dense] if args.update == "scatter_apart" else [rows, dense]):
        train = v1.assign_add(gs, 1)
    if args.update != "scatter_apart":
        rows = None
elif args.update == "adagrad":
    train = v1.train.AdagradOptimizer(0.3).minimize(loss, global_step=gs)
else:
    train = v1.train.FtrlOptimizer(0.3, l1_regularization_strength=0.001).minimize(
        loss, global_step=gs)


def batch(step):
    rng = np.random.RandomState(500 + int(step))
    return rng.randint(0, VOCAB, size=(8, IDS)), rng.randint(0, _base.CLASSES, size=8)


with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        bi, by = batch(step)
        if rows is not None:
            sess.run(rows, {ids: bi, y: by})
        sess.run(train, {ids: bi, y: by})
        step = sess.run(gs)
        import time
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
