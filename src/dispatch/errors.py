"""Every error dispatch raises, in one tree.

The split that matters to a caller is whether to retry::

    DispatchError
    ├── Unreachable          retry later: the call failed, nothing was decided
    │   │                    (connection, timeouts, 5xx, 429, conflicts that outlasted retries)
    │   ├── Conflict         a write's precondition failed (409): the object changed since it was read
    │   └── PodsRemain       pods of the previous execution may still run; nothing was written
    └── Refused              do not retry unchanged: the request itself is wrong or not allowed
        ├── InvalidInput     bad input caught before any request was sent
        ├── ReadOnly         a write was asked of a read-only adapter
        ├── NotFound         the object (or a kind: CRD not installed) does not exist
        │   └── NotServed    the kind itself is not served (its CRD or API group is not installed)
        └── Forbidden        RBAC said no; names the verb and the resource

``PodsRemain`` is an ``Unreachable`` on purpose: the object is fine and the call will succeed once
the previous execution's pods are gone, so a supervisor retries it like any transient failure.
Every error carries the API's ``reason`` and field ``causes`` when the API server gave them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._records import RemainingPod

__all__ = [
    "Conflict",
    "DispatchError",
    "FieldCause",
    "Forbidden",
    "InvalidInput",
    "NotFound",
    "NotServed",
    "PodsRemain",
    "ReadOnly",
    "Refused",
    "Unreachable",
]


@dataclass(frozen=True)
class FieldCause:
    """One field-level cause, as the API server (or dispatch's own validation) reports it."""

    field: str
    message: str
    reason: str = ""


class DispatchError(Exception):
    """Base of every dispatch error."""

    def __init__(
        self,
        message: str,
        *,
        reason: str = "",
        code: int | None = None,
        causes: Sequence[FieldCause] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.code = code
        self.causes: tuple[FieldCause, ...] = tuple(causes)

    def __str__(self) -> str:
        if not self.causes:
            return self.message
        extra = "; ".join(f"{c.field}: {c.message}" for c in self.causes)
        return f"{self.message} ({extra})"


class Unreachable(DispatchError):
    """The call failed for a reason that may go away: retry it."""


class Conflict(Unreachable):
    """A write conditioned on a resourceVersion met a newer one (HTTP 409): read again and decide again.

    One class, so that every caller that retries on a conflict says so by catching it rather than by
    comparing status codes."""


class Refused(DispatchError):
    """The request was refused; retrying it unchanged will fail the same way."""


class InvalidInput(Refused):
    """Input failed validation before anything was sent to the cluster."""


class ReadOnly(Refused):
    """A write was asked of an adapter opened read-only; no request was sent."""


class NotFound(Refused):
    """The named object, or the kind itself (its CRD is not installed), does not exist."""


class NotServed(NotFound):
    """The API server does not serve the kind at all (its CRD or API group is not installed), as
    opposed to one object of a served kind not existing. Recognised once, where replies are mapped."""


class Forbidden(Refused):
    """The API server's authorization refused the request."""


class PodsRemain(Unreachable):
    """Pods of the object's previous execution may still run, so it was not admitted.

    Nothing was written and the hold stays in force. ``pods`` lists what remains, each as
    ``"<pod> on <node> (<node state>)"``; ``remaining`` has the same pods as records.
    """

    def __init__(self, name: str, detail: str, pods: Sequence[str] = (),
                 remaining: Sequence[RemainingPod] = ()) -> None:
        super().__init__(
            f"{name} was not admitted: the previous execution may still run; {detail}",
            reason="PodsRemain",
        )
        self.name = name
        self.detail = detail
        self.pods: tuple[str, ...] = tuple(pods) if pods else tuple(p.describe() for p in remaining)
        self.remaining: tuple[RemainingPod, ...] = tuple(remaining)
