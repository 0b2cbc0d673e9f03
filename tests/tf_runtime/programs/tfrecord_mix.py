"""Input the program writes itself, then reads: at its start it writes 4 TFRecord shards of
serialized `tf.train.Example`s into its working directory (unless there), then reads them
through `Dataset.list_files(shuffle=False)` and an interleave of `TFRecordDataset`s
(`--read interleave`: `interleave(cycle_length=2, block_length=2)`; `parallel`:
`tf.data.experimental.parallel_interleave(cycle_length=2)`; `sample`: two halves mixed by
`tf.data.experimental.sample_from_datasets(weights, seed)`; `choose`: by
`choose_from_datasets` on a cycled choice), parsed by `parse_single_example`, shuffled with
no op seed (the graph's seed) and reshuffled each epoch, repeated, batched; a one-shot
iterator read by the training run, which sums the ids it read into `seen`. Adam."""

import os

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
args = _base.parse(lambda p: p.add_argument("--read", default="interleave",
                                            choices=["interleave", "parallel", "sample", "choose"]))
work = args.workdir or "."
os.makedirs(work, exist_ok=True)
N = 40
features, labels = _base.examples(N)
paths = [os.path.join(work, f"shard-{k}.tfrecord") for k in range(4)]
for k, path in enumerate(paths):
    if os.path.exists(path):
        continue
    with tf.io.TFRecordWriter(path + ".tmp") as writer:
        for i in range(k, N, 4):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=features[i])),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[i]])),
            })).SerializeToString())
    os.replace(path + ".tmp", path)
spec = {"id": tf.io.FixedLenFeature([], tf.int64), "x": tf.io.FixedLenFeature([_base.DIM], tf.float32),
        "y": tf.io.FixedLenFeature([], tf.int64)}


def parse(record):
    ex = tf.io.parse_single_example(record, spec)
    return ex["id"], ex["x"], ex["y"]


files = tf.data.Dataset.list_files(os.path.join(work, "shard-*.tfrecord"), shuffle=False)
if args.read == "interleave":
    records = files.interleave(tf.data.TFRecordDataset, cycle_length=2, block_length=2)
elif args.read == "parallel":
    records = files.apply(tf.data.experimental.parallel_interleave(
        tf.data.TFRecordDataset, cycle_length=2))
else:
    halves = [tf.data.TFRecordDataset(paths[:2]).repeat(), tf.data.TFRecordDataset(paths[2:]).repeat()]
    if args.read == "sample":
        records = tf.data.experimental.sample_from_datasets(halves, weights=[0.7, 0.3], seed=3)
    else:
        choice = tf.data.Dataset.from_tensor_slices(np.array([0, 1, 1], np.int64)).repeat()
        records = tf.data.experimental.choose_from_datasets(halves, choice)
    records = records.take(N)
ds = records.map(parse).shuffle(16, reshuffle_each_iteration=True).repeat().batch(8)
ids, x, y = v1.data.make_one_shot_iterator(ds).get_next()
gs, loss, train = _base.counted_training(ids, x, y)
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    _base.unfed_loop(sess, args, train, gs)
    _base.dump(args.dump, sess)
