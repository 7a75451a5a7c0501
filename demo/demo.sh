#!/bin/bash
#
# demo/demo.sh: the dlock demo, told with the dlock command-line client
# and the Python library.
# tools/demo runs it against a throwaway cluster (PGHOST/PGPORT set, a
# database "demo" with the extension).  Takes under a minute; everything it
# starts is stopped, and its files removed, on the way out.

set -uo pipefail

export PGDATABASE=demo
KEY=stock-sync:warehouse-42
TTL=2s
dir=$(mktemp -d)
pids=()

cleanup()
{
	local pid

	for pid in "${pids[@]}"; do
		kill -CONT "$pid" 2>/dev/null
		kill -TERM "$pid" 2>/dev/null
	done
	wait 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT

# Stop the story when something did not happen as told.
fail()
{
	printf 'demo: %s\n' "$*" >&2
	exit 1
}

say()
{
	printf '\n\033[1m%s\033[0m\n' "$*"
}

sql()
{
	psql -X -q --no-psqlrc -v ON_ERROR_STOP=1 -d demo "$@"
}

show_stock()
{
	sql -c 'SELECT warehouse_id, qty, fence AS written_with_token FROM stock ORDER BY warehouse_id'
}

# The script every worker runs under its lease: it writes the stock it
# computed, presenting its token in the row (the trigger checks it).
cat >"$dir/sync.sh" <<'EOF'
#!/bin/sh
# $1: the quantity this worker computed; if $2 is given, wait for that file
if [ -n "${2:-}" ]; then
	while [ ! -e "$2" ]; do sleep 0.05; done
fi
if out=$(psql -X -q --no-psqlrc -v ON_ERROR_STOP=1 -d demo -c "
	UPDATE stock SET qty = $1, fence = $DLOCK_FENCE WHERE warehouse_id = 42" 2>&1); then
	echo "[worker-$DLOCK_HOLDER] wrote qty=$1 with token $DLOCK_FENCE"
else
	echo "[worker-$DLOCK_HOLDER] its write of qty=$1 with token $DLOCK_FENCE was refused:"
	printf '%s\n' "$out" | sed 's/^/    /'
fi
EOF
chmod +x "$dir/sync.sh"

say "== The table to protect: stock, with dlock's fencing trigger"
sql <<'EOF'
CREATE TABLE stock (warehouse_id int PRIMARY KEY, qty int NOT NULL, fence bigint);
INSERT INTO stock VALUES (42, 100, NULL);
CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock
	FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('stock-sync:warehouse-{warehouse_id}', 'fence');
EOF
cat <<'EOF'
  Every write to a row of stock must carry the current fencing token of the
  lease "stock-sync:warehouse-{warehouse_id}" in its fence column.
EOF

say "== 1. Two workers start the same job at once"
echo "  \$ dlock run --ttl=$TTL $KEY -- sync.sh   (twice, at the same moment)"
for w in A B; do
	DLOCK_HOLDER=$w dlock run --ttl=$TTL --holder="worker-$w" "$KEY" -- \
		sh -c 'sleep 1; exec "$0" "$@"' "$dir/sync.sh" 90 \
		>"$dir/$w.out" 2>&1 &
	pids+=($!)
done
rcA=0; rcB=0
wait "${pids[0]}" || rcA=$?
wait "${pids[1]}" || rcB=$?
pids=()
for w in A B; do
	rc=rcA; [ $w = B ] && rc=rcB
	printf '  worker-%s: exit status %d %s\n' "$w" "${!rc}" \
		"$([ "${!rc}" -eq 75 ] && echo '(75: the key was busy; it did nothing)' || echo '(it held the lease and wrote)')"
	sed 's/^/    /' "$dir/$w.out"
done
[ $((rcA + rcB)) -eq 75 ] || fail "expected one worker to run and one to exit 75, got $rcA and $rcB"
show_stock

say "== 2. Worker C takes the lease, then its process freezes past the TTL"
cat <<'EOF'
  C's command is about to write (it waits for a signal from us), when its
  dlock process is frozen with SIGSTOP, as a long GC pause or a swapped-out
  VM would freeze it: nothing renews C's lease any more.
EOF
DLOCK_HOLDER=C dlock run --ttl=$TTL --on-lost=ignore --holder=worker-C "$KEY" -- \
	"$dir/sync.sh" 70 "$dir/go-C" >"$dir/C.out" 2>&1 &
c_pid=$!
pids+=("$c_pid")
# wait until C holds the lease
for _ in $(seq 1 100); do
	[ "$(sql -Atc "SELECT holder FROM dlock.lease_status WHERE key = '$KEY' AND state = 'held'")" = worker-C ] && break
	sleep 0.1
done
[ "$(sql -Atc "SELECT holder FROM dlock.lease_status WHERE key = '$KEY' AND state = 'held'")" = worker-C ] ||
	fail "worker-C did not get the lease"
sql -c "SELECT key, holder, fence, state FROM dlock.lease_status WHERE key = '$KEY'"
kill -STOP "$c_pid"
echo "  (worker-C's dlock process is stopped; waiting for its $TTL lease to run out)"
sleep 3
sql -c "SELECT key, holder, fence, state FROM dlock.lease_status WHERE key = '$KEY'"

say "== 3. Worker D takes over and writes with its newer token"
DLOCK_HOLDER=D dlock run --ttl=$TTL --holder=worker-D "$KEY" -- \
	"$dir/sync.sh" 80 2>&1 | sed 's/^/    /'
show_stock

say "== 4. Worker C wakes up and writes its stale result"
touch "$dir/go-C"
kill -CONT "$c_pid"
rcC=0
wait "$c_pid" || rcC=$?
pids=()
sed 's/^/    /' "$dir/C.out"
printf '  worker-C: exit status %d (79: dlock run found its lease lost)\n' "$rcC"
[ "$rcC" -eq 79 ] || fail "expected worker-C to exit 79, got $rcC"
grep -q 'refused' "$dir/C.out" || fail "worker-C's stale write was not refused"
show_stock
cat <<'EOF'
  The database refused C's write: it carried the token of the lease C lost, and
  the key's current token is newer.  The stock still shows D's value.
EOF

say "== 5. The same story with the Python library (clients/python)"
cat <<'EOF'
  Worker E is a Python program: dlock.lease() takes the lease and renews it
  in the background every third of the TTL; lease.transaction(conn) opens a
  transaction that presents the token before E's write.  E is frozen
  before its write, worker F takes over, then E wakes up.
EOF
cat >"$dir/worker_e.py" <<'EOF'
import os, sys, time
import psycopg
import dlock

key, go = sys.argv[1], sys.argv[2]
conn = psycopg.connect("dbname=demo", autocommit=True)
with dlock.lease("dbname=demo", key, ttl=2, holder="worker-E",
                 on_lost=lambda l: print("[worker-E] on_lost:", l.lost_reason, flush=True)) as lease:
    print("[worker-E] holds the lease with token", lease.fence, flush=True)
    while not os.path.exists(go):
        time.sleep(0.05)
    try:
        with lease.transaction(conn) as cur:
            cur.execute("UPDATE stock SET qty = 60, fence = %s WHERE warehouse_id = 42",
                        (lease.fence,))
        print("[worker-E] wrote qty=60", flush=True)
    except dlock.LeaseLost as ex:
        print("[worker-E] the library refused to write: %s" % ex, flush=True)
    # had E written without the library's check, the database refuses it
    try:
        with conn.transaction():
            conn.execute("SELECT dlock.use_fence(%s, %s)", (key, lease.fence))
            conn.execute("UPDATE stock SET qty = 60, fence = %s WHERE warehouse_id = 42",
                         (lease.fence,))
        print("[worker-E] its raw write was accepted", flush=True)
    except psycopg.Error as ex:
        print("[worker-E] its raw write with token %d was refused: %s %s"
              % (lease.fence, ex.sqlstate, ex.diag.message_primary), flush=True)
EOF
# the library of this tree, or (DLOCK_DEMO_INSTALLED, tools/demo --installed)
# the one the python3-dlock package installed
if [ -n "${DLOCK_DEMO_INSTALLED:-}" ]; then
	unset PYTHONPATH
else
	export PYTHONPATH
	PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/clients/python"
fi
/usr/bin/python3 "$dir/worker_e.py" "$KEY" "$dir/go-E" >"$dir/E.out" 2>&1 &
e_pid=$!
pids+=("$e_pid")
for _ in $(seq 1 100); do
	grep -qs 'holds the lease' "$dir/E.out" && break
	sleep 0.1
done
grep -q 'holds the lease' "$dir/E.out" || { cat "$dir/E.out"; fail "worker-E did not get the lease"; }
sed 's/^/    /' "$dir/E.out"
kill -STOP "$e_pid"
echo "  (worker-E is stopped; waiting for its 2s lease to run out)"
sleep 3
DLOCK_HOLDER=F dlock run --ttl=$TTL --holder=worker-F "$KEY" -- \
	"$dir/sync.sh" 50 2>&1 | sed 's/^/    /'
touch "$dir/go-E"
kill -CONT "$e_pid"
wait "$e_pid"
pids=()
sed '1d; s/^/    /' "$dir/E.out"
grep -q 'library refused' "$dir/E.out" || fail "worker-E's library did not report the loss"
grep -q 'raw write with token .* was refused: LF001' "$dir/E.out" ||
	fail "worker-E's raw stale write was not refused"
show_stock
cat <<'EOF'
  E's library knew from its own monotonic clock that no renewal had been
  confirmed before the lease's deadline: it reported the loss and refused
  the write without asking the database.  The write E forced anyway was
  refused by the trigger (LF001).  The Go library (clients/go) does the
  same; its lease's Context() is cancelled on loss.
EOF

say "== What just happened"
cat <<'EOF'
  The lease gave liveness: when C froze, D could take over after the TTL
  instead of waiting forever.  The fencing token gave safety: C's late
  write carried an old token, and the trigger refused it in the same
  transaction as the write, so there is no window in between.  dlock run
  also stops a command whose lease it cannot confirm (--on-lost, here
  switched off to show the database's refusal).

  A lock is still not idempotency: a message delivered twice, or a client
  retrying after a timeout, must be handled by unique constraints and
  idempotency keys on the data itself.
EOF
