"""One model function called twice under `variable_scope(reuse=tf.compat.v1.AUTO_REUSE)`:
a training tower fed each mini-batch from the step read, and an evaluation tower on a fixed
batch sharing its weights (evaluated every 3 steps, the loss only printed); a non-trainable
count of the examples seen, incremented with `tf.compat.v1.assign_add` in the training op's
group. `--optimizer momentum|adam`."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--optimizer", choices=["momentum", "adam"], default="momentum")


def model(x, y):
    with v1.variable_scope("model", reuse=v1.AUTO_REUSE):
        h = tf.nn.relu(tf.matmul(x, v1.get_variable("w1", initializer=np.random.RandomState(5)
                                                    .standard_normal((_base.DIM, 8))
                                                    .astype(np.float32) * 0.4)))
        return _base.classifier(h[:, :_base.DIM], y, scope="head")


args, gs, x, y = _base.start(extra)
seen = v1.get_variable("examples_seen", initializer=np.int64(0), trainable=False)
loss = model(x, y)
ex, ey = _base.batch(-1, 16)
eval_loss = model(tf.constant(ex), tf.constant(ey))
opt = (v1.train.MomentumOptimizer(0.05, 0.9) if args.optimizer == "momentum"
       else v1.train.AdamOptimizer(0.02))
train = tf.group(opt.minimize(loss, global_step=gs),
                 v1.assign_add(seen, tf.cast(tf.shape(x)[0], tf.int64)))
assert len(v1.trainable_variables()) == 3  # shared, not duplicated
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = int(sess.run(gs))
    while step < args.steps:
        bx, by = _base.batch(step)
        sess.run(train, {x: bx, y: by})
        step = int(sess.run(gs))
        if step % 3 == 0:
            print("step", step, "eval loss", sess.run(eval_loss), flush=True)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
