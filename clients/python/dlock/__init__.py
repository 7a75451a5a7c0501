"""dlock: leases with fencing tokens in PostgreSQL, for Python.

    import dlock
    with dlock.lease("dbname=app", "nightly-export", ttl=30) as lease:
        with conn.transaction():
            lease.fence_write(conn)        # LF001 -> dlock.StaleFence
            conn.execute("UPDATE ...")

The lease renews itself in the background every ttl/3; once it is lost
(a renewal returned NULL, or none was confirmed before its deadline on the
monotonic clock) ``lease.lost`` is true, ``on_lost`` is called once, and
the fencing helpers raise :class:`LeaseLost`.  ``dlock.aio`` has the same
for asyncio.  See README.md.
"""
from ._core import Leader, Observation
from ._errors import (Busy, CapacityExceeded, Error, InvalidArgument, LeaseLost,
                      NotReady, NotSupported, PermissionDenied, ReadOnly,
                      StaleFence, Unavailable, map_error)
from ._sync import (Lease, acquire, campaign, leader, lease, observe,
                    one_at_a_time)

__version__ = "0.1.0"

__all__ = [
    "Lease", "lease", "acquire", "campaign", "leader", "observe", "one_at_a_time",
    "Leader", "Observation",
    "Error", "Busy", "LeaseLost", "StaleFence", "InvalidArgument", "ReadOnly",
    "NotSupported", "NotReady", "PermissionDenied", "CapacityExceeded",
    "Unavailable", "map_error",
]
