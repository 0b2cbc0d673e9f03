"""A program that exports its model every 4 steps while it trains: a SavedModel into
`<workdir>/export/<step>` (`tf.compat.v1.saved_model.Builder`, `add_meta_graph_and_variables`
with a serving signature; `--export savedmodel`), or its graph by
`tf.compat.v1.train.export_meta_graph` into `<workdir>/graph-<step>.meta` (`--export meta`).
Plain Session loop fed from the step read, Momentum."""

import os
import time

import _base
import tensorflow as tf

v1 = tf.compat.v1
args, gs, x, y = _base.start(lambda p: p.add_argument("--export", default="savedmodel",
                                                      choices=["savedmodel", "meta"]))
loss = _base.classifier(x, y)
train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=gs)
work = args.workdir or "."
with v1.Session(config=_base.config()) as sess:
    sess.run(v1.global_variables_initializer())
    step = sess.run(gs)
    while step < args.steps:
        step = _base.fed_step(sess, train, gs, x, y, step)
        if step % 4 == 0:
            if args.export == "savedmodel":
                builder = v1.saved_model.Builder(os.path.join(work, "export", str(step)))
                signature = v1.saved_model.predict_signature_def({"x": x}, {"loss": loss})
                builder.add_meta_graph_and_variables(
                    sess, ["serve"], signature_def_map={"serving_default": signature})
                builder.save()
            else:
                v1.train.export_meta_graph(os.path.join(work, f"graph-{step}.meta"))
        time.sleep(args.step_sleep)
    _base.dump(args.dump, sess)
