/*-------------------------------------------------------------------------
 *
 * lease.c
 *		The lease API: try_acquire, acquire, renew, release, prune, forget,
 *		and the view dlock.lease_status.
 *
 * Thin callers: arguments are checked by args.c, keys locked for what we
 * intend by keylock.c (whose header comment has the conflict matrix),
 * leases read and written through storage.c, waits slept in wait.c, and
 * what happened counted and logged by stats.c.
 *
 * A grant looks first without any lock and refuses at once when the lease
 * is live; only a key that looks free is locked, conditionally, and looked
 * at again under the lock.  When the lock is busy (a grant, a release or a
 * writer under an expired lease is still open) try_acquire refuses and
 * acquire sleeps on its latch until that transaction ends and wakes it;
 * when the lease is live, acquire sleeps until its expiry, or until a
 * release or renewal wakes it.  No competitor ever waits in the lock
 * manager's queue.
 *
 * Owns: the rules of granting (when a key may be granted, lock_delay,
 * max_hold, the owner check).  Calls fence.c (a changed lease is no longer
 * verified), wait.c, stats.c, storage.c, liveness.c, keylock.c, args.c
 * and settings.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/wait_event.h"

#include "dlock.h"

PG_FUNCTION_INFO_V1(dlock_try_acquire);
PG_FUNCTION_INFO_V1(dlock_acquire);
PG_FUNCTION_INFO_V1(dlock_renew);
PG_FUNCTION_INFO_V1(dlock_release);
PG_FUNCTION_INFO_V1(dlock_prune);
PG_FUNCTION_INFO_V1(dlock_forget);
PG_FUNCTION_INFO_V1(dlock_lease_status);

typedef enum GrantResult
{
	GRANT_OK,					/* granted; the grant lock is held */
	GRANT_HELD,					/* a live lease, or a lock delay, is in the way */
	GRANT_BUSY,					/* the key lock is busy; no live lease seen */
	GRANT_QUEUED				/* other acquirers are ahead in the queue */
} GrantResult;

/*
 * Look at key's lease *lease at now: return its state, and count (once)
 * a lease that has ended without a release.
 */
static DlockLeaseState
look(const char *k, int len, const DlockLease *lease, TimestampTz now)
{
	DlockLeaseState state = dlock_lease_state(lease, now);

	if (state == DLOCK_EXPIRED || state == DLOCK_DISCONNECTED)
		dlock_notice_end(k, len, lease, state, now);
	return state;
}

/*
 * Until when may nobody be granted key, whose lease *lease is in state at
 * now?  0 when it may be granted now.  A live lease blocks until it
 * expires; one granted with a lock delay that ran out unreleased blocks
 * for the delay after its expiry.  (One whose connection ended is free at
 * once: that connection has no work in flight.)
 */
static TimestampTz
blocked_until(const DlockLease *lease, DlockLeaseState state, TimestampTz now)
{
	if (state == DLOCK_LIVE)
		return lease->expires_at;
	if (state == DLOCK_EXPIRED && lease->lock_delay > 0 &&
		now < lease->expires_at + lease->lock_delay)
		return lease->expires_at + lease->lock_delay;
	return 0;
}

/*
 * Grant key (its row *prev, read under the grant lock) for ttl microseconds
 * from now: write the lease, check its token against the key's last one,
 * count it.  On GRANT_OK, *lease is the new lease; GRANT_BUSY when a
 * prune() deleting the key's row has not committed yet.  The caller gives
 * back its locks on failure.
 */
static GrantResult
grant_locked(text *key, int64 ttl, const DlockGrantOptions *opts,
			 const DlockLease *prev, TimestampTz now, DlockLease *lease)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	TimestampTz hold_limit = DT_NOEND;

	/* dlock.max_hold caps the grant, and every renewal of it */
	if (dlock_max_hold_ms > 0)
	{
		hold_limit = now + (int64) dlock_max_hold_ms * 1000;
		ttl = Min(ttl, (int64) dlock_max_hold_ms * 1000);
	}
	if (!dlock_storage_grant(key, now, now + ttl, hold_limit, opts, lease))
	{
		/*
		 * A prune() that deleted the key's row has not committed yet; or,
		 * in memory mode, a restore moved the database's barrier.
		 */
		return GRANT_BUSY;
	}

	/*
	 * Tokens only grow.  A new token at or below one this key was issued
	 * means that the counter was set back (by hand, or by restoring a
	 * sequence from somewhere else): refuse, so that no token is issued
	 * twice, until an administrator moves the counter forward.
	 */
	if (prev->found && !prev->unknown && lease->fence <= prev->fence)
	{
		int			base = dlock_base_key_len(k, len);

		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dlock's token counter is behind a token it issued for key \"%s\"",
						pnstrdup(k, base)),
				 errdetail("The key's last token is " INT64_FORMAT "; the counter gave " INT64_FORMAT ".",
						   prev->fence, lease->fence),
				 errhint("Something set dlock.token_seq back.  As its owner, move it past every token issued, e.g. SELECT setval('dlock.token_seq', max(fence)) FROM dlock.leases, then grant again.")));
	}
	dlock_forget_verified(k, len);
	dlock_count_grant(k, len, prev, lease, opts);
	return GRANT_OK;
}

/*
 * May key (len bytes), whose head says it has used nslots slot keys, be
 * granted exclusively as far as its slots go?  GRANT_OK when no slot's
 * lease is live (nor in its lock delay); else GRANT_HELD, with *lease the
 * slot lease in the way that frees first and *until when, or GRANT_BUSY.
 * With locked (the caller holds the key's grant lock), each slot whose
 * lease is held is locked as for a grant too, without waiting, and looked
 * at under that lock: that orders the grant after the writers under the
 * slot's lease (it may have just run out), and a renewal checked in time
 * is not missed.  Those locks are kept on GRANT_OK, given back otherwise.
 */
static GrantResult
slots_free(const char *k, int len, int32 nslots, bool locked,
		   DlockLease *lease, TimestampTz *until)
{
	char		sk[DLOCK_MAX_STORED_KEY_BYTES + 1];
	int			taken[DLOCK_MAX_SLOTS];
	int			ntaken = 0;
	GrantResult r = GRANT_OK;
	int			i;

	*until = DT_NOEND;
	for (i = 1; i <= nslots && r != GRANT_BUSY; i++)
	{
		int			sklen = dlock_slot_key(sk, k, len, i);
		DlockLease	slot;
		TimestampTz now = GetCurrentTimestamp();
		TimestampTz u;

		dlock_read_lease(sk, sklen, &slot);
		u = blocked_until(&slot, dlock_lease_state(&slot, now), now);
		if (u == 0 && locked && slot.found && slot.held)
		{
			if (!dlock_lock_for_grant(sk, sklen))
			{
				r = GRANT_BUSY;
				break;
			}
			taken[ntaken++] = i;
			dlock_read_lease(sk, sklen, &slot);
			now = GetCurrentTimestamp();
			u = blocked_until(&slot, look(sk, sklen, &slot, now), now);
		}
		if (u != 0)
		{
			r = GRANT_HELD;
			if (u < *until)
			{
				*until = u;
				*lease = slot;
			}
		}
	}
	if (r != GRANT_OK)
	{
		for (i = 0; i < ntaken; i++)
		{
			int			sklen = dlock_slot_key(sk, k, len, taken[i]);

			dlock_unlock_grant(sk, sklen);
		}
	}
	return r;
}

/*
 * One attempt to grant key exclusively for ttl microseconds.  Never waits.
 * On GRANT_OK, *lease is the new lease and the grant lock stays held until
 * the end of the transaction; on GRANT_HELD, *lease is the lease in the
 * way and *until when it stops being in the way.
 */
static GrantResult
attempt_grant(text *key, int64 ttl, const DlockGrantOptions *opts,
			  DlockLease *lease, TimestampTz *until)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	TimestampTz now = GetCurrentTimestamp();
	DlockLease	prev;
	DlockGrantOptions o;
	GrantResult r;

	/*
	 * A refusal needs no lock.  (Nor is an expiry counted from this look:
	 * a renewal may be in flight, and the look under the lock is exact.)
	 */
	dlock_read_lease(k, len, lease);
	*until = blocked_until(lease, dlock_lease_state(lease, now), now);
	if (*until != 0)
		return GRANT_HELD;
	if (lease->nslots > 0 &&
		(r = slots_free(k, len, lease->nslots, false, lease, until)) != GRANT_OK)
		return r;
	if (!dlock_lock_for_grant(k, len))
		return GRANT_BUSY;
	/* read again: a grant may have committed since the first look */
	dlock_read_lease(k, len, lease);
	now = GetCurrentTimestamp();
	*until = blocked_until(lease, look(k, len, lease, now), now);
	if (*until != 0)
	{
		dlock_unlock_grant(k, len);
		return GRANT_HELD;
	}
	prev = *lease;
	if (prev.nslots > 0 &&
		(r = slots_free(k, len, prev.nslots, true, lease, until)) != GRANT_OK)
	{
		dlock_unlock_grant(k, len);
		return r;
	}
	o = *opts;
	o.nslots = prev.nslots;		/* the head keeps its slot count */
	r = grant_locked(key, ttl, &o, &prev, GetCurrentTimestamp(), lease);
	if (r != GRANT_OK)
		dlock_unlock_grant(k, len);
	return r;
}

/*
 * One attempt to grant one of key's slots: one of its first opts->permits
 * permits, or (opts->permits 0) a shared lease, in any of DLOCK_MAX_SLOTS
 * slots.  Never waits.  The lowest free slot is taken.  A live exclusive
 * lease of the key (or its lock delay) is in the way of every slot.  On
 * GRANT_OK, *lease is the new lease of the slot, and the key's slot-grant
 * lock and the slot's grant lock stay held until the end of the
 * transaction; on GRANT_HELD, *lease is the lease in the way that frees
 * first and *until when.
 */
static GrantResult
attempt_slot_grant(text *key, int64 ttl, const DlockGrantOptions *opts,
				   DlockLease *lease, TimestampTz *until)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	int			last = opts->permits == 0 ? DLOCK_MAX_SLOTS : opts->permits;
	char		sk[DLOCK_MAX_STORED_KEY_BYTES + 1];
	int			sklen;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz u;
	DlockLease	head;
	DlockLease	slot;
	DlockGrantOptions o;
	bool		busy = false;
	int			first = 0;
	int			i;

	/* a look without a lock: the first slot that may be free */
	*until = DT_NOEND;
	dlock_read_lease(k, len, &head);
	u = blocked_until(&head, dlock_lease_state(&head, now), now);
	if (u != 0)
	{
		*lease = head;
		*until = u;
		return GRANT_HELD;
	}
	for (i = 1; i <= last && first == 0; i++)
	{
		if (i > head.nslots)
		{
			first = i;			/* never used */
			break;
		}
		sklen = dlock_slot_key(sk, k, len, i);
		dlock_read_lease(sk, sklen, &slot);
		u = blocked_until(&slot, dlock_lease_state(&slot, now), now);
		if (u == 0)
			first = i;
		else if (u < *until)
		{
			*until = u;
			*lease = slot;
		}
	}
	if (first == 0)
		return GRANT_HELD;

	/*
	 * The key's own lease ran out unreleased: a renewal of it may have been
	 * checked in time and not have committed yet, and the slot-grant lock
	 * does not wait for owner ops.  Look under a lock that only owner ops
	 * conflict with (not other slot grants), and give it back: once that
	 * look finds the lease ended, no later renewal can succeed (an owner
	 * op checks the clock under its lock, which it keeps until it ends).
	 */
	if (head.found && head.held && !head.unknown)
	{
		if (!dlock_lock_for_look(k, len))
			return GRANT_BUSY;
		dlock_read_lease(k, len, &head);
		now = GetCurrentTimestamp();
		u = blocked_until(&head, look(k, len, &head, now), now);
		dlock_unlock_look(k, len);
		if (u != 0)
		{
			*lease = head;
			*until = u;
			return GRANT_HELD;
		}
	}
	if (!dlock_lock_for_slot_grant(k, len))
		return GRANT_BUSY;
	dlock_read_lease(k, len, &head);
	now = GetCurrentTimestamp();
	u = blocked_until(&head, look(k, len, &head, now), now);
	if (u != 0)
	{
		dlock_unlock_slot_grant(k, len);
		*lease = head;
		*until = u;
		return GRANT_HELD;
	}
	for (i = first; i <= last; i++)
	{
		GrantResult r;
		text	   *skey;

		sklen = dlock_slot_key(sk, k, len, i);
		if (i <= head.nslots)
		{
			dlock_read_lease(sk, sklen, &slot);
			u = blocked_until(&slot, dlock_lease_state(&slot, now), now);
			if (u != 0)
			{
				if (u < *until)
				{
					*until = u;
					*lease = slot;
				}
				continue;
			}
		}
		if (!dlock_lock_for_grant(sk, sklen))
		{
			busy = true;		/* a grant of this slot in flight */
			continue;
		}
		dlock_read_lease(sk, sklen, &slot);
		now = GetCurrentTimestamp();
		u = blocked_until(&slot, look(sk, sklen, &slot, now), now);
		if (u != 0)
		{
			dlock_unlock_grant(sk, sklen);
			if (u < *until)
			{
				*until = u;
				*lease = slot;
			}
			continue;
		}
		if (i > head.nslots)
		{
			/*
			 * The key's first use of this slot: the head records it, and
			 * more at once (all N permits; for shared leases, twice as
			 * many as before), so that the grants that follow need not
			 * wait for this one to commit before they can record theirs.
			 */
			int32		n = opts->permits > 1 ? opts->permits :
				Min(DLOCK_MAX_SLOTS, Max(8, 2 * head.nslots));

			if (!dlock_lock_for_new_slot(k, len))
			{
				dlock_unlock_grant(sk, sklen);
				dlock_unlock_slot_grant(k, len);
				return GRANT_BUSY;
			}
			dlock_read_lease(k, len, &head);
			n = Max(n, i);
			if (head.nslots < n && !dlock_storage_set_slots(key, n))
			{
				dlock_unlock_grant(sk, sklen);
				dlock_unlock_slot_grant(k, len);
				return GRANT_BUSY;
			}
		}
		o = *opts;
		o.nslots = 0;
		skey = cstring_to_text_with_len(sk, sklen);
		r = grant_locked(skey, ttl, &o, &slot, GetCurrentTimestamp(), lease);
		if (r != GRANT_OK)
		{
			dlock_unlock_grant(sk, sklen);
			dlock_unlock_slot_grant(k, len);
		}
		return r;
	}
	dlock_unlock_slot_grant(k, len);
	return busy ? GRANT_BUSY : GRANT_HELD;
}

/* One attempt to grant key as opts asks (exclusive, a permit, shared). */
static GrantResult
attempt(text *key, int64 ttl, const DlockGrantOptions *opts,
		DlockLease *lease, TimestampTz *until)
{
	if (opts->permits == 1)
		return attempt_grant(key, ttl, opts, lease, until);
	return attempt_slot_grant(key, ttl, opts, lease, until);
}

/*
 * Grant key, waiting on our latch while the key lock is busy, a live lease
 * (or a lock delay) holds the key, or, when the module is preloaded,
 * others queued for the key before us; until deadline when bounded.
 * Returns GRANT_OK, or what stood in the way at the deadline.  While the
 * key lock is busy, lock_timeout applies as to any lock wait.  *waited is
 * how long we waited (0: granted at the first look).
 *
 * Only the head of the queue looks at the key and registers for its
 * wake-ups; the others sleep until the waiter ahead of them leaves the
 * queue (wait.c), so a release wakes one waiter, not all.
 */
static GrantResult
grant_waiting(text *key, int64 ttl, const DlockGrantOptions *opts,
			  bool bounded, TimestampTz deadline, DlockLease *lease,
			  int64 *waited)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	TimestampTz start = GetCurrentTimestamp();
	TimestampTz busy_since = 0;
	bool		registered = false;
	bool		busy_registered = false;
	bool		queued = false;
	volatile bool slept = false;
	GrantResult r = GRANT_QUEUED;

	*waited = 0;

	/*
	 * A transaction that granted the key already does not queue: a waiter
	 * ahead of it would wait for its grant lock while it waits for the
	 * waiter, and nobody can be granted the key before this transaction
	 * ends anyway.  One that holds the key's lock in another mode (it
	 * writes under the key, renewed or released it) would make the head
	 * of the queue find the key busy just the same, and win every time:
	 * while others queue, it gives up at once instead (55P03).
	 */
	switch (dlock_key_lock_held(k, len))
	{
		case DLOCK_HELD_GRANT:
			break;
		case DLOCK_HELD_OTHER:
			if (dlock_queue_others(k, len))
			{
				dlock_count_wait(k, len, 0);
				dlock_count(k, len, DLOCK_EV_TIMEOUT);
				ereport(ERROR,
						(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
						 errmsg("cannot wait for the lease on \"%s\" in a transaction that holds the key",
								text_to_cstring(key)),
						 errdetail("This transaction writes under the key, or renewed or released its lease, and other acquirers are waiting for the key: they would find it busy until this transaction ends."),
						 errhint("Commit first, then call acquire() in a new transaction.")));
			}
			queued = dlock_queue_enter(k, len, opts->permits);
			break;
		case DLOCK_HELD_NONE:
			queued = dlock_queue_enter(k, len, opts->permits);
			break;
	}
	PG_TRY();
	{
		for (;;)
		{
			TimestampTz now;
			TimestampTz wake_at = DT_NOEND;
			TimestampTz until = 0;

			CHECK_FOR_INTERRUPTS();
			if (queued && !dlock_queue_is_head())
				r = GRANT_QUEUED;
			else
			{
				/* register before the first look: no wake-up slips past */
				if (!registered)
				{
					dlock_wait_register(k, len, false);
					registered = true;
				}
				r = attempt(key, ttl, opts, lease, &until);
				if (r == GRANT_OK)
					break;
				if (r == GRANT_BUSY && !busy_registered)
				{
					/* wait for the lock, too; look again before sleeping */
					dlock_wait_register(k, len, true);
					busy_registered = true;
					continue;
				}
				if (r == GRANT_HELD && busy_registered)
				{
					dlock_wait_unregister(k, len, true);
					busy_registered = false;
				}
			}
			now = GetCurrentTimestamp();
			*waited = now - start;
			if (bounded && now >= deadline)
				break;
			if (r == GRANT_HELD)
			{
				wake_at = until;
				busy_since = 0;
			}
			else if (r == GRANT_BUSY)
			{
				if (busy_since == 0)
					busy_since = now;
				if (LockTimeout > 0)
				{
					wake_at = busy_since + (int64) LockTimeout * 1000;
					if (now >= wake_at)
					{
						dlock_count(k, len, DLOCK_EV_TIMEOUT);
						ereport(ERROR,
								(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
								 errmsg("canceling the grant of \"%s\" due to lock timeout",
										text_to_cstring(key)),
								 errdetail("Another transaction kept the key locked for longer than lock_timeout (%d ms): a grant or release not yet committed, or a transaction writing under the key's expired lease.",
										   LockTimeout)));
					}
				}
			}
			if (bounded && deadline < wake_at)
				wake_at = deadline;
			slept = true;
			dlock_sleep_until(wake_at);
		}
	}
	PG_CATCH();
	{
		/* a cancel, a timeout: let the next in the queue have its turn */
		dlock_queue_leave();
		if (slept)
			dlock_count_wait(k, len, GetCurrentTimestamp() - start);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (slept)
		*waited = GetCurrentTimestamp() - start;
	if (busy_registered)
		dlock_wait_unregister(k, len, true);
	if (registered)
		dlock_wait_unregister(k, len, false);
	dlock_queue_leave();
	return r;
}

/*
 * Return a grant's result: with fn_retset (dlock 0.2: SETOF dlock.lease)
 * one row, or none when lease is NULL; else (the 0.1 definition) the
 * dlock.lease, or NULL.
 */
Datum
dlock_lease_result(FunctionCallInfo fcinfo, text *key, DlockLease *lease)
{
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};

	if (lease != NULL)
	{
		pg_uuid_t  *owner = palloc(sizeof(pg_uuid_t));

		memcpy(owner, &lease->owner, sizeof(pg_uuid_t));
		values[0] = PointerGetDatum(key);
		values[1] = UUIDPGetDatum(owner);
		values[2] = Int64GetDatum(lease->fence);
		values[3] = TimestampTzGetDatum(lease->expires_at);
	}
	if (fcinfo->flinfo->fn_retset)
	{
		ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

		InitMaterializedSRF(fcinfo, 0);
		if (lease != NULL)
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc,
								 values, nulls);
		return (Datum) 0;
	}
	if (lease == NULL)
		PG_RETURN_NULL();
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dlock: return type must be a row type");
	tupdesc = BlessTupleDesc(tupdesc);
	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/*
 * dlock.try_acquire(key, ttl, holder): grant the lease when key is free,
 * released or expired; else no row (0.1: NULL) at once.  It never waits:
 * not for a live lease, and not for another transaction that holds the key
 * locked (a grant or release of it not yet committed, a writer under its
 * expired lease), which would be a wait that the deadlock detector cannot
 * see.
 */
Datum
dlock_try_acquire(PG_FUNCTION_ARGS)
{
	text	   *key;
	int64		ttl;
	DlockGrantOptions opts;
	DlockLease	lease;
	TimestampTz until;
	const char *k;
	int			len;

	dlock_no_parallel(fcinfo);
	dlock_check_writable();
	key = dlock_key_arg(fcinfo, 0);
	ttl = dlock_ttl_arg(fcinfo, 1);
	opts.holder = dlock_holder_arg(fcinfo, 2);
	opts.value = NULL;
	opts.lock_delay = dlock_lock_delay_arg(fcinfo, 3);
	opts.session_bound = dlock_bool_arg(fcinfo, 4, "session_bound", false);
	opts.permits = dlock_permits_arg(fcinfo, 5, 6);
	opts.nslots = 0;
	k = VARDATA_ANY(key);
	len = VARSIZE_ANY_EXHDR(key);
	/* acquirers queued for the key come first */
	if (dlock_queue_others(k, len) ||
		attempt(key, ttl, &opts, &lease, &until) != GRANT_OK)
	{
		dlock_count(k, len, DLOCK_EV_CONTENDED);
		return dlock_lease_result(fcinfo, key, NULL);
	}
	return dlock_lease_result(fcinfo, key, &lease);
}

/*
 * Grant args->key as dlock.acquire does (election.c's campaign too): wait
 * up to args->wait (unbounded: no limit of its own) for the lease to be
 * released or to expire, counting the wait; raise 55P03 when it does not
 * happen in time.  *lease is the new lease.
 */
void
dlock_acquire_lease(FunctionCallInfo fcinfo, const DlockAcquireArgs *args,
					DlockLease *lease)
{
	text	   *key = args->key;
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	TimestampTz deadline;
	int64		waited;
	GrantResult r;

	deadline = GetCurrentTimestamp() + (args->bounded ? args->wait : 0);
	r = grant_waiting(key, args->ttl, &args->opts, args->bounded, deadline,
					  lease, &waited);
	if (r != GRANT_OK || waited > 0)
		dlock_count_wait(k, len, waited);
	if (r != GRANT_OK)
	{
		dlock_count(k, len, DLOCK_EV_TIMEOUT);
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("could not acquire the lease on \"%s\" within %s",
						text_to_cstring(key),
						dlock_interval_text(fcinfo, args->wait_argno)),
				 r == GRANT_HELD && args->opts.permits > 1 ?
				 errdetail("All %d permits were held, or an exclusive lease held the key; the first of them to end ends at %s.",
						   args->opts.permits,
						   timestamptz_to_str(lease->expires_at + (dlock_lease_is_live(lease, GetCurrentTimestamp()) ? 0 : lease->lock_delay))) :
				 r == GRANT_HELD && dlock_lease_is_live(lease, GetCurrentTimestamp()) ?
				 errdetail("Another owner holds the lease until %s.",
						   timestamptz_to_str(lease->expires_at)) :
				 r == GRANT_HELD ?
				 errdetail("The key's last lease expired unreleased with a lock delay, which lasts until %s.",
						   timestamptz_to_str(lease->expires_at + lease->lock_delay)) :
				 r == GRANT_QUEUED ?
				 errdetail("Other acquirers of the key were waiting before this one.") :
				 errdetail("A grant or release not yet committed, or a transaction writing under the key's expired lease, kept the key locked."),
				 errhint("Retry later, or pass a longer wait.")));
	}
}

/*
 * dlock.acquire(key, ttl, wait, holder, lock_delay, session_bound): like
 * try_acquire, but wait up to wait (NULL: no limit of its own) for the
 * lease to be released or to expire; raise 55P03 when it does not happen
 * in time.
 */
Datum
dlock_acquire(PG_FUNCTION_ARGS)
{
	DlockAcquireArgs args;
	DlockLease	lease;

	dlock_no_parallel(fcinfo);
	dlock_check_writable();
	args.key = dlock_key_arg(fcinfo, 0);
	args.ttl = dlock_ttl_arg(fcinfo, 1);
	args.wait = 0;
	args.bounded = dlock_wait_arg(fcinfo, 2, &args.wait);
	args.wait_argno = 2;
	args.opts.holder = dlock_holder_arg(fcinfo, 3);
	args.opts.value = NULL;
	args.opts.lock_delay = dlock_lock_delay_arg(fcinfo, 4);
	args.opts.session_bound = dlock_bool_arg(fcinfo, 5, "session_bound", false);
	args.opts.permits = dlock_permits_arg(fcinfo, 6, 7);
	args.opts.nslots = 0;

	dlock_acquire_lease(fcinfo, &args, &lease);
	return dlock_lease_result(fcinfo, args.key, &lease);
}

/* Does owner hold the lease *lease, live at now? */
static bool
owns(const DlockLease *lease, const pg_uuid_t *owner, TimestampTz now)
{
	return !lease->unknown && dlock_lease_is_live(lease, now) &&
		memcmp(&lease->owner, owner, sizeof(pg_uuid_t)) == 0;
}

/*
 * Does owner hold one of the slot leases of key k (len bytes), whose head
 * says it has used nslots slot keys?  Then set ok to that slot key and
 * *lease to its lease, read without a lock.
 */
static bool
find_owner_slot(const char *k, int len, int32 nslots, const pg_uuid_t *owner,
				DlockOwnerKey *ok, DlockLease *lease)
{
	int			i;

	for (i = 1; i <= nslots; i++)
	{
		int			sklen = dlock_slot_key(ok->buf, k, len, i);

		dlock_read_lease(ok->buf, sklen, lease);
		if (lease->found && lease->held && !lease->unknown &&
			memcmp(&lease->owner, owner, sizeof(pg_uuid_t)) == 0)
		{
			ok->k = ok->buf;
			ok->len = sklen;
			ok->key = cstring_to_text_with_len(ok->buf, sklen);
			return true;
		}
	}
	return false;
}

/*
 * Start an owner operation (renew, release, proclaim) on key: find the
 * lease that owner holds, the key's own or one of its slots' (*ok says
 * which), refusing a stranger from the lease rows alone, without touching
 * any lock (see keylock.c); then take the owner-op locks and check again.
 * Return false, holding no lock, when owner does not hold a live lease;
 * else true, with *lease read under the locks and *now the clock after
 * them (a wait for the locks must not keep a lease alive).
 *
 * Without the lock only a different owner (or none) is final.  A lease of
 * this owner that looks expired may have a renewal from another of the
 * holder's connections in flight: that one holds the owner-op lock, and
 * we must wait for it and look again, or we would tell a holder whose
 * lease was renewed in time that it lost it.
 */
bool
dlock_begin_owner_op(text *key, const pg_uuid_t *owner, DlockOwnerKey *ok,
					 DlockLease *lease, TimestampTz *now)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);

	ok->key = key;
	ok->k = k;
	ok->len = len;
	dlock_read_lease(k, len, lease);
	if (!lease->found || lease->unknown)
		return false;
	if (!lease->held || memcmp(&lease->owner, owner, sizeof(pg_uuid_t)) != 0)
	{
		if (lease->nslots == 0 ||
			!find_owner_slot(k, len, lease->nslots, owner, ok, lease))
			return false;
	}
	dlock_lock_for_owner_op(ok->k, ok->len);
	*now = GetCurrentTimestamp();
	dlock_read_lease(ok->k, ok->len, lease);
	if (!owns(lease, owner, *now))
	{
		(void) look(ok->k, ok->len, lease, *now);
		dlock_unlock_owner_op(ok->k, ok->len, false);
		return false;
	}
	return true;
}

/*
 * The latest expiry a renewal of *lease may set: the limit stored at its
 * grant, and this session's dlock.max_hold counted from the grant.
 */
static TimestampTz
hold_limit(const DlockLease *lease)
{
	TimestampTz limit = lease->hold_limit;

	if (dlock_max_hold_ms > 0)
		limit = Min(limit, lease->granted_at + (int64) dlock_max_hold_ms * 1000);
	return limit;
}

/*
 * dlock.renew(key, owner, ttl): set owner's unexpired lease to end at now
 * + ttl, or at its hold limit (dlock.max_hold) if that comes first.
 * Return the new expiry, or NULL when the lease is lost or has reached its
 * limit.  An earlier end than the current one waits for the transactions
 * writing under the lease, which checked their writes against the later
 * end.
 */
Datum
dlock_renew(PG_FUNCTION_ARGS)
{
	text	   *key;
	pg_uuid_t  *owner;
	int64		ttl;
	DlockOwnerKey ok;
	DlockLease	lease;
	TimestampTz now;
	TimestampTz end;
	bool		ending = false;

	dlock_no_parallel(fcinfo);
	dlock_check_writable();
	key = dlock_key_arg(fcinfo, 0);
	owner = dlock_owner_arg(fcinfo, 1);
	ttl = dlock_ttl_arg(fcinfo, 2);

	if (!dlock_begin_owner_op(key, owner, &ok, &lease, &now))
	{
		dlock_count(ok.k, ok.len, DLOCK_EV_LOST_RENEWAL);
		PG_RETURN_NULL();
	}
	if (Min(now + ttl, hold_limit(&lease)) < lease.expires_at)
	{
		dlock_lock_for_ending(ok.k, ok.len);
		ending = true;
		now = GetCurrentTimestamp();
		dlock_read_lease(ok.k, ok.len, &lease);
	}
	end = Min(now + ttl, hold_limit(&lease));
	if (!owns(&lease, owner, now) || end <= now)
	{
		dlock_unlock_owner_op(ok.k, ok.len, ending);
		dlock_count(ok.k, ok.len, DLOCK_EV_LOST_RENEWAL);
		PG_RETURN_NULL();
	}
	dlock_storage_set_end(ok.key, end, false);
	dlock_forget_verified(ok.k, ok.len);
	dlock_count(ok.k, ok.len, DLOCK_EV_RENEWED);
	PG_RETURN_TIMESTAMPTZ(end);
}

/*
 * dlock.release(key, owner): end owner's unexpired lease now; waiters are
 * woken once this transaction ends.  Never touches another owner's lease.
 * Waits for the transactions writing under the lease to end first.
 */
Datum
dlock_release(PG_FUNCTION_ARGS)
{
	text	   *key;
	pg_uuid_t  *owner;
	DlockOwnerKey ok;
	DlockLease	lease;
	TimestampTz now;

	dlock_no_parallel(fcinfo);
	dlock_check_writable();
	key = dlock_key_arg(fcinfo, 0);
	owner = dlock_owner_arg(fcinfo, 1);

	if (!dlock_begin_owner_op(key, owner, &ok, &lease, &now))
		PG_RETURN_BOOL(false);
	/* only now queue behind the writers: a stranger never gets here */
	dlock_lock_for_ending(ok.k, ok.len);
	now = GetCurrentTimestamp();
	dlock_read_lease(ok.k, ok.len, &lease);
	if (!owns(&lease, owner, now))
	{
		dlock_unlock_owner_op(ok.k, ok.len, true);
		PG_RETURN_BOOL(false);
	}
	dlock_storage_set_end(ok.key, now, true);
	dlock_forget_verified(ok.k, ok.len);
	dlock_count_release(ok.k, ok.len, &lease, now);
	PG_RETURN_BOOL(true);
}

/* Did the key's own lease (a head's, *lease) end before cutoff? */
static bool
own_lease_ended(const DlockLease *lease, TimestampTz cutoff)
{
	DlockLease	own = *lease;

	own.nslots = 0;
	return dlock_lease_ended_at(&own, MyDatabaseId) < cutoff;
}

/*
 * May the head of key k (len bytes) go: its own lease ended before cutoff
 * and none of its slots has a lease (row) left?  Read under the key's
 * grant lock, which no slot grant can hold meanwhile.
 */
static bool
head_unused(const char *k, int len, TimestampTz cutoff)
{
	DlockLease	head;
	int			i;

	dlock_read_lease(k, len, &head);
	if (!head.found || head.unknown || !own_lease_ended(&head, cutoff))
		return false;
	for (i = 1; i <= head.nslots; i++)
	{
		char		sk[DLOCK_MAX_STORED_KEY_BYTES + 1];
		int			sklen = dlock_slot_key(sk, k, len, i);
		DlockLease	slot;

		dlock_read_lease(sk, sklen, &slot);
		if (slot.found)
			return false;
	}
	return true;
}

/*
 * dlock.prune(older_than): delete the rows of keys whose lease was released
 * or expired more than older_than ago, then those of keys whose permits
 * and shared leases are all gone; return how many.  Each key is
 * locked as for a grant, only while its row is deleted, and skipped when
 * somebody else has it locked.  A pruned key's next token still comes from
 * the same sequence, so it is higher than any before; only the monotonic
 * fencing mode loses the key's history (see docs/reference.md).
 */
Datum
dlock_prune(PG_FUNCTION_ARGS)
{
	int64		age;
	TimestampTz cutoff;
	List	   *keys;
	ListCell   *lc;
	int64		deleted = 0;

	dlock_no_parallel(fcinfo);
	dlock_check_writable();
	age = dlock_age_arg(fcinfo, 0);
	if (age >= DLOCK_HUGE_USECS)
		PG_RETURN_INT64(0);		/* no lease is that old */
	cutoff = GetCurrentTimestamp() - age;

	keys = dlock_storage_old_keys(cutoff);
	foreach(lc, keys)
	{
		text	   *key = (text *) lfirst(lc);
		const char *k = VARDATA_ANY(key);
		int			len = VARSIZE_ANY_EXHDR(key);

		CHECK_FOR_INTERRUPTS();
		if (!dlock_lock_for_grant(k, len))
			continue;
		if (dlock_storage_delete_old(key, cutoff, false))
		{
			dlock_forget_verified(k, len);
			deleted++;
		}
		dlock_unlock_grant(k, len);
	}

	/*
	 * Then the heads of keys that have had permits or shared leases (never
	 * old keys, dlock_lease_ended_at) whose own lease ended before cutoff
	 * and whose slots are all gone now.  The head's lock is kept until the
	 * end of the transaction: a slot grant that read the head before its
	 * delete commits would record nothing, and an exclusive grant after it
	 * would not know that slot.
	 */
	foreach(lc, dlock_storage_scan())
	{
		DlockLeaseRow *row = (DlockLeaseRow *) lfirst(lc);
		const char *k = VARDATA_ANY(row->key);
		int			len = VARSIZE_ANY_EXHDR(row->key);

		CHECK_FOR_INTERRUPTS();
		if (row->lease.unknown || row->lease.nslots == 0 ||
			dlock_base_key_len(k, len) != len ||
			!own_lease_ended(&row->lease, cutoff) ||
			!dlock_lock_for_grant(k, len))
			continue;
		if (head_unused(k, len, cutoff) &&
			dlock_storage_delete_old(row->key, DT_NOEND, true))
		{
			dlock_forget_verified(k, len);
			deleted++;
		}
		else
			dlock_unlock_grant(k, len);
	}
	PG_RETURN_INT64(deleted);
}

/* Raise the error of forget() for key, which somebody has locked. */
static pg_attribute_noreturn() void
key_in_use(text *key)
{
	ereport(ERROR,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("lock key \"%s\" is in use", text_to_cstring(key)),
			 errdetail("A grant, a renewal, a release or a fenced write of the key is in progress."),
			 errhint("Try again.")));
}

/*
 * dlock.forget(key): drop key's lease, held or not, and those of its
 * permits and shared leases, as prune() drops an old one; return whether
 * there was one.  For administrators (EXECUTE is
 * revoked from PUBLIC), in either storage mode: in memory mode nobody can
 * delete the lease any other way.  The holder's fenced writes are refused
 * from then on (no lease), and the key's next token is still higher than
 * any before.  Locks the key and its slot keys as for a grant, without
 * waiting, until the end of the transaction: while anyone has one of them
 * locked, it fails with 55P03.
 */
Datum
dlock_forget(PG_FUNCTION_ARGS)
{
	text	   *key;
	const char *k;
	int			len;
	bool		deleted = false;
	DlockLease	head;
	int			i;

	dlock_no_parallel(fcinfo);
	dlock_check_writable();
	key = dlock_key_arg(fcinfo, 0);
	k = VARDATA_ANY(key);
	len = VARSIZE_ANY_EXHDR(key);
	if (!dlock_lock_for_grant(k, len))
		key_in_use(key);
	/*
	 * The key's permits and shared leases first; none is granted meanwhile.
	 * Every lock before any delete: in memory mode a delete takes effect at
	 * once, and a refusal must leave every lease as it was.
	 */
	dlock_read_lease(k, len, &head);
	for (i = 1; i <= head.nslots; i++)
	{
		char		sk[DLOCK_MAX_STORED_KEY_BYTES + 1];
		int			sklen = dlock_slot_key(sk, k, len, i);

		if (!dlock_lock_for_grant(sk, sklen))
			key_in_use(key);
	}
	for (i = 1; i <= head.nslots; i++)
	{
		char		sk[DLOCK_MAX_STORED_KEY_BYTES + 1];
		int			sklen = dlock_slot_key(sk, k, len, i);

		if (dlock_storage_delete_old(cstring_to_text_with_len(sk, sklen),
									 DT_NOEND, true))
		{
			dlock_forget_verified(sk, sklen);
			deleted = true;
		}
	}
	if (dlock_storage_delete_old(key, DT_NOEND, true))
	{
		dlock_forget_verified(k, len);
		/* a key that had only slots had no lease of its own */
		deleted = deleted || head.fence != 0;
	}

	/*
	 * The locks stay until the end of the transaction: in table mode the
	 * rows are deleted only at commit, and a writer or an owner op let in
	 * before would act on a lease about to vanish (an exclusive grant after
	 * the commit would not know the slot it writes under).
	 */
	PG_RETURN_BOOL(deleted);
}

/*
 * dlock.lease_status(): the rows of the view dlock.lease_status.  Owners
 * never appear; session-bound leases whose connection has ended show as
 * expired.
 */
Datum
dlock_lease_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TimestampTz now = GetCurrentTimestamp();
	List	   *rows;
	ListCell   *lc;
	int			natts;

	dlock_no_parallel(fcinfo);
	InitMaterializedSRF(fcinfo, 0);
	natts = rsinfo->setDesc->natts;		/* 10 before 0.7, 11 since */
	rows = dlock_storage_scan();
	foreach(lc, rows)
	{
		DlockLeaseRow *row = lfirst(lc);
		DlockLeaseState state = dlock_lease_state(&row->lease, now);
		const char *k = VARDATA_ANY(row->key);
		int			len = VARSIZE_ANY_EXHDR(row->key);
		int			base = dlock_base_key_len(k, len);
		Datum		values[11];
		bool		nulls[11] = {0};

		/* a key that has only had slots has no lease of its own to show */
		if (row->lease.found && !row->lease.unknown &&
			row->lease.nslots > 0 && row->lease.fence == 0)
			continue;
		if (natts < 11 && base != len)
			continue;			/* no permit column: no slots yet anyway */
		values[0] = PointerGetDatum(cstring_to_text_with_len(k, base));
		values[10] = Int32GetDatum(dlock_key_slot(k, len));
		nulls[10] = (base == len);
		if (row->lease.unknown)
		{
			/*
			 * Before the horizon the key is held by an owner nobody knows:
			 * show what a grant would meet, with nothing of a lease that is
			 * not the one in force.
			 */
			int			i;

			for (i = 1; i < 10; i++)
				nulls[i] = true;
			values[4] = TimestampTzGetDatum(row->lease.expires_at);
			nulls[4] = false;
			values[5] = dlock_usecs_interval(row->lease.expires_at - now);
			nulls[5] = false;
			values[6] = CStringGetTextDatum("held");
			nulls[6] = false;
			values[9] = BoolGetDatum(false);
			nulls[9] = false;
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
			continue;
		}
		values[1] = PointerGetDatum(row->holder);
		nulls[1] = (row->holder == NULL);
		values[2] = Int64GetDatum(row->lease.fence);
		values[3] = TimestampTzGetDatum(row->lease.granted_at);
		values[4] = TimestampTzGetDatum(row->lease.expires_at);
		values[5] = dlock_usecs_interval(row->lease.expires_at - now);
		nulls[5] = (state != DLOCK_LIVE);
		values[6] = CStringGetTextDatum(state == DLOCK_LIVE ? "held" :
										state == DLOCK_RELEASED ? "released" :
										"expired");
		values[7] = Int32GetDatum(row->pid);
		nulls[7] = !row->has_pid;
		values[8] = PointerGetDatum(row->application_name);
		nulls[8] = (row->application_name == NULL);
		values[9] = BoolGetDatum(row->lease.session_id != 0);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		if (row->lease.held && state != DLOCK_LIVE)
			dlock_notice_end_in_view(k, len, &row->lease, state, now);
	}
	return (Datum) 0;
}
