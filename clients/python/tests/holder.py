"""The paused worker of test_paused_worker: holds a lease through the
library and writes under it (fenced) in a loop, one line per attempt:
WROTE n, REFUSED <error class> <sqlstate>; after its first refusal it tries
once more with a raw write presenting its old token (RAW <sqlstate> or
RAW ACCEPTED) and exits.  The parent SIGSTOPs it past its TTL."""
import os
import sys
import time

import psycopg

import dlock

dsn, key, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])


def lost(lease):
    print("CALLBACK", flush=True)


conn = psycopg.connect(dsn, autocommit=True)
with dlock.lease(dsn, key, ttl=ttl, on_lost=lost) as lease:
    print("GRANTED", lease.fence, flush=True)
    n = 0
    while True:
        n += 1
        try:
            with lease.transaction(conn) as cur:
                cur.execute("UPDATE stock SET qty = %s, fence = %s WHERE id = 1",
                            (n, lease.fence))
            print("WROTE", n, flush=True)
        except dlock.LeaseLost as ex:
            print("REFUSED", type(ex).__name__, ex.sqlstate, flush=True)
            break
        time.sleep(0.3)
    try:
        with conn.transaction():
            conn.execute("SELECT dlock.use_fence(%s, %s)", (key, lease.fence))
            conn.execute("UPDATE stock SET qty = -1 WHERE id = 1")
        print("RAW ACCEPTED", flush=True)
    except psycopg.Error as ex:
        print("RAW", ex.sqlstate, flush=True)
print("DONE", flush=True)
os._exit(0)
