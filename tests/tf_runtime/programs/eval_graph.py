"""Training and evaluation in two graphs with two sessions, the evaluation session created
and initialised first: every few steps the program saves its own checkpoint from the
training session and restores it into the evaluation graph (the model alone, under an
`eval` name scope for its inputs, no global step, no optimizer) to compute a held-out
loss. RMSProp; each mini-batch fed from the global step it read."""

import os
import time

import _base
import tensorflow as tf


def extra(p):
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--eval-counter", action="store_true",
                   help="the evaluation graph counts its evaluations in a variable of its own")


args = _base.parse(extra)
workdir = args.workdir or "."
own = os.path.join(workdir, "own", "model")
os.makedirs(os.path.dirname(own), exist_ok=True)

eval_graph = tf.Graph()
with eval_graph.as_default():
    with tf.name_scope("eval"):
        ex, ey = _base.inputs()
    eval_loss = _base.classifier(ex, ey)
    eval_saver = tf.compat.v1.train.Saver(tf.compat.v1.trainable_variables())
    if args.eval_counter:
        evals = tf.Variable(0, name="evaluations", trainable=False)
        with tf.control_dependencies([eval_loss]):
            eval_loss = tf.identity(eval_loss)
        count = evals.assign_add(1)
    eval_init = tf.compat.v1.global_variables_initializer()
eval_sess = tf.compat.v1.Session(graph=eval_graph, config=_base.config())
eval_sess.run(eval_init)

train_graph = tf.Graph()
with train_graph.as_default():
    gs = tf.compat.v1.train.get_or_create_global_step()
    x, y = _base.inputs()
    loss = _base.classifier(x, y)
    train = tf.compat.v1.train.RMSPropOptimizer(0.02).minimize(loss, global_step=gs)
    saver = tf.compat.v1.train.Saver(tf.compat.v1.trainable_variables(), max_to_keep=2)
    init = tf.compat.v1.global_variables_initializer()
held_x, held_y = _base.batch(10**6, 32)
with tf.compat.v1.Session(graph=train_graph, config=_base.config()) as sess:
    sess.run(init)
    step = sess.run(gs)
    while step < args.steps:
        step = _base.fed_step(sess, train, gs, x, y, step)
        if step % args.eval_every == 0:
            path = saver.save(sess, own, global_step=step)
            eval_saver.restore(eval_sess, path)
            print(f"step {step} held-out loss "
                  f"{eval_sess.run(eval_loss, {ex: held_x, ey: held_y}):.4f}", flush=True)
            if args.eval_counter:
                print(f"evaluation {eval_sess.run(count)}", flush=True)
        time.sleep(args.step_sleep)
    with train_graph.as_default():
        _base.dump(args.dump, sess)
eval_sess.close()
