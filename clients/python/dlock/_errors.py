"""Typed errors of the dlock client, and the SQLSTATE mapping.

The library never parses messages: a server error is mapped by its
SQLSTATE alone (docs/reference.md, "Errors"); a code dlock does not
document passes through as psycopg's own error.
"""
from __future__ import annotations

from typing import Optional

import psycopg


class Error(Exception):
    """Base class of every error raised by dlock itself."""

    #: the SQLSTATE of the server error this came from, if any
    sqlstate: Optional[str] = None


class Busy(Error):
    """The lease was not granted: the key is held (``try_acquire`` returned
    no row) or the wait ran out (``55P03`` lock_not_available)."""


class LeaseLost(Error):
    """The lease is lost: a renewal returned NULL, no renewal was confirmed
    before the deadline, or the server refused a fenced write (``LF001``).
    Stop working on the key; acquire again and redo the work."""


class StaleFence(LeaseLost):
    """The server refused the token (SQLSTATE ``LF001``): a newer lease
    exists, or this one ended.  A kind of :class:`LeaseLost`."""


class InvalidArgument(Error, ValueError):
    """An argument was refused: by the server (``22023``, ``22004``), or
    by the library before anything was sent (a NaN or infinite duration, a
    NUL in a text)."""


class ReadOnly(Error):
    """Grant, renew or release on a standby or in a read-only transaction
    (``25006``)."""


class NotSupported(Error):
    """``0A000``: e.g. ``observe`` with a wait on a standby."""


class NotReady(Error):
    """``55000`` object_not_in_prerequisite_state."""


class PermissionDenied(Error):
    """``42501`` insufficient_privilege."""


class CapacityExceeded(Error):
    """Memory mode is full (``53200``, ``53400``)."""


class Unavailable(Error):
    """The server could not be reached, or did not answer in time."""


_BY_SQLSTATE = {
    "LF001": StaleFence,
    "55P03": Busy,
    "22023": InvalidArgument,
    "22004": InvalidArgument,
    "25006": ReadOnly,
    "0A000": NotSupported,
    "55000": NotReady,
    "42501": PermissionDenied,
    "53200": CapacityExceeded,
    "53400": CapacityExceeded,
}


def map_error(exc: BaseException) -> BaseException:
    """The typed error for a psycopg error with a documented dlock
    SQLSTATE (its cause set to the original), or the error itself."""
    state = getattr(exc, "sqlstate", None)
    cls = _BY_SQLSTATE.get(state or "")
    if cls is None or not isinstance(exc, psycopg.Error):
        return exc
    new = cls(str(exc).strip())
    new.sqlstate = state
    new.__cause__ = exc
    return new
