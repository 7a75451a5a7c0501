"""The dlock client's tests, against a real server (see README.md, Tests).

Environment: DLOCK_TEST_DSN (direct, superuser, dlock installed and
preloaded), DLOCK_TEST_TCP_PORT (the server's TCP port on 127.0.0.1, for
the test's own proxy), DLOCK_TEST_BOUNCER_DSN (PgBouncer, transaction
mode, pool of 2), DLOCK_TEST_PGDATA and DLOCK_TEST_BINDIR (to stop, kill
and start the server), DLOCK_TEST_SRC (clients/python, for the pip test).
Each test is one TAP assertion in t/client_python.pl.
"""
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import psycopg
import psycopg_pool

import dlock
import dlock.aio

DSN = os.environ.get("DLOCK_TEST_DSN", "")
BOUNCER = os.environ.get("DLOCK_TEST_BOUNCER_DSN", "")
TCP_PORT = os.environ.get("DLOCK_TEST_TCP_PORT", "")
PGDATA = os.environ.get("DLOCK_TEST_PGDATA", "")
BINDIR = os.environ.get("DLOCK_TEST_BINDIR", "")
SRC = os.environ.get("DLOCK_TEST_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
SLACK = 0.35        # how late a loss may be reported after its deadline


def sql(query, params=(), dsn=None):
    with psycopg.connect(dsn or DSN, autocommit=True) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else None


def held(key):
    """Leases of key held now, per dlock.lease_status."""
    return sql("SELECT count(*) FROM dlock.lease_status WHERE key = %s AND state = 'held'",
               (key,))[0][0]


def dlock_threads():
    return [t for t in threading.enumerate() if t.name.startswith("dlock")]


def wait_for_server(dsn, limit=20.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            sql("SELECT 1", dsn=dsn)
            return True
        except psycopg.Error:
            time.sleep(0.1)
    return False


def pg_ctl(*args):
    subprocess.run([os.path.join(BINDIR, "pg_ctl"), "-D", PGDATA, "-w",
                    "-l", os.path.join(PGDATA, "..", "client_python_restart.log")] + list(args),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Recorder:
    """An on_lost callback that records when, and how often, it was called."""

    def __init__(self):
        self.calls = 0
        self.at = None
        self.deadline = None

    def __call__(self, lease):
        self.calls += 1
        self.at = time.monotonic()
        self.deadline = lease._c().deadline


def setUpModule():
    sql("""DROP TABLE IF EXISTS stock;
        CREATE TABLE stock (id int PRIMARY KEY, qty int NOT NULL, fence bigint);
        INSERT INTO stock VALUES (1, 0, NULL), (2, 0, NULL), (3, 0, NULL);
        CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock
          FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('stock', 'fence');
        DROP TABLE IF EXISTS item;
        CREATE TABLE item (k text PRIMARY KEY, n int NOT NULL);
        CREATE TRIGGER item_fence BEFORE INSERT OR UPDATE OR DELETE ON item
          FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{k}');""")


class Base(unittest.TestCase):
    def setUp(self):
        self.threads_before = len(threading.enumerate())

    def assertNoThreadLeft(self):
        self.assertEqual(dlock_threads(), [], "no dlock thread is left")
        self.assertEqual(len(threading.enumerate()), self.threads_before)

    def write_item(self, lease, key, dsn=None):
        """A fenced write through the library: insert or bump row key."""
        with psycopg.connect(dsn or DSN, autocommit=True) as c:
            with lease.transaction(c) as cur:
                cur.execute("INSERT INTO item VALUES (%s, 1) ON CONFLICT (k) "
                            "DO UPDATE SET n = item.n + 1", (key,))


class T01Basics(Base):
    def test_lease_basics(self):
        with dlock.lease(DSN, "basic", ttl=5, holder="t-basic") as lease:
            self.assertGreater(lease.fence, 0)
            self.assertEqual(len(lease.owner), 36)
            self.assertIsNotNone(lease.expires_at)
            self.assertTrue(4.0 < lease.remaining() <= 5.0)
            self.assertFalse(lease.lost)
            self.assertEqual(held("basic"), 1)
            with self.assertRaises(dlock.Busy):
                with dlock.lease(DSN, "basic", ttl=5):
                    pass
            self.write_item(lease, "basic")
        self.assertEqual(held("basic"), 0)
        self.assertTrue(lease.remaining() == 0)
        self.assertNoThreadLeft()

    def test_renews_past_its_ttl(self):
        with dlock.lease(DSN, "renews", ttl=1.2) as lease:
            first = lease.expires_at
            time.sleep(3.0)
            self.assertFalse(lease.lost)
            self.assertGreater(lease.expires_at, first)
            self.write_item(lease, "renews")
        self.assertNoThreadLeft()

    def test_invalid_argument_is_typed(self):
        with self.assertRaises(dlock.InvalidArgument) as cm:
            dlock.acquire(DSN, "", ttl=5)
        self.assertEqual(cm.exception.sqlstate, "22023")
        self.assertNoThreadLeft()

    def test_waiting_acquire_is_granted_and_confirmed(self):
        first = dlock.acquire(DSN, "waited", ttl=1.5)
        threading.Timer(1.0, first.release).start()
        with dlock.lease(DSN, "waited", ttl=1.5, wait=5) as lease:
            self.assertGreater(lease.fence, first.fence)
            self.assertGreater(lease.remaining(), 1.0)
        time.sleep(0.1)
        self.assertNoThreadLeft()

    def test_wait_runs_out_busy(self):
        with dlock.lease(DSN, "waitout", ttl=5):
            t = time.monotonic()
            with self.assertRaises(dlock.Busy) as cm:
                dlock.acquire(DSN, "waitout", ttl=5, wait=0.5)
            self.assertEqual(cm.exception.sqlstate, "55P03")
            self.assertLess(time.monotonic() - t, 2.0)
        self.assertNoThreadLeft()


class T02Loss(Base):
    def test_null_renewal_is_lost_at_once(self):
        rec = Recorder()
        lease = dlock.acquire(DSN, "nullrenew", ttl=3, on_lost=rec)
        sql("SELECT dlock.forget('nullrenew')")
        # the next renewal (after 1 s) returns NULL: lost then, long
        # before the deadline
        time.sleep(1.5)
        self.assertTrue(lease.lost)
        self.assertIn("no longer held", lease.lost_reason)
        self.assertEqual(rec.calls, 1)
        self.assertLess(rec.at, rec.deadline - 1.0)
        with self.assertRaises(dlock.LeaseLost) as cm:
            self.write_item(lease, "nullrenew")
        self.assertNotIsInstance(cm.exception, dlock.StaleFence,
                                 "refused by the library, not the server")
        self.assertFalse(lease.release())
        self.assertEqual(rec.calls, 1)
        self.assertNoThreadLeft()

    def test_lf001_maps_to_stale_fence(self):
        with dlock.lease(DSN, "lf001", ttl=30) as lease:
            sql("SELECT dlock.forget('lf001')")
            with dlock.lease(DSN, "lf001", ttl=30) as newer:
                self.assertFalse(lease.lost)   # not noticed yet: the server says it
                with self.assertRaises(dlock.StaleFence) as cm:
                    self.write_item(lease, "lf001")
                self.assertEqual(cm.exception.sqlstate, "LF001")
                self.assertIsInstance(cm.exception, dlock.LeaseLost)
                self.write_item(newer, "lf001")
        self.assertNoThreadLeft()

    def test_paused_worker(self):
        """SIGSTOP the holder past its TTL, take over and write, SIGCONT:
        its next write through the library is refused, and so is a raw
        write presenting the old token."""
        env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
        child = subprocess.Popen([sys.executable, os.path.join(HERE, "holder.py"), DSN,
                                  "stock", "1.5"], stdout=subprocess.PIPE, text=True, env=env)
        try:
            out = []
            line = child.stdout.readline()
            self.assertTrue(line.startswith("GRANTED"), line)
            old = int(line.split()[1])
            for _ in range(3):
                line = child.stdout.readline()
                self.assertTrue(line.startswith("WROTE"), line)
            # stopped right after a write: in its sleep, no transaction open
            child.send_signal(signal.SIGSTOP)
            time.sleep(2.5)
            with dlock.lease(DSN, "stock", ttl=5, wait=5) as lease:
                self.assertGreater(lease.fence, old)
                with psycopg.connect(DSN) as c:
                    with lease.transaction(c) as cur:
                        cur.execute("UPDATE stock SET qty = 1000, fence = %s WHERE id = 1",
                                    (lease.fence,))
                child.send_signal(signal.SIGCONT)
                out = child.stdout.read().split("\n")
                child.wait(10)
            out = [x for x in out if x]
            self.assertFalse([x for x in out if x.startswith("WROTE")],
                             "no write after the pause: %r" % out)
            # the first attempt after the pause was refused (the callback
            # may print before or after it)
            self.assertTrue([x for x in out if x != "CALLBACK"][0].startswith("REFUSED"), out)
            self.assertIn("RAW LF001", out)
            self.assertIn("CALLBACK", out)
            self.assertEqual(sql("SELECT qty FROM stock WHERE id = 1")[0][0], 1000)
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGCONT)
                child.kill()
                child.wait()
            child.stdout.close()
        self.assertNoThreadLeft()

    def check_lost_at_deadline(self, rec, lease, stopped_at, ttl):
        self.assertTrue(lease.lost)
        self.assertEqual(rec.calls, 1)
        # not long before the deadline (no NULL renewal here) ...
        self.assertGreaterEqual(rec.at, rec.deadline - 0.05)
        # ... and no later than it, and the deadline was set by a renewal
        # sent before the fault
        self.assertLessEqual(rec.at, rec.deadline + SLACK)
        self.assertLessEqual(rec.deadline, stopped_at + ttl + 0.01)
        with self.assertRaises(dlock.LeaseLost):
            lease.use_fence(None)   # refused without touching the database

    def db_gone(self, stop, start):
        ttl = 2.0
        rec = Recorder()
        lease = dlock.acquire(DSN, "dbgone", ttl=ttl, on_lost=rec)
        old = lease.fence
        time.sleep(0.8)
        stopped_at = time.monotonic()
        stop()
        try:
            end = time.monotonic() + ttl + 2
            while rec.calls == 0 and time.monotonic() < end:
                time.sleep(0.05)
            self.check_lost_at_deadline(rec, lease, stopped_at, ttl)
        finally:
            start()
            self.assertTrue(wait_for_server(DSN))
        # no write is accepted under the old token
        with psycopg.connect(DSN) as c:
            with self.assertRaises(psycopg.Error) as cm:
                with c.transaction():
                    c.execute("SELECT dlock.use_fence('dbgone', %s)", (old,))
                    c.execute("INSERT INTO item VALUES ('dbgone', 1)")
            self.assertEqual(cm.exception.sqlstate, "LF001")
        self.assertIn(lease.release(), (False, None))
        with dlock.lease(DSN, "dbgone", ttl=5, wait=5) as again:
            self.assertGreater(again.fence, old)
            self.write_item(again, "dbgone")
        self.assertNoThreadLeft()

    def test_db_stop_immediate(self):
        self.db_gone(lambda: pg_ctl("stop", "-m", "immediate"), lambda: pg_ctl("start"))

    def test_db_kill9_postmaster(self):
        def kill9():
            with open(os.path.join(PGDATA, "postmaster.pid")) as f:
                pid = int(f.readline())
            os.kill(pid, signal.SIGKILL)

        def start():
            # the orphaned backends exit when they notice the postmaster's
            # death; until then pg_ctl start refuses
            end = time.monotonic() + 20
            while True:
                try:
                    pg_ctl("start")
                    return
                except subprocess.CalledProcessError:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.3)
        self.db_gone(kill9, start)

    def test_network_blackholed(self):
        port = free_port()
        proxy = subprocess.Popen([sys.executable, os.path.join(HERE, "proxy.py"), str(port),
                                  TCP_PORT], stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(proxy.stdout.readline().strip(), "READY")
            dsn = "host=127.0.0.1 port=%d dbname=postgres user=%s" % (
                port, sql("SELECT current_user")[0][0])
            ttl = 2.0
            rec = Recorder()
            lease = dlock.acquire(dsn, "blackhole", ttl=ttl, on_lost=rec)
            old = lease.fence
            time.sleep(0.8)
            stopped_at = time.monotonic()
            proxy.send_signal(signal.SIGUSR1)
            end = time.monotonic() + ttl + 2
            while rec.calls == 0 and time.monotonic() < end:
                time.sleep(0.05)
            self.check_lost_at_deadline(rec, lease, stopped_at, ttl)
            t = time.monotonic()
            self.assertIn(lease.release(), (False, None))
            self.assertLess(time.monotonic() - t, 0.5, "release does not hang either")
            self.assertNoThreadLeft()
            # the server side: the old token is refused once the lease ran out
            time.sleep(max(0.0, rec.deadline + 0.2 - time.monotonic()))
            with psycopg.connect(DSN) as c:
                with self.assertRaises(psycopg.Error) as cm:
                    with c.transaction():
                        c.execute("SELECT dlock.use_fence('blackhole', %s)", (old,))
                self.assertEqual(cm.exception.sqlstate, "LF001")
            proxy.send_signal(signal.SIGUSR2)
            with dlock.lease(dsn, "blackhole", ttl=5, wait=5) as again:
                self.assertGreater(again.fence, old)
                self.write_item(again, "blackhole", dsn=dsn)
        finally:
            proxy.kill()
            proxy.wait()
            proxy.stdout.close()
        self.assertNoThreadLeft()

    def test_session_bound_ends_with_its_connection(self):
        rec = Recorder()
        lease = dlock.acquire(DSN, "sb", ttl=10, session_bound=True, on_lost=rec)
        sql("SELECT pg_terminate_backend(pid) FROM dlock.lease_status "
            "WHERE key = 'sb' AND state = 'held'")
        end = time.monotonic() + 5
        while rec.calls == 0 and time.monotonic() < end:
            time.sleep(0.05)
        self.assertTrue(lease.lost)
        self.assertLess(rec.at, rec.deadline - 5, "lost long before its deadline")
        self.assertEqual(held("sb"), 0)
        lease.release()
        with self.assertRaises(ValueError):
            pool = psycopg_pool.ConnectionPool(DSN, min_size=0, max_size=1, open=False)
            dlock.acquire(pool, "sb", session_bound=True)
        self.assertNoThreadLeft()


class T03Pools(Base):
    def test_pgbouncer_transaction_mode_small_pool(self):
        leases = [dlock.acquire(BOUNCER, "bouncer-%d" % i, ttl=1.5) for i in range(6)]
        try:
            time.sleep(3.2)
            self.assertEqual([x.lost for x in leases], [False] * 6)
            for x in leases:
                self.write_item(x, x.key, dsn=BOUNCER)
            self.assertEqual(sql("SELECT sum(n) FROM item WHERE k LIKE 'bouncer-%%'")[0][0], 6)
        finally:
            for x in leases:
                self.assertTrue(x.release())
        self.assertNoThreadLeft()

    def test_one_pool_shared_by_many_leases(self):
        with psycopg_pool.ConnectionPool(DSN, min_size=1, max_size=2) as pool:
            before = len(threading.enumerate())
            leases = [dlock.acquire(pool, "pooled-%d" % i, ttl=1.5) for i in range(10)]
            try:
                time.sleep(3.2)
                self.assertEqual([x.lost for x in leases], [False] * 10)
                for x in leases:
                    with pool.connection() as c:
                        with x.transaction(c) as cur:
                            cur.execute("INSERT INTO item VALUES (%s, 1)", (x.key,))
            finally:
                for x in leases:
                    self.assertTrue(x.release())
            self.assertEqual(dlock_threads(), [])
            self.assertEqual(len(threading.enumerate()), before)
        self.assertNoThreadLeft()


def sigint_timer(seconds):
    """A timer that sends SIGINT to the main thread after seconds, as a
    user's Ctrl-C would interrupt it.  Sent to the process from the timer's
    thread (os.kill), the signal may be delivered to that thread or to the
    library's service thread instead: the main thread, blocked waiting for
    a long poll, is then not woken (no EINTR) and sees the interrupt only
    once the poll answers, which an observe of an idle key never does."""
    return threading.Timer(seconds, signal.pthread_kill,
                           (threading.main_thread().ident, signal.SIGINT))


class T04Cancel(Base):
    def test_cancel_waiting_acquire(self):
        blocker = dlock.acquire(DSN, "cancel", ttl=5)
        timer = sigint_timer(0.7)
        timer.start()
        t = time.monotonic()
        with self.assertRaises(KeyboardInterrupt):
            dlock.acquire(DSN, "cancel", ttl=5, wait=30, holder="cancelled")
        self.assertLess(time.monotonic() - t, 3.0, "interrupted, not timed out")
        timer.join()
        self.assertEqual(sql("SELECT count(*) FROM dlock.waiters WHERE key = 'cancel'")[0][0], 0)
        blocker.release()
        time.sleep(0.3)
        self.assertEqual(sql("SELECT count(*) FROM dlock.lease_status WHERE key = 'cancel' "
                             "AND holder = 'cancelled'")[0][0], 0)
        self.assertEqual(held("cancel"), 0)
        self.assertNoThreadLeft()

    def test_cancel_while_held_and_exit_by_exception(self):
        timer = sigint_timer(0.5)
        t = time.monotonic()
        with self.assertRaises(KeyboardInterrupt):
            with dlock.lease(DSN, "cancel-held", ttl=5):
                timer.start()
                time.sleep(5)
        self.assertLess(time.monotonic() - t, 3.0)
        timer.join()
        self.assertEqual(held("cancel-held"), 0)
        with self.assertRaises(ZeroDivisionError):
            with dlock.lease(DSN, "cancel-held", ttl=5):
                1 / 0
        self.assertEqual(held("cancel-held"), 0)
        self.assertNoThreadLeft()

    def test_aio_cancel_waiting_and_held(self):
        async def main():
            blocker = await dlock.aio.acquire(DSN, "acancel", ttl=5)
            task = asyncio.ensure_future(dlock.aio.acquire(DSN, "acancel", ttl=5, wait=30,
                                                           holder="acancelled"))
            await asyncio.sleep(0.5)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            await blocker.release()

            async def hold():
                async with dlock.aio.lease(DSN, "acancel", ttl=5, wait=5):
                    await asyncio.sleep(30)
            t2 = asyncio.ensure_future(hold())
            await asyncio.sleep(0.5)
            t2.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await t2
            return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        left = asyncio.run(main())
        self.assertEqual(left, [], "no task left")
        time.sleep(0.3)
        self.assertEqual(sql("SELECT count(*) FROM dlock.lease_status WHERE key = 'acancel' "
                             "AND holder = 'acancelled'")[0][0], 0)
        self.assertEqual(held("acancel"), 0)
        self.assertNoThreadLeft()


class T05Election(Base):
    def test_election_observe(self):
        it = dlock.observe(DSN, "elect", poll=5)
        with contextlib.closing(it):
            first = next(it)
            self.assertNotEqual(first.state, "held")
            a = dlock.campaign(DSN, "elect", "node-a", ttl=30).acquire()
            seen = next(it)
            self.assertEqual((seen.state, seen.value, seen.fence), ("held", "node-a", a.epoch))
            self.assertEqual(dlock.leader(DSN, "elect").value, "node-a")
            self.assertTrue(a.proclaim("node-a2"))
            self.assertEqual(next(it).value, "node-a2")
            # a is deposed (an administrator's forget), b is elected
            sql("SELECT dlock.forget('elect')")
            with dlock.campaign(DSN, "elect", "node-b", ttl=30, wait=5) as b:
                self.assertGreater(b.epoch, a.epoch)
                while True:
                    seen = next(it)
                    if seen.state == "held":
                        break
                self.assertEqual((seen.value, seen.fence), ("node-b", b.epoch))
                self.assertEqual(dlock.leader(DSN, "elect").epoch, b.epoch)
                with self.assertRaises(dlock.LeaseLost):
                    self.write_item(a, "elect")
                self.assertFalse(a.proclaim("late"))
                self.write_item(b, "elect")
            a.release()
            self.assertNotEqual(next(it).state, "held")
        self.assertIsNone(dlock.leader(DSN, "elect"))
        self.assertNoThreadLeft()

    def test_aio_election_observe(self):
        async def main():
            agen = dlock.aio.observe(DSN, "aelect", poll=5)
            first = await agen.__anext__()
            async with dlock.aio.campaign(DSN, "aelect", "x", ttl=5) as lead:
                seen = await agen.__anext__()
                self.assertEqual((seen.value, seen.fence), ("x", lead.epoch))
                self.assertEqual((await dlock.aio.leader(DSN, "aelect")).value, "x")
            await agen.aclose()
            return first
        self.assertNotEqual(asyncio.run(main()).state, "held")
        self.assertNoThreadLeft()


class T06Kinds(Base):
    def test_permits_and_shared(self):
        permits = [dlock.acquire(DSN, "sem", ttl=5, permits=3) for _ in range(3)]
        with self.assertRaises(dlock.Busy):
            dlock.acquire(DSN, "sem", ttl=5, permits=3)
        self.assertEqual(len({p.fence for p in permits}), 3)
        with psycopg.connect(DSN) as c:
            with permits[1].transaction(c) as cur:
                cur.execute("INSERT INTO item VALUES ('sem', 1)")
        permits[0].release()
        with dlock.lease(DSN, "sem", ttl=5, permits=3):
            pass
        for p in permits[1:]:
            p.release()
        s1 = dlock.acquire(DSN, "rw", ttl=5, mode="shared")
        s2 = dlock.acquire(DSN, "rw", ttl=5, mode="shared")
        with self.assertRaises(dlock.Busy):
            dlock.acquire(DSN, "rw", ttl=5)
        s1.release()
        s2.release()
        with dlock.lease(DSN, "rw", ttl=5) as ex:
            with self.assertRaises(dlock.Busy):
                dlock.acquire(DSN, "rw", ttl=5, mode="shared")
            self.write_item(ex, "rw")
        self.assertNoThreadLeft()

    def test_one_at_a_time_decorator(self):
        calls = []

        @dlock.one_at_a_time(DSN, "job", ttl=5)
        def job(x):
            calls.append(x)
            return x * 2

        @dlock.one_at_a_time(DSN, "job", ttl=5, on_busy="raise", pass_lease=True)
        def strict(lease):
            return lease.fence

        self.assertEqual(job(1), 2)
        with dlock.lease(DSN, "job", ttl=5):
            self.assertIsNone(job(2))
            with self.assertRaises(dlock.Busy):
                strict()
        self.assertGreater(strict(), 0)
        self.assertEqual(calls, [1])
        self.assertNoThreadLeft()

    def test_aio_lease_renews_and_fences(self):
        async def main():
            async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
                pool = psycopg_pool.AsyncConnectionPool(DSN, min_size=1, max_size=2)
                async with pool:
                    async with dlock.aio.lease(pool, "alease", ttl=1.2) as lease:
                        await asyncio.sleep(2.6)
                        self.assertFalse(lease.lost)
                        async with lease.transaction(conn) as cur:
                            await cur.execute("INSERT INTO item VALUES ('alease', 1)")
                return lease
        lease = asyncio.run(main())
        with self.assertRaises(dlock.LeaseLost):
            lease._c().check()
        self.assertNoThreadLeft()


class T07Packaging(Base):
    def test_offline_pip_install(self):
        with tempfile.TemporaryDirectory() as d:
            venv = os.path.join(d, "venv")
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv],
                           check=True)
            env = dict(os.environ, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                       HOME=d)
            env.pop("PYTHONPATH", None)
            r = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q",
                                "--no-index", SRC], env=env, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            r = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                                "import dlock, dlock.aio, os; print(dlock.__file__); "
                                "print(os.path.exists(os.path.join(os.path.dirname("
                                "dlock.__file__), 'py.typed')))"],
                               env=env, capture_output=True, text=True, cwd=d)
            self.assertEqual(r.returncode, 0, r.stderr)
            path, typed = r.stdout.split()
            self.assertTrue(path.startswith(venv), path)
            self.assertEqual(typed, "True")


class T08Misuse(Base):
    """What an attack pass found (issue 21): each case failed before its fix."""

    def test_on_lost_raising_system_exit_spares_the_others(self):
        """An on_lost that raises SystemExit must not end the renewer:
        the other leases keep renewing and release() returns."""
        def bail(lease):
            sys.exit("lease lost")
        with dlock.lease(DSN, "exit-healthy", ttl=1.5) as healthy:
            with dlock.lease(DSN, "exit-victim", ttl=1.5, on_lost=bail) as victim:
                sql("SELECT dlock.forget('exit-victim')")
                end = time.monotonic() + 3
                while not victim.lost and time.monotonic() < end:
                    time.sleep(0.05)
                self.assertTrue(victim.lost)
            time.sleep(2.0)                    # past healthy's TTL: renewed?
            self.assertFalse(healthy.lost, healthy.lost_reason)
            self.assertEqual(held("exit-healthy"), 1)
        self.assertEqual(held("exit-healthy"), 0)
        self.assertNoThreadLeft()

    def test_lease_object_is_acquired_once(self):
        """A second `with` on a released Lease must not run unlocked."""
        lease = dlock.lease(DSN, "reuse", ttl=5)
        with lease:
            pass
        with self.assertRaises(RuntimeError):
            with lease:
                self.fail("ran without the lease")

        async def main():
            alease = dlock.aio.lease(DSN, "reuse", ttl=5)
            async with alease:
                pass
            with self.assertRaises(RuntimeError):
                async with alease:
                    self.fail("ran without the lease")
        asyncio.run(main())
        self.assertEqual(held("reuse"), 0)
        self.assertNoThreadLeft()

    def test_odd_datestyle_and_float_digits(self):
        """A role's DateStyle or extra_float_digits must neither break a
        grant nor leave a lease behind."""
        sql("DROP ROLE IF EXISTS dlock_odd")
        sql("CREATE ROLE dlock_odd LOGIN SUPERUSER")
        sql("ALTER ROLE dlock_odd SET datestyle = 'SQL, DMY'")
        sql("ALTER ROLE dlock_odd SET extra_float_digits = -15")
        sql("ALTER ROLE dlock_odd SET timezone = 'America/St_Johns'")
        dsn = DSN + " user=dlock_odd"
        try:
            before = time.time()
            with dlock.lease(dsn, "odd-style", ttl=30) as lease:
                exp = lease.expires_at.timestamp()
                self.assertTrue(before + 25 < exp < time.time() + 35, exp - before)
                self.assertGreater(lease.remaining(), 25)
            with dlock.campaign(dsn, "odd-election", "v1", ttl=30) as lead:
                who = dlock.leader(dsn, "odd-election")
                self.assertEqual((who.value, who.epoch), ("v1", lead.epoch))
                self.assertLess(abs(who.since.timestamp() - time.time()), 5)
                obs = dlock.observe(dsn, "odd-election")
                first = next(obs)
                obs.close()
                self.assertEqual((first.state, first.fence), ("held", lead.epoch))
            self.assertEqual(held("odd-style") + held("odd-election"), 0)
        finally:
            sql("DROP ROLE dlock_odd")
        self.assertNoThreadLeft()

    def test_fork_child_does_not_believe_it_holds(self):
        """A child of fork() does not renew the lease: it sees it lost at
        once, and its release() neither hangs nor releases the parent's."""
        with dlock.lease(DSN, "forked", ttl=5) as lease:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                try:
                    t = time.monotonic()
                    lost = lease.lost
                    rel = lease.release()
                    msg = "%s %s %.1f" % (lost, rel, time.monotonic() - t)
                except BaseException as ex:  # noqa: B902
                    msg = "error %r" % ex
                os.write(w, msg.encode())
                os._exit(0)
            os.close(w)
            _, status = os.waitpid(pid, 0)
            msg = os.read(r, 200).decode()
            os.close(r)
            lost, rel, took = msg.split()
            self.assertEqual((lost, rel), ("True", "None"), msg)
            self.assertLess(float(took), 1.0)
            self.assertFalse(lease.lost)
            self.assertEqual(held("forked"), 1)
        self.assertEqual(held("forked"), 0)
        self.assertNoThreadLeft()

    def test_unanswered_connect_and_tiny_ttl_are_typed(self):
        """No answer while connecting is dlock.Unavailable, not a bare
        TimeoutError; a TTL shorter than the connection is not either."""
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)                        # accepts, never answers
        port = lsock.getsockname()[1]
        saved = dlock._core.CONNECT_LIMIT
        dlock._core.CONNECT_LIMIT = 1.0
        try:
            with self.assertRaises(dlock.Unavailable):
                dlock.acquire("host=127.0.0.1 port=%d dbname=x" % port, "bh", ttl=0.5)
        finally:
            dlock._core.CONNECT_LIMIT = saved
            lsock.close()
        try:
            lease = dlock.acquire(DSN, "tiny-ttl", ttl=0.001)
            lease.release()
        except dlock.Error:
            pass                               # typed either way
        for bad in (dict(ttl=float("nan")), dict(ttl=float("inf")), dict(wait=float("nan")),
                    dict(renew_every=float("nan")), dict(lock_delay=-1)):
            with self.assertRaises(dlock.InvalidArgument, msg=repr(bad)):
                dlock.lease(DSN, "bad", **dict(dict(ttl=5), **bad))
        with self.assertRaises(dlock.InvalidArgument):
            dlock.lease(DSN, "nul\x00key", ttl=5)
        with self.assertRaises(dlock.InvalidArgument):
            dlock.lease(DSN, "k", ttl=5, holder="a\x00b")
        self.assertNoThreadLeft()

    def test_on_lost_may_release_or_block_without_holding_up_anything(self):
        """on_lost runs in a thread of its own: it may call release() (the
        renewer thread still stops), and one that blocks holds up neither
        the other leases' renewals nor release()."""
        seen = []

        def cb(lease):
            seen.append(lease.release())
        lease = dlock.acquire(DSN, "cb-release", ttl=1.5, on_lost=cb)
        sql("SELECT dlock.forget('cb-release')")
        end = time.monotonic() + 3
        while not seen and time.monotonic() < end:
            time.sleep(0.05)
        self.assertEqual(seen, [False])
        self.assertIsNone(lease.release())     # released already, by on_lost
        end = time.monotonic() + 2
        while dlock_threads() and time.monotonic() < end:
            time.sleep(0.05)
        self.assertNoThreadLeft()

        gate = threading.Event()
        with dlock.lease(DSN, "cb-other", ttl=1.2) as other:
            blocked = dlock.acquire(DSN, "cb-block", ttl=1.2, on_lost=lambda l: gate.wait(20))
            sql("SELECT dlock.forget('cb-block')")
            time.sleep(1.6)                    # past other's TTL: renewed meanwhile?
            self.assertFalse(other.lost, other.lost_reason)
            t = time.monotonic()
            self.assertEqual(blocked.release(), False)
            self.assertLess(time.monotonic() - t, 1.0, "release waited for on_lost")
        gate.set()
        end = time.monotonic() + 2
        while dlock_threads() and time.monotonic() < end:
            time.sleep(0.05)
        self.assertNoThreadLeft()

    def test_async_on_lost_coroutine_is_awaited(self):
        async def main():
            ran = asyncio.Event()

            async def cb(lease):
                ran.set()
            lease = await dlock.aio.acquire(DSN, "acb", ttl=1.5, on_lost=cb)
            sql("SELECT dlock.forget('acb')")
            await asyncio.wait_for(ran.wait(), 3)
            self.assertEqual(await lease.release(), False)
        asyncio.run(main())

    def test_observe_stopped_mid_poll_is_cancelled_in_server(self):
        """An observe interrupted in its long poll (SIGINT in sync code, a
        cancelled task in asyncio) cancels the poll in the server instead
        of leaving it to run out."""
        polls = ("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                 "AND query LIKE '%%dlock.observe%%' AND pid <> pg_backend_pid()")

        def none_left():
            end = time.monotonic() + 3
            while sql(polls)[0][0] and time.monotonic() < end:
                time.sleep(0.05)
            return sql(polls)[0][0] == 0

        obs = dlock.observe(DSN, "obs-cancel", poll=30)
        self.assertEqual(next(obs).state, "none")
        timer = sigint_timer(0.7)
        timer.start()
        with self.assertRaises(KeyboardInterrupt):
            next(obs)
        timer.join()
        obs.close()
        self.assertTrue(none_left(), "the sync poll was cancelled in the server")

        async def amain():
            agen = dlock.aio.observe(DSN, "obs-cancel", poll=30)
            self.assertEqual((await agen.__anext__()).state, "none")
            task = asyncio.ensure_future(agen.__anext__())
            await asyncio.sleep(0.7)
            self.assertEqual(sql(polls)[0][0], 1, "the long poll runs")
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await task
            await agen.aclose()
        asyncio.run(amain())
        self.assertTrue(none_left(), "the async poll was cancelled in the server")
        self.assertNoThreadLeft()

    def test_dropped_lease_is_released(self):
        lease = dlock.acquire(DSN, "dropped", ttl=1.5)
        self.assertEqual(held("dropped"), 1)
        del lease
        end = time.monotonic() + 3
        while held("dropped") and time.monotonic() < end:
            time.sleep(0.1)
        self.assertEqual(held("dropped"), 0)

    def test_fence_on_autocommit_connection_refused(self):
        with dlock.lease(DSN, "item-ac", ttl=5) as lease:
            with psycopg.connect(DSN, autocommit=True) as c:
                with self.assertRaises(dlock.InvalidArgument):
                    lease.fence_write(c)
                with c.transaction():
                    lease.fence_write(c)       # inside a transaction: fine
                    with self.assertRaises(dlock.InvalidArgument):
                        lease.use_fence(c.cursor(name="named"))
            with psycopg.connect(DSN) as c:    # not autocommit: a transaction starts
                lease.fence_write(c)
                c.execute("INSERT INTO item VALUES ('item-ac', 1)")
                c.commit()
        self.assertNoThreadLeft()

    def test_exit_while_holding_releases(self):
        env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run([sys.executable, "-c",
                            "import dlock, sys; l = dlock.acquire(sys.argv[1], 'exiting', ttl=30); "
                            "print(l.fence)", DSN], env=env, capture_output=True, text=True,
                           timeout=30, cwd=tempfile.gettempdir())
        # (cwd: "python -c" puts the current directory first on sys.path,
        # and the tree the tests run in has the extension's dlock.so)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(held("exiting"), 0, "released at exit, not left for its TTL")

    def test_lost_by_our_clock_is_still_given_back(self):
        """A lease lost by the client's clock alone may still be held by
        the server (a late answer, a network back): release() frees it."""
        lease = dlock.acquire(DSN, "clock-lost", ttl=30)
        lease._c().deadline = time.monotonic() - 1     # as after a long pause
        self.assertTrue(lease.lost)
        self.assertEqual(held("clock-lost"), 1)
        self.assertEqual(lease.release(), False)
        self.assertEqual(held("clock-lost"), 0, "given back in the server")
        self.assertNoThreadLeft()

    def test_release_that_finds_it_gone_calls_on_lost(self):
        rec = Recorder()
        lease = dlock.acquire(DSN, "gone-at-release", ttl=30, on_lost=rec)
        sql("SELECT dlock.forget('gone-at-release')")
        self.assertEqual(lease.release(), False)
        self.assertEqual(rec.calls, 1)
        self.assertTrue(lease.lost)
        self.assertNoThreadLeft()

    def test_pool_without_a_free_connection_says_so(self):
        """Renewals share the pool's max_size: a pool kept busy loses the
        lease, and the reason says it was the pool, not the server."""
        from psycopg_pool import AsyncConnectionPool

        async def main():
            pool = AsyncConnectionPool(DSN, min_size=1, max_size=1,
                                       kwargs=dict(autocommit=True))
            await pool.wait()
            try:
                lease = await dlock.aio.acquire(pool, "pool-busy", ttl=1.2)
                async with pool.connection():
                    await asyncio.sleep(1.6)           # the only connection, kept
                self.assertTrue(lease.lost)
                self.assertIn("no connection from the pool", lease.lost_reason)
                await lease.release()
            finally:
                await pool.close()
        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
