/*-------------------------------------------------------------------------
 *
 * election.c
 *		Leader election on a key (campaign, proclaim, leader) and watching
 *		a key without polling (observe).
 *
 * An election is an ordinary exclusive lease with a value: campaign() is
 * acquire() that stores the value, so the leader's epoch is the lease's
 * token and every guarantee of a lease holds for it (FIFO waits, fenced
 * writes, lock_delay, session_bound, both storage modes); resigning is
 * release().  proclaim() is an owner operation like renew(): it takes the
 * owner-op locks, never the key's grant lock, so it neither waits for the
 * leader's writers nor makes them wait, and the end of its transaction
 * wakes the key's observers.
 *
 * observe() sleeps on its latch, registered as a waiter for the key's
 * lease (wait.c), exactly as an acquirer at the head of the queue does:
 * every transaction that changed the lease (grant, renew, release,
 * proclaim) wakes it after it commits, and it sets its own alarm for the
 * lease's expiry.  It never enters the acquirers' queue, so it delays no
 * grant.  An expiry it reports is confirmed under a lock that only owner
 * ops conflict with, taken without waiting and given back at once: a
 * renewal that was checked in time but has not committed yet keeps the
 * lease live, and no grant or writer waits for an observer.
 *
 * Owns: nothing of its own.  Calls lease.c (the acquire and the owner
 * check), stats.c and events.c (noticed expiries, proclaims), storage.c,
 * liveness.c, keylock.c, wait.c, args.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "dlock.h"

PG_FUNCTION_INFO_V1(dlock_campaign);
PG_FUNCTION_INFO_V1(dlock_proclaim);
PG_FUNCTION_INFO_V1(dlock_leader);
PG_FUNCTION_INFO_V1(dlock_observe);

/*
 * dlock.campaign(election, value, ttl, wait, holder, lock_delay,
 * session_bound): become the leader of election, waiting as acquire()
 * does; the lease's token is the leader's epoch, and value what leader()
 * and observe() show until a proclaim() changes it.
 */
Datum
dlock_campaign(PG_FUNCTION_ARGS)
{
	DlockAcquireArgs args;
	DlockLease	lease;

	dlock_no_parallel(fcinfo);
	dlock_check_writable();
	args.key = dlock_key_arg(fcinfo, 0);
	args.opts.value = dlock_value_arg(fcinfo, 1);
	args.ttl = dlock_ttl_arg(fcinfo, 2);
	args.wait = 0;
	args.bounded = dlock_wait_arg(fcinfo, 3, &args.wait);
	args.wait_argno = 3;
	args.opts.holder = dlock_holder_arg(fcinfo, 4);
	args.opts.lock_delay = dlock_lock_delay_arg(fcinfo, 5);
	args.opts.session_bound = dlock_bool_arg(fcinfo, 6, "session_bound", false);
	args.opts.permits = 1;		/* one leader */
	args.opts.nslots = 0;

	dlock_acquire_lease(fcinfo, &args, &lease);
	return dlock_lease_result(fcinfo, args.key, &lease);
}

/*
 * dlock.proclaim(election, owner, value): as the leader, publish a new
 * value without giving up the lease; false when owner does not hold a live
 * lease on election.  Keeps the epoch and the expiry.
 */
Datum
dlock_proclaim(PG_FUNCTION_ARGS)
{
	text	   *key;
	pg_uuid_t  *owner;
	text	   *value;
	DlockOwnerKey ok;
	DlockLease	lease;
	TimestampTz now;

	dlock_no_parallel(fcinfo);
	dlock_check_writable();
	key = dlock_key_arg(fcinfo, 0);
	owner = dlock_owner_arg(fcinfo, 1);
	value = dlock_value_arg(fcinfo, 2);

	if (!dlock_begin_owner_op(key, owner, &ok, &lease, &now))
		PG_RETURN_BOOL(false);
	dlock_storage_set_value(ok.key, value);
	dlock_log_proclaim(ok.k, ok.len, &lease, value);
	PG_RETURN_BOOL(true);
}

/*
 * dlock.leader(election): the live lease's value, epoch, grant time and
 * expiry; no row when nobody holds a live lease (in memory mode, also
 * until the horizon after a restart: nobody's writes are accepted then).
 */
Datum
dlock_leader(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *key;
	DlockLeaseRow *row;
	Datum		values[4];
	bool		nulls[4] = {0};

	dlock_no_parallel(fcinfo);
	key = dlock_key_arg(fcinfo, 0);
	InitMaterializedSRF(fcinfo, 0);
	row = dlock_storage_read_row(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
	if (row == NULL || row->lease.unknown ||
		!dlock_lease_is_live(&row->lease, GetCurrentTimestamp()))
		return (Datum) 0;
	values[0] = PointerGetDatum(row->value);
	nulls[0] = (row->value == NULL);
	values[1] = Int64GetDatum(row->lease.fence);
	values[2] = TimestampTzGetDatum(row->lease.granted_at);
	values[3] = TimestampTzGetDatum(row->lease.expires_at);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/* Are a and b (either NULL) the same value? */
static bool
same_value(const text *a, const text *b)
{
	if (a == NULL || b == NULL)
		return a == b;
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/* What observe() found at one look. */
typedef enum Sight
{
	SIGHT_REPORT,				/* a change to return */
	SIGHT_SLEEP,				/* nothing new: sleep until *wake_at */
	SIGHT_CONFIRM,				/* an expiry, to confirm under the lock */
	SIGHT_BUSY					/* ... while the key lock is busy */
} Sight;

/*
 * Judge key's lease *row (NULL: none) for observe() at now: return what to
 * do and, for SIGHT_SLEEP, set *wake_at to when its state changes by itself
 * (its expiry, the barrier), DT_NOEND for never.  *ref is the value the
 * caller knows (taken from the first live lease judged when it gave none).
 */
static Sight
judge(const DlockLeaseRow *row, TimestampTz now, int64 after_fence,
	  bool seen_end, text **ref, bool *ref_set, TimestampTz *wake_at)
{
	DlockLeaseState state;

	*wake_at = DT_NOEND;
	if (row == NULL)
		return seen_end ? SIGHT_SLEEP : SIGHT_REPORT;
	if (row->lease.unknown)
	{
		/* memory mode before the horizon: nothing is known until then */
		*wake_at = row->lease.expires_at;
		return SIGHT_SLEEP;
	}
	if (row->lease.fence > after_fence)
		return SIGHT_REPORT;
	state = dlock_lease_state(&row->lease, now);
	if (state == DLOCK_LIVE)
	{
		if (!*ref_set)
		{
			*ref = row->value;
			*ref_set = true;
		}
		if (!same_value(row->value, *ref))
			return SIGHT_REPORT;
		*wake_at = row->lease.expires_at;
		return SIGHT_SLEEP;
	}
	*ref_set = true;			/* a lease granted later reports anyway */
	if (seen_end)
		return SIGHT_SLEEP;
	if (state == DLOCK_RELEASED)
		return SIGHT_REPORT;
	return SIGHT_CONFIRM;
}

/*
 * row, unless it is only the head of a key that has only ever had permits
 * or shared leases: no lease of its own (token 0), as if it had no row.
 */
static DlockLeaseRow *
no_head(DlockLeaseRow *row)
{
	if (row != NULL && !row->lease.unknown && row->lease.fence == 0)
		return NULL;
	return row;
}

/*
 * Look at key for observe(): judge its lease (*row, NULL when none), and
 * confirm an expiry under a lock that excludes owner ops only (not grants,
 * nor writers): a renewal checked in time may still be committing.  Only
 * with the lock free at once (SIGHT_BUSY otherwise); it is given back at
 * once.
 */
static Sight
observe_look(const char *k, int len, int64 after_fence, bool seen_end,
			 text **ref, bool *ref_set, DlockLeaseRow **row,
			 TimestampTz *wake_at)
{
	TimestampTz now;
	Sight		sight;

	*row = no_head(dlock_storage_read_row(k, len));
	sight = judge(*row, GetCurrentTimestamp(), after_fence, seen_end,
				  ref, ref_set, wake_at);
	if (sight != SIGHT_CONFIRM)
		return sight;
	if (RecoveryInProgress())
		return SIGHT_REPORT;	/* no lock to take; nothing commits here */
	if (!dlock_lock_for_look(k, len))
		return SIGHT_BUSY;
	*row = no_head(dlock_storage_read_row(k, len));
	now = GetCurrentTimestamp();
	sight = judge(*row, now, after_fence, seen_end, ref, ref_set, wake_at);
	if (sight == SIGHT_CONFIRM)
	{
		dlock_notice_end(k, len, &(*row)->lease,
						 dlock_lease_state(&(*row)->lease, now), now);
		sight = SIGHT_REPORT;
	}
	dlock_unlock_look(k, len);
	return sight;
}

/*
 * dlock.observe(key, after_fence, wait, seen_value, seen_end): return the
 * key's (fence, holder, value, state, expires_at, since) as soon as its
 * token is above after_fence, its current lease is not live or it has none
 * (unless seen_end says the caller knows), or its live lease's value
 * differs from seen_value (NULL: from the value when the call began); no
 * row when wait (NULL: no limit) runs out first.
 */
Datum
dlock_observe(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *key;
	const char *k;
	int			len;
	int64		after_fence;
	int64		wait = 0;
	bool		bounded;
	text	   *ref = NULL;
	bool		ref_set = false;
	bool		seen_end;
	TimestampTz deadline;
	bool		registered = false;
	bool		busy_registered = false;
	DlockLeaseRow *row = NULL;
	bool		report = false;

	dlock_no_parallel(fcinfo);
	key = dlock_key_arg(fcinfo, 0);
	if (PG_ARGISNULL(1))
		dlock_null_argument(fcinfo, "after_fence");
	after_fence = PG_GETARG_INT64(1);
	if (after_fence < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("after_fence must not be negative"),
				 errdetail("The token given was " INT64_FORMAT ".", after_fence),
				 errhint("Pass 0 to see the key's current lease, or the last token observe() returned.")));
	bounded = dlock_wait_arg(fcinfo, 2, &wait);
	if (!PG_ARGISNULL(3))
	{
		ref = PG_GETARG_TEXT_PP(3);
		ref_set = true;
	}
	seen_end = dlock_bool_arg(fcinfo, 4, "seen_end", false);
	k = VARDATA_ANY(key);
	len = VARSIZE_ANY_EXHDR(key);
	deadline = GetCurrentTimestamp() + (bounded ? wait : 0);
	if ((!bounded || wait > 0) && RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dlock.observe() cannot wait during recovery"),
				 errdetail("On a standby, changes arrive by WAL replay, which wakes no observer."),
				 errhint("Observe on the primary, or pass wait => '0' and poll.")));
	InitMaterializedSRF(fcinfo, 0);

	/*
	 * (An error or a cancel while registered: the registrations' locks go
	 * with the transaction, their counts at its end; see wait.c.)
	 */
	for (;;)
	{
		TimestampTz wake_at = DT_NOEND;
		TimestampTz now;
		Sight		sight;

		CHECK_FOR_INTERRUPTS();
		/* register before the look: no wake-up slips between */
		if (!registered && (!bounded || wait > 0))
		{
			dlock_wait_register(k, len, false);
			registered = true;
		}
		sight = observe_look(k, len, after_fence, seen_end, &ref, &ref_set,
							 &row, &wake_at);
		if (sight == SIGHT_REPORT)
		{
			report = true;
			break;
		}
		if (sight == SIGHT_BUSY && !busy_registered && (!bounded || wait > 0))
		{
			/* wait for the lock, too; look again before sleeping */
			dlock_wait_register(k, len, true);
			busy_registered = true;
			continue;
		}
		now = GetCurrentTimestamp();
		if (bounded && now >= deadline)
			break;
		if (bounded && deadline < wake_at)
			wake_at = deadline;
		dlock_sleep_until(wake_at);
	}
	if (busy_registered)
		dlock_wait_unregister(k, len, true);
	if (registered)
		dlock_wait_unregister(k, len, false);

	if (report)
	{
		Datum		values[6];
		bool		nulls[6] = {0};
		TimestampTz now = GetCurrentTimestamp();

		if (row == NULL)
		{
			memset(nulls, true, sizeof(nulls));
			values[3] = CStringGetTextDatum("none");
			nulls[3] = false;
		}
		else
		{
			DlockLeaseState state = dlock_lease_state(&row->lease, now);

			values[0] = Int64GetDatum(row->lease.fence);
			values[1] = PointerGetDatum(row->holder);
			nulls[1] = (row->holder == NULL);
			values[2] = PointerGetDatum(row->value);
			nulls[2] = (row->value == NULL);
			values[3] = CStringGetTextDatum(state == DLOCK_LIVE ? "held" :
											state == DLOCK_RELEASED ? "released" :
											"expired");
			values[4] = TimestampTzGetDatum(row->lease.expires_at);
			values[5] = TimestampTzGetDatum(row->lease.granted_at);
		}
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
