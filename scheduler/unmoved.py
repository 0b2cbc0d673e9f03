"""A move (migration, grow, shrink) that did not move its job, as its ``job.migration`` event
begins: the one list the live engine writes and the observers read (problems, sharing, the
demo). It imports nothing: the demo's client reads it without the scheduler's modules.

The event begins with the phase the move ended in, then a space (`\\b` took an event that
begins with a server's name as well: "failed-over-2's helper moved ..."): one of
``ENDED_UNMOVED``, or ``NOT_STARTED`` for a move refused before it began
(``LiveEngine._policy_move``)."""

from __future__ import annotations

# The phases a migration ends in without moving its job (migrations.phase; the event's first
# word): said otherwise when the job ended first ("... before it moved: nothing to move").
ENDED_UNMOVED = frozenset(("aborted", "failed", "restarted_at_source"))
# A move refused before it began (its runtime gone, found not migratable).
NOT_STARTED = "not started"
# How a failed move's job goes back to the queue (its state change's reason begins so; the
# move's own event says `failed`): the decision log read back after a restart says `failed`
# of it, as live (scheduler/observe/history.py; before session 53 "not kept: queued").
FAILED_REQUEUE = "migration failed, re-placing: "


def unmoved_end(message: str) -> str | None:
    """How the move a ``job.migration`` event's ``message`` tells of ended without moving its
    job (a phase of ENDED_UNMOVED, or NOT_STARTED), or None: it moved, or is still moving."""
    word, space, _ = message.partition(" ")
    if space and word in ENDED_UNMOVED:
        return word
    return NOT_STARTED if message.startswith(NOT_STARTED + " ") else None
