"""A trainer run as a directory, `python trainapp/ --steps N` (python runs its __main__.py,
the directory first on sys.path: `import model` finds the sibling module); zipped by
`python -m zipapp trainapp` it runs the same as `python trainapp.pyz`. A plain Session loop
fed from the step read, Adagrad."""

import argparse
import time

import model

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--dump", default=None)
args = p.parse_args()
sess, gs, train, feed = model.build()
with sess:
    step = int(sess.run(gs))
    while step < args.steps:
        sess.run(train, feed(step))
        step = int(sess.run(gs))
        time.sleep(args.step_sleep)
    model.dump(sess, args.dump)
