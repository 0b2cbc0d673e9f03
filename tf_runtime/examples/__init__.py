"""Example TF1-style training programs shipped with tf_runtime (tests, demo, benchmarks).

Run one with `python -m tf_runtime.run $(python -c 'import tf_runtime.examples.mlp as m;
print(m.__file__)') --steps 100`, or directly as a module: `python -m tf_runtime.examples.mlp`.
"""
