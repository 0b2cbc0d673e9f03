"""Two-phase training, as in fine-tuning: plain SGD on the classifier first; at step
`--switch` the program builds a second optimizer (Adam, new slot variables) in the middle of
its loop, initialises only the new variables, and trains with it to the end. A restarted copy
that reads a step past the switch builds the second phase at once, so its Adam slots exist
only after the shim's restore: they must come back from the checkpoint all the same."""

import time

import _base
import tensorflow as tf


def extra(p):
    p.add_argument("--switch", type=int, default=10)


args = _base.parse(extra)
gs = tf.compat.v1.train.get_or_create_global_step()
x, y = _base.inputs()
loss = _base.classifier(x, y)
train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
with tf.compat.v1.Session(config=_base.config()) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    step = sess.run(gs)
    phase = 1
    while step < args.steps:
        if phase == 1 and step >= args.switch:
            before = set(tf.compat.v1.global_variables())
            train = tf.compat.v1.train.AdamOptimizer(0.02).minimize(loss, global_step=gs)
            fresh = [v for v in tf.compat.v1.global_variables() if v not in before]
            sess.run(tf.compat.v1.variables_initializer(fresh))
            phase = 2
        step = _base.fed_step(sess, train, gs, x, y, step)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
