"""The migration protocol the scheduler, the helpers and the migration benchmark all
speak (fast_path: pre-warm, checkpoint, transfer, activate, and its fault handling),
and what else both sides must agree on (host_memory: sizes, a server's host memory,
a job's resident set).

It belongs to neither side: ``scheduler`` drives it over its helper and runtime
streams (scheduler/engine/live_migration.py), ``migration_helper`` drives it over
its in-memory control plane (local_control.py, bench.py). It imports only the
generated protos and the standard library.
"""
