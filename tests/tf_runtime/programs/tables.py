"""Training state outside the variables: a MutableHashTable counts how often each label has
been seen (updated in the training run) and the loss weighs each example by the inverse of
its label's count, as class-balancing code does; a DenseHashTable remembers the last step
each label was seen at. Adam; each mini-batch fed from the global step it read.

`--update train` (default): the tables are updated in the training run; `before`: in a run
of their own fed the step's mini-batch before the training run; `after`: in one after it."""

import _base
import tensorflow as tf


def extra(p):
    p.add_argument("--update", default="train", choices=["train", "before", "after"])


args = _base.parse(extra)
gs = tf.compat.v1.train.get_or_create_global_step()
x, y = _base.inputs()
counts = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, default_value=0.0,
                                                 name="label_counts")
last_seen = tf.lookup.experimental.DenseHashTable(tf.int64, tf.int64, default_value=-1,
                                                  empty_key=-1, deleted_key=-2, name="last_seen")
labels, _ = tf.unique(y)
seen = counts.lookup(labels) + tf.cast(
    tf.reduce_sum(tf.cast(tf.equal(labels[:, None], y[None, :]), tf.int32), 1), tf.float32)
update = tf.group(counts.insert(labels, seen),
                  last_seen.insert(labels, tf.fill(tf.shape(labels), tf.cast(gs, tf.int64))))
w = tf.compat.v1.get_variable("w", initializer=tf.fill([_base.DIM, _base.CLASSES], 0.1))
with tf.control_dependencies([update] if args.update == "train" else []):
    weights = 1.0 / tf.maximum(counts.lookup(y), 1.0)
    logits = tf.matmul(x, w)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits, weights=weights)
train = tf.compat.v1.train.AdamOptimizer(0.05).minimize(loss, global_step=gs)
# the weights depend on the tables' counts
_base.plain_loop(args, train, gs, x, y,
                 before=(lambda sess, feed: sess.run(update, feed)) if args.update == "before" else None,
                 after=(lambda sess, feed: sess.run(update, feed)) if args.update == "after" else None)
