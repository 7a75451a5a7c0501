/*-------------------------------------------------------------------------
 *
 * horizon.c
 *		Memory mode's horizon: a time that no lease granted in memory mode
 *		outlives, kept durable before a lease that would outlive it is
 *		returned; the barrier read from it after every start, before which
 *		every key is held by an owner nobody knows; and the same barrier in
 *		table mode after a switch back from memory mode.
 *
 * With dlock.storage = memory the leases live in memstore.c's shared hash
 * and are lost by a restart, a crash or a failover.  What makes that safe
 * is the horizon, dlock.horizon_seq (and dlock.horizon_mark, which pg_dump
 * does not save): it is moved ahead, and made durable (confirmed by today's
 * synchronous standbys too), before a lease that would outlive it is
 * returned (dlock_secure_horizon); and it is read after every start as the
 * barrier before which every key is held by an unknown owner
 * (dlock_memory_state).  Whoever held a lease before is out of time before
 * anyone else is granted the key.  The placeholder lease of that unknown
 * owner matches nothing: its owner is random and its token -1
 * (dlock_unknown_lease).
 *
 * A database's barrier, horizon and unknown owner are kept in memstore.c's
 * per-database slots (dlock_mem_db_*), which are part of the shared hash's
 * accounting (its entries per database, their eviction, DROP DATABASE).
 *
 * Owns: what this backend knows of the table-mode barrier.  Calls
 * leasetable.c (the end of the latest table lease, for a switch from table
 * mode), memstore.c (the slots), durable.c (confirming WAL), objects.c,
 * liveness.c, settings and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "commands/dbcommands.h"
#include "commands/sequence.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/timestamp.h"

#include "dlock.h"

/*
 * Table mode: this backend has seen the horizon pass (see table_barrier)
 * while dlock_objects_generation was table_barrier_generation, and the
 * horizon it read.
 */
static bool table_barrier_passed = false;
static uint64 table_barrier_generation = 0;
static TimestampTz table_horizon = 0;

/*
 * The horizon: the later of dlock.horizon_seq, which pg_dump saves so that
 * a restore elsewhere waits for it too, and dlock.horizon_mark (0.6),
 * which it does not save, so that a data-only restore of an older dump,
 * which sets dlock.horizon_seq back, cannot set the horizon back.
 */
static TimestampTz
read_horizon(void)
{
	return Max(dlock_read_sequence(dlock_objects.horizon),
			   dlock_read_sequence(dlock_objects.horizon_mark));
}

/*
 * Fill *lease with the lease that every key has until the barrier: held
 * by an owner nobody knows, ending at until.  It is a placeholder, marked
 * unknown, and nothing may match it: its owner is random (and lease.c's
 * owns() and begin_owner_op refuse it anyway), its token is -1, which no
 * token can equal since fence.c refuses every token below 1 before
 * comparing.
 */
void
dlock_unknown_lease(DlockLease *lease, TimestampTz until,
					const pg_uuid_t *owner)
{
	memset(lease, 0, sizeof(DlockLease));
	lease->found = true;
	lease->held = true;
	lease->unknown = true;
	lease->owner = *owner;
	lease->fence = -1;
	lease->expires_at = until;
	lease->granted_at = until;
	lease->hold_limit = DT_NOEND;
}

/*
 * Memory mode: this database's barrier, horizon and unknown owner (see
 * memstore.c).  The first call after memory was set up (a start, a crash
 * restart, a promotion) reads the barrier: the horizon, or the end of the
 * latest lease in dlock.leases after a switch from table mode if later.
 * A standby's horizon moves with replay, so there it is read every time;
 * and what was read while recovery was still in progress is never kept,
 * even if the promotion has ended by the time it is stored.
 */
void
dlock_memory_state(TimestampTz *barrier, TimestampTz *horizon,
				   pg_uuid_t *unknown, bool take_slot)
{
	TimestampTz h;
	TimestampTz b;
	bool		in_recovery;

	/* a session that predates ALTER EXTENSION UPDATE to 0.4 looks again */
	if (!OidIsValid(dlock_objects.horizon))
		dlock_objects_find_again();
	if (!OidIsValid(dlock_objects.horizon))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dlock.storage = memory needs version 0.4 of extension dlock"),
				 errhint("Run ALTER EXTENSION dlock UPDATE.")));
	if (dlock_mem_db_get(dlock_objects.seq, barrier, horizon, unknown, take_slot))
		return;
	in_recovery = RecoveryInProgress();
	h = read_horizon();
	b = Max(h, dlock_table_max_end());
	/*
	 * A reader takes no slot (they are few, and shared by every database):
	 * it reads the durable state each time until a writer takes one.
	 */
	if (in_recovery || !take_slot)
	{
		/*
		 * A writer that took the slot since our look may have moved the
		 * horizon already (it takes the slot first): what we read is then
		 * its new horizon, not a barrier, and the slot knows better.
		 */
		if (!in_recovery &&
			dlock_mem_db_get(dlock_objects.seq, barrier, horizon, unknown, false))
			return;
		*barrier = b;
		*horizon = h;
		memset(unknown, 0, sizeof(pg_uuid_t));
		return;
	}
	*barrier = b;
	*horizon = h;
	dlock_mem_db_set(dlock_objects.seq, barrier, horizon, unknown);
	if (GetCurrentTimestamp() < *barrier)
		ereport(LOG,
				(errmsg("dlock: no key of database \"%s\" is granted before %s",
						get_database_name(MyDatabaseId),
						timestamptz_to_str(*barrier)),
				 errdetail("With dlock.storage = memory, leases do not survive a restart, a crash or a failover; those granted before may still be held until then.")));
}

/*
 * Table mode: mark *lease when it was granted before the horizon, that is
 * before the last period in memory mode ended.  Memory mode never writes
 * dlock.leases, so the row does not know the tokens issued for its key in
 * that period, which may be greater than its own: the monotonic fencing
 * mode must not compare with it (fence.c).  A lease granted since is
 * granted at or after the horizon, since no key is granted before it.
 */
static void
mark_before_switch(DlockLease *lease)
{
	lease->before_switch = lease->found && !lease->unknown &&
		table_horizon != 0 && lease->granted_at < table_horizon;
}

/*
 * Table mode after a switch back from memory mode: until the horizon has
 * passed, a key without a live lease row is held by an unknown owner.
 * Each backend reads the horizon until it has seen it pass (it only moves
 * in memory mode, which needs a restart).
 */
static void
table_barrier(DlockLease *lease)
{
	static pg_uuid_t unknown;
	static bool have_unknown = false;
	TimestampTz h = read_horizon();
	TimestampTz now = GetCurrentTimestamp();

	table_horizon = h;
	mark_before_switch(lease);
	if (now >= h)
	{
		table_barrier_passed = true;
		table_barrier_generation = dlock_objects_generation;
		return;
	}
	if (dlock_lease_is_live(lease, now))
		return;
	if (!have_unknown)
	{
		dlock_random(unknown.data, UUID_LEN, "owner token");
		have_unknown = true;
	}
	dlock_unknown_lease(lease, h, &unknown);
}

/*
 * Table mode: what a read of *lease, a row of dlock.leases, must add:
 * before the horizon has passed, a key without a live lease is held by an
 * unknown owner; a lease granted before the horizon is marked
 * (mark_before_switch).
 */
void
dlock_horizon_table_read(DlockLease *lease)
{
	if (!table_barrier_passed ||
		table_barrier_generation != dlock_objects_generation)
		table_barrier(lease);
	else
		mark_before_switch(lease);
}

/*
 * Table mode: the same for a row of a scan (the views): only what a grant
 * would meet, an unknown owner before the horizon.
 */
void
dlock_horizon_table_scanned(DlockLease *lease)
{
	if (!table_barrier_passed ||
		table_barrier_generation != dlock_objects_generation)
		table_barrier(lease);
}

/*
 * Make the latest value of sequence seqid (the horizon) durable, before
 * anyone relies on it: after a crash or a failover the sequence must not
 * go back behind it, even if this transaction never commits.  Call with
 * synchronous_commit already raised.
 */
static void
secure_sequence(Oid seqid)
{
	dlock_confirm_lsn(dlock_sequence_lsn(seqid), false);
}

/*
 * Memory mode: make sure the durable horizon is at or after need, the end
 * (plus lock delay) of a lease about to be granted or renewed, so that
 * after a crash or a failover nobody is granted a key before that lease is
 * over.  When it is not, set it dlock.horizon_margin later (one durable
 * write then covers the grants of that long), marked pending in shared
 * memory until confirmed (a cancelled confirmation is finished by the next
 * caller, not taken for somebody else's setval), under a lock that keeps two
 * backends from moving it at once.  Every call compares the LSN of the
 * sequence's page with the one it had after our last look, so that a
 * setval by anyone else (a restore) is noticed at the next grant.  The
 * sequence itself is read under that lock and never set back: whoever set it since it was cached (a restore's
 * setval) is obeyed, and if that time is still to come the database's
 * barrier moves with it: then false is returned, and a grant must not go
 * on (the key may be held until then).
 */
bool
dlock_secure_horizon(TimestampTz need)
{
	TimestampTz barrier;
	TimestampTz horizon;
	pg_uuid_t	unknown;
	TimestampTz current;
	bool		moved_by_others = false;

	/*
	 * Fast path: the horizon covers the lease, and nobody changed the
	 * sequence since we last did (its page's LSN would have moved).
	 */
	dlock_memory_state(&barrier, &horizon, &unknown, true);
	if (need <= horizon)
	{
		XLogRecPtr	lsn = dlock_sequence_lsn(dlock_objects.horizon);

		if (lsn == dlock_mem_db_horizon_lsn(dlock_objects.seq, 0))
		{
			/*
			 * The horizon we rely on was made durable when it was set, but
			 * perhaps under other settings: with synchronous_standby_names
			 * empty then and a standby's name in it now, it never reached
			 * that standby.  Confirm it under today's settings; when it was
			 * confirmed already this is one comparison with what the
			 * standbys acknowledged.
			 */
			dlock_raise_synchronous_commit();
			dlock_confirm_lsn(lsn, false);
			return true;
		}
	}

	/*
	 * The slow path, under a lock that keeps two backends from moving the
	 * horizon at once.  (Not one that conflicts with setval's own
	 * RowExclusiveLock: reading and setting the sequence keep that until
	 * the transaction ends, and two transactions that had each moved the
	 * horizon before would deadlock.)  Someone else's setval is noticed by
	 * the page's LSN: the one recorded at the end is read before the value
	 * it stands for, so a setval in between shows as a changed LSN at the
	 * next call; after our own setval the value is read again.
	 */
	LockRelationOid(dlock_objects.horizon, ShareUpdateExclusiveLock);
	for (;;)
	{
		XLogRecPtr	lsn;

		dlock_memory_state(&barrier, &horizon, &unknown, true);
		lsn = dlock_sequence_lsn(dlock_objects.horizon);
		current = dlock_read_sequence(dlock_objects.horizon);
		if (current > horizon && current == dlock_mem_db_pending(dlock_objects.seq))
		{
			/* ours, whose confirmation was cancelled: confirm it now */
			dlock_raise_synchronous_commit();
			secure_sequence(dlock_objects.horizon);
			dlock_mem_db_advance(dlock_objects.seq, current, false);
			horizon = current;
		}
		else if (current > horizon)
		{
			/*
			 * Set by somebody else (a restore): leases may run until then.
			 * Relied on from now on, so confirmed like ours.
			 */
			dlock_raise_synchronous_commit();
			secure_sequence(dlock_objects.horizon);
			if (current > GetCurrentTimestamp())
				moved_by_others = true;
			dlock_mem_db_advance(dlock_objects.seq, current, current > GetCurrentTimestamp());
			horizon = current;
		}
		if (need > horizon || current < horizon)
		{
			DlockSection s;
			TimestampTz next = Max(need + (int64) dlock_horizon_margin_ms * 1000,
								   horizon);

			/*
			 * The sequence is behind what leases rely on when somebody set
			 * it back (a data-only restore of an older dump) or it is not
			 * the one we set (a rolled-back ALTER EXTENSION UPDATE made and
			 * dropped one): set it to what we know, never lower.  If the
			 * confirmation below is cancelled, the next caller finishes it.
			 */
			/* a session from before the update to 0.6 looks for the mark */
			if (!OidIsValid(dlock_objects.horizon_mark))
				dlock_objects_find_again();
			dlock_mem_db_set_pending(dlock_objects.seq, next);
			dlock_section_begin(&s);
			(void) DirectFunctionCall3(setval3_oid, ObjectIdGetDatum(dlock_objects.horizon),
									   Int64GetDatum(next), BoolGetDatum(true));
			/* the copy that no dump saves, only ever moved ahead */
			if (OidIsValid(dlock_objects.horizon_mark) &&
				dlock_read_sequence(dlock_objects.horizon_mark) < next)
				(void) DirectFunctionCall3(setval3_oid,
										   ObjectIdGetDatum(dlock_objects.horizon_mark),
										   Int64GetDatum(next), BoolGetDatum(true));
			dlock_section_end(&s);
			dlock_raise_synchronous_commit();
			dlock_confirm_lsn(Max(dlock_sequence_lsn(dlock_objects.horizon),
							OidIsValid(dlock_objects.horizon_mark) ?
							dlock_sequence_lsn(dlock_objects.horizon_mark) : InvalidXLogRecPtr),
						false);
			dlock_mem_db_advance(dlock_objects.seq, next, false);
			/* somebody else's setval since ours: look again */
			lsn = dlock_sequence_lsn(dlock_objects.horizon);
			if (dlock_read_sequence(dlock_objects.horizon) != next)
				continue;
		}
		/* whatever set it last, it is relied on from now: confirmed */
		dlock_raise_synchronous_commit();
		dlock_confirm_lsn(lsn, false);
		/* what the sequence's page said before we read it is what we know */
		(void) dlock_mem_db_horizon_lsn(dlock_objects.seq, lsn);
		break;
	}
	UnlockRelationOid(dlock_objects.horizon, ShareUpdateExclusiveLock);
	return !moved_by_others;
}
