"""A program written for distributed TensorFlow, run as one process: `--mode local`, a session
on an in-process gRPC server (`tf.compat.v1.train.Server.create_local_server()`); `--mode ps`,
a parameter server and a worker as two servers of one cluster in this process, the variables
placed on the parameter server by `replica_device_setter`. Adam; each mini-batch fed from the
global step it read."""

import socket
import time

import _base
import tensorflow as tf

v1 = tf.compat.v1


def extra(p):
    p.add_argument("--mode", choices=["local", "ps"], default="ps")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


args = _base.parse(extra)
if args.mode == "local":
    server = v1.train.Server.create_local_server(config=_base.config())
    setter = None
else:
    cluster = v1.train.ClusterSpec({"ps": [f"127.0.0.1:{free_port()}"],
                                    "worker": [f"127.0.0.1:{free_port()}"]})
    ps = v1.train.Server(cluster, job_name="ps", task_index=0, config=_base.config())
    server = v1.train.Server(cluster, job_name="worker", task_index=0, config=_base.config())
    setter = v1.train.replica_device_setter(worker_device="/job:worker/task:0", cluster=cluster)
with v1.device(setter):
    gs = v1.train.get_or_create_global_step()
    x, y = _base.inputs()
    loss = _base.classifier(x, y)
    train = v1.train.AdamOptimizer(0.05).minimize(loss, global_step=gs)
with v1.Session(server.target, config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        step = _base.fed_step(sess, train, gs, x, y, step)
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
print(f"done at step {step}", flush=True)
