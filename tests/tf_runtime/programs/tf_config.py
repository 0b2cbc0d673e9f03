"""A program written for a cluster and configured by TF_CONFIG, run as a one-worker cluster:
the cluster and its own task read by `TFConfigClusterResolver` from TF_CONFIG
(`{"cluster": {"worker": ["localhost:PORT"]}, "task": {"type": "worker", "index": 0}}`), a
gRPC server started for that task at its fixed address, the session on the server's target,
the chief's work (a log line) chosen by the task. Momentum; each mini-batch fed from the
global step it read."""

import json
import os
import time

import _base
import tensorflow as tf

v1 = tf.compat.v1

args = _base.parse()
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
task_type, task_id = resolver.task_type, resolver.task_id
server = v1.train.Server(resolver.cluster_spec(), job_name=task_type, task_index=task_id,
                         config=_base.config())
is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0)
with v1.device(f"/job:{task_type}/task:{task_id}"):
    gs = v1.train.get_or_create_global_step()
    x, y = _base.inputs()
    train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(_base.classifier(x, y), global_step=gs)
with v1.Session(server.target, config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        step = _base.fed_step(sess, train, gs, x, y, step)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
if is_chief:
    print(f"chief of {json.loads(os.environ['TF_CONFIG'])['cluster']}: done at step {step}", flush=True)
