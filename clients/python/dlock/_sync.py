"""The sync API: leases, election, observe, run by a background thread.

Every sync lease of the process is served by one background thread (named
``dlock-renewer``) running an asyncio loop (dlock._core does the work
there).  The thread starts with the first lease and is stopped and joined
when the last one is released, so a program that has released its leases
has no thread of dlock's left.  The caller's thread only waits for the
loop's answers, in slices, so that KeyboardInterrupt reaches it; an
interrupted acquire is cancelled in the loop, which cancels the statement
in the server and gives back a lease granted meanwhile.
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import os
import threading
import time
import weakref
from typing import (Any, Awaitable, Callable, Dict, Iterator, List, Optional,
                    TypeVar, cast)

import psycopg

from . import _core
from ._core import Leader, LeaseCore, Observation, make_link
from ._errors import Busy, map_error

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class _Service:
    """The background thread and its loop, shared by the sync leases."""

    _lock = threading.Lock()
    _current: Optional["_Service"] = None
    _refs = 0

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.pools: Dict[int, List[Any]] = {}   # id(sync pool) -> [apool, refs, pool]
        self.thread = threading.Thread(target=self._main, name="dlock-renewer",
                                       daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @classmethod
    def enter(cls) -> "_Service":
        with cls._lock:
            if cls._current is not None and cls._current.pid != os.getpid():
                # a child of fork(): the parent's thread was not copied;
                # its leases stay the parent's (lost here), start afresh
                cls._current, cls._refs = None, 0
            if cls._current is None:
                cls._current = _Service()
            cls._refs += 1
            return cls._current

    @classmethod
    def leave(cls) -> None:
        with cls._lock:
            if cls._current is not None and cls._current.pid != os.getpid():
                return
            cls._refs -= 1
            if cls._refs > 0 or cls._current is None:
                return
            svc, cls._current = cls._current, None
            svc._stop()

    def _stop(self) -> None:
        if threading.current_thread() is self.thread:
            raise RuntimeError("dlock: do not release a lease from its on_lost callback")
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        try:
            fut.result(timeout=10)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    async def _shutdown(self) -> None:
        for apool, _refs, _pool in list(self.pools.values()):
            try:
                await apool.close(timeout=1.0)
            except Exception:
                pass
        self.pools.clear()
        current = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks() if t is not current]
        for t in rest:
            t.cancel()
        if rest:
            await asyncio.wait(rest, timeout=1.0)

    def run(self, coro: Awaitable[T], timeout: Optional[float] = None) -> T:
        """Run coro in the loop and wait for it.  If the waiting thread is
        interrupted (KeyboardInterrupt), the coroutine is cancelled and
        waited for (its cleanup: cancel the statement, give back a lease),
        then the interruption goes on."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("dlock: a sync call from the renewer thread "
                               "(an on_lost callback) would wait for itself")
        if self.pid != os.getpid():
            raise RuntimeError("dlock: this lease belongs to process %d; a child of "
                               "fork() cannot use it" % self.pid)
        done = threading.Event()

        async def wrapper() -> T:
            try:
                return await coro
            finally:
                done.set()

        fut = asyncio.run_coroutine_threadsafe(wrapper(), self.loop)
        try:
            return self._result(fut, timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            done.wait(15)
            raise
        except BaseException:
            if not fut.done():
                fut.cancel()
                # wait for the coroutine's cleanup, unless nothing runs it
                while not done.wait(1) and self.thread.is_alive():
                    pass
            raise

    def _result(self, fut: "concurrent.futures.Future[T]", timeout: Optional[float]) -> T:
        """fut's result, waiting in slices so that a renewer thread that
        died (it never should) is an error instead of a hang."""
        until = None if timeout is None else time.monotonic() + timeout
        while True:
            slice_ = 1.0 if until is None else min(1.0, max(until - time.monotonic(), 0.0))
            try:
                return fut.result(slice_)
            except concurrent.futures.TimeoutError:
                if until is not None and time.monotonic() >= until:
                    raise
                if not self.thread.is_alive():
                    raise RuntimeError("dlock: the renewer thread has ended") from None

    def link(self, target: Any) -> Any:
        """The Link for target: a conninfo, or a sync ConnectionPool (whose
        mirror AsyncConnectionPool lives in this loop)."""
        if isinstance(target, str):
            return make_link(target)
        if hasattr(target, "getconn") and hasattr(target, "max_size"):
            return self.run(self._mirror(target))
        raise TypeError("expected a conninfo string or a psycopg_pool.ConnectionPool, "
                        "got %r" % type(target).__name__)

    async def _mirror(self, pool: Any) -> Any:
        from psycopg_pool import AsyncConnectionPool
        entry = self.pools.get(id(pool))
        if entry is None or entry[2] is not pool:
            kwargs = dict(pool.kwargs)
            kwargs["autocommit"] = True
            kwargs["prepare_threshold"] = None
            apool = AsyncConnectionPool(pool.conninfo, kwargs=kwargs, min_size=0,
                                        max_size=pool.max_size,
                                        name="dlock-" + str(pool.name))
            entry = self.pools[id(pool)] = [apool, 0, pool]
        return _core.PoolLink(entry[0])


#: the sync leases acquired and not yet released, given back at exit
_live: "weakref.WeakSet[Lease]" = weakref.WeakSet()


@atexit.register
def _release_at_exit() -> None:
    """An interpreter that exits while holding leases gives them back
    (each bounded as any release) instead of leaving the keys blocked
    for their TTL."""
    for lease in list(_live):
        try:
            lease.release()
        except BaseException:  # noqa: B902 - exiting anyway
            pass


class Lease:
    """A lease on a key, renewed in the background while held.

    Use it as a context manager (``with dlock.lease(...) as lease:``), or
    call :meth:`acquire` and :meth:`release` yourself.
    """

    def __init__(self, target: Any, key: str, *, ttl: float = 30.0,
                 wait: Optional[float] = 0, holder: Optional[str] = None,
                 lock_delay: Optional[float] = None, session_bound: bool = False,
                 permits: int = 1, mode: str = "exclusive",
                 renew_every: Optional[float] = None,
                 on_lost: Optional[Callable[["Lease"], Any]] = None,
                 _campaign_value: Optional[str] = None) -> None:
        self._target = target
        self._args = dict(key=key, ttl=ttl, wait=wait, holder=holder,
                          lock_delay=lock_delay, session_bound=session_bound,
                          permits=permits, mode=mode, renew_every=renew_every,
                          on_lost=on_lost, campaign_value=_campaign_value)
        self._core: Optional[LeaseCore] = None
        self._svc: Optional[_Service] = None
        self.key = key
        _core.check_args(**self._args)  # type: ignore[arg-type]

    # ---- the lease's facts

    def _c(self) -> LeaseCore:
        if self._core is None or self._core.owner is None:
            raise RuntimeError("the lease on %r was not acquired" % self.key)
        return self._core

    @property
    def owner(self) -> str:
        """The owner token (a UUID): the capability to renew and release."""
        return cast(str, self._c().owner)

    @property
    def fence(self) -> int:
        """The fencing token (for an election: the epoch)."""
        return cast(int, self._c().fence)

    epoch = fence

    @property
    def expires_at(self) -> Any:
        """The expiry by the server's clock (last grant or renewal); for
        display only: the library judges by :meth:`remaining`."""
        return self._c().expires_at

    @property
    def lost(self) -> bool:
        """True once the lease is lost (or past its deadline)."""
        return self._c().lost

    @property
    def lost_reason(self) -> Optional[str]:
        return self._c().lost_reason

    def remaining(self) -> float:
        """Seconds the lease is known to be ours (client monotonic clock)."""
        return self._c().remaining()

    # ---- life

    def acquire(self) -> "Lease":
        """Grant the lease; raise :class:`Busy` when it is not granted."""
        if self._core is not None:
            raise RuntimeError("a Lease object is acquired once")
        svc = _Service.enter()
        try:
            link = svc.link(self._target)
            core = LeaseCore(link, owner_object=self, **self._args)  # type: ignore[arg-type]
            core.callback_in_thread = True
            self._core = core
            svc.run(core.acquire())
        except BaseException:
            self._core = None
            _Service.leave()
            raise
        self._svc = svc
        _live.add(self)
        return self

    def release(self) -> Optional[bool]:
        """Stop renewing and release (at most 5 s).  True: released; False:
        it was no longer ours; None: it could not be released (it expires
        by itself; logged)."""
        if self._svc is None or self._core is None:
            return None
        if threading.current_thread() is self._svc.thread:
            raise RuntimeError("dlock: a lease cannot be released from dlock's renewer "
                               "thread (an async on_lost callback of a sync lease)")
        if self._svc.pid != os.getpid():
            # a child of fork(): the lease is the parent's to release
            self._svc = None
            return None
        svc, self._svc = self._svc, None
        _live.discard(self)
        try:
            return svc.run(self._core.release())
        finally:
            _Service.leave()

    resign = release

    def __enter__(self) -> "Lease":
        if self._core is None:
            self.acquire()
        elif self._svc is None:
            raise RuntimeError("the lease on %r was already released: a Lease object "
                               "is acquired once, make a new one" % self.key)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        # Dropped while held: give it back rather than renew it for ever,
        # and let the renewer thread stop once no lease needs it.
        svc, core = getattr(self, "_svc", None), getattr(self, "_core", None)
        if svc is None or core is None:
            return
        self._svc = None
        _core.log.warning("dlock: the lease on %r was dropped without being released; "
                          "releasing it", self.key)
        if svc.pid != os.getpid() or not svc.thread.is_alive():
            return

        def leave(_fut: Any) -> None:
            # runs in the renewer's loop, which leave() may stop and join
            threading.Thread(target=_Service.leave, name="dlock-leave",
                             daemon=True).start()
        try:
            asyncio.run_coroutine_threadsafe(core.release(), svc.loop).add_done_callback(leave)
        except RuntimeError:
            pass

    # ---- fencing

    def use_fence(self, cur: Any) -> None:
        """Present the token in cur's transaction (``dlock.use_fence``):
        every write of that transaction to a fenced table is checked
        against this lease.  Raises :class:`LeaseLost` without touching the
        database once the lease is lost, and :class:`StaleFence` (a
        LeaseLost) when the server refuses the token (LF001)."""
        core = self._c()
        core.check()
        _core.check_cursor(cur)
        try:
            cur.execute(_core.SQL_USE_FENCE, (core.key, core.fence), prepare=False)
        except psycopg.Error as ex:
            raise map_error(ex) from None

    def fence_write(self, conn: Any) -> None:
        """:meth:`use_fence` on a cursor of conn (in its current transaction)."""
        with conn.cursor() as cur:
            self.use_fence(cur)

    @contextlib.contextmanager
    def transaction(self, conn: Any) -> Iterator[Any]:
        """``with lease.transaction(conn) as cur:`` a transaction of conn
        that has presented the token; writes through cur are fenced."""
        with conn.transaction():
            with conn.cursor() as cur:
                self.use_fence(cur)
                yield cur

    def proclaim(self, value: str) -> bool:
        """As leader, publish a new value; False when no longer leader."""
        assert self._svc is not None
        return self._svc.run(self._c().proclaim(value))


def lease(target: Any, key: str, **kw: Any) -> Lease:
    """A lease on key, granted when the ``with`` block starts (or by
    :meth:`Lease.acquire`).  target: a conninfo string or a
    ``psycopg_pool.ConnectionPool``.  Options: ttl (seconds, 30), wait
    (seconds; 0: try once, the default; None: no limit), holder,
    lock_delay, session_bound, permits, mode ('exclusive', 'shared'),
    renew_every (ttl/3), on_lost (called once, from the renewer thread,
    with the lease)."""
    return Lease(target, key, **kw)


def acquire(target: Any, key: str, **kw: Any) -> Lease:
    """:func:`lease`, acquired now; release it with :meth:`Lease.release`."""
    return Lease(target, key, **kw).acquire()


def campaign(target: Any, election: str, value: str, **kw: Any) -> Lease:
    """Campaign in election with value (``dlock.campaign``): the lease,
    granted when elected; its fence is the epoch.  wait defaults to None
    (no limit).  Resign with release (or the end of the ``with``)."""
    kw.setdefault("wait", None)
    return Lease(target, election, _campaign_value=value, **kw)


def leader(target: Any, election: str, timeout: float = 30.0) -> Optional[Leader]:
    """Who leads election, or None."""
    svc = _Service.enter()
    link = None
    try:
        link = svc.link(target)
        return svc.run(_core.leader(link, election, timeout))
    finally:
        if link is not None:
            try:
                svc.run(link.close())
            except Exception:
                pass
        _Service.leave()


def observe(target: Any, key: str, after_fence: int = 0,
            poll: float = 30.0) -> Iterator[Observation]:
    """Follow key or an election: yields its current state, then every
    change (dlock.observe's long poll, poll seconds a call).  Close the
    iterator (``with contextlib.closing(...)``, or break out of a for loop
    and let it go) to stop."""
    svc = _Service.enter()
    agen = None
    try:
        link = svc.link(target)
        agen = _core.observe(link, key, after_fence, poll)
        while True:
            try:
                item = svc.run(agen.__anext__())
            except StopAsyncIteration:
                return
            yield item
    finally:
        if agen is not None:
            try:
                svc.run(agen.aclose())
            except Exception:
                pass
        _Service.leave()


def one_at_a_time(target: Any, key: str, *, on_busy: str = "skip",
                  pass_lease: bool = False, **kw: Any) -> Callable[[F], F]:
    """Decorator: run the function only while holding the lease on key, so
    that it runs at most once at a time across all processes.  When the
    key is busy: on_busy='skip' returns None without running it,
    on_busy='raise' raises :class:`Busy`.  pass_lease=True passes the
    lease as keyword argument ``lease`` (for its fenced writes)."""
    if on_busy not in ("skip", "raise"):
        raise ValueError("on_busy must be 'skip' or 'raise'")

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                held = acquire(target, key, **kw)
            except Busy:
                if on_busy == "skip":
                    return None
                raise
            with held:
                if pass_lease:
                    kwargs["lease"] = held
                return fn(*args, **kwargs)
        return cast(F, wrapper)
    return decorate
