/*-------------------------------------------------------------------------
 *
 * leasetable.c
 *		The lease table dlock.leases: reading its rows, and writing them
 *		directly with heap calls.
 *
 * Reading.  Never with the caller's transaction snapshot: a REPEATABLE
 * READ caller whose snapshot predates a grant must still see that grant.
 * We read the latest committed version (and our own changes) with
 * SnapshotSelf, by a direct lookup in the primary key index.  That is not
 * an MVCC snapshot, so a SERIALIZABLE caller's reads of the lease table do
 * not take predicate locks: the key locks already order everything that
 * matters, and SSI would otherwise fail concurrent acquirers of one key
 * with 40001.  The caller holds whichever key lock makes the answer stable
 * (keylock.c); a key's row is only ever changed under a lock that excludes
 * the reader's, except by a renewal extending it or prune deleting an
 * expired row, where either version is right.
 *
 * Writing.  Directly with heap_* calls and index inserts, no SQL, no
 * executor: no trigger, rule, policy or operator chosen by anyone can run
 * in between, and a name in a query text can never resolve to somebody
 * else's table.  The writes run as the table's owner (objects.c,
 * dlock_section_begin).  The caller holds the key lock that serializes
 * changes to the key, so a row read with a fresh snapshot is the latest
 * version.
 *
 * Owns: the table's layout.  Calls objects.c (finding the table, running
 * as its owner), liveness.c and args.c.  Tokens, durability and the horizon
 * are storage.c's to combine with these rows.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/procarray.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "dlock.h"


/*
 * Columns of dlock.leases, in the order of the install script.  Versions
 * 0.1 and 0.2 have only the first six, 0.3 to 0.6 the first eleven: until
 * ALTER EXTENSION dlock UPDATE the others read as NULL and are not written
 * (and the functions that need them do not exist).
 */
#define Natts_leases			13
#define Anum_leases_key			1
#define Anum_leases_fence		2
#define Anum_leases_owner		3
#define Anum_leases_expires_at	4
#define Anum_leases_holder		5
#define Anum_leases_granted_at	6
#define Anum_leases_pid			7
#define Anum_leases_application_name 8
#define Anum_leases_session_id	9
#define Anum_leases_lock_delay	10
#define Anum_leases_hold_limit	11
#define Anum_leases_value		12
#define Anum_leases_slots		13

/*
 * Open dlock.leases with lockmode, after making sure that ids are valid.
 * A DROP EXTENSION that commits while we wait for the lock gets a clear
 * error, not "could not open relation".
 */
static Relation
open_leases(LOCKMODE lockmode)
{
	Relation	rel;

	dlock_objects_find();
	rel = try_table_open(dlock_objects.leases, lockmode);
	if (rel == NULL)
	{
		dlock_objects.valid = false;
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the lease table of extension dlock was dropped"),
				 errhint("The extension was dropped, or dropped and created again, while this call waited: call again.")));
	}
	if (RelationGetDescr(rel)->natts > Natts_leases)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("dlock.leases has columns that this version of dlock does not know"),
				 errhint("Install the version of the dlock module that matches the extension, or drop the added columns.")));
	return rel;
}

/*
 * Open dlock.leases for a change, as its owner (dlock_section_begin), after
 * checking that the transaction may write.  Undo with dlock_table_end_change.
 */
void
dlock_table_begin_change(DlockTableChange *c)
{
	dlock_check_writable();
	c->rel = open_leases(RowExclusiveLock);
	dlock_section_begin(&c->section);
}

/* Close the table after a change, keeping its lock; end the section. */
void
dlock_table_end_change(DlockTableChange *c)
{
	table_close(c->rel, NoLock);
	dlock_section_end(&c->section);
}

/*
 * Return a copy of the latest row of key in rel (opened by the caller), or
 * NULL when the key has no row.
 *
 * SnapshotSelf judges each version when the scan reaches it, so a scan
 * that meets the new version of a row first (invisible: its updater is
 * still running) and the old one after the updater committed (invisible
 * now too) finds nothing.  A row exists far more often than not, so when
 * none is found we look once more; the second scan sees the committed
 * version.
 */
static HeapTuple
fetch_row(Relation rel, const char *key, int len)
{
	ScanKeyData skey;
	SysScanDesc scan;
	HeapTuple	tup = NULL;
	text	   *keytext = cstring_to_text_with_len(key, len);
	int			attempt;

	for (attempt = 0; attempt < 2 && tup == NULL; attempt++)
	{
		ScanKeyEntryInitialize(&skey, 0, Anum_leases_key, BTEqualStrategyNumber,
							   InvalidOid,
							   TupleDescAttr(RelationGetDescr(rel), Anum_leases_key - 1)->attcollation,
							   F_TEXTEQ, PointerGetDatum(keytext));
		scan = systable_beginscan(rel, RelationGetPrimaryKeyIndex(rel), true,
								  SnapshotSelf, 1, &skey);
		tup = systable_getnext(scan);
		if (HeapTupleIsValid(tup))
			tup = heap_copytuple(tup);
		systable_endscan(scan);
	}
	return tup;
}

/*
 * Return column attnum of tup (a row of rel) in *isnull and the result;
 * NULL for a column that this version of the table does not have.
 */
static Datum
column(Relation rel, HeapTuple tup, int attnum, bool *isnull)
{
	TupleDesc	desc = RelationGetDescr(rel);

	if (attnum > desc->natts || TupleDescAttr(desc, attnum - 1)->attisdropped)
	{
		*isnull = true;
		return (Datum) 0;
	}
	return heap_getattr(tup, attnum, desc, isnull);
}

/* Fill *lease from tup, a row of rel (NULL: the key has no row). */
static void
row_to_lease(Relation rel, HeapTuple tup, DlockLease *lease)
{
	TupleDesc	desc = RelationGetDescr(rel);
	bool		isnull;
	Datum		d;

	memset(lease, 0, sizeof(DlockLease));
	lease->hold_limit = DT_NOEND;
	if (tup == NULL)
		return;
	lease->found = true;
	d = heap_getattr(tup, Anum_leases_owner, desc, &isnull);
	lease->held = !isnull;
	if (!isnull)
		memcpy(&lease->owner, DatumGetUUIDP(d), sizeof(pg_uuid_t));
	lease->fence = DatumGetInt64(heap_getattr(tup, Anum_leases_fence,
											  desc, &isnull));
	lease->expires_at = DatumGetTimestampTz(heap_getattr(tup, Anum_leases_expires_at,
														 desc, &isnull));
	lease->granted_at = DatumGetTimestampTz(heap_getattr(tup, Anum_leases_granted_at,
														 desc, &isnull));
	d = column(rel, tup, Anum_leases_session_id, &isnull);
	if (!isnull)
		lease->session_id = DatumGetInt64(d);
	d = column(rel, tup, Anum_leases_lock_delay, &isnull);
	if (!isnull)
		lease->lock_delay = dlock_interval_usecs(DatumGetIntervalP(d));
	d = column(rel, tup, Anum_leases_hold_limit, &isnull);
	if (!isnull)
		lease->hold_limit = DatumGetTimestampTz(d);
	d = column(rel, tup, Anum_leases_slots, &isnull);
	if (!isnull)
		lease->nslots = DatumGetInt32(d);
}

/*
 * The latest end (plus lock delay) of a lease held in dlock.leases: what a
 * switch from table mode to memory mode must wait out.
 */
TimestampTz
dlock_table_max_end(void)
{
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tup;
	TimestampTz latest = 0;

	rel = open_leases(AccessShareLock);
	scan = systable_beginscan(rel, InvalidOid, false, SnapshotSelf, 0, NULL);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		DlockLease	lease;

		row_to_lease(rel, tup, &lease);
		if (lease.held)
			latest = Max(latest, lease.expires_at + lease.lock_delay);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return latest;
}

/*
 * Insert the index entries of tup, just written to rel (not needed after
 * a HOT update).  dlock.leases has only its primary key; expression and
 * partial indexes, which would need an executor, are refused.
 */
static void
insert_index_entries(Relation rel, HeapTuple tup)
{
	List	   *indexes = RelationGetIndexList(rel);
	TupleTableSlot *slot;
	ListCell   *lc;

	slot = MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsHeapTuple);
	ExecStoreHeapTuple(tup, slot, false);
	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), RowExclusiveLock);
		IndexInfo  *info = BuildIndexInfo(index);
		Datum		values[INDEX_MAX_KEYS];
		bool		isnull[INDEX_MAX_KEYS];

		if (info->ii_Expressions != NIL || info->ii_Predicate != NIL)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("index \"%s\" on dlock.leases is not supported",
							RelationGetRelationName(index)),
					 errhint("Drop it: dlock.leases needs only its primary key.")));
		FormIndexDatum(info, slot, NULL, values, isnull);
		(void) index_insert(index, values, isnull, &tup->t_self, rel,
							index->rd_index->indisunique ?
							UNIQUE_CHECK_YES : UNIQUE_CHECK_NO,
							false, info);
		index_close(index, NoLock);
	}
	ExecDropSingleTupleTableSlot(slot);
	list_free(indexes);
}

/*
 * Keep dlock.leases locked (AccessShareLock) until the transaction ends, so
 * that a DROP EXTENSION waits for it (memory mode writes no row).
 */
void
dlock_table_keep(void)
{
	table_close(open_leases(AccessShareLock), NoLock);
}

/*
 * Read the row of key into *lease (found = false when it has none), with a
 * fresh snapshot.
 */
void
dlock_table_read(const char *key, int len, DlockLease *lease)
{
	Relation	rel;
	HeapTuple	tup;

	rel = open_leases(AccessShareLock);
	tup = fetch_row(rel, key, len);
	row_to_lease(rel, tup, lease);
	if (tup)
		heap_freetuple(tup);
	table_close(rel, AccessShareLock);
}

/*
 * Refuse a grant that the table, as it is before ALTER EXTENSION UPDATE,
 * cannot record; before any token is drawn for it.
 */
void
dlock_table_check_grant(DlockTableChange *c, const DlockGrantOptions *opts)
{
	int			natts = RelationGetDescr(c->rel)->natts;

	if (opts->session_bound && natts < Anum_leases_hold_limit)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("session-bound leases need dlock 0.3"),
				 errhint("Run ALTER EXTENSION dlock UPDATE.")));
	if ((opts->value != NULL || opts->nslots != 0) && natts < Anum_leases_slots)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("election values need dlock 0.7"),
				 errhint("Run ALTER EXTENSION dlock UPDATE.")));
}

/*
 * Write *lease, new and with its token, as the row of key (c from
 * dlock_table_begin_change); opts gives its holder label and whether it is
 * session-bound.  Return false, writing nothing, when the key's row is
 * being deleted by a prune() that has not committed yet: the key is busy
 * until it does.
 */
bool
dlock_table_put_grant(DlockTableChange *c, const char *k, int len,
					  const DlockLease *lease, const DlockGrantOptions *opts)
{
	Relation	rel = c->rel;
	TupleDesc	desc = RelationGetDescr(rel);
	HeapTuple	old;
	HeapTuple	tup;
	Datum		values[Natts_leases];
	bool		nulls[Natts_leases] = {0};
	bool		replace[Natts_leases] = {0};
	TM_Result	result;
	TM_FailureData tmfd;
	LockTupleMode lockmode;
	int			natts;
	int			i;

	values[Anum_leases_key - 1] = PointerGetDatum(cstring_to_text_with_len(k, len));
	values[Anum_leases_fence - 1] = Int64GetDatum(lease->fence);
	values[Anum_leases_owner - 1] = UUIDPGetDatum(&lease->owner);
	values[Anum_leases_expires_at - 1] = TimestampTzGetDatum(lease->expires_at);
	values[Anum_leases_holder - 1] = PointerGetDatum(opts->holder);
	nulls[Anum_leases_holder - 1] = (opts->holder == NULL);
	values[Anum_leases_granted_at - 1] = TimestampTzGetDatum(lease->granted_at);
	values[Anum_leases_pid - 1] = Int32GetDatum(MyProcPid);
	if (application_name != NULL && application_name[0] != '\0')
		values[Anum_leases_application_name - 1] =
			PointerGetDatum(cstring_to_text(application_name));
	else
		nulls[Anum_leases_application_name - 1] = true;
	values[Anum_leases_session_id - 1] = Int64GetDatum(lease->session_id);
	nulls[Anum_leases_session_id - 1] = !opts->session_bound;
	if (lease->lock_delay > 0)
	{
		Interval   *delay = palloc0(sizeof(Interval));

		delay->time = lease->lock_delay;
		values[Anum_leases_lock_delay - 1] = IntervalPGetDatum(delay);
	}
	else
		nulls[Anum_leases_lock_delay - 1] = true;
	values[Anum_leases_hold_limit - 1] = TimestampTzGetDatum(lease->hold_limit);
	nulls[Anum_leases_hold_limit - 1] = (lease->hold_limit == DT_NOEND);
	values[Anum_leases_value - 1] = PointerGetDatum(opts->value);
	nulls[Anum_leases_value - 1] = (opts->value == NULL);
	values[Anum_leases_slots - 1] = Int32GetDatum(lease->nslots);
	nulls[Anum_leases_slots - 1] = (lease->nslots == 0);
	/* before ALTER EXTENSION UPDATE, the table has only the first columns */
	natts = Min(desc->natts, Natts_leases);

	old = fetch_row(rel, k, len);
	if (old != NULL)
	{
		DlockLease	current;

		row_to_lease(rel, old, &current);
		if (dlock_lease_is_live(&current, lease->granted_at))
			elog(ERROR, "dlock: grant of a key with a live lease");

		/*
		 * prune() may have deleted the row (it holds the grant lock only
		 * while it deletes, not until its commit; SnapshotSelf still shows
		 * the row then).  A grant must not wait in the lock manager for
		 * it: report the key busy while that delete is in progress.  No
		 * new delete can start, we hold the grant lock.
		 */
		if (!(old->t_data->t_infomask & HEAP_XMAX_INVALID) &&
			!HEAP_XMAX_IS_LOCKED_ONLY(old->t_data->t_infomask) &&
			TransactionIdIsInProgress(HeapTupleHeaderGetUpdateXid(old->t_data)))
		{
			/* the token drawn is never shown: it is simply not used */
			return false;
		}

		/*
		 * Only non-indexed columns change: a HOT update when there is room.
		 * A prune() that has committed since leaves TM_Deleted: insert.
		 */
		for (i = Anum_leases_fence; i <= natts; i++)
			replace[i - 1] = !TupleDescAttr(desc, i - 1)->attisdropped;
		tup = heap_modify_tuple(old, desc, values, nulls, replace);
		result = heap_update(rel, &old->t_self, tup, GetCurrentCommandId(true),
							 InvalidSnapshot, true, &tmfd, &lockmode);
		if (result == TM_Ok)
		{
			if (!HeapTupleIsHeapOnly(tup))
				insert_index_entries(rel, tup);
		}
		else if (result == TM_Deleted)
			old = NULL;			/* prune() deleted it meanwhile: insert */
		else
			elog(ERROR, "dlock: unexpected result %d updating a lease row",
				 (int) result);
	}
	if (old == NULL)
	{
		Datum		v[MaxTupleAttributeNumber];
		bool		n[MaxTupleAttributeNumber];

		/* the table's own shape: fewer columns before an upgrade */
		for (i = 0; i < desc->natts; i++)
		{
			v[i] = i < natts ? values[i] : (Datum) 0;
			n[i] = i < natts ? nulls[i] : true;
		}
		tup = heap_form_tuple(desc, v, n);
		simple_heap_insert(rel, tup);
		insert_index_entries(rel, tup);
	}
	CommandCounterIncrement();
	return true;
}

/*
 * Set the end of the lease of key to end, keeping its owner, or clearing it
 * with release (c from dlock_table_begin_change).
 */
void
dlock_table_put_end(DlockTableChange *c, const char *k, int len,
					TimestampTz end, bool release)
{
	Relation	rel = c->rel;
	HeapTuple	old;
	HeapTuple	tup;
	Datum		values[Natts_leases] = {0};
	bool		nulls[Natts_leases] = {0};
	bool		replace[Natts_leases] = {0};

	old = fetch_row(rel, k, len);
	if (old == NULL)
		elog(ERROR, "dlock: lease row of a held key vanished");
	values[Anum_leases_expires_at - 1] = TimestampTzGetDatum(end);
	replace[Anum_leases_expires_at - 1] = true;
	if (release)
	{
		nulls[Anum_leases_owner - 1] = true;
		replace[Anum_leases_owner - 1] = true;
	}
	tup = heap_modify_tuple(old, RelationGetDescr(rel), values, nulls, replace);
	simple_heap_update(rel, &old->t_self, tup);
	if (!HeapTupleIsHeapOnly(tup))
		insert_index_entries(rel, tup);
	CommandCounterIncrement();
}

/*
 * Set the value of the lease of key (held: the caller checked its owner
 * under the owner-op lock), keeping everything else (c from
 * dlock_table_begin_change).
 */
void
dlock_table_put_value(DlockTableChange *c, const char *k, int len,
					  const text *value)
{
	Relation	rel = c->rel;
	HeapTuple	old;
	HeapTuple	tup;
	Datum		values[Natts_leases] = {0};
	bool		nulls[Natts_leases] = {0};
	bool		replace[Natts_leases] = {0};

	if (RelationGetDescr(rel)->natts < Anum_leases_value)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("election values need dlock 0.7"),
				 errhint("Run ALTER EXTENSION dlock UPDATE.")));
	old = fetch_row(rel, k, len);
	if (old == NULL)
		elog(ERROR, "dlock: lease row of a held key vanished");
	values[Anum_leases_value - 1] = PointerGetDatum(value);
	replace[Anum_leases_value - 1] = true;
	tup = heap_modify_tuple(old, RelationGetDescr(rel), values, nulls, replace);
	simple_heap_update(rel, &old->t_self, tup);
	if (!HeapTupleIsHeapOnly(tup))
		insert_index_entries(rel, tup);
	CommandCounterIncrement();
}

/*
 * Record in the row of key (c from dlock_table_begin_change) that it has
 * used nslots slot keys; a key without a row gets one, with no lease (no
 * owner, token 0).  The caller holds the key's new-slot lock.  Return
 * false, writing nothing, when a prune() that has not committed yet is
 * deleting the row (as dlock_table_put_grant does).
 */
bool
dlock_table_put_slots(DlockTableChange *c, const char *k, int len,
					  int32 nslots)
{
	Relation	rel = c->rel;
	TupleDesc	desc = RelationGetDescr(rel);
	HeapTuple	old;
	HeapTuple	tup;
	Datum		values[Natts_leases] = {0};
	bool		nulls[Natts_leases] = {0};
	bool		replace[Natts_leases] = {0};

	if (desc->natts < Anum_leases_slots)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("permits and shared leases need dlock 0.7"),
				 errhint("Run ALTER EXTENSION dlock UPDATE.")));
	values[Anum_leases_slots - 1] = Int32GetDatum(nslots);
	replace[Anum_leases_slots - 1] = true;
	old = fetch_row(rel, k, len);
	if (old != NULL &&
		!(old->t_data->t_infomask & HEAP_XMAX_INVALID) &&
		!HEAP_XMAX_IS_LOCKED_ONLY(old->t_data->t_infomask) &&
		TransactionIdIsInProgress(HeapTupleHeaderGetUpdateXid(old->t_data)))
		return false;
	if (old != NULL)
	{
		tup = heap_modify_tuple(old, desc, values, nulls, replace);
		simple_heap_update(rel, &old->t_self, tup);
		if (!HeapTupleIsHeapOnly(tup))
			insert_index_entries(rel, tup);
	}
	else
	{
		TimestampTz now = GetCurrentTimestamp();
		int			i;

		for (i = 0; i < Natts_leases; i++)
			nulls[i] = true;
		values[Anum_leases_key - 1] = PointerGetDatum(cstring_to_text_with_len(k, len));
		values[Anum_leases_fence - 1] = Int64GetDatum(0);
		values[Anum_leases_expires_at - 1] = TimestampTzGetDatum(now);
		values[Anum_leases_granted_at - 1] = TimestampTzGetDatum(now);
		nulls[Anum_leases_key - 1] = false;
		nulls[Anum_leases_fence - 1] = false;
		nulls[Anum_leases_expires_at - 1] = false;
		nulls[Anum_leases_granted_at - 1] = false;
		nulls[Anum_leases_slots - 1] = false;
		tup = heap_form_tuple(desc, values, nulls);
		simple_heap_insert(rel, tup);
		insert_index_entries(rel, tup);
	}
	CommandCounterIncrement();
	return true;
}

/* A row for the views, or for dlock.leader and dlock.observe, from tup. */
static DlockLeaseRow *
make_row(Relation rel, HeapTuple tup)
{
	DlockLeaseRow *row = palloc0(sizeof(DlockLeaseRow));
	bool		isnull;
	Datum		d;

	row_to_lease(rel, tup, &row->lease);
	row->key = DatumGetTextPCopy(column(rel, tup, Anum_leases_key, &isnull));
	d = column(rel, tup, Anum_leases_holder, &isnull);
	if (!isnull)
		row->holder = DatumGetTextPCopy(d);
	d = column(rel, tup, Anum_leases_value, &isnull);
	if (!isnull)
		row->value = DatumGetTextPCopy(d);
	d = column(rel, tup, Anum_leases_pid, &isnull);
	row->has_pid = !isnull;
	if (!isnull)
		row->pid = DatumGetInt32(d);
	d = column(rel, tup, Anum_leases_application_name, &isnull);
	if (!isnull)
		row->application_name = DatumGetTextPCopy(d);
	return row;
}

/*
 * Return the row of key, with a fresh snapshot, or NULL when the key has
 * none.
 */
DlockLeaseRow *
dlock_table_read_row(const char *key, int len)
{
	Relation	rel;
	HeapTuple	tup;
	DlockLeaseRow *row = NULL;

	rel = open_leases(AccessShareLock);
	tup = fetch_row(rel, key, len);
	if (tup)
	{
		row = make_row(rel, tup);
		heap_freetuple(tup);
	}
	table_close(rel, AccessShareLock);
	return row;
}

/*
 * Return every row of dlock.leases (a List of DlockLeaseRow), as of a
 * fresh snapshot, for the views.
 */
List *
dlock_table_scan(void)
{
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tup;
	List	   *rows = NIL;

	rel = open_leases(AccessShareLock);
	scan = systable_beginscan(rel, InvalidOid, false, SnapshotSelf, 0, NULL);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
		rows = lappend(rows, make_row(rel, tup));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return rows;
}

/*
 * Return the keys (a List of text) whose lease was released or expired
 * before cutoff, as of a fresh snapshot.
 */
List *
dlock_table_old_keys(TimestampTz cutoff)
{
	Relation	rel;
	TupleDesc	desc;
	SysScanDesc scan;
	HeapTuple	tup;
	List	   *keys = NIL;

	rel = open_leases(AccessShareLock);
	desc = RelationGetDescr(rel);
	scan = systable_beginscan(rel, InvalidOid, false, SnapshotSelf, 0, NULL);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		isnull;
		DlockLease	lease;

		row_to_lease(rel, tup, &lease);
		if (dlock_lease_ended_at(&lease, MyDatabaseId) < cutoff)
			keys = lappend(keys, DatumGetTextPCopy(heap_getattr(tup, Anum_leases_key,
																desc, &isnull)));
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return keys;
}

/*
 * Delete the row of key if its lease was released or expired before
 * cutoff, or in any case when force is set; return whether it did.  A row
 * that another prune() is deleting is left to it, without waiting.
 */
bool
dlock_table_delete_old(const char *k, int len, TimestampTz cutoff, bool force)
{
	DlockTableChange c;
	Relation	rel;
	HeapTuple	old;
	DlockLease	lease;
	bool		deleted = false;

	dlock_table_begin_change(&c);
	rel = c.rel;
	old = fetch_row(rel, k, len);
	row_to_lease(rel, old, &lease);
	/*
	 * A live lease, or a lock delay still running, keeps the row; a
	 * session-bound lease whose connection is gone has ended
	 * (dlock_lease_ended_at).
	 */
	if (old != NULL &&
		(force || dlock_lease_ended_at(&lease, MyDatabaseId) < cutoff))
	{
		TM_FailureData tmfd;

		deleted = heap_delete(rel, &old->t_self, GetCurrentCommandId(true),
							  InvalidSnapshot, false, &tmfd, false) == TM_Ok;
		CommandCounterIncrement();
	}
	dlock_table_end_change(&c);
	return deleted;
}
