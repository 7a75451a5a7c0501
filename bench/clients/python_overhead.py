#!/usr/bin/python3
"""Overhead of the Python client's acquire + release over the raw SQL
calls (issue 21): cycles per second of

  raw:     try_acquire + release, two statements over one psycopg
           connection per client, reused (the same SQL the library sends);
  library: with dlock.lease(pool, key): the same two statements over a
           pool of the client count (psycopg_pool), plus what the library
           adds (its service thread, the renewer task, the deadline);

at 1 and 8 clients (threads), random keys out of 100,000, one run of
DURATION seconds each, side by side, with the ratio library/raw.
Usage: bench/clients/python_overhead.py "host=... dbname=..." [DURATION]
(dlock installed in that database).  Not part of CI.
"""
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "clients", "python"))
import psycopg  # noqa: E402
import psycopg_pool  # noqa: E402

import dlock  # noqa: E402
from dlock import _core  # noqa: E402

DSN = sys.argv[1]
DURATION = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
TTL = _core._ms(30)


def raw_worker(stop, counts, i):
    with psycopg.connect(DSN, autocommit=True, prepare_threshold=None) as c:
        n = 0
        while not stop.is_set():
            key = "bench-%d" % random.randrange(100000)
            row = c.execute(_core.SQL_TRY_ACQUIRE,
                            (key, TTL, "bench", None, False, 1, "exclusive"),
                            prepare=False).fetchone()
            if row:
                c.execute(_core.SQL_RELEASE, (key, row[1]), prepare=False)
                n += 1
        counts[i] = n


def lib_worker(pool, stop, counts, i):
    n = 0
    while not stop.is_set():
        key = "bench-%d" % random.randrange(100000)
        try:
            with dlock.lease(pool, key, ttl=30, holder="bench"):
                pass
            n += 1
        except dlock.Busy:
            pass
    counts[i] = n


def run(clients, lib):
    stop = threading.Event()
    counts = [0] * clients
    pool = None
    if lib:
        pool = psycopg_pool.ConnectionPool(DSN, min_size=clients, max_size=clients)
        pool.wait()
        # one lease held throughout keeps the library's thread and its
        # mirror pool up, as in a program that holds leases all the time
        keeper = dlock.acquire(pool, "bench-keeper", ttl=30)
        threads = [threading.Thread(target=lib_worker, args=(pool, stop, counts, i))
                   for i in range(clients)]
    else:
        threads = [threading.Thread(target=raw_worker, args=(stop, counts, i))
                   for i in range(clients)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    time.sleep(DURATION)
    stop.set()
    for t in threads:
        t.join()
    took = time.monotonic() - t0
    if lib:
        keeper.release()
        pool.close()
    return sum(counts) / took


print("clients  raw cycles/s  library cycles/s  library/raw")
for clients in (1, 8):
    raw = run(clients, False)
    lib = run(clients, True)
    print("%7d  %12.0f  %16.0f  %11.2f" % (clients, raw, lib, lib / raw))
