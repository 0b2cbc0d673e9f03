"""The program's own `tf.compat.v1.train.Saver(max_to_keep=N)` in a restored process.

A Saver keeps the list of the checkpoints it wrote in memory, and prunes the oldest of
them at each save beyond `max_to_keep`. A process restored from Gandiva's checkpoint (a
migration, a restart after a lost server) starts with an empty list, so the program's
checkpoints written before the restore were never pruned: each migration left up to N of
them in the program's directory for good (after an uninterrupted run of 20 steps saving
every 3 with N=3 the directory held steps 12, 15, 18; after a migration at 7 also 3 and 6),
and the directory's `checkpoint` state file listed only the new process's. At its first
save in a restored process, such a Saver takes up the checkpoints the directory's state
file lists under its own prefix and that the job wrote (since its first process started:
not a run's from before the job, which the uninterrupted process never prunes)
(`Saver.recover_last_checkpoints`, TensorFlow's own way), as the uninterrupted process
would hold them; it then prunes and lists them alike.
Nothing here imports TensorFlow."""

from __future__ import annotations

import logging
import os
import re
from typing import Any

log = logging.getLogger("tf_runtime")


def recover(saver: Any, save_path: str, latest_filename: str | None,
            state_of: Any, mtime_of: Any, since: float | None) -> list[str]:
    """Give `saver` (a program's Saver about to make its first save in this process) the
    checkpoints of its prefix that `save_path`'s directory state lists, that still exist
    and that were written since the job's first process started (`since`, wall-clock;
    None: not known, none taken up); returns them (in the form `save_path` has: relative
    stays relative). `state_of(directory, latest_filename)`: TensorFlow's
    `get_checkpoint_state`; `mtime_of(path)`: when the checkpoint was written, None when
    it is gone."""
    if getattr(saver, "last_checkpoints", None) or not (saver.saver_def.max_to_keep or 0) > 0:
        return []  # it knows its checkpoints already, or prunes none
    directory = os.path.dirname(save_path)
    state = state_of(directory or ".", latest_filename)
    if state is None:
        return []
    # Its own names: the prefix, or the prefix and a step (Saver.save's "-%d"). Another
    # Saver sharing the directory and state file under a longer prefix ("model.ckpt-best"
    # beside "model.ckpt") is not this one's: its checkpoints were taken up and pruned.
    own = re.compile(re.escape(os.path.basename(save_path)) + r"(-\d+)?")
    paths = []
    for listed in state.all_model_checkpoint_paths:
        name = os.path.basename(listed)
        if not own.fullmatch(name):
            continue  # another Saver's checkpoints sharing the directory
        path = os.path.join(directory, name)
        written = mtime_of(path)
        # Only the job's own: a run from before the job (the program restored it from the
        # directory it saves into, and was moved before its first save: the state file still
        # lists that run's) is never pruned by the uninterrupted run's Saver.
        if written is not None and since is not None and written >= since:
            paths.append(path)
    if paths:
        saver.recover_last_checkpoints(paths)
        log.info("the program's Saver takes up %d checkpoint(s) of %s written before the "
                 "restore, to prune them as its uninterrupted run would", len(paths), save_path)
    return paths
