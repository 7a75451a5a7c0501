package dlock

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"time"
)

// renewResult is the answer to one dlock.renew.
type renewResult struct {
	null      bool // the server says the lease is not held
	remaining time.Duration
	expiresAt time.Time
	err       error
}

// renewOnce sends one renewal and reads its answer (blocking: it runs in a
// call of its own). sent, if not nil, is set to 1 once a connection is had
// (from the pool, or a new one): a renewal abandoned before that was never
// sent, and the loss must say so (a pool at its limit), not "no answer".
func (l *Lease) renewOnce(ctx context.Context, sent *int32) renewResult {
	var e sql.NullTime
	var rem sql.NullInt64
	q := querier(l.conn)
	if l.conn == nil {
		c, err := l.db.Conn(ctx)
		if err != nil {
			return renewResult{err: err}
		}
		defer c.Close()
		q = c
	}
	if sent != nil {
		atomic.StoreInt32(sent, 1)
	}
	err := q.QueryRowContext(ctx, sqlRenew, l.key, l.owner, l.ttlArg).Scan(&e, &rem)
	if err != nil {
		return renewResult{err: err}
	}
	if !e.Valid {
		return renewResult{null: true}
	}
	return renewResult{remaining: time.Duration(rem.Int64) * time.Millisecond, expiresAt: e.Time}
}

// attemptTimeout is how long a renewal may take before it is abandoned and
// another sent: min((deadline-now)/2, every), at least 100 ms (the CLI's).
func (l *Lease) attemptTimeout(deadline, now time.Time) time.Duration {
	t := deadline.Sub(now) / 2
	if l.every < t {
		t = l.every
	}
	if t < 100*time.Millisecond {
		t = 100 * time.Millisecond
	}
	return t
}

// retryDelay is the pause after a failed renewal.
func (l *Lease) retryDelay() time.Duration {
	d := l.every / 4
	if d < 50*time.Millisecond {
		d = 50 * time.Millisecond
	}
	if d > time.Second {
		d = time.Second
	}
	return d
}

// renewer keeps the lease until Release or the loss. It never blocks on a
// driver call: each renewal runs in a call of its own, and this loop waits
// for its answer, its timeout, the deadline and Release together, so the
// deadline is acted on in time even when a call hangs forever (a
// blackholed network; a driver whose cancellation hangs too). A renewal
// that times out is abandoned (its context cancelled) and another sent
// over a fresh connection from the pool. A session-bound lease cannot
// change connections: its renewal is given until the deadline, and a
// failed connection loses it at once.
func (l *Lease) renewer(next time.Time) {
	l.renew(next)
	close(l.done)
	// OnLost runs here, after done is closed: a Release called from it,
	// or waiting for the renewer elsewhere, does not wait for it.
	l.notifyLost()
}

func (l *Lease) renew(next time.Time) {
	var (
		inflight  chan renewResult
		gotConn   *int32 // the call in flight had a connection
		sent      time.Time
		callUntil time.Time
		ccancel   context.CancelFunc = func() {}
	)
	defer func() { ccancel() }()

	for {
		l.mu.Lock()
		err := l.checkLocked() // judges the deadline
		deadline := l.deadline
		l.mu.Unlock()
		if err != nil {
			break
		}

		now := time.Now()
		if inflight == nil && !now.Before(next) {
			timeout := l.attemptTimeout(deadline, now)
			if l.conn != nil {
				timeout = deadline.Sub(now)
			}
			cctx, cancel := context.WithTimeout(context.Background(), timeout)
			ccancel = cancel
			sent, callUntil = now, now.Add(timeout)
			ch := make(chan renewResult, 1)
			inflight = ch
			got := new(int32)
			gotConn = got
			l.goCall(func() { ch <- l.renewOnce(cctx, got) })
		}

		wake := deadline
		if inflight == nil {
			if next.Before(wake) {
				wake = next
			}
		} else if callUntil.Before(wake) {
			wake = callUntil
		}
		timer := time.NewTimer(time.Until(wake))

		select {
		case <-l.stop:
			timer.Stop()
			return
		case <-l.lostCh:
			timer.Stop()
		case r := <-inflight:
			timer.Stop()
			inflight = nil
			ccancel()
			l.renewed(r, sent)
			if r.err != nil || r.null {
				next = time.Now().Add(l.retryDelay())
			} else {
				next = sent.Add(l.every)
			}
		case <-timer.C:
			if inflight != nil && !time.Now().Before(callUntil) {
				// abandoned: its call ends when the driver returns
				ccancel()
				inflight = nil
				l.mu.Lock()
				within := callUntil.Sub(sent).Round(time.Millisecond)
				if atomic.LoadInt32(gotConn) == 0 {
					// never sent: the pool had no connection to give (at
					// SetMaxOpenConns, busy with waiting Acquires and
					// transactions), or a new one could not be made
					l.lastErr = fmt.Errorf("no connection from the pool (or a new one) for a renewal within %v", within)
				} else {
					l.lastErr = fmt.Errorf("no answer to a renewal within %v", within)
				}
				l.mu.Unlock()
				next = time.Now()
			}
		}
	}

	// lost
	l.closeConn()
}

// renewed acts on a renewal's answer: a new deadline from when it was
// sent, the loss on NULL (at once: the server says so), and for a
// session-bound lease the loss when its connection failed. Any other
// error is retried until the deadline (e.g. read-only after a failover).
func (l *Lease) renewed(r renewResult, sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.checkLocked() != nil {
		return // an answer after the deadline confirms nothing
	}
	switch {
	case r.err != nil:
		l.lastErr = wrap("renew", r.err)
		if l.conn != nil && connectionGone(r.err) {
			l.loseLocked(LostConnection, l.lastErr)
		}
	case r.null:
		l.loseLocked(LostRenewal, nil)
	default:
		l.deadline = sent.Add(minDur(l.ttl, r.remaining))
		l.expiresAt = r.expiresAt
		l.lastErr = nil
	}
}
