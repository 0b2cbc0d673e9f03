"""Mini-batches made by input producers beside the training loop: `--producer thread`, a
`threading.Thread` putting the batches of steps start, start+1, ... into a
`queue.Queue(maxsize=4)` (start: the global step the program read after initialising);
`--producer process`, a `multiprocessing.Process` (fork) doing the same into a
`multiprocessing.Queue`. The loop takes one batch per step (`q.get()`); Adam."""

import multiprocessing
import queue
import threading
import time

import _base
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--producer", choices=["thread", "process"], default="thread")


def produce(q, start, end):
    for step in range(start, end):
        q.put(_base.batch(step))


if __name__ == "__main__":
    args, gs, x, y = _base.start(extra)
    train = v1.train.AdamOptimizer(0.02).minimize(_base.classifier(x, y), global_step=gs)
    with v1.Session(config=_base.config()) as sess:
        sess.run(v1.global_variables_initializer())
        step = int(sess.run(gs))
        if args.producer == "thread":
            q = queue.Queue(maxsize=4)
            worker = threading.Thread(target=produce, args=(q, step, args.steps), daemon=True)
        else:
            q = multiprocessing.get_context("fork").Queue(maxsize=4)
            worker = multiprocessing.get_context("fork").Process(
                target=produce, args=(q, step, args.steps), daemon=True)
        worker.start()
        while step < args.steps:
            bx, by = q.get(timeout=60)
            sess.run(train, {x: bx, y: by})
            step = int(sess.run(gs))
            time.sleep(args.step_sleep)
        worker.join(10)
        _base.dump(args.dump, sess)
