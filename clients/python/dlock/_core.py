"""The asyncio core shared by the sync and the async API.

Everything that talks to the server runs here, in an asyncio loop: the
grant, the renewals, the release, the long polls.  The sync API runs
this code in a background thread of its own (dlock._sync), the async API
in the caller's loop (dlock.aio).

The deadline rule is the CLI's (client/run.c): a grant or renewal that
the server confirms holds for min(ttl, remaining) from when its request
was *sent*, on time.monotonic(); remaining is the server's own expiry
minus its own clock, read in the same statement, never compared with our
clock.  If no renewal is confirmed by then, whatever the reason, the lease
is lost.  Every connection attempt and every statement gets a timeout
well under the time left (asyncio.wait_for); on timeout the connection is
dropped, so a socket that hangs forever cannot keep us past the deadline.
The loss itself is decided by the clock, not by a call returning.
"""
from __future__ import annotations

import asyncio
import datetime
import getpass
import inspect
import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass
import weakref
from typing import (Any, AsyncIterator, Callable, List, Optional, Sequence,
                    Tuple, Union, cast)

import psycopg

from ._errors import Busy, InvalidArgument, LeaseLost, Unavailable, map_error

log = logging.getLogger("dlock")

now = time.monotonic

# remaining: the lease's expiry minus the server's clock, in ms, read in
# the statement that granted or renewed it (client/main.c, REMAINING_MS)
def _remaining(col: str) -> str:
    # rounded down: a deadline rounded up could fall after the server's expiry
    return ("pg_catalog.floor(pg_catalog.date_part('epoch', " + col + " OPERATOR(pg_catalog.-) "
            "pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8")


# Timestamps come back as numeric seconds since the epoch (EXTRACT gives
# numeric): psycopg parses a timestamptz's text only in DateStyle ISO, and a
# role or database may set another; numeric's text no setting changes.
def _epoch(col: str) -> str:
    return "EXTRACT(EPOCH FROM " + col + ")"


_LEASE_COLUMNS = ("SELECT l.key, l.owner::pg_catalog.text, l.fence, "
                  + _epoch("l.expires_at") + ", " + _remaining("l.expires_at"))

SQL_TRY_ACQUIRE = (
    _LEASE_COLUMNS + " FROM dlock.try_acquire(%s, %s::pg_catalog.interval, "
    "holder => %s, lock_delay => %s::pg_catalog.interval, "
    "session_bound => %s::pg_catalog.bool, permits => %s::pg_catalog.int4, "
    "mode => %s) AS l")
SQL_ACQUIRE = (
    _LEASE_COLUMNS + " FROM dlock.acquire(%s, %s::pg_catalog.interval, "
    "wait => %s::pg_catalog.interval, "
    "holder => %s, lock_delay => %s::pg_catalog.interval, "
    "session_bound => %s::pg_catalog.bool, permits => %s::pg_catalog.int4, "
    "mode => %s) AS l")
SQL_CAMPAIGN = (
    _LEASE_COLUMNS + " FROM dlock.campaign(%s, %s, %s::pg_catalog.interval, "
    "wait => %s::pg_catalog.interval, holder => %s, "
    "lock_delay => %s::pg_catalog.interval, "
    "session_bound => %s::pg_catalog.bool) AS l")
SQL_RENEW = ("SELECT " + _epoch("e") + ", " + _remaining("e") +
             " FROM dlock.renew(%s, %s::pg_catalog.uuid, %s::pg_catalog.interval) AS e")
SQL_RELEASE = "SELECT dlock.release(%s, %s::pg_catalog.uuid)"
SQL_PROCLAIM = "SELECT dlock.proclaim(%s, %s::pg_catalog.uuid, %s)"
SQL_USE_FENCE = "SELECT dlock.use_fence(%s, %s::pg_catalog.int8)"
SQL_LEADER = ("SELECT l.value, l.fence, " + _epoch("l.since") + ", "
              + _epoch("l.expires_at") + " "
              "FROM dlock.leader(%s) AS l")
SQL_OBSERVE = ("SELECT o.fence, o.holder, o.value, o.state, " + _epoch("o.expires_at")
               + ", " + _epoch("o.since") + " "
               "FROM dlock.observe(%s, %s::pg_catalog.int8, %s::pg_catalog.interval, "
               "%s, %s::pg_catalog.bool) AS o")

#: how long making the connection for a grant may take
CONNECT_LIMIT = 10.0
#: how long a release may take (the CLI's figure)
RELEASE_LIMIT = 5.0
#: how long the release of a lease already lost by our clock may take
LOST_RELEASE_LIMIT = 0.4
#: how long a cancelled grant waits for the server's answer before giving up
CANCEL_LIMIT = 5.0
#: margin on top of an observe call's own wait
OBSERVE_SLACK = 10.0


def _ts(epoch: Any) -> Optional[datetime.datetime]:
    """A timestamp read as seconds since the epoch (see _epoch), in UTC."""
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(float(epoch), datetime.timezone.utc)


def _check_seconds(name: str, value: Optional[float], *, positive: bool) -> None:
    """A duration argument: a finite number of seconds (NaN and infinities
    would make the deadline arithmetic meaningless)."""
    if value is None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not math.isfinite(value):
        raise InvalidArgument("%s must be a finite number of seconds, not %r" % (name, value))
    if value < 0 or (positive and value == 0):
        raise InvalidArgument("%s must be %s, not %r"
                              % (name, "positive" if positive else "zero or more", value))


def _check_text(name: str, value: Optional[str]) -> None:
    """PostgreSQL text cannot hold NUL: refuse it here, typed."""
    if value is not None and "\x00" in value:
        raise InvalidArgument("%s must not contain a NUL character" % name)


def check_args(*, key: str, ttl: float, wait: Optional[float] = None,
               holder: Optional[str] = None, lock_delay: Optional[float] = None,
               renew_every: Optional[float] = None,
               campaign_value: Optional[str] = None, **_: Any) -> None:
    """The checks the library makes before anything is sent."""
    _check_seconds("ttl", ttl, positive=True)
    _check_seconds("wait", wait, positive=False)
    _check_seconds("lock_delay", lock_delay, positive=False)
    _check_seconds("renew_every", renew_every, positive=True)
    if renew_every is not None and renew_every >= ttl:
        raise InvalidArgument("renew_every must be below the ttl (%r >= %r)"
                              % (renew_every, ttl))
    _check_text("key", key)
    _check_text("holder", holder)
    _check_text("value", campaign_value)


def _ms(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=round(seconds * 1000))


def default_holder() -> str:
    """user@host:pid, as the CLI labels its leases."""
    try:
        user = getpass.getuser()
    except Exception:
        user = "?"
    return "%s@%s:%d" % (user, socket.gethostname(), os.getpid())


def _kill_socket(conn: Any) -> None:
    """Shut the connection's socket down under psycopg's feet: a call
    blocked on it (even on a blackholed network) wakes at once with an
    error.  Purely local, never blocks."""
    try:
        fd = conn.pgconn.socket
        s = socket.socket(fileno=os.dup(fd))
        try:
            s.shutdown(socket.SHUT_RDWR)
        finally:
            s.close()
    except Exception:
        pass


async def _close(conn: Any) -> None:
    """Close a connection without waiting for the server."""
    try:
        _kill_socket(conn)
        await conn.close()
    except Exception:
        pass


async def fetch(conn: Any, sql: str, params: Sequence[Any]) -> List[Tuple[Any, ...]]:
    """One statement, never prepared (PgBouncer in transaction mode), its
    rows; committed if the connection is not in autocommit."""
    cur = conn.cursor()
    await cur.execute(sql, params, prepare=False)
    rows = await cur.fetchall() if cur.description is not None else []
    if not conn.autocommit:
        await conn.commit()
    return rows


class Link:
    """Where statements go: a connection of the lease's own (a conninfo),
    or a borrowed one (an AsyncConnectionPool)."""

    session_capable = False

    async def run(self, sql: str, params: Sequence[Any], timeout: Optional[float],
                  drop_on_timeout: bool = True) -> List[Tuple[Any, ...]]:
        raise NotImplementedError

    async def grant(self, sql: str, params: Sequence[Any],
                    timeout: Optional[float]) -> List[Tuple[Any, ...]]:
        raise NotImplementedError

    async def close(self) -> None:
        pass


class OwnLink(Link):
    """A connection of the lease's own, made from a conninfo, kept across
    statements and made again when it fails.  A session-bound lease lives
    on it."""

    session_capable = True

    def __init__(self, conninfo: str, kwargs: Optional[dict] = None) -> None:
        self.conninfo = conninfo
        self.kwargs = dict(kwargs or {})
        self.kwargs.setdefault("application_name", "dlock-python")
        self.conn: Optional[psycopg.AsyncConnection] = None
        self.generation = 0     # connections made so far (session_bound)

    async def _connect(self) -> psycopg.AsyncConnection:
        if self.conn is not None and not self.conn.closed and not self.conn.broken:
            return self.conn
        await self.drop()
        self.conn = await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, prepare_threshold=None, **self.kwargs)
        self.generation += 1
        return self.conn

    async def _run(self, sql: str, params: Sequence[Any]) -> List[Tuple[Any, ...]]:
        conn = await self._connect()
        try:
            return await fetch(conn, sql, params)
        except psycopg.OperationalError:
            if conn.broken or conn.closed:
                await self.drop()
            raise

    async def run(self, sql: str, params: Sequence[Any], timeout: Optional[float],
                  drop_on_timeout: bool = True) -> List[Tuple[Any, ...]]:
        try:
            return await asyncio.wait_for(self._run(sql, params), timeout)
        except asyncio.TimeoutError:
            if drop_on_timeout:
                await self.drop()
            raise Unavailable("no answer from the server within %.3f s" % (timeout or 0))

    async def grant(self, sql: str, params: Sequence[Any],
                    timeout: Optional[float]) -> List[Tuple[Any, ...]]:
        # The connection is made before the request is sent, so its time is
        # not the lease's: give it CONNECT_LIMIT (or the grant's own limit
        # when that is longer), so that a tiny TTL is not a connect timeout.
        limit = CONNECT_LIMIT if timeout is None else max(timeout, CONNECT_LIMIT)
        try:
            conn = await asyncio.wait_for(self._connect(), limit)
        except asyncio.TimeoutError:
            await self.drop()
            raise Unavailable("could not connect within %.3f s" % limit) from None
        return await _cancellable_grant(conn, sql, params, timeout, self.drop)

    async def drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            await _close(conn)

    async def close(self) -> None:
        await self.drop()


class PoolLink(Link):
    """Statements over connections borrowed from an AsyncConnectionPool,
    one statement per borrow (so leases share the pool's connections)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    async def _run(self, sql: str, params: Sequence[Any],
                   state: Optional[List[bool]] = None) -> List[Tuple[Any, ...]]:
        async with self.pool.connection() as conn:
            if state is not None:
                state.append(True)      # a connection was had
            try:
                return await fetch(conn, sql, params)
            except BaseException:
                # a connection cut off mid-statement is not given back
                # for reuse
                if conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
                    _kill_socket(conn)
                raise

    async def run(self, sql: str, params: Sequence[Any], timeout: Optional[float],
                  drop_on_timeout: bool = True) -> List[Tuple[Any, ...]]:
        state: List[bool] = []
        try:
            return await asyncio.wait_for(self._run(sql, params, state), timeout)
        except asyncio.TimeoutError:
            if not state:
                raise Unavailable("no connection from the pool within %.3f s (renewals "
                                  "share the pool's max_size with everything else it "
                                  "serves)" % (timeout or 0)) from None
            raise Unavailable("no answer from the server within %.3f s" % (timeout or 0))

    async def grant(self, sql: str, params: Sequence[Any],
                    timeout: Optional[float]) -> List[Tuple[Any, ...]]:
        async with self.pool.connection() as conn:
            async def drop() -> None:
                _kill_socket(conn)
            return await _cancellable_grant(conn, sql, params, timeout, drop)


async def _cancellable_grant(conn: Any, sql: str, params: Sequence[Any],
                             timeout: Optional[float],
                             drop: Callable[[], Any]) -> List[Tuple[Any, ...]]:
    """Run a grant that may wait, bounded by timeout.  If the caller is
    cancelled meanwhile, cancel the statement in the server and give back
    a lease that was granted anyway (the CLI does the same), so that a
    cancelled acquire leaves nothing behind."""
    inner = asyncio.ensure_future(fetch(conn, sql, params))
    try:
        return await asyncio.wait_for(asyncio.shield(inner), timeout)
    except asyncio.TimeoutError:
        await drop()
        await asyncio.wait([inner], timeout=0.5)
        raise Unavailable("no answer from the server within %.3f s" % (timeout or 0))
    except asyncio.CancelledError:
        await _give_back(conn, inner, drop)
        raise


async def _give_back(conn: Any, inner: "asyncio.Future[Any]",
                     drop: Callable[[], Any]) -> None:
    if not inner.done():
        # PQcancel blocks: run it in a thread of its own, waited for a
        # bounded time (a cancel request to a blackholed server would
        # hang until TCP gives up; see README "What it does not do")
        t = threading.Thread(target=_send_cancel, args=(conn,),
                             name="dlock-cancel", daemon=True)
        t.start()
        done, _ = await asyncio.wait([inner], timeout=CANCEL_LIMIT)
    if not inner.done() or inner.cancelled() or inner.exception() is not None:
        if not inner.done():
            await drop()
            await asyncio.wait([inner], timeout=0.5)
        if inner.done() and not inner.cancelled():
            inner.exception()   # consumed: it was cancelled on purpose
        return
    rows = inner.result()
    if rows:
        key, owner = rows[0][0], rows[0][1]
        try:
            await asyncio.wait_for(fetch(conn, SQL_RELEASE, (key, owner)), RELEASE_LIMIT)
        except BaseException as ex:  # noqa: B902 - reported, not raised
            log.warning("dlock: could not give back the lease on %r granted "
                        "after a cancel (it expires by itself): %s", key, ex)
            await drop()


async def cancel_in_server(conn: Any, limit: float = 2.0) -> None:
    """Ask the server to cancel conn's statement in flight, waiting at most
    limit for the request to be delivered (PQcancel blocks: it runs in a
    short-lived thread of its own)."""
    t = threading.Thread(target=_send_cancel, args=(conn,), name="dlock-cancel",
                         daemon=True)
    t.start()
    until = now() + limit
    while t.is_alive() and now() < until:
        await asyncio.sleep(0.01)


def _send_cancel(conn: Any) -> None:
    try:
        conn.pgconn.get_cancel().cancel()
    except Exception:
        pass


def check_cursor(cur: Any) -> None:
    """use_fence needs a client-side cursor: a server-side (named) one
    would only DECLARE the call, and run it at the first fetch."""
    if isinstance(cur, (psycopg.ServerCursor, psycopg.AsyncServerCursor)):
        raise InvalidArgument("use_fence needs a client-side cursor, not a server-side "
                              "(named) one")
    check_in_transaction(cur.connection)


def check_in_transaction(conn: Any) -> None:
    """use_fence presents the token for the rest of the transaction; on an
    autocommit connection outside a transaction block that is its own
    statement only, and the write that follows would go unfenced."""
    if conn.autocommit and \
            conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        raise InvalidArgument("use_fence needs a transaction: this connection is in "
                              "autocommit with no transaction open (use "
                              "lease.transaction(conn), or conn.transaction())")


@dataclass
class Leader:
    """Who leads an election (dlock.leader)."""
    value: Optional[str]
    epoch: int
    since: datetime.datetime
    expires_at: datetime.datetime


@dataclass
class Observation:
    """One state of a key seen by dlock.observe: ``state`` is ``'held'``,
    ``'released'``, ``'expired'`` or ``'none'``."""
    state: str
    fence: Optional[int]
    holder: Optional[str]
    value: Optional[str]
    expires_at: Optional[datetime.datetime]
    since: Optional[datetime.datetime]


class LeaseCore:
    """One lease: its grant, its renewals, its loss, its release.

    Runs in one asyncio loop; ``lost``, ``deadline`` and the fencing check
    may be read from any thread.
    """

    def __init__(self, link: Link, key: str, *, ttl: float,
                 wait: Optional[float], holder: Optional[str],
                 lock_delay: Optional[float], session_bound: bool,
                 permits: int, mode: str, renew_every: Optional[float],
                 on_lost: Optional[Callable[[Any], Any]],
                 campaign_value: Optional[str] = None,
                 owner_object: Any = None) -> None:
        check_args(key=key, ttl=ttl, wait=wait, holder=holder, lock_delay=lock_delay,
                   renew_every=renew_every, campaign_value=campaign_value)
        if session_bound and not link.session_capable:
            raise ValueError("session_bound needs a connection of the lease's own: "
                             "pass a conninfo, not a pool")
        self.link = link
        self.key = key
        self.ttl = float(ttl)
        self.wait = wait
        self.holder = holder if holder is not None else default_holder()
        self.lock_delay = lock_delay
        self.session_bound = session_bound
        self.permits = permits
        self.mode = mode
        self.renew_every = float(renew_every) if renew_every else self.ttl / 3
        if self.renew_every >= self.ttl:
            raise InvalidArgument("renew_every must be below the ttl (%r >= %r)"
                                  % (self.renew_every, self.ttl))
        self.on_lost = on_lost
        self.campaign_value = campaign_value
        # The Lease object is held weakly, so that one dropped without a
        # release is noticed (the renewer gives the lease back) instead of
        # being renewed for ever by the renewer's own reference.
        self._owner_ref: Optional[Callable[[], Any]] = (
            weakref.ref(owner_object) if owner_object is not None else None)
        self.pid = os.getpid()

        self.owner: Optional[str] = None
        self.fence: Optional[int] = None
        self.expires_at: Optional[datetime.datetime] = None
        self.deadline = 0.0          # time.monotonic() until which it is ours
        self.granted = 0.0           # deadline minus the last confirmed send
        self.next_try = 0.0
        self.last_error: Optional[str] = None
        self._lost = False
        self.server_said_gone = False    # a renewal or release returned NULL/false
        self.callback_in_thread = False  # the sync API: on_lost in a thread of its own
        self.lost_reason: Optional[str] = None
        self.lost_at: Optional[float] = None
        self.released = False
        self._lost_lock = threading.Lock()
        self._callback_done = False
        self._stop: Optional[asyncio.Event] = None
        self._wake: Optional[asyncio.Event] = None
        self._task: Optional["asyncio.Task[None]"] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._session_generation = 0

    # ---- state readable from any thread

    @property
    def owner_object(self) -> Any:
        """What on_lost is called with: the Lease (None once collected)."""
        return self._owner_ref() if self._owner_ref is not None else self

    @property
    def lost(self) -> bool:
        """True once the lease is lost, or its deadline has passed (even if
        the renewer has not come round to say so yet: a paused process
        must not believe it on waking)."""
        if self._lost:
            return True
        if self.owner is not None and os.getpid() != self.pid:
            # a child of fork(): nothing renews the lease here, and the
            # parent may still write under it
            self.mark_lost("inherited across fork() from process %d, which alone "
                           "renews and releases it" % self.pid)
            return True
        if self.owner is not None and not self.released and now() >= self.deadline:
            self.mark_lost("no renewal was confirmed before it ran out (%.0f ms after the "
                           "last confirmed request was sent)%s" %
                           (self.granted * 1000,
                            ": " + self.last_error if self.last_error else ""))
            return True
        return False

    def remaining(self) -> float:
        """Seconds the lease is known to be ours (monotonic clock), 0 when lost."""
        if self.lost or self.released:
            return 0.0
        return max(self.deadline - now(), 0.0)

    def check(self) -> None:
        """Raise LeaseLost unless the lease is still ours."""
        if self.released:
            raise LeaseLost("the lease on %r was released" % self.key)
        if self.lost:
            raise LeaseLost("the lease on %r is lost: %s" % (self.key, self.lost_reason))

    def mark_lost(self, reason: str) -> None:
        """Record the loss once (any thread); the renewer calls the callback."""
        with self._lost_lock:
            if self._lost:
                return
            self._lost = True
            self.lost_reason = reason
            self.lost_at = now()
        log.warning("dlock: lost the lease on %r: %s", self.key, reason)
        loop, wake = self._loop, self._wake
        if os.getpid() != self.pid:
            return      # the loop belongs to the parent process
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                if _running_loop() is loop:
                    wake.set()
                else:
                    loop.call_soon_threadsafe(wake.set)
            except RuntimeError:
                pass

    def _run_callback(self) -> None:
        if self._callback_done or self.on_lost is None:
            self._callback_done = True
            return
        self._callback_done = True
        if self.callback_in_thread and not inspect.iscoroutinefunction(self.on_lost):
            # the sync API: a callback of the user's never runs in the
            # renewer's loop, where blocking would hold up every other
            # lease's renewals and every release
            threading.Thread(target=self._callback_thread, name="dlock-on-lost",
                             daemon=True).start()
            return
        try:
            result = self.on_lost(self.owner_object)
            if inspect.isawaitable(result):
                # an async callback: run it in this loop, its failure logged
                task = asyncio.ensure_future(result)
                task.add_done_callback(self._callback_finished)
        except BaseException:  # noqa: B902 - nothing may escape into the renewer
            # SystemExit or KeyboardInterrupt included: raised here, in
            # the renewer's loop, they would end the renewals of every
            # other lease and could not end the process anyway
            log.exception("dlock: the on_lost callback of the lease on %r raised "
                          "(it runs in dlock's renewer, where it cannot stop the "
                          "program: set a flag, or signal the main thread)", self.key)

    def _callback_thread(self) -> None:
        try:
            assert self.on_lost is not None
            self.on_lost(self.owner_object)
        except BaseException:  # noqa: B902 - a thread of ours: log, go no further
            log.exception("dlock: the on_lost callback of the lease on %r raised "
                          "(it runs in a thread of dlock's, where it cannot stop "
                          "the program: set a flag, or signal the main thread)", self.key)

    def _callback_finished(self, task: "asyncio.Future[Any]") -> None:
        if task.cancelled():
            return
        ex = task.exception()
        if ex is not None:
            log.error("dlock: the on_lost callback of the lease on %r raised",
                      self.key, exc_info=ex)

    # ---- grant

    def _grant_sql(self) -> Tuple[str, Tuple[Any, ...]]:
        ttl = _ms(self.ttl)
        delay = _ms(self.lock_delay) if self.lock_delay is not None else None
        if self.campaign_value is not None:
            wait = _ms(self.wait) if self.wait is not None else None
            return SQL_CAMPAIGN, (self.key, self.campaign_value, ttl, wait, self.holder,
                                  delay, self.session_bound)
        if self.wait == 0:
            return SQL_TRY_ACQUIRE, (self.key, ttl, self.holder, delay, self.session_bound,
                                     self.permits, self.mode)
        wait = _ms(self.wait) if self.wait is not None else None
        return SQL_ACQUIRE, (self.key, ttl, wait, self.holder, delay, self.session_bound,
                             self.permits, self.mode)

    async def acquire(self) -> None:
        """Grant the lease (raise Busy when not granted), confirm it if the
        grant waited, and start the renewer in the running loop."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        sql, params = self._grant_sql()
        # An answer later than wait + ttl would bring a lease that has
        # already run out by our clock
        limit = None if self.wait is None else self.wait + self.ttl
        sent = now()
        try:
            rows = await self.link.grant(sql, params, limit)
        except psycopg.Error as ex:
            await self.link.close()
            raise map_error(ex) from None
        except BaseException:
            await self.link.close()
            raise
        if not rows:
            await self.link.close()
            # no row: held by another, or (memory mode) grants are paused
            # until the horizon after a restart; the server does not say which
            raise Busy("key %r was not granted: it is held by someone else, or grants "
                       "are paused (memory mode, after a restart)" % self.key)
        _key, self.owner, self.fence, expires_at, remaining = rows[0]
        self.expires_at = _ts(expires_at)
        if isinstance(self.link, OwnLink):
            self._session_generation = self.link.generation
        self._confirmed(sent, remaining)
        if now() >= self.next_try:
            # the grant waited: it may have happened long after the request
            # was sent, so confirm it with a renewal and judge from that
            try:
                await self._confirm()
            except BaseException:
                await self._give_back_quietly()
                raise
        self._task = asyncio.ensure_future(self._renewer())

    def _confirmed(self, sent: float, remaining: Optional[int]) -> None:
        self.granted = min(self.ttl, max((remaining or 0) / 1000.0, 0.0))
        self.deadline = sent + self.granted
        self.next_try = sent + self.renew_every

    async def _confirm(self) -> None:
        sent = now()
        try:
            rows = await self.link.run(SQL_RENEW, (self.key, self.owner, _ms(self.ttl)),
                                       self.ttl, drop_on_timeout=not self.session_bound)
        except psycopg.Error as ex:
            raise map_error(ex) from None
        if not rows or rows[0][0] is None:
            self.server_said_gone = True
            self.mark_lost("lost before it was handed over (its first renewal returned NULL)")
            raise LeaseLost("the lease on %r was lost before it was handed over" % self.key)
        self.expires_at = _ts(rows[0][0])
        self._confirmed(sent, rows[0][1])

    async def _give_back_quietly(self) -> None:
        try:
            await self.link.run(SQL_RELEASE, (self.key, self.owner), RELEASE_LIMIT)
        except BaseException:
            pass
        await self.link.close()

    # ---- renewer

    async def _renewer(self) -> None:
        assert self._stop is not None and self._wake is not None
        try:
            while not self._stop.is_set():
                t = now()
                if self.lost:          # also notices the deadline
                    break
                if self._owner_ref is not None and self._owner_ref() is None:
                    log.warning("dlock: the lease on %r was dropped without being "
                                "released; releasing it", self.key)
                    await self._give_back_quietly()
                    self.released = True
                    return
                if t < self.next_try:
                    await self._sleep(min(self.next_try, self.deadline) - t)
                    continue
                await self._renew_once()
        finally:
            if self._lost:
                await self.link.close()
                self._run_callback()

    async def _sleep(self, seconds: float) -> None:
        assert self._stop is not None and self._wake is not None
        self._wake.clear()
        waiter = asyncio.ensure_future(self._wake.wait())
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait([waiter, stopper], timeout=max(seconds, 0.0),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            stopper.cancel()

    def _attempt_timeout(self, t: float) -> float:
        """The CLI's rule: well under the time left, at least 100 ms."""
        if self.session_bound:
            # dropping its connection would end the lease: wait up to the
            # deadline, when it is lost anyway
            return max(self.deadline - t, 0.001)
        return max(min((self.deadline - t) / 2, self.renew_every), 0.1)

    def _retry_delay(self) -> float:
        return min(1.0, max(0.05, self.renew_every / 4))

    async def _renew_once(self) -> None:
        sent = now()
        timeout = self._attempt_timeout(sent)
        if self.session_bound:
            assert isinstance(self.link, OwnLink)
            if self.link.conn is None or self.link.generation != self._session_generation:
                self.mark_lost("the connection of the session-bound lease failed")
                return
        try:
            rows = await self.link.run(SQL_RENEW, (self.key, self.owner, _ms(self.ttl)),
                                       timeout, drop_on_timeout=not self.session_bound)
        except (Unavailable, psycopg.OperationalError) as ex:
            if self.session_bound and (self.link.conn is None  # type: ignore[attr-defined]
                                       or self.link.conn.broken):  # type: ignore[attr-defined]
                self.mark_lost("the connection of the session-bound lease failed: %s" % ex)
                return
            self.last_error = str(ex).strip()
            self.next_try = now() + self._retry_delay()
            return
        except psycopg.Error as ex:
            # refused (e.g. read-only after a failover): retry until the deadline
            self.last_error = str(ex).strip()
            self.next_try = now() + self._retry_delay()
            return
        if not rows or rows[0][0] is None:
            self.server_said_gone = True
            self.mark_lost("a renewal found it no longer held (expired, released or taken)")
            return
        if self.lost:
            return      # the deadline passed while we waited: it stays lost
        self.expires_at = _ts(rows[0][0])
        self._confirmed(sent, rows[0][1])
        self.last_error = None

    # ---- release

    async def release(self) -> Optional[bool]:
        """Stop the renewer, then release (bounded: 5 s, and never past the
        deadline).  True: released; False: it was no longer ours; None: it
        could not be released (it expires by itself; logged)."""
        if self.released or self.owner is None:
            return None
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            try:
                await self._task
            except BaseException:
                pass
        self.released = True
        result: Optional[bool] = None
        try:
            if self.server_said_gone:
                return False
            # Lost by our clock only, the server may still hold it (a late
            # answer, a network that came back): release(key, owner) frees
            # it only if this owner still holds it, so try, briefly (a
            # healthy server answers in milliseconds; a dead one must not
            # hold up the program's exit).
            t = now()
            lost = self.lost        # judges the deadline too (a pause just ended)
            until = t + LOST_RELEASE_LIMIT if lost else min(self.deadline, t + RELEASE_LIMIT)
            if until <= t:
                return None
            if self.session_bound and (self.link.conn is None  # type: ignore[attr-defined]
                                       or self.link.generation != self._session_generation):  # type: ignore[attr-defined]
                return None     # it ended with its connection
            while True:
                try:
                    rows = await self.link.run(SQL_RELEASE, (self.key, self.owner),
                                               max(until - now(), 0.001))
                    result = bool(rows and rows[0][0])
                    break
                except psycopg.Error as ex:
                    err: BaseException = ex
                except Unavailable as ex:
                    err = ex
                if self.session_bound or now() + self._retry_delay() >= until:
                    log.warning("dlock: could not release the lease on %r (it expires "
                                "by itself): %s", self.key, err)
                    break
                await asyncio.sleep(self._retry_delay())
            if result is False and not self._lost:
                self.mark_lost("it was no longer held when released")
            if self._lost:
                return False
            return result
        finally:
            # lost, and on_lost not called yet (the renewer stopped before
            # it knew: this release found it gone, or a pause just ended)
            if self._lost and not self._callback_done:
                self._run_callback()
            await self.link.close()

    async def proclaim(self, value: str) -> bool:
        """Publish a new value as the leader; False when no longer leader."""
        self.check()
        t = now()
        try:
            rows = await self.link.run(SQL_PROCLAIM, (self.key, self.owner, value),
                                       max(self.deadline - t, 0.1),
                                       drop_on_timeout=not self.session_bound)
        except psycopg.Error as ex:
            raise map_error(ex) from None
        return bool(rows and rows[0][0])


def _running_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def leader(link: Link, election: str, timeout: float = 30.0) -> Optional[Leader]:
    """Who leads election (None: nobody)."""
    try:
        rows = await link.run(SQL_LEADER, (election,), timeout)
    except psycopg.Error as ex:
        raise map_error(ex) from None
    if not rows:
        return None
    value, fence, since, expires_at = rows[0]
    return Leader(value=value, epoch=fence, since=cast(datetime.datetime, _ts(since)),
                  expires_at=cast(datetime.datetime, _ts(expires_at)))


async def observe(link: Link, key: str, after_fence: int = 0,
                  poll: float = 30.0) -> AsyncIterator[Observation]:
    """Follow key (or an election) with observe()'s long poll, yielding
    each new state: the first call only looks, then the watch loop of
    docs/reference.md.  A connection that fails is made again (after 0.1 s,
    doubling up to 5 s) and the loop carries on where it was."""
    fence = after_fence
    value: Optional[str] = None
    seen_end = False
    started = False
    backoff = 0.1
    polling = False
    try:
        while True:
            wait = poll if started else 0.0
            polling = True
            try:
                rows = await link.run(SQL_OBSERVE, (key, fence, _ms(wait), value, seen_end),
                                      wait + OBSERVE_SLACK)
            except (Unavailable, psycopg.OperationalError) as ex:
                polling = False
                log.info("dlock: observe of %r: %s (retrying)", key, ex)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except psycopg.Error as ex:
                polling = False
                raise map_error(ex) from None
            polling = False
            backoff = 0.1
            if not rows:
                if started:
                    continue
                obs = Observation("none", None, None, None, None, None)
            else:
                f, holder, v, state, expires_at, since = rows[0]
                obs = Observation(state, f, holder, v, _ts(expires_at), _ts(since))
            started = True
            if obs.fence is not None:
                fence = obs.fence
            value = obs.value
            seen_end = obs.state != "held"
            yield obs
    finally:
        # Closed or cancelled in the middle of a long poll: the server
        # would go on waiting (up to poll) with nobody to answer, holding
        # a connection (behind PgBouncer, a server connection); cancel it.
        # (A pool's connection is cut off by PoolLink instead.)
        if polling and isinstance(link, OwnLink) and link.conn is not None \
                and not link.conn.closed \
                and link.conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
            await cancel_in_server(link.conn)
        await link.close()


def make_link(target: Union[str, Any], kwargs: Optional[dict] = None) -> Link:
    """A Link for a conninfo string or an AsyncConnectionPool."""
    if isinstance(target, str):
        return OwnLink(target, kwargs)
    if hasattr(target, "connection") and hasattr(target, "getconn"):
        return PoolLink(target)
    raise TypeError("expected a conninfo string or a psycopg_pool pool, got %r"
                    % type(target).__name__)
