"""No global step at all: the program counts its training iterations in a variable of its own
(`iterations`, int64, as Keras optimizers do), passed as `global_step=` to `minimize` or
incremented by an `assign_add` in the training op's group (`--count group`), and its loss reads
the counter (a KL-style weight annealed by `min(1, iterations / 10)`). The loop reads the counter
after each training run and feeds the mini-batch of the count it read. Adam. `--collection`:
the counter added to the GLOBAL_STEP collection, as the shim's refusal advises."""

import time

import _base
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--count", default="minimize", choices=["minimize", "group"])
    p.add_argument("--collection", action="store_true",
                   help="add the counter to the GLOBAL_STEP collection (the refusal's advice)")


args = _base.parse(extra)
x, y = _base.inputs()
iterations = v1.get_variable("iterations", initializer=tf.constant(0, tf.int64), trainable=False)
if args.collection:
    v1.add_to_collection(v1.GraphKeys.GLOBAL_STEP, iterations)
anneal = tf.minimum(1.0, tf.cast(iterations, tf.float32) / 10.0)
with v1.variable_scope("net"):
    w = v1.get_variable("w", initializer=tf.fill([_base.DIM, _base.CLASSES], 0.1))
logits = tf.matmul(x, w)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)) \
    + anneal * 0.01 * tf.reduce_sum(w * w)
opt = v1.train.AdamOptimizer(0.05)
if args.count == "minimize":
    train = opt.minimize(loss, global_step=iterations)
else:
    train = tf.group(opt.minimize(loss), v1.assign_add(iterations, 1))
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    count = sess.run(iterations)
    while count < args.steps:
        bx, by = _base.batch(count)
        sess.run(train, {x: bx, y: by})
        count = int(sess.run(iterations))
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
