"""A WGAN in the shape of the original TF1 ports: the critic updated --critic times per
generator update (--critic-early times for the first generator steps and every
--every-long steps, the number chosen in Python from the step read), each critic update
followed by a run of its own that clips the critic's weights (`p.assign(clip_by_value(p,
-c, c))`); RMSProp(5e-5) for both; the generator's run advances the global step. Noise
and "real" samples from a RandomState of (step, critic iteration)."""
import argparse
import time

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--critic", type=int, default=5)
p.add_argument("--critic-early", type=int, default=12)
p.add_argument("--early", type=int, default=3)
p.add_argument("--every-long", type=int, default=25)
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--dump", default=None)
args = p.parse_args()

tf.compat.v1.disable_eager_execution()
tf.config.experimental.enable_op_determinism()

B, Z, D = 16, 8, 6
init = tf.compat.v1.random_normal_initializer(stddev=0.1, seed=8)


def mlp(h, scope, sizes):
    with tf.compat.v1.variable_scope(scope, reuse=tf.compat.v1.AUTO_REUSE):
        for i, n in enumerate(sizes):
            w = tf.compat.v1.get_variable(f"w{i}", [h.shape[-1], n], initializer=init)
            b = tf.compat.v1.get_variable(f"b{i}", [n], initializer=tf.zeros_initializer())
            h = tf.matmul(h, w) + b
            if i < len(sizes) - 1:
                h = tf.nn.leaky_relu(h)
        return h


z = tf.compat.v1.placeholder(tf.float32, [None, Z])
real = tf.compat.v1.placeholder(tf.float32, [None, D])
fake = mlp(z, "generator", [32, D])
d_real, d_fake = mlp(real, "critic", [32, 1]), mlp(fake, "critic", [32, 1])
d_loss = tf.reduce_mean(d_fake) - tf.reduce_mean(d_real)
g_loss = -tf.reduce_mean(d_fake)
d_vars = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, "critic")
g_vars = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, "generator")
gs = tf.compat.v1.train.get_or_create_global_step()
d_optim = tf.compat.v1.train.RMSPropOptimizer(5e-5).minimize(d_loss, var_list=d_vars)
g_optim = tf.compat.v1.train.RMSPropOptimizer(5e-5).minimize(g_loss, var_list=g_vars, global_step=gs)
clip_d = [v.assign(tf.clip_by_value(v, -0.05, 0.05)) for v in d_vars]

CENTRE = np.linspace(-1, 1, D).astype(np.float32)


def batch(step, i):
    r = np.random.RandomState(step * 1000 + i)
    return {z: r.standard_normal((B, Z)).astype(np.float32),
            real: (CENTRE + 0.1 * r.standard_normal((B, D))).astype(np.float32)}


with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    gen_iter = sess.run(gs)
    while gen_iter < args.steps:
        if gen_iter < args.early or gen_iter % args.every_long == 0:
            d_iters = args.critic_early
        else:
            d_iters = args.critic
        for i in range(d_iters):
            sess.run(d_optim, batch(gen_iter, i))
            sess.run(clip_d)
        _, gl = sess.run([g_optim, g_loss], batch(gen_iter, 999))
        gen_iter = sess.run(gs)
        print(f"gen_iter {gen_iter} critic runs {d_iters} g_loss {gl:.5f}", flush=True)
        time.sleep(args.step_sleep)
    if args.dump:
        vs = tf.compat.v1.global_variables()
        np.savez(args.dump, **{v.name: a for v, a in zip(vs, sess.run(vs))})
