// Package dlock is the Go client of dlock, the PostgreSQL extension that
// gives leases with fencing tokens.
//
// Acquire takes a lease on a key and renews it in the background; the
// lease's Context is cancelled the moment the lease is lost or can no
// longer be confirmed in time, which is the Go way of saying "stop
// working". Writes present the lease's fencing token with UseFence in the
// writing transaction, so that the server refuses them (SQLSTATE LF001,
// errors.Is(err, ErrLost)) once the lease has ended, even when the holder
// has not noticed yet.
//
// The deadline rule is dlock's command-line client's: a grant or renewal
// the server confirms holds for min(TTL, the remaining time the server
// reports) from when its request was sent, on Go's monotonic clock; server
// timestamps are never compared with the local clock. If no renewal is
// confirmed by then, the lease is lost, whatever the reason (server down,
// network hung, process paused). The decision is taken by a timer, never
// by a call returning: a driver call stuck on a dead socket does not delay
// it.
//
// The package uses database/sql only and works with any driver whose
// errors have a SQLState() string method (lib/pq's *pq.Error, pgx's
// *pgconn.PgError).
package dlock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Mode is the kind of lease asked for.
type Mode string

// The modes of a lease.
const (
	Exclusive Mode = "exclusive" // the key's one exclusive lease (or one of its permits)
	Shared    Mode = "shared"    // one of many shared leases; an exclusive one waits for them
)

// Forever as Options.Wait waits without a limit of its own (ctx still
// cancels the wait).
const Forever time.Duration = -1

// DefaultTTL is the TTL of a lease whose Options.TTL is 0.
const DefaultTTL = 30 * time.Second

// releaseBound is the longest Release waits for the server, as the CLI.
const releaseBound = 5 * time.Second

// connectAllowance is what an Acquire or Campaign with a bounded Wait
// gives the driver, on top of Wait + TTL, before it abandons the call (a
// variable for the tests).
var connectAllowance = 10 * time.Second

// checkText refuses, before sending, what PostgreSQL refuses in a text
// (22021): a NUL byte, invalid UTF-8.
func checkText(ss ...string) error {
	for _, s := range ss {
		if strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) {
			return fmt.Errorf("%w: %q has a NUL byte or is not valid UTF-8", ErrInvalid, s)
		}
	}
	return nil
}

// addSat is a + b for non-negative durations, saturated at the largest.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Options are the parameters of a lease. Only TTL matters to most callers.
type Options struct {
	// TTL is the lease's time to live, renewed every RenewEvery. Default 30s.
	TTL time.Duration
	// Wait: 0 tries once (dlock.try_acquire: ErrBusy at once when the key
	// is held); a positive duration waits up to that long (dlock.acquire:
	// ErrBusy when it runs out); Forever waits without a limit of its own.
	// ctx cancels any wait.
	Wait time.Duration
	// Holder is a label for humans in dlock.lease_status. Default
	// user@host:pid, as the CLI.
	Holder string
	// LockDelay: if the lease expires unreleased, nobody gets the key for
	// this long after the expiry. 0: none.
	LockDelay time.Duration
	// SessionBound ends the lease with the connection that took it, too.
	// The lease then keeps that connection (a *sql.Conn from the pool) for
	// its lifetime, renews over it, and is lost at once if it fails. Never
	// use it behind PgBouncer in transaction mode (docs/reference.md).
	SessionBound bool
	// Permits > 1 takes one of the key's first Permits permits (a counting
	// semaphore). 0 or 1: the exclusive lease.
	Permits int
	// Mode is Exclusive (default) or Shared.
	Mode Mode
	// RenewEvery is how often the lease is renewed. Default TTL/3.
	RenewEvery time.Duration
	// OnLost, if set, is called once when the lease is lost (not when it
	// is released), with the reason (a *LostError): in a goroutine of the
	// lease's own, after the renewer has ended, so it may call Release
	// (and Release never waits for it). Also when Release itself finds
	// the lease gone. A panic in it is logged, not propagated.
	OnLost func(err error)
	// Logf logs what the library cannot return: a panic in OnLost.
	// Default log.Printf.
	Logf func(format string, args ...interface{})
}

// Lease is a lease held by this process, renewed in the background until
// Release or its loss. Its methods are safe for concurrent use.
type Lease struct {
	db     *sql.DB
	conn   *sql.Conn // session-bound leases only: the granting connection
	key    string
	owner  string
	fence  int64
	ttl    time.Duration
	every  time.Duration
	opts   Options
	ttlArg string

	ctx    context.Context
	cancel context.CancelFunc

	calls tracker // driver calls in flight, abandoned ones included

	mu        sync.Mutex
	deadline  time.Time // monotonic: request sent + granted time
	expiresAt time.Time // the server's clock, for display only
	value     sql.NullString
	lost      *LostError
	released  bool
	lastErr   error // of the last failed renewal, for the loss's Cause

	lostCh    chan struct{} // closed at the loss
	lostOnce  sync.Once
	stop      chan struct{} // closed by Release
	stopOnce  sync.Once
	done      chan struct{} // closed when the renewer has returned
	relOnce   sync.Once
	relErr    error
	closeOnce sync.Once
	notified  int32 // OnLost called (atomic: Release may call it from OnLost)
}

// querier is what a lease's calls go through: the pool (*sql.DB) or the
// connection of a session-bound lease (*sql.Conn).
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...interface{}) *sql.Row
}

func (l *Lease) q() querier {
	if l.conn != nil {
		return l.conn
	}
	return l.db
}

// Key is the lease's key (for an election, its name).
func (l *Lease) Key() string { return l.key }

// Owner is the lease's owner token, the capability to renew and release
// it: keep it secret.
func (l *Lease) Owner() string { return l.owner }

// Fence is the lease's fencing token (for an election, the term's epoch).
func (l *Lease) Fence() int64 { return l.fence }

// Context is cancelled when the lease is lost or released: stop the work
// done under it then. Err says why.
func (l *Lease) Context() context.Context { return l.ctx }

// ExpiresAt is the lease's expiry by the server's clock, as of the last
// confirmed renewal; for display only (Remaining is what counts).
func (l *Lease) ExpiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiresAt
}

// Err is nil while the lease is held; a *LostError (errors.Is ErrLost)
// once it is lost; ErrReleased once released.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checkLocked()
}

// Remaining is how long the lease is known to be ours without another
// renewal, by the local monotonic clock: 0 once lost or released.
func (l *Lease) Remaining() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.checkLocked() != nil {
		return 0
	}
	return time.Until(l.deadline)
}

// checkLocked judges the deadline now, so that a caller never acts on a
// lease whose deadline passed before the renewer's timer fired (a process
// just continued after a pause). l.mu held.
func (l *Lease) checkLocked() error {
	if l.lost != nil {
		return l.lost
	}
	if l.released {
		return ErrReleased
	}
	if !time.Now().Before(l.deadline) {
		l.loseLocked(LostDeadline, l.lastErr)
		return l.lost
	}
	return nil
}

// loseLocked marks the lease lost, once, and wakes everything that
// waits for that. l.mu held.
func (l *Lease) loseLocked(why LostReason, cause error) {
	if l.lost != nil || l.released {
		return
	}
	l.lost = &LostError{Key: l.key, Reason: why, At: time.Now(), Cause: cause}
	l.cancel()
	l.lostOnce.Do(func() { close(l.lostCh) })
}

func (l *Lease) lose(why LostReason, cause error) {
	l.mu.Lock()
	l.loseLocked(why, cause)
	l.mu.Unlock()
}

// UseFence presents the lease's token in the caller's transaction
// (dlock.use_fence): the writes of tx are then accepted only while the
// lease is live. Once the lease is known lost it returns the loss without
// touching the database; a refusal by the server (LF001) comes back as an
// *Error that satisfies errors.Is(err, ErrLost), and marks the lease lost.
//
// It returns at the loss at the latest (the lease's deadline), even when
// the statement hangs on a silent network: tx is then unusable (the
// statement may still be running in the driver; roll it back, which
// database/sql makes wait until the driver returns, so do it in a
// goroutine of your own if the network may be gone).
func (l *Lease) UseFence(ctx context.Context, tx *sql.Tx) error {
	if err := l.Err(); err != nil {
		return err
	}
	// The statement runs in a goroutine of its own so that UseFence
	// returns at the loss (the deadline's timer) even when it hangs on a
	// silent network (lib/pq heeds ctx neither while connecting nor while
	// reading); its context is cancelled then (the driver's
	// cancellation). The goroutine ends when the driver returns.
	fctx, fcancel := context.WithCancel(ctx)
	ch := make(chan error, 1)
	l.goCall(func() {
		defer fcancel()
		_, err := tx.ExecContext(fctx, sqlUseFence, l.key, l.fence)
		ch <- err
	})
	var err error
	select {
	case err = <-ch:
	case <-l.ctx.Done(): // lost or released
		fcancel()
		if err := l.Err(); err != nil {
			return err
		}
		err = <-ch // not reached: l.ctx is only cancelled with Err set
	}
	err = wrap("use_fence", err)
	if errors.Is(err, ErrLost) {
		l.lose(LostFenced, err)
	}
	return err
}

// Acquire takes the lease on key (dlock.try_acquire, or dlock.acquire
// when opts.Wait is not 0) and starts renewing it. It returns ErrBusy when
// the key is held (or the wait ran out). A lease granted by a wait is
// confirmed by one renewal before it is returned (it may have been
// granted long after the request was sent). If ctx is cancelled while
// the request runs, the request is cancelled in the server and a lease
// granted meanwhile is released: nothing is left behind.
//
// With a bounded Wait (0 included), Acquire returns at the latest after
// Wait + TTL + 10 s (the connection allowance) even when ctx has no
// deadline and the network is silent (lib/pq heeds ctx neither while it
// connects nor while it reads): the error then satisfies
// errors.Is(err, context.DeadlineExceeded). The abandoned call's goroutine
// lingers until the driver returns; a lease it brings back then is
// released in the background (within 5 s). With Wait Forever, only ctx
// ends the wait.
func Acquire(ctx context.Context, db *sql.DB, key string, opts Options) (*Lease, error) {
	if opts.Mode == "" {
		opts.Mode = Exclusive
	}
	if opts.Permits == 0 {
		opts.Permits = 1
	}
	q := sqlTryAcquire
	if opts.Wait != 0 {
		q = sqlAcquire
	}
	return grant(ctx, db, key, opts, "acquire", q, nil)
}

func newLease(db *sql.DB, key string, opts Options) (*Lease, error) {
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	if opts.RenewEvery == 0 {
		opts.RenewEvery = opts.TTL / 3
	}
	if opts.TTL < time.Millisecond || opts.RenewEvery <= 0 || opts.RenewEvery >= opts.TTL {
		return nil, fmt.Errorf("%w: TTL must be at least 1ms and RenewEvery between 0 and TTL", ErrInvalid)
	}
	if opts.Wait < 0 && opts.Wait != Forever || opts.LockDelay < 0 {
		return nil, fmt.Errorf("%w: Wait and LockDelay must not be negative", ErrInvalid)
	}
	if opts.Holder == "" {
		opts.Holder = defaultHolder()
	}
	if opts.Logf == nil {
		opts.Logf = log.Printf
	}
	l := &Lease{
		db: db, key: key, ttl: opts.TTL, every: opts.RenewEvery, opts: opts,
		ttlArg: interval(opts.TTL),
		lostCh: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l, nil
}

// grant runs the statement q that returns a lease (acquire, try_acquire,
// campaign; value is campaign's), and hands over the lease once it is
// known to be ours.
func grant(ctx context.Context, db *sql.DB, key string, opts Options, op, q string, value *string) (*Lease, error) {
	l, err := newLease(db, key, opts)
	if err != nil {
		return nil, err
	}
	opts = l.opts // with the defaults filled in
	if err := checkText(key, opts.Holder); err != nil {
		return nil, err
	}
	if value != nil {
		if err := checkText(*value); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if opts.SessionBound {
		if l.conn, err = db.Conn(ctx); err != nil {
			return nil, err
		}
	}
	args := []interface{}{key, l.ttlArg, opts.Holder, nullInterval(opts.LockDelay),
		opts.SessionBound}
	if value != nil {
		args = append(args, *value, waitArg(opts.Wait))
	} else {
		args = append(args, opts.Permits, string(opts.Mode))
		if opts.Wait != 0 {
			args = append(args, waitArg(opts.Wait))
		}
	}

	// A marker in the statement's text lets a cancellation find it in
	// pg_stat_activity, wherever it runs (see cancelMarked).
	marker := "dlock-go:" + randomHex(8)
	text := "/* " + marker + " */ " + q
	// The call is waited for Wait + TTL + connectAllowance at most (not
	// for a Forever wait): lib/pq ignores ctx while it connects and reads,
	// so a try on a silent network would otherwise never return when ctx
	// has no deadline. The allowance covers making a connection; the TTL
	// alone is no driver timeout (a TTL of 1 ms cancelled the call, and
	// could drop a lease the server had granted). Saturated, not
	// overflowed, for a Wait near MaxInt64.
	qctx, qcancel := context.WithCancel(context.Background())
	var bound time.Duration
	var timeout <-chan time.Time
	if opts.Wait >= 0 {
		bound = addSat(addSat(opts.Wait, opts.TTL), connectAllowance)
		qctx, qcancel = context.WithTimeout(context.Background(), bound)
		tm := time.NewTimer(bound)
		defer tm.Stop()
		timeout = tm.C
	}
	ch := make(chan grantResult, 1)
	fin := make(chan struct{})
	sent := time.Now()
	l.goCall(func() {
		defer qcancel()
		ch <- scanGrant(l.q().QueryRowContext(qctx, text, args...))
		close(fin)
	})

	var r grantResult
	select {
	case <-fin:
		r = <-ch
	case <-ctx.Done():
		// Cancel the request in the server, and give back whatever it
		// granted meanwhile: its answer is waited for (a cancelled context
		// would make database/sql drop a lease the server had granted).
		if cancelMarked(db, marker, fin, qcancel, l.goCall) {
			if r := <-ch; r.err == nil && r.ok {
				l.owner = r.owner
				l.giveBack()
			}
		}
		l.closeConn()
		return nil, ctx.Err()
	case <-timeout:
		// Abandoned: the driver's cancellation is tried (qctx), and the
		// call's goroutine lingers until the driver returns; a lease it
		// brings back then is released in the background (within
		// releaseBound).
		qcancel()
		l.goCall(func() {
			if r := <-ch; r.err == nil && r.ok {
				l.owner = r.owner
				l.giveBack()
			}
			l.closeConn()
		})
		return nil, fmt.Errorf("dlock: %s of key %q: no answer from the server within %v (Wait + TTL + %v to connect): %w",
			op, key, bound, connectAllowance, context.DeadlineExceeded)
	}
	if r.err != nil {
		l.closeConn()
		return nil, wrap(op, r.err)
	}
	if !r.ok {
		l.closeConn()
		return nil, ErrBusy
	}
	l.owner, l.fence, l.expiresAt = r.owner, r.fence, r.expiresAt
	if value != nil {
		l.value = sql.NullString{String: *value, Valid: true}
	}
	l.deadline = sent.Add(minDur(l.ttl, r.remaining))
	next := sent.Add(l.every)
	if !time.Now().Before(next) {
		// The grant took a while (a wait): it may have happened long after
		// the request was sent. Confirm it with one renewal, and judge
		// the deadline from that.
		if next, err = l.confirm(ctx); err != nil {
			return nil, err
		}
	}
	go l.renewer(next)
	return l, nil
}

// confirm renews a lease that is not handed over yet, once; returns when
// the next renewal is due, or an error (the lease given back if need be).
func (l *Lease) confirm(ctx context.Context) (time.Time, error) {
	sent := time.Now()
	cctx, ccancel := context.WithTimeout(context.Background(), l.ttl)
	ch := make(chan renewResult, 1)
	l.goCall(func() {
		defer ccancel()
		ch <- l.renewOnce(cctx, nil)
	})
	var r renewResult
	tm := time.NewTimer(l.ttl)
	defer tm.Stop()
	select {
	case r = <-ch:
	case <-ctx.Done():
		ccancel()
		l.giveBack()
		l.closeConn()
		return time.Time{}, ctx.Err()
	case <-tm.C:
		// no answer within the TTL (lib/pq may not heed cctx): the lease
		// could not be confirmed; give it back in the background
		ccancel()
		l.goCall(func() { l.giveBack(); l.closeConn() })
		return time.Time{}, &LostError{Key: l.key, Reason: LostDeadline, At: time.Now(),
			Cause: fmt.Errorf("no answer to the confirming renewal within %v", l.ttl)}
	}
	switch {
	case r.err != nil:
		l.giveBack() // it may still be ours: do not leave it behind
		l.closeConn()
		return time.Time{}, &LostError{Key: l.key, Reason: LostDeadline, At: time.Now(), Cause: wrap("renew", r.err)}
	case r.null:
		l.closeConn()
		return time.Time{}, &LostError{Key: l.key, Reason: LostRenewal, At: time.Now()}
	}
	l.deadline = sent.Add(minDur(l.ttl, r.remaining))
	l.expiresAt = r.expiresAt
	return sent.Add(l.every), nil
}

// cancelMarked cancels, in the server, the statement carrying marker
// (pg_cancel_backend of the backend that runs it, found in
// pg_stat_activity, behind PgBouncer too), again every 100 ms until fin is
// closed (its call has returned): a cancellation that arrives before the
// statement has started, or while it queues in the pool or in PgBouncer, is
// lost, and the driver's own cancellation request has the same race. After
// releaseBound it gives up, cancels the call's context (the driver's
// cancellation), and waits one more second. Each attempt runs through spawn,
// bounded by a second. Returns whether the call returned.
func cancelMarked(db *sql.DB, marker string, fin <-chan struct{}, qcancel context.CancelFunc, spawn func(func())) bool {
	giveUp := time.NewTimer(releaseBound)
	defer giveUp.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		spawn(func() {
			defer ccancel()
			_, _ = db.ExecContext(cctx, sqlCancelMarked, marker)
		})
		select {
		case <-fin:
			return true
		case <-tick.C:
		case <-giveUp.C:
			qcancel()
			select {
			case <-fin:
				return true
			case <-time.After(time.Second):
				return false
			}
		}
	}
}

// giveBack releases a lease that was never handed over, best effort,
// within releaseBound.
func (l *Lease) giveBack() {
	ctx, cancel := context.WithTimeout(context.Background(), releaseBound)
	defer cancel()
	_, _ = l.releaseCall(ctx)
}

// releaseCall runs dlock.release in a call of its own, waiting for it no
// longer than ctx.
func (l *Lease) releaseCall(ctx context.Context) (bool, error) {
	type res struct {
		ok  bool
		err error
	}
	cctx, ccancel := context.WithCancel(ctx)
	ch := make(chan res, 1)
	l.goCall(func() {
		defer ccancel()
		var ok bool
		err := l.q().QueryRowContext(cctx, sqlRelease, l.key, l.owner).Scan(&ok)
		ch <- res{ok, err}
	})
	select {
	case r := <-ch:
		return r.ok, wrap("release", r.err)
	case <-ctx.Done():
		ccancel()
		return false, ctx.Err()
	}
}

// Release gives the lease back (dlock.release) after stopping the
// renewer and waiting for it. The whole of it takes at most 5 seconds,
// whatever ctx says: the release statement runs on a context of its own
// (context.Background with a 5 s timeout), so that a deferred Release
// with a context already cancelled at shutdown still gives the lease
// back. ctx is not used to cut it short (it is there for symmetry with
// the other calls). A failed release need not be handled (the lease
// expires by itself) but is returned.
//
// A lease this client judged lost may still be held in the server (an
// answer that came late, a pause, a refusal seen in another database):
// dlock.release frees it only if this owner still holds it, so it is
// tried then too, unless the server itself said the lease was gone (a
// renewal, proclaim or release that found it not held). Release then
// returns the loss (a *LostError). If the lease was lost and OnLost was
// not called yet (Release found it gone, or the loss was seen only now,
// after a pause), Release calls it, in a goroutine of its own, once in
// all. It may be called from OnLost, and never waits for OnLost.
// Later calls return what the first returned. Afterwards no goroutine of
// the lease is left, except OnLost still running, and driver calls stuck
// on a dead connection that had not returned within the bound: those are
// reported in the error.
func (l *Lease) Release(ctx context.Context) error {
	l.relOnce.Do(func() { l.relErr = l.release() })
	return l.relErr
}

func (l *Lease) release() error {
	ctx, cancel := context.WithTimeout(context.Background(), releaseBound)
	defer cancel()
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done // the renewer never blocks on a call, nor on OnLost: this is prompt

	l.mu.Lock()
	err := l.checkLocked()
	gone := l.lost != nil && (l.lost.Reason == LostRenewal || l.lost.Reason == LostNotHeld)
	l.mu.Unlock()
	if !gone {
		ok, rerr := l.releaseCall(ctx)
		l.mu.Lock()
		switch {
		case l.lost != nil:
			err = l.lost // lost before or meanwhile: the release was for the server's sake
		case rerr != nil:
			err = fmt.Errorf("dlock: could not release the lease on key %q (it expires by itself): %w", l.key, rerr)
		case !ok:
			l.loseLocked(LostNotHeld, nil)
			err = l.lost
		}
		l.mu.Unlock()
	}
	l.mu.Lock()
	l.released = true
	l.cancel()
	lost := l.lost
	l.mu.Unlock()
	// Lost, and OnLost perhaps not called yet: the renewer, stopped above,
	// may have left before the loss was known (a pause, a Proclaim or
	// UseFence that found it gone meanwhile, this release). notifyLost
	// calls it once in all; in a goroutine of its own, so that Release
	// never waits for it and a Release called from it does not wait for
	// this one (we are inside relOnce).
	if lost != nil && l.opts.OnLost != nil && atomic.LoadInt32(&l.notified) == 0 {
		go l.notifyLost()
	}
	l.closeConn()
	if !l.calls.wait(ctx.Done()) {
		e := fmt.Errorf("dlock: %d driver call(s) of the lease on key %q had not returned when Release gave up (they end when the driver returns)", l.calls.count(), l.key)
		if err == nil {
			return e
		}
		return fmt.Errorf("%w; %v", err, e)
	}
	return err
}

// notifyLost calls OnLost with the loss, once; a panic in it is logged.
func (l *Lease) notifyLost() {
	l.mu.Lock()
	lost := l.lost
	l.mu.Unlock()
	if lost == nil || l.opts.OnLost == nil || !atomic.CompareAndSwapInt32(&l.notified, 0, 1) {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			l.opts.Logf("dlock: OnLost of key %q panicked: %v", l.key, p)
		}
	}()
	l.opts.OnLost(lost)
}

// closeConn gives the session-bound lease's connection back to the pool
// (closing a *sql.Conn waits for its call in flight, so it is done in a
// call of its own).
func (l *Lease) closeConn() {
	if l.conn == nil {
		return
	}
	l.closeOnce.Do(func() {
		l.goCall(func() { _ = l.conn.Close() })
	})
}

// goCall runs f, a driver call, in a goroutine that is counted until it
// returns: the lease never waits for it past its deadline, but Release
// waits for it (within its bound).
func (l *Lease) goCall(f func()) {
	l.calls.add()
	go func() {
		defer l.calls.done()
		f()
	}()
}

// grantResult is the row of a statement that returns a lease.
type grantResult struct {
	ok        bool
	owner     string
	fence     int64
	expiresAt time.Time
	remaining time.Duration
	err       error
}

func scanGrant(row *sql.Row) grantResult {
	var r grantResult
	var key string
	var rem sql.NullInt64
	err := row.Scan(&key, &r.owner, &r.fence, &r.expiresAt, &rem)
	switch {
	case err == sql.ErrNoRows:
	case err != nil:
		r.err = err
	default:
		r.ok = true
		r.remaining = time.Duration(rem.Int64) * time.Millisecond
	}
	return r
}

// tracker counts goroutines and lets one wait, with a limit, for none to
// be left.
type tracker struct {
	mu   sync.Mutex
	n    int
	idle chan struct{}
}

func (t *tracker) add() {
	t.mu.Lock()
	if t.n == 0 {
		t.idle = make(chan struct{})
	}
	t.n++
	t.mu.Unlock()
}

func (t *tracker) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 {
		close(t.idle)
	}
	t.mu.Unlock()
}

func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// wait: true once none is left, false if stop comes first.
func (t *tracker) wait(stop <-chan struct{}) bool {
	t.mu.Lock()
	if t.n == 0 {
		t.mu.Unlock()
		return true
	}
	idle := t.idle
	t.mu.Unlock()
	select {
	case <-idle:
		return true
	case <-stop:
		return false
	}
}

// interval is d as a parameter of type interval (microseconds: exact).
func interval(d time.Duration) string {
	return fmt.Sprintf("%d microseconds", d.Microseconds())
}

func nullInterval(d time.Duration) interface{} {
	if d <= 0 {
		return nil
	}
	return interval(d)
}

func waitArg(w time.Duration) interface{} {
	if w < 0 {
		return nil // Forever: no limit of its own
	}
	return interval(w)
}

func minDur(a, b time.Duration) time.Duration {
	if b < a {
		if b < 0 {
			return 0
		}
		return b
	}
	return a
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return fmt.Sprintf("%x", time.Now().UnixNano())
	}
	return hex.EncodeToString(b)
}

// defaultHolder is user@host:pid, as the CLI's.
func defaultHolder() string {
	host, _ := os.Hostname()
	user := os.Getenv("USER")
	if user == "" {
		user = "go"
	}
	return fmt.Sprintf("%s@%s:%d", user, host, os.Getpid())
}
