"""Mini-batches made by a `multiprocessing` pool of input workers, the next one prefetched
while the current one trains (`apply_async`), each a function of its global step.
`--start fork|spawn|forkserver`: the pool's start method (spawn and forkserver start a new
Python that imports this file again, TensorFlow with it)."""

import multiprocessing
import time

import _base
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--start", choices=["fork", "spawn", "forkserver"], default="fork")


if __name__ == "__main__":
    args, gs, x, y = _base.start(extra)
    train = v1.train.AdamOptimizer(0.02).minimize(_base.classifier(x, y), global_step=gs)
    with multiprocessing.get_context(args.start).Pool(2) as pool, \
            v1.Session(config=_base.config()) as sess:
        sess.run(v1.global_variables_initializer())
        step = sess.run(gs)
        pending = pool.apply_async(_base.batch, (step,))
        while step < args.steps:
            bx, by = pending.get(60)
            pending = pool.apply_async(_base.batch, (step + 1,))
            sess.run(train, {x: bx, y: by})
            step = sess.run(gs)
            time.sleep(args.step_sleep)
        _base.dump(args.dump, sess)
