"""A project whose own modules are named as Gandiva's top-level packages: `scheduler.py` (its
learning-rate schedule) and a `protos/` package (its configuration) beside the script,
imported after TensorFlow (`--order after`) or before it. The rate is fed from the step read;
Momentum. The shim used to fail to start in it ("cannot import name 'transport' from
'scheduler'")."""

import os
import sys
import time

if "--order" in sys.argv and sys.argv[sys.argv.index("--order") + 1] == "before":
    import protos
    import scheduler
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the family's _base
import _base

import protos
import scheduler

args, gs, x, y = _base.start(lambda p: p.add_argument("--order", default="after"))
tf = _base.tf
rate = tf.compat.v1.placeholder(tf.float32, [])
train = tf.compat.v1.train.MomentumOptimizer(rate, protos.MOMENTUM).minimize(
    _base.classifier(x, y), global_step=gs)
with tf.compat.v1.Session(config=_base.config()) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    step = int(sess.run(gs))
    while step < args.steps:
        bx, by = _base.batch(step)
        sess.run(train, {x: bx, y: by, rate: scheduler.rate(step)})
        step = int(sess.run(gs))
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
