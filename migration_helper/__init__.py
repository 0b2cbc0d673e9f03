"""The Migration Helper: the daemon on every GPU server (brief §5).

It registers the server and its GPUs with the scheduler, launches job processes
under the tf_runtime shim pinned to their GPUs, pre-warms destination sessions
for migration, receives checkpoints into its ramdisk, and reports GPU samples
and process exits. ``gandiva helper`` starts it (see migration_helper.cli).
"""
