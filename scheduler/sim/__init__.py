"""The trace-driven simulator: the live scheduler's policy code on a virtual clock.

`gandiva sim` (scheduler/sim/cli.py) is its command line; docs/simulator.md documents
the mechanism model and every parameter.
"""
