"""Knowledge distillation with the teacher and the student in two graphs, each in a session
of its own, both open for the whole run. Each step the teacher's logits on the mini-batch
(fed from the global step the student's session read) are fetched from the teacher's session
and fed to the student's training run as soft targets (temperature 2) beside the labels.

`--teacher frozen`: the teacher only infers (its weights a fixed "pre-trained" draw).
`--teacher pretrain`: the teacher trained first for `--teacher-steps` steps in a session it
then closes (its graph's global step), then used for inference only.
`--teacher online`: co-distillation, the teacher is trained too, in its own session, by a
run of its own right before the student's (Adam, its own step counter).
`--order teacher-first|student-first`: which session is created and initialised first.
`--teacher-step own|global`: the online teacher counts its steps in a variable of its own, or
in its graph's global step (its code copied from a training script)."""

import os
import time

import _base
import numpy as np
import tensorflow as tf


def extra(p):
    p.add_argument("--teacher", choices=["frozen", "online", "pretrain"], default="online")
    p.add_argument("--teacher-steps", type=int, default=10)
    p.add_argument("--order", choices=["teacher-first", "student-first"], default="student-first")
    p.add_argument("--teacher-step", choices=["own", "global"], default="own",
                   help="the online teacher's step counter: a variable of its own, or its "
                        "graph's global step (the training script it was copied from)")


args = _base.parse(extra)
T = 2.0

teacher_graph = tf.Graph()
with teacher_graph.as_default():
    tx, ty = _base.inputs()
    with tf.compat.v1.variable_scope("teacher"):
        w1 = tf.compat.v1.get_variable("w1", initializer=np.random.RandomState(5).standard_normal(
            (_base.DIM, 16)).astype(np.float32) * 0.4)
        w2 = tf.compat.v1.get_variable("w2", initializer=np.random.RandomState(6).standard_normal(
            (16, _base.CLASSES)).astype(np.float32) * 0.4)
        t_logits = tf.matmul(tf.nn.relu(tf.matmul(tx, w1)), w2)
        t_loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=ty, logits=t_logits))
    if args.teacher_step == "global":
        t_steps = tf.compat.v1.train.get_or_create_global_step()
    with tf.compat.v1.variable_scope("teacher"):
        if args.teacher_step == "own":
            t_steps = tf.Variable(0, trainable=False, name="steps", dtype=tf.int64)
        t_train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(t_loss, global_step=t_steps)
    t_init = tf.compat.v1.global_variables_initializer()

student_graph = tf.Graph()
with student_graph.as_default():
    gs = tf.compat.v1.train.get_or_create_global_step()
    x, y = _base.inputs()
    soft = tf.compat.v1.placeholder(tf.float32, [None, _base.CLASSES])
    with tf.compat.v1.variable_scope("student"):
        w = tf.compat.v1.get_variable("w", initializer=np.random.RandomState(3).standard_normal(
            (_base.DIM, _base.CLASSES)).astype(np.float32) * 0.3)
        logits = tf.matmul(x, w)
    hard = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    distil = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
        labels=tf.nn.softmax(soft / T), logits=logits / T)) * T * T
    loss = 0.5 * hard + 0.5 * distil
    train = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
    init = tf.compat.v1.global_variables_initializer()


def open_teacher():
    sess = tf.compat.v1.Session(graph=teacher_graph, config=_base.config())
    sess.run(t_init)
    return sess


def open_student():
    sess = tf.compat.v1.Session(graph=student_graph, config=_base.config())
    sess.run(init)
    return sess


if args.teacher == "pretrain":
    # The classic recipe in one script: train the teacher first (a training script of its
    # own: its graph's global step), close its session, then the student on its targets.
    with teacher_graph.as_default():
        t_gs = tf.compat.v1.train.get_or_create_global_step()
        t_pre = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(t_loss, global_step=t_gs)
        t_init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=teacher_graph, config=_base.config()) as pre:
        pre.run(t_init)
        t_step = pre.run(t_gs)
        while t_step < args.teacher_steps:
            bx, by = _base.batch(10**5 + t_step)
            pre.run(t_pre, {tx: bx, ty: by})
            t_step = pre.run(t_gs)
            time.sleep(args.step_sleep)
        # The trained teacher goes on as inference in a session of its own.
        trained = {v: pre.run(v) for v in (w1, w2)}
    teacher = tf.compat.v1.Session(graph=teacher_graph, config=_base.config())
    for v, value in trained.items():
        v.load(value, teacher)
    student = open_student()
elif args.order == "teacher-first":
    teacher = open_teacher()
    student = open_student()
else:
    student = open_student()
    teacher = open_teacher()

step = student.run(gs)
while step < args.steps:
    bx, by = _base.batch(step)
    if args.teacher == "online":
        teacher.run(t_train, {tx: bx, ty: by})
    targets = teacher.run(t_logits, {tx: bx})
    student.run(train, {x: bx, y: by, soft: targets})
    step = student.run(gs)
    time.sleep(args.step_sleep)

if args.dump:
    values = {}
    for name, graph, sess in (("student", student_graph, student), ("teacher", teacher_graph, teacher)):
        variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        if sess is teacher and args.teacher == "pretrain":
            variables = [w1, w2]  # all the inference session holds
        values.update({f"{name}:{v.name}": a for v, a in zip(variables, sess.run(variables))})
    np.savez(args.dump + ".tmp.npz", **values)
    os.replace(args.dump + ".tmp.npz", args.dump)
teacher.close()
student.close()
