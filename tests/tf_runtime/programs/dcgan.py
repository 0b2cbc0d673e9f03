"""A DCGAN in the style of carpedm20/DCGAN-tensorflow without tf.layers: conv2d and
conv2d_transpose by hand (tf.nn), batch normalisation by hand on the batch's moments,
leaky ReLU; two Adam(2e-4, beta1=0.5) optimizers over the discriminator's and the
generator's variables (var_list by scope). Each step runs d_optim once, then g_optim
twice ("to make sure that d_loss does not go to zero"), each call on its own line.
--advance g: g_optim carries global_step= (the step advances twice a step);
--advance d: d_optim carries it (once a step, before the two generator runs).
--g-form loop: the two generator runs from one line (`for _ in range(2): sess.run(g_optim)`).
Noise and "real" images from a RandomState of the step read."""
import argparse
import time

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--dump", default=None)
p.add_argument("--advance", choices=["g", "d"], default="g")
p.add_argument("--g-form", choices=["lines", "loop"], default="lines")
args = p.parse_args()

tf.compat.v1.disable_eager_execution()
tf.config.experimental.enable_op_determinism()
tf.compat.v1.set_random_seed(3)

B, Z, S, C = 8, 16, 8, 1  # batch, noise, image side, channels
init = tf.compat.v1.truncated_normal_initializer(stddev=0.02, seed=5)


def lrelu(x):
    return tf.maximum(x, 0.2 * x)


def batch_norm(x, name):
    with tf.compat.v1.variable_scope(name):
        ch = x.shape[-1]
        beta = tf.compat.v1.get_variable("beta", [ch], initializer=tf.zeros_initializer())
        gamma = tf.compat.v1.get_variable("gamma", [ch], initializer=tf.ones_initializer())
        mean, var = tf.nn.moments(x, list(range(len(x.shape) - 1)))
        return tf.nn.batch_normalization(x, mean, var, beta, gamma, 1e-5)


def conv2d(x, out, name):
    with tf.compat.v1.variable_scope(name):
        w = tf.compat.v1.get_variable("w", [5, 5, x.shape[-1], out], initializer=init)
        b = tf.compat.v1.get_variable("b", [out], initializer=tf.zeros_initializer())
        return tf.nn.conv2d(x, w, strides=[1, 2, 2, 1], padding="SAME") + b


def deconv2d(x, shape, name):
    with tf.compat.v1.variable_scope(name):
        w = tf.compat.v1.get_variable("w", [5, 5, shape[-1], x.shape[-1]], initializer=init)
        b = tf.compat.v1.get_variable("b", [shape[-1]], initializer=tf.zeros_initializer())
        return tf.nn.conv2d_transpose(x, w, output_shape=shape, strides=[1, 2, 2, 1]) + b


def linear(x, out, name):
    with tf.compat.v1.variable_scope(name):
        w = tf.compat.v1.get_variable("Matrix", [x.shape[-1], out], initializer=init)
        b = tf.compat.v1.get_variable("bias", [out], initializer=tf.zeros_initializer())
        return tf.matmul(x, w) + b


def generator(z):
    with tf.compat.v1.variable_scope("generator"):
        h0 = tf.nn.relu(batch_norm(tf.reshape(linear(z, 2 * 2 * 32, "g_h0_lin"), [B, 2, 2, 32]), "g_bn0"))
        h1 = tf.nn.relu(batch_norm(deconv2d(h0, [B, 4, 4, 16], "g_h1"), "g_bn1"))
        return tf.nn.tanh(deconv2d(h1, [B, S, S, C], "g_h2"))


def discriminator(image, reuse=False):
    with tf.compat.v1.variable_scope("discriminator", reuse=reuse):
        h0 = lrelu(conv2d(image, 8, "d_h0_conv"))
        h1 = lrelu(batch_norm(conv2d(h0, 16, "d_h1_conv"), "d_bn1"))
        logits = linear(tf.reshape(h1, [B, -1]), 1, "d_h2_lin")
        return tf.nn.sigmoid(logits), logits


def xent(logits, ones):
    labels = tf.ones_like(logits) if ones else tf.zeros_like(logits)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(logits=logits, labels=labels))


inputs = tf.compat.v1.placeholder(tf.float32, [B, S, S, C], name="real_images")
z = tf.compat.v1.placeholder(tf.float32, [B, Z], name="z")
G = generator(z)
D, D_logits = discriminator(inputs)
D_, D_logits_ = discriminator(G, reuse=True)
d_loss = xent(D_logits, True) + xent(D_logits_, False)
g_loss = xent(D_logits_, True)
t_vars = tf.compat.v1.trainable_variables()
d_vars = [v for v in t_vars if "discriminator" in v.name]
g_vars = [v for v in t_vars if "generator" in v.name]
global_step = tf.compat.v1.train.get_or_create_global_step()
d_optim = tf.compat.v1.train.AdamOptimizer(2e-4, beta1=0.5).minimize(
    d_loss, var_list=d_vars, global_step=global_step if args.advance == "d" else None)
g_optim = tf.compat.v1.train.AdamOptimizer(2e-4, beta1=0.5).minimize(
    g_loss, var_list=g_vars, global_step=global_step if args.advance == "g" else None)


def data(step):
    rng = np.random.RandomState(step)
    batch_z = rng.uniform(-1, 1, [B, Z]).astype(np.float32)
    xs = np.linspace(-1, 1, S, dtype=np.float32)
    phase = rng.uniform(0, 3, size=(B, 1, 1, 1)).astype(np.float32)
    images = np.sin(3 * xs[None, :, None, None] + phase) * np.cos(3 * xs[None, None, :, None])
    return images.astype(np.float32), batch_z


with tf.compat.v1.Session() as sess:
    tf.compat.v1.global_variables_initializer().run()
    counter = sess.run(global_step)
    while counter < args.steps:
        batch_images, batch_z = data(counter)
        # Update D network
        sess.run([d_optim], feed_dict={inputs: batch_images, z: batch_z})
        if args.g_form == "loop":
            for _ in range(2):  # Update G network twice, from one line
                sess.run([g_optim], feed_dict={z: batch_z, inputs: batch_images})
        else:
            # Update G network
            sess.run([g_optim], feed_dict={z: batch_z, inputs: batch_images})
            # Run g_optim twice to make sure that d_loss does not go to zero (different from paper)
            sess.run([g_optim], feed_dict={z: batch_z, inputs: batch_images})
        errD, errG = sess.run([d_loss, g_loss], {inputs: batch_images, z: batch_z})
        counter = sess.run(global_step)
        print(f"step {counter} d_loss {errD:.6f} g_loss {errG:.6f}", flush=True)
        time.sleep(args.step_sleep)
    if args.dump:
        vs = tf.compat.v1.global_variables()
        np.savez(args.dump, **{v.name: x for v, x in zip(vs, sess.run(vs))})
