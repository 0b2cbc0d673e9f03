"""Input from TensorFlow 1's queues: `slice_input_producer` over a fixed dataset and
`tf.compat.v1.train.batch` (a small capacity, so the queue runner's enqueue blocks on a full
queue), its QueueRunner threads started under a Coordinator; a plain loop on a Python counter
that also reads the global step. One thread, no shuffling: every run sees the same batches.
Not migratable (the queues' positions are in no checkpoint); suspended and resumed in place.
`--num-epochs N`: the producer ends after N epochs (its count in a local variable), and the
loop ends with the data (`OutOfRangeError`), as under `coord.should_stop()`."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1

args = _base.parse(lambda p: p.add_argument("--num-epochs", type=int, default=None))
rng = np.random.RandomState(5)
features = rng.standard_normal((64, _base.DIM)).astype(np.float32)
labels = rng.randint(0, _base.CLASSES, size=64).astype(np.int64)
gs = v1.train.get_or_create_global_step()
one_x, one_y = v1.train.slice_input_producer([features, labels], shuffle=False,
                                             num_epochs=args.num_epochs)
x, y = v1.train.batch([one_x, one_y], batch_size=8, num_threads=1, capacity=8)
loss = _base.classifier(x, y)
train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
with v1.Session(config=_base.config()) as sess:
    sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
    coord = v1.train.Coordinator()
    threads = v1.train.start_queue_runners(sess, coord)
    if args.num_epochs is None:
        step = _base.unfed_loop(sess, args, train, gs)
    else:
        try:
            while not coord.should_stop():
                sess.run(train)
                time.sleep(args.step_sleep)
        except tf.errors.OutOfRangeError:
            pass
        step = sess.run(gs)
    _base.dump(args.dump, sess)
    coord.request_stop()
    coord.join(threads, stop_grace_period_secs=5)
print(f"done at step {step}", flush=True)
