package dlock

// The statements, with parameters only, every name schema-qualified (as
// client/main.c does: a search_path cannot redirect them). Each is one
// statement in autocommit, so they work behind PgBouncer in transaction
// mode.

// remainingMS is the lease's expiry minus the server's clock, read in the
// same statement as the grant or renewal: a duration measured by the
// server alone, never compared with our clock. It is shorter than the TTL
// asked for when dlock.max_hold cut the lease. Rounded down (floor), so
// that the client's deadline is never after the server's expiry (a cast
// to int8 rounds to the nearest).
func remainingMS(col string) string {
	return "pg_catalog.floor(pg_catalog.date_part('epoch', " + col + " OPERATOR(pg_catalog.-) " +
		"pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8"
}

const leaseColumns = "SELECT l.key, l.owner::pg_catalog.text, l.fence, l.expires_at, "

var (
	sqlTryAcquire = leaseColumns + remainingMS("l.expires_at") +
		" FROM dlock.try_acquire($1, $2::pg_catalog.interval, holder => $3," +
		" lock_delay => $4::pg_catalog.interval, session_bound => $5::pg_catalog.bool," +
		" permits => $6::pg_catalog.int4, mode => $7) AS l"
	// wait NULL: no limit of its own
	sqlAcquire = leaseColumns + remainingMS("l.expires_at") +
		" FROM dlock.acquire($1, $2::pg_catalog.interval, wait => $8::pg_catalog.interval," +
		" holder => $3, lock_delay => $4::pg_catalog.interval," +
		" session_bound => $5::pg_catalog.bool, permits => $6::pg_catalog.int4, mode => $7) AS l"
	sqlCampaign = leaseColumns + remainingMS("l.expires_at") +
		" FROM dlock.campaign($1, $6, $2::pg_catalog.interval, wait => $7::pg_catalog.interval," +
		" holder => $3, lock_delay => $4::pg_catalog.interval," +
		" session_bound => $5::pg_catalog.bool) AS l"
	sqlRenew = "SELECT e, " + remainingMS("e") +
		" FROM dlock.renew($1, $2::pg_catalog.uuid, $3::pg_catalog.interval) AS e"
)

const (
	sqlRelease  = "SELECT dlock.release($1, $2::pg_catalog.uuid)"
	sqlProclaim = "SELECT dlock.proclaim($1, $2::pg_catalog.uuid, $3)"
	sqlUseFence = "SELECT dlock.use_fence($1, $2::pg_catalog.int8)"
	sqlLeader   = "SELECT l.value, l.fence, l.since, l.expires_at FROM dlock.leader($1) AS l"
	sqlObserve  = "SELECT o.state, o.fence, o.holder, o.value, o.expires_at, o.since" +
		" FROM dlock.observe($1, $2::pg_catalog.int8, $3::pg_catalog.interval, $4," +
		" $5::pg_catalog.bool) AS o"
	// Cancel the statement that carries a marker ($1) in its text, wherever
	// it runs (behind PgBouncer: on whichever server connection), but not
	// this one.
	sqlCancelMarked = "SELECT pg_catalog.pg_cancel_backend(a.pid) FROM pg_catalog.pg_stat_activity a" +
		" WHERE a.state OPERATOR(pg_catalog.=) 'active'" +
		" AND pg_catalog.strpos(a.query, $1) OPERATOR(pg_catalog.>) 0" +
		" AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()"
)
