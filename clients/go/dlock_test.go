package dlock

// The library against a real server (t/client_go.pl starts it, with
// PgBouncer in front, and sets the environment):
//
//	DLOCK_TEST_DSN          lib/pq connection string of the server (required)
//	DLOCK_TEST_TCP          host:port of the server over TCP (the proxy's target)
//	DLOCK_TEST_BOUNCER_DSN  PgBouncer, transaction mode, a pool of 2 server connections
//	DLOCK_TEST_PGDATA, DLOCK_TEST_BINDIR, DLOCK_TEST_PGLOG
//	                        to stop, kill and restart the server
//
// Without DLOCK_TEST_DSN every test is skipped (t/client_go.pl counts the
// passes, so a run that skipped is red there).

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lib/pq"
)

var bg = context.Background()

func TestMain(m *testing.M) {
	if os.Getenv("DLOCK_TEST_CHILD") == "paused" {
		pausedChild()
		return
	}
	if dsn := os.Getenv("DLOCK_TEST_DSN"); dsn != "" {
		db, err := sql.Open("postgres", dsn)
		if err == nil {
			_, err = db.Exec(`
				CREATE EXTENSION IF NOT EXISTS dlock;
				CREATE TABLE IF NOT EXISTS gotest (k text PRIMARY KEY, n int NOT NULL, fence bigint);
				DROP TRIGGER IF EXISTS gotest_fence ON gotest;
				CREATE TRIGGER gotest_fence BEFORE INSERT OR UPDATE OR DELETE ON gotest
				  FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{k}', 'fence');`)
			db.Close()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "setup:", err)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

func need(t *testing.T, vars ...string) {
	t.Helper()
	for _, v := range append([]string{"DLOCK_TEST_DSN"}, vars...) {
		if os.Getenv(v) == "" {
			t.Skipf("%s is not set", v)
		}
	}
}

func open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func direct(t *testing.T) *sql.DB { return open(t, os.Getenv("DLOCK_TEST_DSN")) }

// fencedWrite adds 1 to gotest's row k in a transaction that presents the
// lease's token through the library.
func fencedWrite(ctx context.Context, db *sql.DB, l *Lease, k string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := l.UseFence(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO gotest VALUES ($1, 1, NULL)
		ON CONFLICT (k) DO UPDATE SET n = gotest.n + 1`, k); err != nil {
		return wrap("write", err)
	}
	return tx.Commit()
}

// rawFencedWrite presents token fence for key k without the library.
func rawFencedWrite(db *sql.DB, k string, fence int64) error {
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`SELECT dlock.use_fence($1, $2)`, k, fence); err != nil {
		return err
	}
	if _, err := tx.Exec(`UPDATE gotest SET n = n + 1 WHERE k = $1`, k); err != nil {
		return err
	}
	return tx.Commit()
}

func isLF001(err error) bool { return sqlState(err) == "LF001" }

func count(t *testing.T, db *sql.DB, q string, args ...interface{}) int {
	t.Helper()
	var n int
	if err := db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func held(t *testing.T, db *sql.DB, key string) int {
	return count(t, db, `SELECT count(*) FROM dlock.lease_status
		WHERE split_part(key, U&'\001F', 1) = $1 AND state = 'held'`, key)
}

// leaseGoroutines counts the goroutines running code of this package
// (the renewer, calls in flight, Observe's follower).
func leaseGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "dlock.(*Lease)") || strings.Contains(g, "dlock.Observe") ||
			strings.Contains(g, "dlock.(*Observer)") || strings.Contains(g, "dlock.grant") {
			n++
		}
	}
	return n
}

// noGoroutinesLeft waits up to 3 s for the package's goroutines to end and
// the total to come back to baseline.
func noGoroutinesLeft(t *testing.T, baseline int) {
	t.Helper()
	var mine, total int
	for i := 0; i < 60; i++ {
		mine, total = leaseGoroutines(), runtime.NumGoroutine()
		if mine == 0 && total <= baseline {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	t.Errorf("goroutines left: %d of this package, %d in all (baseline %d)\n%s",
		mine, total, baseline, buf[:runtime.Stack(buf, true)])
}

// The basics: a lease kept past its TTL by renewals, fenced writes,
// Release, and the errors of the API.
func TestAcquireRenewRelease(t *testing.T) {
	need(t)
	db := direct(t)
	l, err := Acquire(bg, db, "go-basic", Options{TTL: time.Second, Holder: "go-holder", LockDelay: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM dlock.lease_status s JOIN dlock.leases l USING (key)
		WHERE key = 'go-basic' AND s.holder = 'go-holder' AND l.lock_delay = '2 s'`); n != 1 {
		t.Errorf("holder and lock_delay not as given (%d rows)", n)
	}
	if l.Fence() < 1 || len(l.Owner()) != 36 {
		t.Errorf("fence %d, owner %q", l.Fence(), l.Owner())
	}
	time.Sleep(2500 * time.Millisecond) // 2.5 TTLs: renewed meanwhile
	if err := l.Err(); err != nil {
		t.Fatalf("lost a renewed lease: %v", err)
	}
	if r := l.Remaining(); r <= 0 || r > time.Second {
		t.Errorf("remaining %v", r)
	}
	if err := fencedWrite(bg, db, l, "go-basic"); err != nil {
		t.Errorf("fenced write: %v", err)
	}
	if _, err := Acquire(bg, db, "go-basic", Options{TTL: time.Second}); !errors.Is(err, ErrBusy) {
		t.Errorf("second acquire: %v, want ErrBusy", err)
	}
	if err := l.Release(bg); err != nil {
		t.Errorf("release: %v", err)
	}
	if !errors.Is(l.Err(), ErrReleased) || l.Context().Err() == nil {
		t.Errorf("after release: Err %v, Context %v", l.Err(), l.Context().Err())
	}
	if err := fencedWrite(bg, db, l, "go-basic"); !errors.Is(err, ErrReleased) {
		t.Errorf("fenced write after release: %v", err)
	}
	if n := held(t, db, "go-basic"); n != 0 {
		t.Errorf("%d leases held after release", n)
	}
	// the server's refusals come typed, with the driver's error inside
	_, err = Acquire(bg, db, "", Options{})
	var pqe *pq.Error
	if !errors.Is(err, ErrInvalid) || !errors.As(err, &pqe) || pqe.Code != "22023" {
		t.Errorf("empty key: %v", err)
	}
	if _, err := Acquire(bg, db, "k", Options{TTL: time.Second, RenewEvery: 2 * time.Second}); !errors.Is(err, ErrInvalid) {
		t.Errorf("RenewEvery over TTL: %v", err)
	}
}

// A renewal the server refuses (read-only: 25006, as after a failover) is
// retried until the deadline: the lease survives a short refusal, and is
// lost at its deadline, not before, when the refusals go on.
func TestRefusedRenewalRetried(t *testing.T) {
	need(t)
	admin := direct(t)
	if _, err := admin.Exec(`DROP ROLE IF EXISTS go_ro; CREATE ROLE go_ro LOGIN`); err != nil {
		t.Fatal(err)
	}
	readOnly := func(on bool) {
		t.Helper()
		if _, err := admin.Exec(fmt.Sprintf(`ALTER ROLE go_ro SET default_transaction_read_only = %v`, on)); err != nil {
			t.Fatal(err)
		}
	}
	db := open(t, os.Getenv("DLOCK_TEST_DSN")+" user=go_ro")
	db.SetMaxIdleConns(0) // every call on a new session, which sees the role's setting
	lostc := make(chan error, 1)
	l, err := Acquire(bg, db, "go-readonly", Options{TTL: 1500 * time.Millisecond, RenewEvery: 300 * time.Millisecond,
		OnLost: func(err error) { lostc <- err }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(bg)
	readOnly(true)
	time.Sleep(800 * time.Millisecond) // two or three refused renewals
	readOnly(false)
	time.Sleep(700 * time.Millisecond)
	if err := l.Err(); err != nil {
		t.Fatalf("lost after a short refusal: %v", err)
	}
	readOnly(true)
	defer readOnly(false)
	f := time.Now()
	select {
	case err := <-lostc:
		var le *LostError
		if !errors.As(err, &le) || le.Reason != LostDeadline || !errors.Is(err, ErrReadOnly) {
			t.Errorf("lost: %v, want the deadline after read-only refusals", err)
		}
		if d := le.At.Sub(f); d < 1500*time.Millisecond-300*time.Millisecond-200*time.Millisecond {
			t.Errorf("lost %v after the refusals began: before its deadline", d)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("not lost at its deadline")
	}
}

// A wait that runs out is ErrBusy (55P03); a grant that waited is
// confirmed by a renewal before it is handed over.
func TestWait(t *testing.T) {
	need(t)
	db := direct(t)
	a, err := Acquire(bg, db, "go-wait", Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(bg, db, "go-wait", Options{TTL: time.Second, Wait: 200 * time.Millisecond})
	var e *Error
	if !errors.Is(err, ErrBusy) || !errors.As(err, &e) || e.SQLState != "55P03" {
		t.Errorf("wait ran out: %v", err)
	}
	go func() {
		time.Sleep(800 * time.Millisecond)
		a.Release(bg)
	}()
	start := time.Now()
	b, err := Acquire(bg, db, "go-wait", Options{TTL: 900 * time.Millisecond, Wait: Forever})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(bg)
	waited := time.Since(start)
	// the confirming renewal was sent after the grant arrived, so the
	// deadline is a whole TTL (less a round trip) from then
	if r := b.Remaining(); waited < 600*time.Millisecond || r < 700*time.Millisecond {
		t.Errorf("waited %v, remaining %v: not confirmed after the wait", waited, r)
	}
	if b.Fence() <= a.Fence() {
		t.Errorf("fence %d after %d", b.Fence(), a.Fence())
	}
}

// A renewal that returns NULL loses the lease at once, long before its
// deadline; OnLost is called once.
func TestNullRenewalLosesAtOnce(t *testing.T) {
	need(t)
	db := direct(t)
	var calls int32
	lostc := make(chan error, 2)
	l, err := Acquire(bg, db, "go-null", Options{TTL: 10 * time.Second, RenewEvery: 200 * time.Millisecond,
		OnLost: func(err error) { atomic.AddInt32(&calls, 1); lostc <- err }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(bg)
	if _, err := db.Exec(`SELECT dlock.forget('go-null')`); err != nil {
		t.Fatal(err)
	}
	forgot := time.Now()
	select {
	case err := <-lostc:
		var le *LostError
		if !errors.As(err, &le) || le.Reason != LostRenewal {
			t.Errorf("lost: %v, want LostRenewal", err)
		}
		if d := time.Since(forgot); d > time.Second {
			t.Errorf("loss reported %v after the lease was forgotten", d)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("a NULL renewal did not lose the lease within 3 s (the deadline is 10 s away)")
	}
	<-l.Context().Done()
	time.Sleep(300 * time.Millisecond)
	if c := atomic.LoadInt32(&calls); c != 1 {
		t.Errorf("OnLost called %d times", c)
	}
}

// A write the server refuses (LF001) comes back as ErrLost, with the
// driver's error inside, even before the library has noticed the loss.
func TestUseFenceRefusedIsLost(t *testing.T) {
	need(t)
	db := direct(t)
	logged := make(chan string, 1)
	l, err := Acquire(bg, db, "go-lf001", Options{TTL: 10 * time.Second, RenewEvery: 9 * time.Second,
		OnLost: func(error) { panic("in OnLost") },
		Logf:   func(f string, args ...interface{}) { logged <- fmt.Sprintf(f, args...) }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(bg)
	if err := fencedWrite(bg, db, l, "go-lf001"); err != nil {
		t.Fatalf("first write: %v", err)
	}
	if _, err := db.Exec(`SELECT dlock.forget('go-lf001')`); err != nil {
		t.Fatal(err)
	}
	if l.Err() != nil {
		t.Fatal("the library knew of the loss already: the test proves nothing")
	}
	err = fencedWrite(bg, db, l, "go-lf001")
	var pqe *pq.Error
	var e *Error
	if !errors.Is(err, ErrLost) || !errors.As(err, &e) || e.SQLState != "LF001" ||
		!errors.As(err, &pqe) {
		t.Errorf("write under a forgotten lease: %v, want LF001 as ErrLost", err)
	}
	var le *LostError
	if !errors.As(l.Err(), &le) || le.Reason != LostFenced || l.Context().Err() == nil {
		t.Errorf("after LF001: Err %v", l.Err())
	}
	select {
	case s := <-logged:
		if !strings.Contains(s, "in OnLost") {
			t.Errorf("logged %q", s)
		}
	case <-time.After(2 * time.Second):
		t.Error("a panic in OnLost was not logged")
	}
}

// A session-bound lease is lost as soon as its connection fails.
func TestSessionBound(t *testing.T) {
	need(t)
	db := direct(t)
	l, err := Acquire(bg, db, "go-sb", Options{TTL: 10 * time.Second, RenewEvery: 300 * time.Millisecond, SessionBound: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(bg)
	if _, err := db.Exec(`SELECT pg_terminate_backend(pid) FROM dlock.lease_status
		WHERE key = 'go-sb' AND state = 'held' AND session_bound`); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
		var le *LostError
		if !errors.As(l.Err(), &le) || (le.Reason != LostConnection && le.Reason != LostRenewal) {
			t.Errorf("lost: %v", l.Err())
		}
	case <-time.After(3 * time.Second):
		t.Fatal("not lost 3 s after its connection ended")
	}
}

// The paused worker: a child process holding a lease is stopped past its
// TTL; another takes the key over and writes; the child, continued,
// writes again at once through the library: it gets the loss (or LF001),
// never success, and its raw write with the old token is refused.
func TestPausedWorker(t *testing.T) {
	need(t)
	db := direct(t)
	const key = "go-paused"
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "DLOCK_TEST_CHILD=paused", "DLOCK_TEST_KEY="+key)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var all []string
	// a few writes, then stop it between two of them (not inside a
	// transaction, which would hold the key's lock while it is stopped)
	idle := 0
	for idle < 3 {
		select {
		case s, ok := <-lines:
			if !ok {
				t.Fatalf("child ended: %v", all)
			}
			all = append(all, s)
			if strings.HasPrefix(s, "IDLE") {
				idle++
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("child said: %v", all)
		}
	}
	for try := 0; ; try++ {
		syscall.Kill(cmd.Process.Pid, syscall.SIGSTOP)
		if count(t, db, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'paused-child' AND state <> 'idle'`) == 0 {
			break
		}
		if try == 5 {
			t.Fatal("the child is always stopped inside a transaction")
		}
		syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
		time.Sleep(50 * time.Millisecond)
	}
	stopped := time.Now()
	before := count(t, db, `SELECT n FROM gotest WHERE k = $1`, key)
	time.Sleep(time.Second + 300*time.Millisecond - time.Since(stopped)) // past its TTL of 1 s

	b, err := Acquire(bg, db, key, Options{TTL: 10 * time.Second})
	if err != nil {
		syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
		t.Fatalf("takeover: %v", err)
	}
	defer b.Release(bg)
	if err := fencedWrite(bg, db, b, key); err != nil {
		t.Fatalf("the new holder's write: %v", err)
	}
	after := count(t, db, `SELECT n FROM gotest WHERE k = $1`, key)
	syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
	done := make(chan error, 1)
	go func() {
		for s := range lines {
			all = append(all, s)
		}
		done <- cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("child: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("child did not finish: %v", all)
	}
	t.Logf("child: %v", all)
	oks, first := 0, ""
	for _, s := range all {
		f := strings.Fields(s)
		if f[0] != "RES" {
			continue
		}
		if f[2] == "OK" {
			if first != "" {
				t.Errorf("a write succeeded after a refused one: %v", all)
			}
			oks++
		} else if first == "" {
			first = f[2]
		}
	}
	if oks != before {
		t.Errorf("the child reports %d accepted writes, the table %d before the takeover", oks, before)
	}
	if first != "LOST" && first != "LF001" {
		t.Errorf("first write after the pause: %q, want LOST or LF001", first)
	}
	if n := count(t, db, `SELECT n FROM gotest WHERE k = $1`, key); n != after {
		t.Errorf("the table changed after the takeover's write: %d, was %d", n, after)
	}
	for _, want := range []string{"RAW LF001", "CTXDONE true"} {
		found := false
		for _, s := range all {
			found = found || s == want
		}
		if !found {
			t.Errorf("child did not say %q: %v", want, all)
		}
	}
}

// pausedChild is the paused worker's process: it takes the lease (TTL 1s)
// and writes under it every 100 ms; at the first write the library or the
// server refuses, it tries a raw write with the old token, says whether
// the lease's Context is done, and exits.
func pausedChild() {
	key := os.Getenv("DLOCK_TEST_KEY")
	db, err := sql.Open("postgres", os.Getenv("DLOCK_TEST_DSN")+" application_name=paused-child")
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	l, err := Acquire(bg, db, key, Options{TTL: time.Second})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println("GRANTED", l.Fence())
	for i := 0; ; i++ {
		err := fencedWrite(bg, db, l, key)
		switch {
		case err == nil:
			fmt.Println("RES", i, "OK")
			fmt.Println("IDLE", i)
			time.Sleep(200 * time.Millisecond)
			continue
		case isLF001(err):
			fmt.Println("RES", i, "LF001")
		case errors.Is(err, ErrLost):
			fmt.Println("RES", i, "LOST")
		default:
			fmt.Println("RES", i, "ERR", strings.ReplaceAll(err.Error(), " ", "_"))
		}
		break
	}
	if err := rawFencedWrite(db, key, l.Fence()); isLF001(err) {
		fmt.Println("RAW LF001")
	} else {
		fmt.Println("RAW", err)
	}
	fmt.Println("CTXDONE", l.Context().Err() != nil)
	l.Release(bg)
}

// serverAway runs one "database goes away" case: a lease through the
// proxy, the fault at F; the loss must be reported by the deadline timer
// (not long before: no NULL said so), no later than F + TTL + slack, and
// at its deadline; then the server comes back, the old token is refused,
// and a new lease works.
func serverAway(t *testing.T, fault, recover func(t *testing.T, p *proxy)) {
	need(t, "DLOCK_TEST_TCP", "DLOCK_TEST_PGDATA", "DLOCK_TEST_BINDIR")
	const ttl = 2 * time.Second
	key := "go-away-" + t.Name()
	p := newProxy(t, os.Getenv("DLOCK_TEST_TCP"))
	db := open(t, fmt.Sprintf("host=127.0.0.1 port=%d dbname=postgres sslmode=disable connect_timeout=5", p.addr().Port))
	baseline := runtime.NumGoroutine()
	lostc := make(chan error, 1)
	l, err := Acquire(bg, db, key, Options{TTL: ttl, OnLost: func(err error) { lostc <- err }})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := fencedWrite(bg, db, l, key); err != nil {
		t.Fatalf("write before the fault: %v", err)
	}
	l.mu.Lock()
	before := l.deadline
	l.mu.Unlock()
	f := time.Now()
	fault(t, p)
	var lost *LostError
	select {
	case err := <-lostc:
		errors.As(err, &lost)
	case <-time.After(ttl + 3*time.Second):
		t.Fatal("not reported lost within TTL + 3 s")
	}
	l.mu.Lock()
	deadline := l.deadline
	l.mu.Unlock()
	el := lost.At.Sub(f)
	t.Logf("loss reported %v after the fault (%v), %v after its deadline; %s", el, lost.Reason,
		lost.At.Sub(deadline), lost.Error())
	if lost.Reason != LostDeadline {
		t.Errorf("reason %q, want the deadline", lost.Reason)
	}
	if el > ttl+300*time.Millisecond {
		t.Errorf("loss reported %v after the fault: later than TTL + 300 ms", el)
	}
	// the last confirmed renewal was sent at most RenewEvery before the
	// fault (plus a round trip)
	if el < ttl-ttl/3-300*time.Millisecond {
		t.Errorf("loss reported %v after the fault: long before the deadline", el)
	}
	if d := lost.At.Sub(deadline); d < 0 || d > 200*time.Millisecond || deadline.Sub(before) < 0 {
		t.Errorf("loss reported %v after its deadline", d)
	}
	if err := l.UseFence(bg, nil); !errors.Is(err, ErrLost) {
		t.Errorf("UseFence after the loss: %v", err)
	}

	recover(t, p)
	time.Sleep(300 * time.Millisecond) // the server's expiry is a moment after our deadline
	dd := direct(t)
	var derr error
	for i := 0; i < 100; i++ {
		if derr = dd.Ping(); derr == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if derr != nil {
		t.Fatalf("server not back: %v", derr)
	}
	if err := rawFencedWrite(dd, key, l.Fence()); !isLF001(err) {
		t.Errorf("raw write with the old token after the loss: %v, want LF001", err)
	}
	if err := l.Release(bg); !errors.Is(err, ErrLost) {
		t.Errorf("release of the lost lease: %v", err)
	}
	var n *Lease
	for i := 0; i < 50; i++ {
		ctx, cancel := context.WithTimeout(bg, 3*time.Second)
		n, err = Acquire(ctx, db, key, Options{TTL: ttl, Wait: 2 * time.Second})
		cancel()
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("a new lease once the server is back: %v", err)
	}
	if err := fencedWrite(bg, db, n, key); err != nil {
		t.Errorf("the new lease's write: %v", err)
	}
	if err := n.Release(bg); err != nil {
		t.Errorf("release: %v", err)
	}
	p.closeConns() // stuck driver calls of the blackhole return now
	db.Close()
	noGoroutinesLeft(t, baseline)
}

func pgctl(t *testing.T, args ...string) {
	t.Helper()
	args = append([]string{"-D", os.Getenv("DLOCK_TEST_PGDATA")}, args...)
	out, err := exec.Command(filepath.Join(os.Getenv("DLOCK_TEST_BINDIR"), "pg_ctl"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("pg_ctl %v: %v\n%s", args, err, out)
	}
}

func startServer(t *testing.T, _ *proxy) {
	t.Helper()
	var err error
	for i := 0; i < 50; i++ {
		args := []string{"-D", os.Getenv("DLOCK_TEST_PGDATA"), "-w", "-l", os.Getenv("DLOCK_TEST_PGLOG"), "start"}
		var out []byte
		out, err = exec.Command(filepath.Join(os.Getenv("DLOCK_TEST_BINDIR"), "pg_ctl"), args...).CombinedOutput()
		if err == nil {
			return
		}
		err = fmt.Errorf("%v: %s", err, out)
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("could not restart the server: %v", err)
}

func TestServerStopImmediate(t *testing.T) {
	serverAway(t, func(t *testing.T, _ *proxy) { pgctl(t, "-m", "immediate", "stop") }, startServer)
}

func TestServerKill9(t *testing.T) {
	serverAway(t, func(t *testing.T, _ *proxy) {
		b, err := os.ReadFile(filepath.Join(os.Getenv("DLOCK_TEST_PGDATA"), "postmaster.pid"))
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}, startServer)
}

func TestNetworkBlackhole(t *testing.T) {
	serverAway(t, func(t *testing.T, p *proxy) { p.blackhole(true) },
		func(t *testing.T, p *proxy) { p.blackhole(false); p.closeConns() })
}

// holdMany holds n leases through db for hold, writing under each now and
// then: none may be lost, every write accepted.
func holdMany(t *testing.T, db *sql.DB, prefix string, n int, hold time.Duration) {
	t.Helper()
	ls := make([]*Lease, n)
	for i := range ls {
		var err error
		ls[i], err = Acquire(bg, db, fmt.Sprintf("%s-%d", prefix, i), Options{TTL: 1500 * time.Millisecond})
		if err != nil {
			t.Fatalf("lease %d: %v", i, err)
		}
	}
	var wg sync.WaitGroup
	var failed int32
	for i, l := range ls {
		wg.Add(1)
		go func(i int, l *Lease) {
			defer wg.Done()
			for end := time.Now().Add(hold); time.Now().Before(end); time.Sleep(400 * time.Millisecond) {
				if err := fencedWrite(bg, db, l, fmt.Sprintf("%s-%d", prefix, i)); err != nil {
					t.Errorf("lease %d: write: %v", i, err)
					atomic.AddInt32(&failed, 1)
					return
				}
			}
		}(i, l)
	}
	wg.Wait()
	for i, l := range ls {
		if err := l.Err(); err != nil {
			t.Errorf("lease %d lost: %v", i, err)
		}
		if err := l.Release(bg); err != nil {
			t.Errorf("lease %d: release: %v", i, err)
		}
	}
	if h := count(t, direct(t), `SELECT count(*) FROM dlock.lease_status WHERE key LIKE $1 AND state = 'held'`, prefix+"-%"); h != 0 {
		t.Errorf("%d leases still held", h)
	}
}

// Behind PgBouncer in transaction mode, 8 leases over 2 server
// connections: all renew, none is lost, fencing works.
func TestPgBouncerSmallPool(t *testing.T) {
	need(t, "DLOCK_TEST_BOUNCER_DSN")
	db := open(t, os.Getenv("DLOCK_TEST_BOUNCER_DSN"))
	holdMany(t, db, "go-bouncer", 8, 3*time.Second)
}

// One *sql.DB with 2 connections shared by 20 leases and their writers.
func TestSharedPool(t *testing.T) {
	need(t)
	db := direct(t)
	db.SetMaxOpenConns(2)
	holdMany(t, db, "go-shared", 20, 3*time.Second)
}

// Cancellation and shutdown leave no lease and no goroutine: an acquire
// cancelled while it waits (also when the key is granted to it at the
// moment of the cancellation), a lease whose work is cancelled, a lease
// whose work panics.
func TestCancelLeavesNothing(t *testing.T) {
	need(t)
	db := direct(t)
	db.SetMaxOpenConns(4)
	if err := db.Ping(); err != nil {
		t.Fatal(err)
	}
	baseline := runtime.NumGoroutine()

	a, err := Acquire(bg, db, "go-cancel", Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	errc := make(chan error, 1)
	go func() {
		l, err := Acquire(ctx, db, "go-cancel", Options{TTL: 5 * time.Second, Wait: Forever})
		if l != nil {
			l.Release(bg) // granted before the cancellation: a proper lease
		}
		errc <- err
	}()
	dd := direct(t)
	for i := 0; count(t, dd, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%dlock-go:%acquire%' AND state = 'active' AND pid <> pg_backend_pid()`) == 0; i++ {
		if i > 50 {
			t.Fatal("the waiting acquire never reached the server")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled acquire: %v", err)
	}
	if n := count(t, dd, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%dlock-go:%acquire%' AND state = 'active' AND pid <> pg_backend_pid()`); n != 0 {
		t.Errorf("the cancelled acquire still waits in the server (%d)", n)
	}
	if err := a.Release(bg); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if n := held(t, dd, "go-cancel"); n != 0 {
		t.Errorf("%d leases held after the cancelled acquire", n)
	}

	// granted while being cancelled: the key is released just as the
	// context is cancelled; whatever the server did, nothing is left
	for i := 0; i < 3; i++ {
		a, err := Acquire(bg, db, "go-cancel", Options{TTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		go func() {
			l, err := Acquire(ctx, db, "go-cancel", Options{TTL: 5 * time.Second, Wait: Forever})
			if l != nil {
				l.Release(bg)
			}
			errc <- err
		}()
		time.Sleep(300 * time.Millisecond)
		go a.Release(bg)
		time.Sleep(time.Duration(i) * time.Millisecond)
		cancel()
		<-errc
		time.Sleep(100 * time.Millisecond)
		if n := held(t, dd, "go-cancel"); n != 0 {
			t.Errorf("round %d: %d leases held after the race of grant and cancel", i, n)
		}
	}

	// work cancelled while held: the deferred Release gives it back
	work := func(ctx context.Context, fail bool) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		l, err := Acquire(ctx, db, "go-cancel-held", Options{TTL: time.Second})
		if err != nil {
			return err
		}
		defer l.Release(bg)
		if fail {
			panic("the work failed")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-l.Context().Done():
			return l.Err()
		}
	}
	ctx, cancel = context.WithTimeout(bg, 1500*time.Millisecond)
	if err := work(ctx, false); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled work: %v", err)
	}
	cancel()
	if err := work(bg, true); err == nil || !strings.Contains(err.Error(), "panic") {
		t.Errorf("failed work: %v", err)
	}
	if n := held(t, dd, "go-cancel-held"); n != 0 {
		t.Errorf("%d leases held after the work ended", n)
	}
	dd.Close()
	noGoroutinesLeft(t, baseline)
}

// Election: campaign, proclaim, leader, observe; the observer sees the
// new leader; a deposed leader's write is refused.
func TestElection(t *testing.T) {
	need(t)
	db := direct(t)
	const el = "go-election"
	if err := db.Ping(); err != nil {
		t.Fatal(err)
	}
	baseline := runtime.NumGoroutine()
	ctx, stop := context.WithCancel(bg)
	defer stop()
	states := Observe(ctx, db, el)

	a, err := Campaign(bg, db, el, "node-a", Options{TTL: 10 * time.Second, RenewEvery: 9 * time.Second, Wait: Forever})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(bg)
	next := func(want func(State) bool, what string) State {
		t.Helper()
		for {
			select {
			case s := <-states:
				if want(s) {
					return s
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("observer did not see %s", what)
			}
		}
	}
	s := next(func(s State) bool { return s.Held() && s.Value == "node-a" }, "node-a")
	if s.Fence != a.Fence() {
		t.Errorf("observed epoch %d, campaign's %d", s.Fence, a.Fence())
	}
	if li, err := Leader(bg, db, el); err != nil || li.Value != "node-a" || li.Epoch != a.Fence() {
		t.Errorf("leader: %+v %v", li, err)
	}
	if err := a.Proclaim(bg, "node-a2"); err != nil || a.Value() != "node-a2" {
		t.Errorf("proclaim: %v", err)
	}
	next(func(s State) bool { return s.Value == "node-a2" }, "the proclaimed value")

	// b waits for its turn; a is deposed behind its back
	bc := make(chan *Lease, 1)
	go func() {
		b, err := Campaign(bg, db, el, "node-b", Options{TTL: 10 * time.Second, Wait: Forever})
		if err != nil {
			t.Error(err)
		}
		bc <- b
	}()
	time.Sleep(200 * time.Millisecond)
	if _, err := db.Exec(`SELECT dlock.forget($1)`, el); err != nil {
		t.Fatal(err)
	}
	b := <-bc
	if b == nil {
		t.FailNow()
	}
	defer b.Release(bg)
	s = next(func(s State) bool { return s.Held() && s.Value == "node-b" }, "node-b")
	if s.Fence != b.Fence() || b.Fence() <= a.Fence() {
		t.Errorf("new epoch %d (observed %d), old %d", b.Fence(), s.Fence, a.Fence())
	}
	if err := fencedWrite(bg, db, a, el); !errors.Is(err, ErrLost) || !isLF001(err) {
		t.Errorf("deposed leader's write: %v, want LF001", err)
	}
	if err := a.Proclaim(bg, "node-a3"); !errors.Is(err, ErrLost) {
		t.Errorf("deposed leader's proclaim: %v", err)
	}
	if err := fencedWrite(bg, db, b, el); err != nil {
		t.Errorf("new leader's write: %v", err)
	}
	if err := b.Release(bg); err != nil {
		t.Fatal(err)
	}
	next(func(s State) bool { return s.State == "released" }, "the resignation")
	if _, err := Leader(bg, db, el); !errors.Is(err, ErrNoLeader) {
		t.Errorf("leader after resigning: %v", err)
	}
	// stop following while a call waits in the server: it ends at once
	time.Sleep(200 * time.Millisecond)
	stopped := time.Now()
	stop()
	for range states {
	}
	if d := time.Since(stopped); d > 2*time.Second {
		t.Errorf("the observer took %v to stop", d)
	}
	a.Release(bg)
	noGoroutinesLeft(t, baseline)
}

// Permits and shared leases.
func TestPermitsAndShared(t *testing.T) {
	need(t)
	db := direct(t)
	var ps []*Lease
	for i := 0; i < 3; i++ {
		l, err := Acquire(bg, db, "go-sem", Options{TTL: 5 * time.Second, Permits: 3})
		if err != nil {
			t.Fatalf("permit %d: %v", i, err)
		}
		ps = append(ps, l)
	}
	if _, err := Acquire(bg, db, "go-sem", Options{TTL: 5 * time.Second, Permits: 3}); !errors.Is(err, ErrBusy) {
		t.Errorf("4th of 3 permits: %v", err)
	}
	for i, l := range ps {
		if err := fencedWrite(bg, db, l, "go-sem"); err != nil {
			t.Errorf("permit %d's write: %v", i, err)
		}
	}
	ps[0].Release(bg)
	l, err := Acquire(bg, db, "go-sem", Options{TTL: 5 * time.Second, Permits: 3})
	if err != nil {
		t.Errorf("a freed permit: %v", err)
	} else {
		l.Release(bg)
	}
	if err := fencedWrite(bg, db, ps[0], "go-sem"); !errors.Is(err, ErrReleased) {
		t.Errorf("released permit's write: %v", err)
	}
	for _, l := range ps[1:] {
		l.Release(bg)
	}

	s1, err1 := Acquire(bg, db, "go-rw", Options{TTL: 5 * time.Second, Mode: Shared})
	s2, err2 := Acquire(bg, db, "go-rw", Options{TTL: 5 * time.Second, Mode: Shared})
	if err1 != nil || err2 != nil {
		t.Fatalf("two shared: %v %v", err1, err2)
	}
	if _, err := Acquire(bg, db, "go-rw", Options{TTL: 5 * time.Second}); !errors.Is(err, ErrBusy) {
		t.Errorf("exclusive over shared: %v", err)
	}
	s1.Release(bg)
	s2.Release(bg)
	x, err := Acquire(bg, db, "go-rw", Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("exclusive once the shared are gone: %v", err)
	}
	if _, err := Acquire(bg, db, "go-rw", Options{TTL: 5 * time.Second, Mode: Shared}); !errors.Is(err, ErrBusy) {
		t.Errorf("shared over exclusive: %v", err)
	}
	if err := fencedWrite(bg, db, s1, "go-rw"); !errors.Is(err, ErrReleased) {
		t.Errorf("a released shared lease's write: %v", err)
	}
	if err := rawFencedWrite(db, "go-rw", s2.Fence()); !isLF001(err) {
		t.Errorf("an ended shared lease's raw write: %v", err)
	}
	x.Release(bg)
}

// Findings of the attack pass (each test fails without its fix).

// OnLost runs after the renewer has ended: a Release called from OnLost
// returns (it used to deadlock: Release waited for the renewer, which
// waited for OnLost), a slow OnLost does not hold up a Release from
// elsewhere, and nothing is left once OnLost has returned.
func TestReleaseFromOnLost(t *testing.T) {
	need(t)
	db := direct(t)
	if err := db.Ping(); err != nil {
		t.Fatal(err)
	}
	baseline := runtime.NumGoroutine()
	var l *Lease
	ready, slow := make(chan struct{}), make(chan struct{})
	inOnLost := make(chan error, 1)
	l, err := Acquire(bg, db, "go-onlost-release", Options{TTL: 5 * time.Second, RenewEvery: 200 * time.Millisecond,
		OnLost: func(error) {
			<-ready
			inOnLost <- l.Release(bg)
			<-slow // a slow handler
		}})
	if err != nil {
		t.Fatal(err)
	}
	close(ready)
	if _, err := db.Exec(`SELECT dlock.forget('go-onlost-release')`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-inOnLost:
		if !errors.Is(err, ErrLost) {
			t.Errorf("Release in OnLost: %v, want the loss", err)
		}
	case <-time.After(3 * time.Second):
		close(slow)
		t.Fatal("Release called from OnLost did not return within 3 s")
	}
	rc := make(chan error, 1)
	go func() { rc <- l.Release(bg) }()
	select {
	case err := <-rc:
		if !errors.Is(err, ErrLost) {
			t.Errorf("second Release: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Error("a slow OnLost holds up Release")
	}
	close(slow)
	noGoroutinesLeft(t, baseline)
}

// Release with a context cancelled already (a deferred Release at
// shutdown) still gives the lease back: the release has a bound of its own.
func TestReleaseCancelledContext(t *testing.T) {
	need(t)
	db := direct(t)
	l, err := Acquire(bg, db, "go-release-ctx", Options{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release(cancelled ctx): %v", err)
	}
	if n := held(t, db, "go-release-ctx"); n != 0 {
		t.Errorf("%d leases held after Release with a cancelled context", n)
	}
}

// A lease the client judged lost (its deadline passed: a late answer, a
// pause) may still be held in the server: Release still tries
// dlock.release. And OnLost is called once when Release itself finds the
// lease gone.
func TestReleaseAfterLossAndReleaseFindsItGone(t *testing.T) {
	need(t)
	db := direct(t)
	l, err := Acquire(bg, db, "go-release-lost", Options{TTL: 10 * time.Second, RenewEvery: 9 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	l.deadline = time.Now().Add(-time.Millisecond) // as after a pause
	l.mu.Unlock()
	if !errors.Is(l.Err(), ErrLost) {
		t.Fatalf("Err after the deadline: %v", l.Err())
	}
	if err := l.Release(bg); !errors.Is(err, ErrLost) {
		t.Errorf("Release of the lost lease: %v", err)
	}
	if n := held(t, db, "go-release-lost"); n != 0 {
		t.Errorf("%d leases held: Release did not try dlock.release after the client-side loss", n)
	}

	var calls int32
	l, err = Acquire(bg, db, "go-release-gone", Options{TTL: 10 * time.Second, RenewEvery: 9 * time.Second,
		OnLost: func(error) { atomic.AddInt32(&calls, 1) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`SELECT dlock.forget('go-release-gone')`); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(bg); !errors.Is(err, ErrLost) {
		t.Errorf("Release of a forgotten lease: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	if c := atomic.LoadInt32(&calls); c != 1 {
		t.Errorf("OnLost called %d times when Release found the lease gone, want 1", c)
	}
}

// A pool at its limit: the renewal waits for a connection, and the loss
// says so (not "no answer", as no renewal was sent).
func TestPoolExhaustedLossSaysSo(t *testing.T) {
	need(t)
	db := direct(t)
	db.SetMaxOpenConns(1)
	lostc := make(chan error, 1)
	l, err := Acquire(bg, db, "go-pool-full", Options{TTL: 600 * time.Millisecond, RenewEvery: 200 * time.Millisecond,
		OnLost: func(err error) { lostc <- err }})
	if err != nil {
		t.Fatal(err)
	}
	c, err := db.Conn(bg) // the pool's one connection
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-lostc:
		if !strings.Contains(err.Error(), "no connection from the pool") {
			t.Errorf("loss: %v, want it to say no connection was had from the pool", err)
		}
	case <-time.After(3 * time.Second):
		t.Error("not lost while the pool was exhausted")
	}
	c.Close()
	l.Release(bg)
}

// A try with a tiny TTL: the driver's timeout is not the TTL (it gave
// "context deadline exceeded" or 57014 and could drop a granted lease);
// a Wait near MaxInt64 does not overflow Wait+TTL.
func TestTinyTTLAndHugeWait(t *testing.T) {
	need(t)
	db := direct(t)
	for i := 0; i < 5; i++ {
		l, err := Acquire(bg, db, "go-tiny-ttl", Options{TTL: time.Millisecond})
		if errors.Is(err, context.DeadlineExceeded) || sqlState(err) == "57014" {
			t.Fatalf("TTL 1ms: %v", err)
		}
		if l != nil {
			l.Release(bg)
		}
	}
	l, err := Acquire(bg, db, "go-huge-wait", Options{TTL: time.Second, Wait: time.Duration(math.MaxInt64)})
	if err != nil {
		t.Fatalf("Wait MaxInt64: %v", err)
	}
	l.Release(bg)
}

// A try on a silent network returns, even with a context without a
// deadline (lib/pq ignores ctx while it connects and reads): at Wait + TTL
// + the connect allowance; the abandoned call ends when the driver does.
func TestTryAcquireBlackhole(t *testing.T) {
	need(t, "DLOCK_TEST_TCP")
	saved := connectAllowance
	connectAllowance = time.Second
	defer func() { connectAllowance = saved }()
	p := newProxy(t, os.Getenv("DLOCK_TEST_TCP"))
	db := open(t, fmt.Sprintf("host=127.0.0.1 port=%d dbname=postgres sslmode=disable", p.addr().Port))
	p.blackhole(true)
	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		l, err := Acquire(bg, db, "go-try-blackhole", Options{TTL: time.Second})
		if l != nil {
			l.Release(bg)
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("try on a silent network: %v", err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("returned after %v, bound 2 s", d)
		}
	case <-time.After(6 * time.Second):
		t.Error("a try on a silent network did not return within 6 s")
	}
	p.blackhole(false)
	p.closeConns()
}

// Text with NUL or invalid UTF-8 is ErrInvalid (client-side, and 22021
// from the server); ErrBusy does not claim someone holds the key (memory
// mode pauses grants after a restart).
func TestInvalidTextAndBusyMessage(t *testing.T) {
	need(t)
	db := direct(t)
	for _, k := range []string{"a\x00b", "a\xffb"} {
		if _, err := Acquire(bg, db, k, Options{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("key %q: %v, want ErrInvalid", k, err)
		}
	}
	if _, err := Acquire(bg, db, "go-holder-nul", Options{Holder: "x\x00"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("holder with NUL: %v, want ErrInvalid", err)
	}
	if !errors.Is(&Error{Op: "acquire", SQLState: "22021", Err: errors.New("x")}, ErrInvalid) {
		t.Error("22021 is not ErrInvalid")
	}
	if !strings.Contains(ErrBusy.Error(), "memory mode") {
		t.Errorf("ErrBusy says %q", ErrBusy)
	}
}

// The remaining time from the server is rounded down, so the client's
// deadline is never after the server's expiry.
func TestRemainingRoundsDown(t *testing.T) {
	need(t)
	db := direct(t)
	var ms int64
	if err := db.QueryRow(`SELECT ` + remainingMS("(pg_catalog.clock_timestamp() + interval '999 microseconds')")).Scan(&ms); err != nil {
		t.Fatal(err)
	}
	if ms != 0 {
		t.Errorf("999 µs left reads as %d ms, want 0", ms)
	}
}

// Proclaim and UseFence already in flight when the network goes silent
// return at the loss (the caller's transaction is then unusable).
func TestInFlightCallsReturnAtLoss(t *testing.T) {
	need(t, "DLOCK_TEST_TCP")
	p := newProxy(t, os.Getenv("DLOCK_TEST_TCP"))
	db := open(t, fmt.Sprintf("host=127.0.0.1 port=%d dbname=postgres sslmode=disable", p.addr().Port))
	l, err := Campaign(bg, db, "go-inflight", "v", Options{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(bg, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.blackhole(true)
	start := time.Now()
	pc, fc := make(chan error, 1), make(chan error, 1)
	go func() { pc <- l.Proclaim(bg, "w") }()
	go func() { fc <- l.UseFence(bg, tx) }()
	for what, c := range map[string]chan error{"Proclaim": pc, "UseFence": fc} {
		select {
		case err := <-c:
			if !errors.Is(err, ErrLost) {
				t.Errorf("%s: %v, want the loss", what, err)
			}
			if d := time.Since(start); d > 1500*time.Millisecond {
				t.Errorf("%s returned %v after the network went silent (TTL 1 s)", what, d)
			}
		case <-time.After(4 * time.Second):
			t.Errorf("%s in flight did not return at the loss", what)
		}
	}
	p.blackhole(false)
	p.closeConns()
	l.Release(bg)
}

// OnLost in the paths where Release is the first to know (a second attack
// pass): a Release called from OnLost when Release found the lease gone
// must not deadlock, and a loss seen only by Release (the deadline passed
// during a pause, before the renewer's timer fired) still calls OnLost.
func TestOnLostWhenReleaseIsFirstToKnow(t *testing.T) {
	need(t)
	db := direct(t)
	var l *Lease
	inner := make(chan error, 1)
	l, err := Acquire(bg, db, "go-onlost-nested", Options{TTL: 30 * time.Second, RenewEvery: 20 * time.Second,
		OnLost: func(error) { inner <- l.Release(bg) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`SELECT dlock.forget('go-onlost-nested')`); err != nil {
		t.Fatal(err)
	}
	outer := make(chan error, 1)
	go func() { outer <- l.Release(bg) }()
	for _, c := range []chan error{outer, inner} {
		select {
		case err := <-c:
			if !errors.Is(err, ErrLost) {
				t.Errorf("Release: %v, want the loss", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("Release from OnLost, called by a Release that found the lease gone, deadlocked")
		}
	}

	var calls int32
	l2, err := Acquire(bg, db, "go-onlost-pause", Options{TTL: 30 * time.Second, RenewEvery: 20 * time.Second,
		OnLost: func(error) { atomic.AddInt32(&calls, 1) }})
	if err != nil {
		t.Fatal(err)
	}
	l2.mu.Lock()
	l2.deadline = time.Now().Add(-time.Second) // as after a pause past the deadline
	l2.mu.Unlock()
	if err := l2.Release(bg); !errors.Is(err, ErrLost) {
		t.Errorf("Release after the deadline: %v, want the loss", err)
	}
	for i := 0; i < 50 && atomic.LoadInt32(&calls) == 0; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	if c := atomic.LoadInt32(&calls); c != 1 {
		t.Errorf("OnLost called %d times for a loss Release saw first, want 1", c)
	}
}
