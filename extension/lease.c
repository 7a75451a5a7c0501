/*-------------------------------------------------------------------------
 *
 * lease.c
 *		The lease API: try_acquire, acquire, renew, release, prune.
 *
 * Lease state lives in dlock.leases.  It is read by direct lookups in the
 * table's primary key index and changed through SPI, with plans prepared
 * once per backend.  Three rules make it safe:
 *
 * 1. Every change to a key happens under its key lock (keylock.c), held
 *	  until the end of the transaction, so a reader that takes the lock
 *	  sees every earlier change committed.
 * 2. Every read uses a fresh snapshot (GetLatestSnapshot), never the
 *	  caller's transaction snapshot: a REPEATABLE READ caller whose
 *	  snapshot predates a grant must still see that grant.
 * 3. Changes run as the owner of dlock.leases, so PUBLIC needs no
 *	  privilege on it, and every operator and function in our SQL is
 *	  schema-qualified, so the caller's search_path cannot inject code into
 *	  those queries.
 *
 * Durability: a grant or renewal forces its transaction's commit to be
 * synchronous (it raises synchronous_commit for this transaction only), so
 * a lease that was returned survives a crash.  A fencing token drawn inside
 * an explicit transaction block is flushed to WAL at once, because the
 * caller can see it before commit: if the transaction then never commits
 * (rollback, crash), the token must still never be issued again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/table.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "replication/syncrep.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/bufmgr.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "dlock.h"

PG_FUNCTION_INFO_V1(dlock_try_acquire);
PG_FUNCTION_INFO_V1(dlock_acquire);
PG_FUNCTION_INFO_V1(dlock_renew);
PG_FUNCTION_INFO_V1(dlock_release);
PG_FUNCTION_INFO_V1(dlock_prune);

/*
 * Longest pause between two attempts of a bounded acquire while another
 * transaction holds the key lock (a release, a grant, or a writer under
 * the lease still open).  The pauses start at 1 ms and double.
 */
#define BUSY_BACKOFF_MAX_MS		50

typedef enum GrantResult
{
	GRANT_OK,					/* granted; the key lock is held */
	GRANT_HELD,					/* another owner holds an unexpired lease */
	GRANT_HELD_UNLOCKED,		/* looks so, read while the lock was busy */
	GRANT_BUSY					/* key lock not available (nowait) */
} GrantResult;

/* What storage_begin saves for storage_end. */
typedef struct StorageSave
{
	Oid			userid;
	int			sec_context;
} StorageSave;

/* Columns of dlock.leases, in the order of the install script. */
#define Anum_leases_key			1
#define Anum_leases_fence		2
#define Anum_leases_owner		3
#define Anum_leases_expires_at	4

/* Plans kept for the life of the backend. */
static SPIPlanPtr plan_grant_update = NULL;
static SPIPlanPtr plan_grant_insert = NULL;
static SPIPlanPtr plan_renew = NULL;
static SPIPlanPtr plan_release = NULL;
static SPIPlanPtr plan_prune = NULL;

/* Return the OID of relation relname in schema dlock. */
static Oid
dlock_relid(const char *relname)
{
	Oid			relid;

	relid = get_relname_relid(relname, get_namespace_oid("dlock", false));
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("relation dlock.%s does not exist", relname),
				 errhint("Reinstall the extension with DROP EXTENSION dlock; CREATE EXTENSION dlock.")));
	return relid;
}

/*
 * Connect to SPI and become the owner of dlock.leases until storage_end.
 * An error in between restores the user at transaction (or subtransaction)
 * abort.
 */
static void
storage_begin(StorageSave *save)
{
	HeapTuple	tup;
	Oid			relid = dlock_relid("leases");
	Oid			owner;

	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	GetUserIdAndSecContext(&save->userid, &save->sec_context);
	SetUserIdAndSecContext(owner,
						   save->sec_context | SECURITY_LOCAL_USERID_CHANGE);
}

/* Undo storage_begin. */
static void
storage_end(StorageSave *save)
{
	SetUserIdAndSecContext(save->userid, save->sec_context);
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
}

/* Return the cached plan *cache, preparing and keeping it the first time. */
static SPIPlanPtr
storage_plan(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes)
{
	if (*cache == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare(sql, nargs, argtypes);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s",
				 sql, SPI_result_code_string(SPI_result));
		SPI_keepplan(plan);
		*cache = plan;
	}
	return *cache;
}

/*
 * Run plan (a change) with values under a fresh snapshot; return the
 * number of rows processed.  Inside storage_begin/storage_end only.
 */
static uint64
storage_exec(SPIPlanPtr plan, Datum *values, const char *nulls)
{
	int			rc;

	rc = SPI_execute_snapshot(plan, values, nulls, GetLatestSnapshot(),
							  InvalidSnapshot, false, false, 0);
	if (rc < 0)
		elog(ERROR, "SPI_execute_snapshot failed: %s",
			 SPI_result_code_string(rc));
	return SPI_processed;
}

/*
 * Read the current state of key into *lease, with a fresh snapshot, by a
 * direct lookup in the primary key index: no executor, no SPI, no change
 * of user (reading the table from C needs no privilege).  The caller
 * decides which key lock, if any, makes the answer stable.
 */
void
dlock_read_lease(text *key, DlockLease *lease)
{
	Relation	rel = table_open(dlock_relid("leases"), AccessShareLock);
	TupleDesc	desc = RelationGetDescr(rel);
	Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyData skey;
	SysScanDesc scan;
	HeapTuple	tup;

	ScanKeyEntryInitialize(&skey, 0, Anum_leases_key, BTEqualStrategyNumber,
						   InvalidOid, TupleDescAttr(desc, Anum_leases_key - 1)->attcollation,
						   F_TEXTEQ, PointerGetDatum(key));
	scan = systable_beginscan(rel, RelationGetPrimaryKeyIndex(rel), true,
							  snapshot, 1, &skey);
	memset(lease, 0, sizeof(DlockLease));
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		d;

		lease->found = true;
		d = heap_getattr(tup, Anum_leases_owner, desc, &isnull);
		lease->held = !isnull;
		if (!isnull)
			memcpy(&lease->owner, DatumGetUUIDP(d), sizeof(pg_uuid_t));
		lease->fence = DatumGetInt64(heap_getattr(tup, Anum_leases_fence,
												  desc, &isnull));
		lease->expires_at = DatumGetTimestampTz(heap_getattr(tup, Anum_leases_expires_at,
															 desc, &isnull));
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
}

/* Is *lease held by someone and unexpired at now? */
static inline bool
lease_is_live(const DlockLease *lease, TimestampTz now)
{
	return lease->found && lease->held && lease->expires_at > now;
}

/* Return argument argno, a key, after checking it. */
static text *
key_argument(FunctionCallInfo fcinfo, int argno)
{
	text	   *key;

	if (PG_ARGISNULL(argno))
		dlock_null_argument(fcinfo, "key");
	key = PG_GETARG_TEXT_PP(argno);
	dlock_check_key(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
	return key;
}

/*
 * Rough length of span in microseconds, a month counted as 30 days.  Used
 * only to keep absurd lengths away from timestamp arithmetic, which would
 * fail with a bare "timestamp out of range": lengths beyond
 * DLOCK_HUGE_USECS exceed any dlock.max_ttl, mean "no limit" for a wait,
 * and are older than any lease for prune.
 */
#define DLOCK_HUGE_USECS	1e15		/* about 31 years */

static double
rough_usecs(const Interval *span)
{
	return (double) span->time + (double) span->day * USECS_PER_DAY +
		(double) span->month * DAYS_PER_MONTH * USECS_PER_DAY;
}

/*
 * Return the end of a lease of ttl starting at now, after checking that
 * ttl is positive and within dlock.max_ttl.
 */
static TimestampTz
lease_end(TimestampTz now, Interval *ttl)
{
	double		rough = rough_usecs(ttl);
	TimestampTz end = 0;
	bool		not_positive;
	bool		too_long;

	not_positive = rough < -DLOCK_HUGE_USECS;
	too_long = rough > DLOCK_HUGE_USECS;
	if (!not_positive && !too_long)
	{
		end = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
													  TimestampTzGetDatum(now),
													  IntervalPGetDatum(ttl)));
		not_positive = end <= now;
		too_long = !not_positive && (end - now) / 1000 > dlock_max_ttl_ms;
	}
	if (not_positive)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be positive"),
				 errdetail("The ttl given was %s.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(ttl)))),
				 errhint("Pass how long the lease should last, for example '30 seconds'.")));
	if (too_long)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl exceeds dlock.max_ttl"),
				 errdetail("The ttl given was %s; dlock.max_ttl is %d ms.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(ttl))),
						   dlock_max_ttl_ms),
				 errhint("Use a shorter ttl and renew the lease while you work, or ask an administrator to raise dlock.max_ttl.")));
	return end;
}

/* Return argument argno, a ttl, after checking it against the clock. */
static Interval *
ttl_argument(FunctionCallInfo fcinfo, int argno)
{
	Interval   *ttl;

	if (PG_ARGISNULL(argno))
		dlock_null_argument(fcinfo, "ttl");
	ttl = PG_GETARG_INTERVAL_P(argno);
	(void) lease_end(GetCurrentTimestamp(), ttl);
	return ttl;
}

/* Return argument argno, an owner. */
static pg_uuid_t *
owner_argument(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		dlock_null_argument(fcinfo, "owner");
	return PG_GETARG_UUID_P(argno);
}

/*
 * Return the holder label of argument argno: the argument, or
 * application_name when it is NULL; NULL when both are empty.
 */
static text *
holder_argument(FunctionCallInfo fcinfo, int argno)
{
	text	   *holder = NULL;

	if (!PG_ARGISNULL(argno))
		holder = PG_GETARG_TEXT_PP(argno);
	else if (application_name != NULL && application_name[0] != '\0')
		holder = cstring_to_text(application_name);
	if (holder != NULL && VARSIZE_ANY_EXHDR(holder) > DLOCK_MAX_HOLDER_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("holder label is too long"),
				 errdetail("The label is %d bytes long; the limit is %d bytes.",
						   (int) VARSIZE_ANY_EXHDR(holder),
						   DLOCK_MAX_HOLDER_BYTES),
				 errhint("Keep it short: it is a label for people reading dlock.leases.")));
	return holder;
}

/*
 * Make sure this transaction commits synchronously: a grant or renewal
 * must survive a crash once the caller has seen it.  Set for the
 * transaction only, like SET LOCAL; the session's setting comes back
 * afterwards.
 */
static void
force_synchronous_commit(void)
{
	/*
	 * The local flush, even if a function's SET clause reverts the setting
	 * below before commit ...
	 */
	ForceSyncCommit();
	/* ... and, through the setting, the wait for synchronous standbys. */
	if (synchronous_commit < SYNCHRONOUS_COMMIT_ON)
		(void) set_config_option("synchronous_commit", "on",
								 PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_LOCAL, true, 0, false);
}

/*
 * Make the fencing token just drawn safe to show, before the caller can
 * see it: after a crash or a failover the sequence must not hand the same
 * number out again, even if this transaction never commits (a rollback, a
 * crash before commit, or a client that used the token before its commit:
 * inside a transaction block, in a protocol pipeline, ...).
 *
 * A sequence logs ahead (one WAL record every 32 values), so the record
 * covering our token is at or before the LSN of the sequence's page.  That
 * is usually flushed already and this costs a buffer read; otherwise we
 * flush it and, with synchronous standbys, wait for them to have it.
 * Call with synchronous_commit already raised (force_synchronous_commit).
 */
static void
secure_drawn_fence(void)
{
	Relation	seq = relation_open(dlock_relid("fence_seq"), AccessShareLock);
	Buffer		buf = ReadBuffer(seq, 0);
	XLogRecPtr	lsn;

	LockBuffer(buf, BUFFER_LOCK_SHARE);
	lsn = PageGetLSN(BufferGetPage(buf));
	UnlockReleaseBuffer(buf);
	relation_close(seq, AccessShareLock);

	XLogFlush(lsn);				/* returns at once when already flushed */
	if (SyncRepRequested())
	{
		bool		replicated;

		SyncRepWaitForLSN(lsn, false);

		/*
		 * A cancel ends that wait with only a warning: check.  (Only the
		 * lsn[] array of WalSndCtl is read; the fields after it changed in
		 * PostgreSQL 15 minor releases.)
		 */
		replicated = SyncRepStandbyNames == NULL || SyncRepStandbyNames[0] == '\0';
		if (!replicated)
		{
			LWLockAcquire(SyncRepLock, LW_SHARED);
			replicated = WalSndCtl->lsn[SYNC_REP_WAIT_FLUSH] >= lsn;
			LWLockRelease(SyncRepLock);
		}
		if (!replicated)
			ereport(ERROR,
					(errcode(ERRCODE_QUERY_CANCELED),
					 errmsg("fencing token not confirmed by the synchronous standbys"),
					 errdetail("The wait for synchronous replication was cancelled before the standbys had the token's WAL; the grant is rolled back and the token is never used."),
					 errhint("Try again; check that the synchronous standbys are connected.")));
	}
}

/* Fill *owner with a version 4 UUID from the strong random source. */
static void
new_owner(pg_uuid_t *owner)
{
	if (!pg_strong_random(owner->data, UUID_LEN))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("could not generate a random owner token")));
	owner->data[6] = (owner->data[6] & 0x0f) | 0x40;	/* version 4 */
	owner->data[8] = (owner->data[8] & 0x3f) | 0x80;	/* RFC 4122 variant */
}

/*
 * One attempt to grant key for ttl.  With nowait, give up (GRANT_BUSY)
 * rather than wait for another transaction holding the key lock.  With
 * quick_refusal, when the key lock is busy, look without it and refuse at
 * once if the lease is held (GRANT_HELD_UNLOCKED): a refusal needs no lock,
 * only a grant does.  That look may predate a release in progress, so a
 * waiter must not sleep on it until the expiry.  On GRANT_OK the key lock
 * stays held until the end of the transaction and *lease is the new lease;
 * on GRANT_HELD(_UNLOCKED) *lease is the lease that is in the way.
 */
static GrantResult
attempt_grant(text *key, Interval *ttl, text *holder, bool nowait,
			  bool quick_refusal, DlockLease *lease)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	StorageSave save;
	TimestampTz now;
	Oid			argtypes[5] = {TEXTOID, UUIDOID, TIMESTAMPTZOID, TEXTOID,
	TIMESTAMPTZOID};
	Datum		values[5];
	char		nulls[5] = "     ";
	bool		isnull;
	SPIPlanPtr	plan;

	storage_begin(&save);
	if (!dlock_lock_key(k, len, ExclusiveLock, true))
	{
		/* Someone is busy with the key: a refusal needs no lock. */
		if (quick_refusal)
		{
			dlock_read_lease(key, lease);
			if (lease_is_live(lease, GetCurrentTimestamp()))
			{
				storage_end(&save);
				return GRANT_HELD_UNLOCKED;
			}
		}
		if (nowait)
		{
			storage_end(&save);
			return GRANT_BUSY;
		}
		(void) dlock_lock_key(k, len, ExclusiveLock, false);
	}
	now = GetCurrentTimestamp();
	new_owner(&lease->owner);
	lease->expires_at = lease_end(now, ttl);
	values[0] = PointerGetDatum(key);
	values[1] = UUIDPGetDatum(&lease->owner);
	values[2] = TimestampTzGetDatum(lease->expires_at);
	values[3] = PointerGetDatum(holder);
	if (holder == NULL)
		nulls[3] = 'n';
	values[4] = TimestampTzGetDatum(now);

	/*
	 * Take over the key's row if its lease is free: one HOT update (only
	 * non-indexed columns change) that draws the token only when it
	 * applies.  Otherwise the key is held, or has no row yet: insert it.  A
	 * row deleted by a concurrent prune() makes the update find nothing and
	 * the insert then succeeds: prune deletes only rows of free keys, and
	 * we hold the key lock.
	 */
	plan = storage_plan(&plan_grant_update,
						"UPDATE dlock.leases"
						" SET owner = $2, expires_at = $3, holder = $4, granted_at = $5,"
						" fence = pg_catalog.nextval('dlock.fence_seq'::pg_catalog.regclass)"
						" WHERE key OPERATOR(pg_catalog.=) $1"
						" AND (owner IS NULL OR expires_at OPERATOR(pg_catalog.<=) $5)"
						" RETURNING fence",
						5, argtypes);
	if (storage_exec(plan, values, nulls) == 0)
	{
		DlockLease	current;

		dlock_read_lease(key, &current);
		if (current.found)
		{
			*lease = current;
			dlock_unlock_key(k, len, ExclusiveLock);
			storage_end(&save);
			return GRANT_HELD;
		}
		plan = storage_plan(&plan_grant_insert,
							"INSERT INTO dlock.leases"
							" (key, owner, expires_at, holder, granted_at, fence)"
							" VALUES ($1, $2, $3, $4, $5,"
							" pg_catalog.nextval('dlock.fence_seq'::pg_catalog.regclass))"
							" RETURNING fence",
							5, argtypes);
		(void) storage_exec(plan, values, nulls);
	}
	lease->found = true;
	lease->held = true;
	lease->fence = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 1,
											   &isnull));
	storage_end(&save);

	dlock_fence_forget(key);
	force_synchronous_commit();
	secure_drawn_fence();
	return GRANT_OK;
}

/* Build the dlock.lease result of a grant. */
static Datum
lease_result(FunctionCallInfo fcinfo, text *key, DlockLease *lease)
{
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	pg_uuid_t  *owner = palloc(sizeof(pg_uuid_t));

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	tupdesc = BlessTupleDesc(tupdesc);

	memcpy(owner, &lease->owner, sizeof(pg_uuid_t));
	values[0] = PointerGetDatum(key);
	values[1] = UUIDPGetDatum(owner);
	values[2] = Int64GetDatum(lease->fence);
	values[3] = TimestampTzGetDatum(lease->expires_at);
	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/*
 * dlock.try_acquire(key, ttl, holder): grant the lease when key is free or
 * its lease has expired, else return NULL at once.
 */
Datum
dlock_try_acquire(PG_FUNCTION_ARGS)
{
	text	   *key = key_argument(fcinfo, 0);
	Interval   *ttl = ttl_argument(fcinfo, 1);
	text	   *holder = holder_argument(fcinfo, 2);
	DlockLease	lease;

	if (attempt_grant(key, ttl, holder, false, true, &lease) != GRANT_OK)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(lease_result(fcinfo, key, &lease));
}

/*
 * dlock.acquire(key, ttl, wait, holder): like try_acquire, but wait up to
 * wait (NULL: no limit of our own) for the lease to be released or to
 * expire.  Releases and renewals wake us through our latch (keylock.c);
 * expiries by our own timeout.  No key lock is held while sleeping.  While
 * another transaction holds the key lock, an unbounded acquire queues for
 * it in the lock manager; a bounded one retries with growing pauses, since
 * a lock wait cannot be given a deadline of its own.
 */
Datum
dlock_acquire(PG_FUNCTION_ARGS)
{
	text	   *key = key_argument(fcinfo, 0);
	Interval   *ttl = ttl_argument(fcinfo, 1);
	text	   *holder = holder_argument(fcinfo, 3);
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	bool		bounded = !PG_ARGISNULL(2);
	TimestampTz deadline = 0;
	long		backoff_ms = 1;
	DlockLease	lease;

	if (bounded)
	{
		Interval   *wait = PG_GETARG_INTERVAL_P(2);
		TimestampTz now = GetCurrentTimestamp();
		double		rough = rough_usecs(wait);

		if (rough > DLOCK_HUGE_USECS)
			bounded = false;	/* decades: no limit of our own */
		else if (rough >= -DLOCK_HUGE_USECS)
			deadline = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
															   TimestampTzGetDatum(now),
															   IntervalPGetDatum(wait)));
		if (bounded && (rough < -DLOCK_HUGE_USECS || deadline < now))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("wait must not be negative"),
					 errdetail("The wait given was %s.",
							   DatumGetCString(DirectFunctionCall1(interval_out,
																   IntervalPGetDatum(wait)))),
					 errhint("Pass how long to wait, '0' to try once, or NULL to wait without a limit of its own.")));
	}

	/* Register before the first look, so no release can slip past us. */
	dlock_register_waiter(k, len);
	for (;;)
	{
		GrantResult r;
		TimestampTz now;
		TimestampTz wake_at;
		long		timeout_ms;

		CHECK_FOR_INTERRUPTS();
		r = attempt_grant(key, ttl, holder, bounded, bounded, &lease);
		if (r == GRANT_OK)
			break;

		now = GetCurrentTimestamp();
		if (bounded && now >= deadline)
			ereport(ERROR,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("could not acquire the lease on \"%s\" within %s",
							text_to_cstring(key),
							DatumGetCString(DirectFunctionCall1(interval_out,
																PG_GETARG_DATUM(2)))),
					 r != GRANT_BUSY ?
					 errdetail("Another owner holds the lease until %s.",
							   timestamptz_to_str(lease.expires_at)) :
					 errdetail("A transaction writing under the key's expired lease, or changing the key, was still open."),
					 errhint("Retry later, or pass a longer wait.")));

		if (r == GRANT_HELD)
		{
			wake_at = lease.expires_at;
			backoff_ms = 1;
		}
		else
		{
			wake_at = now + backoff_ms * 1000;
			if (r == GRANT_HELD_UNLOCKED && lease.expires_at < wake_at)
				wake_at = lease.expires_at;
			backoff_ms = Min(backoff_ms * 2, BUSY_BACKOFF_MAX_MS);
		}
		if (bounded && wake_at > deadline)
			wake_at = deadline;
		/* round up, so that a lease is seen expired when we wake */
		timeout_ms = (long) ((wake_at - now + 999) / 1000);
		if (timeout_ms < 1)
			timeout_ms = 1;

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 timeout_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	dlock_unregister_waiter(k, len);

	PG_RETURN_DATUM(lease_result(fcinfo, key, &lease));
}

/*
 * Run an owner operation (renew or release) on key: take the key lock in
 * mode and the owner-op lock, which order it against grants, fenced
 * writers (see dlock.h) and other owner operations, read the clock only
 * then (a wait for the locks must not make an expired lease look alive),
 * and run plan with $1 key, $2 owner, $3 now and $4 the new expires_at:
 * now + ttl, or now when ttl is NULL.  Return the rows it changed and set
 * *end to that $4.
 */
static uint64
owner_operation(SPIPlanPtr *cache, const char *sql, text *key,
				pg_uuid_t *owner, LOCKMODE mode, Interval *ttl,
				TimestampTz *end)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	Oid			argtypes[4] = {TEXTOID, UUIDOID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		values[4];
	StorageSave save;
	TimestampTz now;
	uint64		changed;

	storage_begin(&save);
	(void) dlock_lock_key(k, len, mode, false);
	dlock_lock_owner_ops(k, len);
	now = GetCurrentTimestamp();
	*end = ttl ? lease_end(now, ttl) : now;
	values[0] = PointerGetDatum(key);
	values[1] = UUIDPGetDatum(owner);
	values[2] = TimestampTzGetDatum(now);
	values[3] = TimestampTzGetDatum(*end);
	changed = storage_exec(storage_plan(cache, sql, 4, argtypes),
						   values, NULL);
	storage_end(&save);

	/*
	 * Nothing changed (not the owner, or the lease is gone): keep no locks,
	 * so that a caller without the owner cannot hold the key up by leaving
	 * its transaction open.
	 */
	if (changed == 0)
	{
		dlock_unlock_owner_ops(k, len);
		dlock_unlock_key(k, len, mode);
	}
	return changed;
}

/*
 * dlock.renew(key, owner, ttl): extend owner's unexpired lease to now +
 * ttl.  Return the new expiry, or NULL when the lease is lost.
 */
Datum
dlock_renew(PG_FUNCTION_ARGS)
{
	text	   *key = key_argument(fcinfo, 0);
	pg_uuid_t  *owner = owner_argument(fcinfo, 1);
	Interval   *ttl = ttl_argument(fcinfo, 2);
	TimestampTz end;

	if (owner_operation(&plan_renew,
						"UPDATE dlock.leases SET expires_at = $4"
						" WHERE key OPERATOR(pg_catalog.=) $1"
						" AND owner OPERATOR(pg_catalog.=) $2"
						" AND expires_at OPERATOR(pg_catalog.>) $3",
						key, owner, RowShareLock, ttl, &end) == 0)
		PG_RETURN_NULL();
	dlock_fence_forget(key);
	/* waiters sleep until the old expiry, which may be later than end */
	dlock_wake_waiters(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
	force_synchronous_commit();
	PG_RETURN_TIMESTAMPTZ(end);
}

/*
 * dlock.release(key, owner): end owner's unexpired lease now and wake the
 * acquirers waiting for it.  Never touches another owner's lease.  Waits
 * for transactions writing under the lease to end first.  The
 * commit may be asynchronous: losing a release in a crash only delays the
 * key's availability until the lease expires.
 */
Datum
dlock_release(PG_FUNCTION_ARGS)
{
	text	   *key = key_argument(fcinfo, 0);
	pg_uuid_t  *owner = owner_argument(fcinfo, 1);
	TimestampTz end;

	if (owner_operation(&plan_release,
						"UPDATE dlock.leases SET owner = NULL, expires_at = $4"
						" WHERE key OPERATOR(pg_catalog.=) $1"
						" AND owner OPERATOR(pg_catalog.=) $2"
						" AND expires_at OPERATOR(pg_catalog.>) $3",
						key, owner, RowExclusiveLock, NULL, &end) == 0)
		PG_RETURN_BOOL(false);
	dlock_fence_forget(key);
	dlock_wake_waiters(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
	PG_RETURN_BOOL(true);
}

/*
 * dlock.prune(older_than): delete the rows of keys whose lease was released
 * or expired more than older_than ago; return how many.  Takes no key
 * locks: a grant racing with it finds the row gone and inserts a new one.
 * A pruned key's next token still comes from the same sequence, so it is
 * higher than any before; only the monotonic fencing mode loses the key's
 * history (see README).
 */
Datum
dlock_prune(PG_FUNCTION_ARGS)
{
	Interval   *older_than;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz cutoff;
	Oid			argtypes[1] = {TIMESTAMPTZOID};
	Datum		values[1];
	StorageSave save;
	uint64		deleted;

	if (PG_ARGISNULL(0))
		dlock_null_argument(fcinfo, "older_than");
	older_than = PG_GETARG_INTERVAL_P(0);
	if (rough_usecs(older_than) > DLOCK_HUGE_USECS)
		PG_RETURN_INT64(0);		/* no lease is that old */
	if (rough_usecs(older_than) < -DLOCK_HUGE_USECS)
		cutoff = DT_NOEND;
	else
		cutoff = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_mi_interval,
														 TimestampTzGetDatum(now),
														 IntervalPGetDatum(older_than)));
	if (cutoff > now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("older_than must not be negative"),
				 errdetail("The age given was %s.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(older_than)))),
				 errhint("Pass how long a key must have been free, for example '1 day'.")));

	values[0] = TimestampTzGetDatum(cutoff);
	storage_begin(&save);
	deleted = storage_exec(storage_plan(&plan_prune,
										"DELETE FROM dlock.leases"
										" WHERE expires_at OPERATOR(pg_catalog.<) $1",
										1, argtypes),
						   values, NULL);
	storage_end(&save);
	PG_RETURN_INT64((int64) deleted);
}
