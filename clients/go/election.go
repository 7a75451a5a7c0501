package dlock

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Campaign waits to lead election (dlock.campaign), publishing value (the
// candidate's address, say), and returns the leadership as a Lease: its
// Fence is the term's epoch, its writes are fenced like any lease's, it is
// renewed like any lease, and Release resigns. opts.Wait as for Acquire
// (use Forever to wait for one's turn); opts.Permits and opts.Mode do not
// apply.
func Campaign(ctx context.Context, db *sql.DB, election, value string, opts Options) (*Lease, error) {
	if (opts.Permits != 0 && opts.Permits != 1) || (opts.Mode != "" && opts.Mode != Exclusive) {
		return nil, fmt.Errorf("%w: an election has one exclusive lease", ErrInvalid)
	}
	return grant(ctx, db, election, opts, "campaign", sqlCampaign, &value)
}

// Value is the value the leader published (Campaign, Proclaim); "" for a
// lease that is not a campaign's.
func (l *Lease) Value() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.value.String
}

// Proclaim publishes a new value for the current term (dlock.proclaim),
// keeping the lease, its epoch and its expiry. It returns the loss without
// touching the database once the lease is lost, and marks it lost when the
// server says it does not lead any more. It returns at the loss at the
// latest (the lease's deadline), even when the call hangs on a silent
// network; ctx can end it sooner.
func (l *Lease) Proclaim(ctx context.Context, value string) error {
	if err := l.Err(); err != nil {
		return err
	}
	if err := checkText(value); err != nil {
		return err
	}
	// The statement runs in a call of its own, and Proclaim returns at the
	// loss (the deadline's timer) if it has not answered by then: on a
	// silent network lib/pq heeds ctx neither while connecting nor while
	// reading. The call, abandoned, ends when the driver returns.
	type res struct {
		ok  bool
		err error
	}
	pctx, pcancel := context.WithCancel(ctx)
	ch := make(chan res, 1)
	l.goCall(func() {
		defer pcancel()
		var ok bool
		err := l.q().QueryRowContext(pctx, sqlProclaim, l.key, l.owner, value).Scan(&ok)
		ch <- res{ok, err}
	})
	var ok bool
	select {
	case r := <-ch:
		if r.err != nil {
			return wrap("proclaim", r.err)
		}
		ok = r.ok
	case <-l.ctx.Done(): // lost or released
		pcancel()
		return l.Err()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !ok {
		l.loseLocked(LostNotHeld, nil)
		return l.checkLocked()
	}
	l.value = sql.NullString{String: value, Valid: true}
	return nil
}

// LeaderInfo is who leads an election (dlock.leader).
type LeaderInfo struct {
	Value     string // NULL (a lease never proclaimed) is ""
	Epoch     int64  // the term's fencing token
	Since     time.Time
	ExpiresAt time.Time // server clock
}

// Leader tells who leads election; ErrNoLeader when nobody does.
func Leader(ctx context.Context, db *sql.DB, election string) (LeaderInfo, error) {
	var li LeaderInfo
	var v sql.NullString
	err := db.QueryRowContext(ctx, sqlLeader, election).Scan(&v, &li.Epoch, &li.Since, &li.ExpiresAt)
	if err == sql.ErrNoRows {
		return LeaderInfo{}, ErrNoLeader
	}
	if err != nil {
		return LeaderInfo{}, wrap("leader", err)
	}
	li.Value = v.String
	return li, nil
}

// State is what dlock.observe reports of a key's exclusive lease (an
// election's term).
type State struct {
	State     string // "held", "released", "expired" or "none"; only "held" means someone holds it
	Fence     int64  // the lease's token (the term's epoch); 0 for "none"
	Holder    string
	Value     string
	ExpiresAt time.Time // server clock; zero for "none"
	Since     time.Time // the grant; zero when unknown
}

// Held tells whether someone holds the lease (leads the election).
func (s State) Held() bool { return s.State == "held" }

// Observer follows a key or an election with dlock.observe's long poll:
// each Next returns the next state the caller has not seen. One call is
// one statement, so it works behind PgBouncer in transaction mode (each
// waiting call occupies a server connection).
type Observer struct {
	db  *sql.DB
	key string
	// Wait is how long one call waits in the server (default 30s).
	Wait time.Duration

	fence   int64
	value   sql.NullString
	seenEnd bool
}

// NewObserver follows key from now: the first Next returns its current
// state.
func NewObserver(db *sql.DB, key string) *Observer {
	return &Observer{db: db, key: key, Wait: 30 * time.Second}
}

// Next waits for a state not seen yet and returns it (the latest one:
// changes that follow each other quickly can be seen as one). ctx cancels
// the wait.
func (o *Observer) Next(ctx context.Context) (State, error) {
	for {
		var s State
		var fence sql.NullInt64
		var holder, value sql.NullString
		var exp, since sql.NullTime
		var seen interface{}
		if o.value.Valid {
			seen = o.value.String
		}
		// The call runs on a context of its own, cancelled in the server
		// when ctx is (see cancelMarked: the driver's cancellation alone
		// can arrive before the statement starts, and be lost, and the
		// call would then wait its whole Wait).
		if err := ctx.Err(); err != nil {
			return State{}, err
		}
		marker := "dlock-go:" + randomHex(8)
		qctx, qcancel := context.WithCancel(context.Background())
		fin := make(chan struct{})
		var err error
		go func() {
			defer close(fin)
			defer qcancel()
			err = o.db.QueryRowContext(qctx, "/* "+marker+" */ "+sqlObserve, o.key, o.fence,
				interval(o.Wait), seen, o.seenEnd).Scan(&s.State, &fence, &holder, &value, &exp, &since)
		}()
		select {
		case <-fin:
		case <-ctx.Done():
			cancelMarked(o.db, marker, fin, qcancel, func(f func()) { go f() })
			return State{}, ctx.Err()
		}
		if err == sql.ErrNoRows {
			continue // the wait ran out: nothing new
		}
		if err != nil {
			if ctx.Err() != nil {
				return State{}, ctx.Err()
			}
			return State{}, wrap("observe", err)
		}
		s.Fence, s.Holder, s.Value = fence.Int64, holder.String, value.String
		s.ExpiresAt, s.Since = exp.Time, since.Time
		// what the next call has seen: observe's watch loop
		// (docs/reference.md)
		if fence.Valid {
			o.fence = fence.Int64
		}
		o.value = value
		o.seenEnd = s.State != "held"
		return s, nil
	}
}

// Observe follows key in a goroutine and sends each new state on the
// returned channel, which is closed when ctx is done (the goroutine has
// then returned, or returns as soon as the driver hands back the
// cancelled call). Errors are retried after 0.1 s, then twice as long each
// time, at most 5 s, as dlock leader --watch does; a change made
// meanwhile is sent once the server answers again.
func Observe(ctx context.Context, db *sql.DB, key string) <-chan State {
	ch := make(chan State)
	o := NewObserver(db, key)
	go func() {
		defer close(ch)
		backoff := 100 * time.Millisecond
		for {
			s, err := o.Next(ctx)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				t := time.NewTimer(backoff)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				if backoff *= 2; backoff > 5*time.Second {
					backoff = 5 * time.Second
				}
				continue
			}
			backoff = 100 * time.Millisecond
			select {
			case ch <- s:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}
