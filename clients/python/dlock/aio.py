"""The asyncio API: ``async with dlock.aio.lease(...) as lease:``.

The same leases as the sync API, run in the caller's event loop: the
renewer is a task of that loop (so the loop must keep running: a loop
blocked by synchronous code cannot renew, and the lease is then lost at
its deadline like a paused process's).  target is a conninfo string or a
``psycopg_pool.AsyncConnectionPool``.  Cancelling the task that waits in
an acquire cancels the statement in the server and gives back a lease
granted meanwhile.
"""
from __future__ import annotations

import contextlib
import functools
from typing import (Any, AsyncIterator, Awaitable, Callable, Optional,
                    TypeVar, cast)

import psycopg

from . import _core
from ._core import Leader, LeaseCore, Observation, make_link
from ._errors import Busy, map_error

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class AsyncLease:
    """A lease on a key, renewed by a task of the running loop."""

    def __init__(self, target: Any, key: str, *, ttl: float = 30.0,
                 wait: Optional[float] = 0, holder: Optional[str] = None,
                 lock_delay: Optional[float] = None, session_bound: bool = False,
                 permits: int = 1, mode: str = "exclusive",
                 renew_every: Optional[float] = None,
                 on_lost: Optional[Callable[["AsyncLease"], Any]] = None,
                 _campaign_value: Optional[str] = None) -> None:
        self._core = LeaseCore(make_link(target), key, ttl=ttl, wait=wait, holder=holder,
                               lock_delay=lock_delay, session_bound=session_bound,
                               permits=permits, mode=mode, renew_every=renew_every,
                               on_lost=on_lost, campaign_value=_campaign_value,
                               owner_object=self)
        self.key = key
        self._acquired = False

    def _c(self) -> LeaseCore:
        if self._core.owner is None:
            raise RuntimeError("the lease on %r was not acquired" % self.key)
        return self._core

    @property
    def owner(self) -> str:
        return cast(str, self._c().owner)

    @property
    def fence(self) -> int:
        return cast(int, self._c().fence)

    epoch = fence

    @property
    def expires_at(self) -> Any:
        return self._c().expires_at

    @property
    def lost(self) -> bool:
        return self._c().lost

    @property
    def lost_reason(self) -> Optional[str]:
        return self._c().lost_reason

    def remaining(self) -> float:
        return self._c().remaining()

    async def acquire(self) -> "AsyncLease":
        """Grant the lease; raise :class:`Busy` when it is not granted."""
        if self._acquired:
            raise RuntimeError("an AsyncLease object is acquired once")
        self._acquired = True
        await self._core.acquire()
        return self

    async def release(self) -> Optional[bool]:
        """As :meth:`dlock.Lease.release`."""
        return await self._core.release()

    resign = release

    async def __aenter__(self) -> "AsyncLease":
        if not self._acquired:
            await self.acquire()
        elif self._core.owner is None or self._core.released:
            raise RuntimeError("the lease on %r was released or never granted: an "
                               "AsyncLease object is acquired once, make a new one"
                               % self.key)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.release()

    async def use_fence(self, cur: Any) -> None:
        """Present the token in cur's transaction (an AsyncCursor); raises
        :class:`dlock.LeaseLost` once lost, :class:`dlock.StaleFence` on LF001."""
        core = self._c()
        core.check()
        _core.check_cursor(cur)
        try:
            await cur.execute(_core.SQL_USE_FENCE, (core.key, core.fence), prepare=False)
        except psycopg.Error as ex:
            raise map_error(ex) from None

    async def fence_write(self, conn: Any) -> None:
        """:meth:`use_fence` on a cursor of conn (an AsyncConnection)."""
        async with conn.cursor() as cur:
            await self.use_fence(cur)

    @contextlib.asynccontextmanager
    async def transaction(self, conn: Any) -> AsyncIterator[Any]:
        """``async with lease.transaction(conn) as cur:`` a fenced transaction."""
        async with conn.transaction():
            async with conn.cursor() as cur:
                await self.use_fence(cur)
                yield cur

    async def proclaim(self, value: str) -> bool:
        return await self._c().proclaim(value)


def lease(target: Any, key: str, **kw: Any) -> AsyncLease:
    """As :func:`dlock.lease`, for ``async with``."""
    return AsyncLease(target, key, **kw)


async def acquire(target: Any, key: str, **kw: Any) -> AsyncLease:
    return await AsyncLease(target, key, **kw).acquire()


def campaign(target: Any, election: str, value: str, **kw: Any) -> AsyncLease:
    """As :func:`dlock.campaign`, for ``async with``."""
    kw.setdefault("wait", None)
    return AsyncLease(target, election, _campaign_value=value, **kw)


async def leader(target: Any, election: str, timeout: float = 30.0) -> Optional[Leader]:
    link = make_link(target)
    try:
        return await _core.leader(link, election, timeout)
    finally:
        await link.close()


def observe(target: Any, key: str, after_fence: int = 0,
            poll: float = 30.0) -> AsyncIterator[Observation]:
    """As :func:`dlock.observe`, an async iterator."""
    return _core.observe(make_link(target), key, after_fence, poll)


def one_at_a_time(target: Any, key: str, *, on_busy: str = "skip",
                  pass_lease: bool = False, **kw: Any) -> Callable[[F], F]:
    """As :func:`dlock.one_at_a_time`, for coroutine functions."""
    if on_busy not in ("skip", "raise"):
        raise ValueError("on_busy must be 'skip' or 'raise'")

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                held = await acquire(target, key, **kw)
            except Busy:
                if on_busy == "skip":
                    return None
                raise
            async with held:
                if pass_lease:
                    kwargs["lease"] = held
                return await fn(*args, **kwargs)
        return cast(F, wrapper)
    return decorate


__all__ = ["AsyncLease", "lease", "acquire", "campaign", "leader", "observe",
           "one_at_a_time", "Leader", "Observation"]
