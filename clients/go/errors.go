package dlock

import (
	"errors"
	"fmt"
	"time"
)

// The kinds of failure a caller tells apart, with errors.Is. Errors from the
// server come as *Error (its SQLSTATE and the driver's error, unwrapped by
// errors.As); a lost lease as *LostError.
var (
	// ErrBusy: not granted: the key is held (a try that got no row), or a
	// wait ran out (SQLSTATE 55P03); in memory mode also while grants are
	// paused after a server restart (until its horizon), with nobody
	// holding the key.
	ErrBusy = errors.New("dlock: not granted: the key is held, or (memory mode) grants are paused after a restart")
	// ErrLost: the lease is lost (a renewal returned NULL, none was
	// confirmed before the deadline, its session-bound connection failed),
	// or the server refused a write under its token (SQLSTATE LF001).
	ErrLost = errors.New("dlock: the lease is lost")
	// ErrReleased: the lease was released by Release.
	ErrReleased = errors.New("dlock: the lease was released")
	// ErrNoLeader: nobody leads the election (Leader).
	ErrNoLeader = errors.New("dlock: nobody leads the election")
	// ErrInvalid: an argument the server or this package refuses
	// (SQLSTATE 22023, 22004; 22021: a NUL or invalid UTF-8 in a text,
	// which this package refuses before sending).
	ErrInvalid = errors.New("dlock: invalid argument")
	// ErrReadOnly: a grant, renewal or release on a standby or in a
	// read-only transaction (SQLSTATE 25006), e.g. after a failover.
	ErrReadOnly = errors.New("dlock: the server is read-only")
	// ErrPermission: not allowed for this role (SQLSTATE 42501).
	ErrPermission = errors.New("dlock: permission denied")
	// ErrNoRoom: memory mode has no room for another key or database
	// (SQLSTATE 53200, 53400).
	ErrNoRoom = errors.New("dlock: no room for the key in memory mode")
	// ErrUnsupported: not possible here, e.g. observe with a wait on a
	// standby (SQLSTATE 0A000).
	ErrUnsupported = errors.New("dlock: not supported here")
	// ErrPrerequisite: the server is not in the state the call needs, e.g.
	// the token counter was set back by hand (SQLSTATE 55000).
	ErrPrerequisite = errors.New("dlock: object not in prerequisite state")
)

// sentinels maps the SQLSTATEs documented in docs/reference.md's error
// table to the errors above.
var sentinels = map[string]error{
	"55P03": ErrBusy,
	"LF001": ErrLost,
	"22023": ErrInvalid,
	"22004": ErrInvalid,
	"22021": ErrInvalid, // character_not_in_repertoire: NUL, invalid UTF-8
	"25006": ErrReadOnly,
	"42501": ErrPermission,
	"53200": ErrNoRoom,
	"53400": ErrNoRoom,
	"0A000": ErrUnsupported,
	"55000": ErrPrerequisite,
}

// Error is an error the server raised during a dlock call: its SQLSTATE
// and the driver's error (errors.As reaches it, e.g. a *pq.Error).
// errors.Is(err, ErrLost) and the other sentinels match by SQLSTATE.
type Error struct {
	Op       string // what the library was doing: "acquire", "renew", "use_fence", ...
	SQLState string
	Err      error // the driver's error
}

func (e *Error) Error() string { return "dlock: " + e.Op + ": " + e.Err.Error() }

// Unwrap returns the driver's error.
func (e *Error) Unwrap() error { return e.Err }

// Is matches the sentinel of the error's SQLSTATE.
func (e *Error) Is(target error) bool {
	s, ok := sentinels[e.SQLState]
	return ok && s == target
}

// sqlState is the SQLSTATE of a driver's error: lib/pq's *pq.Error and
// pgx's *pgconn.PgError both have this method. "" when err has none (a
// network failure, a cancelled context).
func sqlState(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}

// wrap makes an error of the server an *Error; anything else (the
// network, a context) is returned as it is.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if state := sqlState(err); state != "" {
		return &Error{Op: op, SQLState: state, Err: err}
	}
	return err
}

// connectionGone tells whether err means the connection itself failed (no
// SQLSTATE at all: the driver's own error, or class 08, or the server
// shutting the session down), as opposed to the server refusing one
// statement.
func connectionGone(err error) bool {
	state := sqlState(err)
	switch {
	case state == "":
		return true
	case len(state) == 5 && state[:2] == "08":
		return true
	case state == "57P01", state == "57P02", state == "57P03":
		return true
	}
	return false
}

// LostReason says why a lease was lost.
type LostReason string

// The reasons a lease is lost.
const (
	// LostDeadline: no renewal was confirmed before the lease could have
	// run out (request sent + granted time, on the local monotonic clock).
	LostDeadline LostReason = "no renewal was confirmed before the deadline"
	// LostRenewal: a renewal returned NULL: the server says it is not held.
	LostRenewal LostReason = "a renewal found it no longer held"
	// LostConnection: the connection of a session-bound lease failed.
	LostConnection LostReason = "the connection of the session-bound lease failed"
	// LostFenced: the server refused a write under its token (LF001).
	LostFenced LostReason = "the server refused its token"
	// LostNotHeld: proclaim or release found it no longer held.
	LostNotHeld LostReason = "it was no longer held"
)

// LostError is why a lease was lost (Lease.Err, Lease.UseFence after the
// loss, OnLost). errors.Is(err, ErrLost) holds.
type LostError struct {
	Key    string
	Reason LostReason
	At     time.Time // when the library decided
	Cause  error     // the last error seen, if any
}

func (e *LostError) Error() string {
	s := fmt.Sprintf("dlock: lost the lease on key %q: %s", e.Key, e.Reason)
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Is matches ErrLost.
func (e *LostError) Is(target error) bool { return target == ErrLost }

// Unwrap returns the last error seen before the loss, if any.
func (e *LostError) Unwrap() error { return e.Cause }
