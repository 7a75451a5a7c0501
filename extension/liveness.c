/*-------------------------------------------------------------------------
 *
 * liveness.c
 *		Whether a lease is live: its state now, and when it ended.
 *
 * A lease is live while it is held, unexpired and, when session-bound,
 * its connection is up (keylock.c's session marks).  These are pure
 * judgments of a DlockLease as read by storage.c; the lease API, fencing,
 * the views and memory mode's eviction all judge through them.
 *
 * Owns: nothing.  Calls keylock.c (is a session mark still held?).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/timestamp.h"

#include "dlock.h"

/*
 * The state of *lease at now.  A session-bound lease is live only while
 * the connection that took it is up (keylock.c).
 */
DlockLeaseState
dlock_lease_state(const DlockLease *lease, TimestampTz now)
{
	if (!lease->found)
		return DLOCK_NO_ROW;
	if (!lease->held)
		return DLOCK_RELEASED;
	/* the connection first: no lock delay after it ended (blocked_until) */
	if (lease->session_id != 0 && !dlock_session_alive(lease->session_id))
		return DLOCK_DISCONNECTED;
	if (lease->expires_at <= now)
		return DLOCK_EXPIRED;
	return DLOCK_LIVE;
}

/*
 * When did *lease (of a key of database db) end, for prune() and for
 * memory mode's eviction?  DT_NOEND while it is live or a lock delay after
 * it still keeps the key.  A released or expired lease ended at its expiry;
 * a session-bound lease whose connection is gone ended when the connection
 * did, which nobody recorded: it counts as ended at its grant.
 */
TimestampTz
dlock_lease_ended_at(const DlockLease *lease, Oid db)
{
	TimestampTz now = GetCurrentTimestamp();

	if (!lease->found || lease->unknown)
		return DT_NOEND;
	/* the head of a key with slots: what they are is in the slots */
	if (lease->nslots > 0)
		return DT_NOEND;
	if (!lease->held)
		return lease->expires_at;
	if (lease->session_id != 0 && !dlock_session_alive_in(db, lease->session_id))
		return Min(lease->granted_at, lease->expires_at);
	if (lease->expires_at > now)
		return DT_NOEND;
	if (lease->lock_delay > 0 && now < lease->expires_at + lease->lock_delay)
		return DT_NOEND;
	return lease->expires_at;
}

/* Is *lease held by someone and live at now? */
bool
dlock_lease_is_live(const DlockLease *lease, TimestampTz now)
{
	return dlock_lease_state(lease, now) == DLOCK_LIVE;
}
