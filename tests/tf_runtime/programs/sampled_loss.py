"""A word2vec-style skip-gram model as TF1 tutorials write it: an embedding and an output
layer trained with `tf.nn.nce_loss` (or `sampled_softmax_loss`), whose negative classes
come from a candidate sampler op with a seed, fed each mini-batch from the global step it
reads. The sampler's generator lives in its kernel, not in a variable: a restarted copy
draws other negative classes than an uninterrupted run. `--loss sampled_softmax`, `nce`;
`--sampler fixed` samples from fixed counts (FixedUnigramCandidateSampler) instead of
the log-uniform sampler."""

import time

import _base
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
VOCAB, EMB = 50, 8


def extra(p):
    p.add_argument("--loss", choices=["nce", "sampled_softmax"], default="nce")
    p.add_argument("--sampler", choices=["log_uniform", "fixed"], default="log_uniform")


args = _base.parse(extra)
gs = v1.train.get_or_create_global_step()
center = v1.placeholder(tf.int64, [None])
context = v1.placeholder(tf.int64, [None, 1])
emb = v1.get_variable("emb", initializer=np.random.RandomState(1).uniform(
    -1, 1, (VOCAB, EMB)).astype(np.float32))
out_w = v1.get_variable("out_w", initializer=np.random.RandomState(2).standard_normal(
    (VOCAB, EMB)).astype(np.float32) * 0.1)
out_b = v1.get_variable("out_b", initializer=np.zeros(VOCAB, np.float32))
embedded = tf.nn.embedding_lookup(emb, center)
if args.sampler == "fixed":
    sampled = tf.random.fixed_unigram_candidate_sampler(
        context, 1, 5, True, VOCAB, unigrams=list(range(1, VOCAB + 1)), seed=3)
else:
    sampled = tf.random.log_uniform_candidate_sampler(context, 1, 5, True, VOCAB, seed=3)
loss_fn = tf.nn.nce_loss if args.loss == "nce" else tf.nn.sampled_softmax_loss
loss = tf.reduce_mean(loss_fn(out_w, out_b, context, embedded, num_sampled=5,
                              num_classes=VOCAB, sampled_values=sampled))
train = v1.train.GradientDescentOptimizer(0.5).minimize(loss, global_step=gs)


def batch(step):
    rng = np.random.RandomState(100 + int(step))
    c = rng.randint(0, VOCAB, 16)
    return c, ((c + rng.randint(1, 3, 16)) % VOCAB).reshape(-1, 1)


with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        c, ctx = batch(step)
        sess.run(train, {center: c, context: ctx})
        step = sess.run(gs)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
