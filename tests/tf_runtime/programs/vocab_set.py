"""A word model whose vocabulary is numbered by a `set`'s order (`vocab = list(set(words))`,
word ids by position), as tutorials build it: each incarnation of the process must hash
strings alike (PYTHONHASHSEED) or it trains the embedding rows of other words. Each
mini-batch (word ids of sentences made from the step read) is fed from the step; Adam.
Self-contained (no sibling module), so that it runs under `python -I` as it is, launched
`python -E vocab_set.py` or `python -I vocab_set.py`."""

import argparse
import time

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "a", "small",
         "cat", "sleeps", "near", "the", "warm", "fire", "and", "an", "old", "owl", "watches", "from",
         "the", "tall", "tree"]
DIM, CLASSES = 4, 3

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--dump", default=None)
args = p.parse_args()
v1.disable_eager_execution()
tf.config.experimental.enable_op_determinism()

vocab = list(set(WORDS))
ids = {w: i for i, w in enumerate(vocab)}
gs = v1.train.get_or_create_global_step()
x = v1.placeholder(tf.int64, [None, 5])
y = v1.placeholder(tf.int64, [None])
emb = v1.get_variable("emb", initializer=np.random.RandomState(3).standard_normal(
    (len(vocab), DIM)).astype(np.float32) * 0.3)
w = v1.get_variable("w", initializer=np.random.RandomState(4).standard_normal(
    (DIM, CLASSES)).astype(np.float32) * 0.3)
logits = tf.matmul(tf.reduce_mean(tf.nn.embedding_lookup(emb, x), axis=1), w)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
train = v1.train.AdamOptimizer(0.01).minimize(loss, global_step=gs)


def batch(step):
    rng = np.random.RandomState(1000 + int(step))
    sentences = [[WORDS[i] for i in rng.randint(0, len(WORDS), 5)] for _ in range(8)]
    labels = [len(s[0]) % CLASSES for s in sentences]  # a class from the first word itself
    return np.asarray([[ids[w] for w in s] for s in sentences], np.int64), np.asarray(labels, np.int64)


config = v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
with v1.Session(config=config) as sess:
    sess.run(v1.global_variables_initializer())
    step = int(sess.run(gs))
    while step < args.steps:
        bx, by = batch(step)
        sess.run(train, {x: bx, y: by})
        step = int(sess.run(gs))
        time.sleep(args.step_sleep)
    if args.dump:
        variables = v1.global_variables()
        np.savez(args.dump, **{v.name: a for v, a in zip(variables, sess.run(variables))})
