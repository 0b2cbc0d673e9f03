"""Domain errors. Expected outcomes of a request that users must hear about;
the API layer maps each to one gRPC status code."""

from __future__ import annotations


class GandivaError(Exception):
    """Base of every error the API turns into a status code."""


class InvalidArgument(GandivaError):
    """A request field has a bad value; `field` names it (e.g. ``spec.gpus``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFound(GandivaError):
    def __init__(self, kind: str, ident: str) -> None:
        super().__init__(f"{kind} {ident!r} not found")
        self.kind = kind
        self.ident = ident


class FailedPrecondition(GandivaError):
    """The request is valid but the object is in the wrong state for it."""


class Busy(FailedPrecondition):
    """The job has another command in progress (a periodic checkpoint, another caller's
    action): worth asking again shortly. Sent with trailing metadata BUSY_METADATA, which
    clients check instead of the message's wording."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} has a command in progress; try again shortly")
        self.job_id = job_id


# The trailing metadata of a Busy refusal: (key, value). Machine-readable, so that a
# client's retry does not depend on the message's English (scheduler/cli/client.is_busy).
BUSY_METADATA = ("gandiva-refusal", "busy")


class AlreadyExists(GandivaError):
    """A request id the caller used before, for a different request."""


class Unavailable(GandivaError):
    """Infrastructure the scheduler depends on (the database) cannot be reached."""


class ResourceExhausted(GandivaError):
    """The caller holds too much of something bounded (open event watches)."""


class Unauthenticated(GandivaError):
    """No credential, or one the scheduler does not accept."""


class PermissionDenied(GandivaError):
    """A valid credential that may not do this."""
