"""A feedable tf.data iterator, as the TF1 programmer's guide wrote it: one
`Iterator.from_string_handle` picked by a string handle fed at each run, switching between
a training iterator (one-shot over a shuffled, repeated set: `--train one_shot`; or
initializable: `--train initializable`) and an initializable evaluation iterator,
re-initialised and read to its end every 5 steps. The handles are fetched once after
initialising (`sess.run(it.string_handle())`). The loop reads the global step; the training
run sums the ids it read into `seen`."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
args = _base.parse(lambda p: p.add_argument("--train", default="one_shot",
                                            choices=["one_shot", "initializable"]))
N = 40
features, labels = _base.examples(N)
train_ds = tf.data.Dataset.from_tensor_slices(
    (np.arange(N, dtype=np.int64), features, labels)).shuffle(N, seed=5).repeat().batch(8)
val_ds = tf.data.Dataset.from_tensor_slices(
    (np.zeros(12, np.int64), features[:12] + 0.5, labels[:12])).batch(4)
handle = v1.placeholder(tf.string, [])
iterator = v1.data.Iterator.from_string_handle(handle, v1.data.get_output_types(train_ds),
                                               v1.data.get_output_shapes(train_ds))
ids, x, y = iterator.get_next()
if args.train == "one_shot":
    train_it = v1.data.make_one_shot_iterator(train_ds)
else:
    train_it = v1.data.make_initializable_iterator(train_ds)
val_it = v1.data.make_initializable_iterator(val_ds)
gs, loss, train = _base.counted_training(ids, x, y)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    if args.train == "initializable":
        sess.run(train_it.initializer)
    train_handle, val_handle = sess.run([train_it.string_handle(), val_it.string_handle()])
    step = sess.run(gs)
    while step < args.steps:
        sess.run(train, {handle: train_handle})
        step = sess.run(gs)
        if step % 5 == 0:
            sess.run(val_it.initializer)
            total = 0.0
            while True:
                try:
                    total += sess.run(loss, {handle: val_handle})
                except tf.errors.OutOfRangeError:
                    break
            print(f"step {step}: evaluation loss {total:.6f}", flush=True)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
