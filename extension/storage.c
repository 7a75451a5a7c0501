/*-------------------------------------------------------------------------
 *
 * storage.c
 *		The lease table dlock.leases and the sequences dlock.fence_seq and
 *		dlock.horizon_seq: finding them, reading, writing, durability, and
 *		what the current transaction has verified; in memory mode, the same
 *		through memstore.c.
 *
 * Finding.  The table and the sequence are found through the extension's
 * own membership (pg_depend rows of deptype 'e'), never by name: a schema
 * name can be squatted or renamed.  The OIDs are cached for the backend and
 * forgotten by a relcache callback (DROP EXTENSION, or anything else that
 * invalidates them) or a namespace syscache callback (a schema changing
 * owner).  Each lookup also checks that the extension's schema belongs to
 * the extension's owner (or a superuser): whoever owns the schema can
 * rename or replace what is in it.
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
 * else's table.  The writes run as the table's owner with
 * SECURITY_RESTRICTED_OPERATION and a fresh GUC nest level, as
 * REFRESH MATERIALIZED VIEW does, although nothing below runs user code.
 * The caller holds the key lock that serializes changes to the key, so a
 * row read with a fresh snapshot is the latest version.
 *
 * Durability.  A grant or renewal forces its transaction's commit to be
 * synchronous, so a lease that was returned survives a crash.  A token is
 * made durable before it is returned, committed or not.  A release is the
 * opposite: when it is all its transaction wrote, the commit is made
 * asynchronous, saving a WAL flush per lock cycle.  Losing a release in a
 * crash only keeps the key held by its owner until the lease expires, as
 * if the release had not been called; and any later grant of the key
 * commits synchronously after it in the WAL, so it flushes the release
 * too.  A transaction that wrote anything else keeps its own setting: a
 * release never weakens the durability of the caller's table writes.
 * dlock.async_release = off turns this off (storage_xact_callback).
 *
 * Memory mode (dlock.storage = memory).  The leases live in memstore.c's
 * shared hash instead of the table, and nothing above about rows applies:
 * a grant's commit is not forced synchronous.  What this file still keeps
 * durable is the token (as above) and the horizon, dlock.horizon_seq: a
 * time no lease outlives, moved ahead before a lease that would outlive it
 * is returned (secure_horizon), and read after every start as the barrier
 * before which every key is held by an unknown owner (memory_state).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/parallel.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/table.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/dependency.h"
#include "catalog/index.h"
#include "catalog/indexing.h"
#include "catalog/pg_class.h"
#include "catalog/pg_depend.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "commands/sequence.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "replication/syncrep.h"
#include "replication/walsender.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "dlock.h"

/*
 * Columns of dlock.leases, in the order of the install script.  Versions
 * 0.1 and 0.2 have only the first six: until ALTER EXTENSION dlock UPDATE
 * the others read as NULL and are not written.
 */
#define Natts_leases			11
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

/* The extension's storage, as found through pg_depend. */
typedef struct StorageIds
{
	bool		valid;
	Oid			leases;			/* dlock.leases */
	Oid			seq;			/* dlock.fence_seq */
	Oid			horizon;		/* dlock.horizon_seq (0.4), or InvalidOid */
	Oid			token;			/* dlock.token_seq (0.6), or InvalidOid */
	Oid			horizon_mark;	/* dlock.horizon_mark (0.6), or InvalidOid */
	Oid			owner;			/* owner of dlock.leases */
} StorageIds;

static StorageIds ids;

/* What section_begin saves for section_end. */
typedef struct Section
{
	Oid			userid;
	int			sec_context;
	int			nestlevel;
} Section;

/*
 * The transaction whose only writes so far are releases, and the end of its
 * WAL after the last one (see dlock_storage_set_end and
 * storage_xact_callback).
 */
static LocalTransactionId release_only_lxid = InvalidLocalTransactionId;
static XLogRecPtr release_only_end = InvalidXLogRecPtr;

/*
 * Memory mode: the transaction whose transaction id and WAL so far come only
 * from memory grants (a sequence logging ahead, the horizon), all flushed
 * before the grant returned, and the end of its WAL then (memory_grant).
 */
static LocalTransactionId seq_only_lxid = InvalidLocalTransactionId;
static XLogRecPtr seq_only_end = InvalidXLogRecPtr;

/*
 * Table mode: the transaction that granted or renewed a lease, whose commit
 * must be synchronous whatever the settings say by then
 * (force_synchronous_commit, storage_xact_callback).
 */
static LocalTransactionId durable_lxid = InvalidLocalTransactionId;

/* The per-transaction view of verified keys (see DlockKeyState). */
static DlockXactHash key_states;

/* key_states' table if this transaction has entries there, else NULL */
#define KEY_STATES() \
	(MyProc != NULL ? dlock_xact_hash(&key_states, NULL, 0, 0, 0, false) : NULL)

/*
 * Table mode: this backend has seen the horizon pass (see table_barrier),
 * and the horizon it read.
 */
static bool table_barrier_passed = false;
static TimestampTz table_horizon = 0;

/* The highest token the counter may have returned, as last read. */
static int64 known_high = 0;

/*
 * Forget the cached OIDs, and what this transaction verified against the
 * storage they name: the next lookup and the next write check again.
 */
static void
forget_storage(void)
{
	ids.valid = false;
	table_barrier_passed = false;
	known_high = 0;
	if (KEY_STATES() != NULL)
	{
		HASH_SEQ_STATUS status;
		DlockKeyState *st;

		hash_seq_init(&status, key_states.htab);
		while ((st = hash_seq_search(&status)) != NULL)
			st->verified = false;
	}
}

/* Forget the storage when one of our relations is invalidated. */
static void
storage_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == ids.leases || relid == ids.seq ||
		relid == ids.horizon || relid == ids.token || relid == ids.horizon_mark)
		forget_storage();
}

/* Forget it too when any schema changes (its owner, say). */
static void
storage_syscache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	forget_storage();
}

/*
 * Raise an error unless the schema nspid is owned by trusted or by a
 * superuser.  Whoever owns the schema can rename it, drop dlock's objects
 * in it and put look-alikes in their place.  installing says whether the
 * install or upgrade script asks (else a function at run time).
 */
static void
check_schema_owner(Oid nspid, Oid trusted, bool installing)
{
	HeapTuple	tup;
	Oid			nspowner;
	char	   *nspname;

	tup = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(nspid));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for schema %u", nspid);
	nspowner = ((Form_pg_namespace) GETSTRUCT(tup))->nspowner;
	nspname = pstrdup(NameStr(((Form_pg_namespace) GETSTRUCT(tup))->nspname));
	ReleaseSysCache(tup);

	if (nspowner == trusted || superuser_arg(nspowner))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("schema \"%s\" of extension dlock is owned by role \"%s\"",
					nspname, GetUserNameFromId(nspowner, false)),
			 errdetail("The owner of the schema can rename it and replace dlock's lease table, so dlock refuses to work in it; only role \"%s\" or a superuser may own it.",
					   GetUserNameFromId(trusted, false)),
			 installing ?
			 errhint("Let CREATE EXTENSION create the schema: drop or rename schema %s first; or, after checking what is in it, ALTER SCHEMA %s OWNER TO %s.",
					 quote_identifier(nspname), quote_identifier(nspname),
					 quote_identifier(GetUserNameFromId(trusted, false))) :
			 errhint("After checking what is in it, ALTER SCHEMA %s OWNER TO %s.  Do not drop the extension to fix this: that forgets the leases and the token counter.",
					 quote_identifier(nspname),
					 quote_identifier(GetUserNameFromId(trusted, false)))));
}

/*
 * Called by the install and upgrade scripts (through dlock.c) with the
 * schema they install into: refuse a schema owned by anyone but the
 * installing role or a superuser.  CREATE EXTENSION uses an existing
 * schema named in the control file as it is, whoever created it.
 */
void
dlock_install_check_schema(Oid nspid)
{
	check_schema_owner(nspid, GetUserId(), true);
}

/* Fill ids: the extension's table and sequence, found through pg_depend. */
static void
find_storage(void)
{
	Oid			ext = get_extension_oid("dlock", true);
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData skey[2];
	HeapTuple	tup;
	Oid			extowner = InvalidOid;
	Oid			extnsp = InvalidOid;
	StorageIds	found = {0};

	if (!OidIsValid(ext))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension dlock is not installed in this database"),
				 errhint("Run CREATE EXTENSION dlock.")));

	/* the extension's owner and schema */
	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&skey[0], Anum_pg_extension_oid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(ext));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, skey);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		extowner = ((Form_pg_extension) GETSTRUCT(tup))->extowner;
		extnsp = ((Form_pg_extension) GETSTRUCT(tup))->extnamespace;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (!OidIsValid(extowner))
		elog(ERROR, "extension dlock (%u) vanished", ext);
	check_schema_owner(extnsp, extowner, false);

	/* its member relations */
	rel = table_open(DependRelationId, AccessShareLock);
	ScanKeyInit(&skey[0], Anum_pg_depend_refclassid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(ExtensionRelationId));
	ScanKeyInit(&skey[1], Anum_pg_depend_refobjid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(ext));
	scan = systable_beginscan(rel, DependReferenceIndexId, true, NULL, 2, skey);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		Form_pg_depend dep = (Form_pg_depend) GETSTRUCT(tup);
		char	   *relname;
		char		relkind;

		if (dep->classid != RelationRelationId ||
			dep->deptype != DEPENDENCY_EXTENSION || dep->objsubid != 0)
			continue;
		relname = get_rel_name(dep->objid);
		relkind = get_rel_relkind(dep->objid);
		if (relname == NULL)
			continue;
		if (relkind == RELKIND_RELATION && strcmp(relname, "leases") == 0)
			found.leases = dep->objid;
		else if (relkind == RELKIND_SEQUENCE && strcmp(relname, "fence_seq") == 0)
			found.seq = dep->objid;
		else if (relkind == RELKIND_SEQUENCE && strcmp(relname, "horizon_seq") == 0)
			found.horizon = dep->objid;
		else if (relkind == RELKIND_SEQUENCE && strcmp(relname, "token_seq") == 0)
			found.token = dep->objid;
		else if (relkind == RELKIND_SEQUENCE && strcmp(relname, "horizon_mark") == 0)
			found.horizon_mark = dep->objid;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);

	if (!OidIsValid(found.leases) || !OidIsValid(found.seq))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension dlock is missing its lease table or its token sequence"),
				 errhint("Reinstall the extension with DROP EXTENSION dlock; CREATE EXTENSION dlock.")));
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(found.leases));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for relation %u", found.leases);
	found.owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	found.valid = true;
	ids = found;
}

/* Make ids valid, looking the storage up again after an invalidation. */
static void
storage_ids(void)
{
	/* process pending invalidations, so that a stale cache is noticed */
	AcceptInvalidationMessages();
	if (!ids.valid)
		find_storage();
}

/*
 * Open dlock.leases with lockmode, after making sure that ids are valid.
 * A DROP EXTENSION that commits while we wait for the lock gets a clear
 * error, not "could not open relation".
 */
static Relation
open_leases(LOCKMODE lockmode)
{
	Relation	rel;

	storage_ids();
	rel = try_table_open(ids.leases, lockmode);
	if (rel == NULL)
	{
		ids.valid = false;
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

/* Set up the caches' invalidation; called once from _PG_init. */
static void storage_subxact_callback(SubXactEvent event,
									 SubTransactionId mySubid,
									 SubTransactionId parentSubid,
									 void *arg);
static void storage_xact_callback(XactEvent event, void *arg);

void
dlock_storage_init(void)
{
	CacheRegisterRelcacheCallback(storage_relcache_callback, (Datum) 0);
	CacheRegisterSyscacheCallback(NAMESPACEOID, storage_syscache_callback,
								  (Datum) 0);
	RegisterSubXactCallback(storage_subxact_callback, NULL);
	RegisterXactCallback(storage_xact_callback, NULL);
}

/*
 * Become the owner of the storage, in a security-restricted operation with
 * a fresh GUC nest level, until section_end.  An error in between undoes
 * both at (sub)transaction abort.
 */
static void
section_begin(Section *s)
{
	GetUserIdAndSecContext(&s->userid, &s->sec_context);
	SetUserIdAndSecContext(ids.owner,
						   s->sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	s->nestlevel = NewGUCNestLevel();
}

/* Undo section_begin. */
static void
section_end(Section *s)
{
	AtEOXact_GUC(false, s->nestlevel);
	SetUserIdAndSecContext(s->userid, s->sec_context);
}

/*
 * Open dlock.leases for a change, as its owner (section_begin), after
 * checking that the transaction may write.  Undo with close_changed.
 */
static Relation
open_for_change(Section *s)
{
	Relation	rel;

	dlock_check_writable();
	rel = open_leases(RowExclusiveLock);
	section_begin(s);
	return rel;
}

/* Close rel after a change, keeping its lock; end the section. */
static void
close_changed(Relation rel, Section *s)
{
	table_close(rel, NoLock);
	section_end(s);
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
}

/*
 * Lock sequence seqid (AccessShareLock, kept until the transaction ends),
 * so that a DROP EXTENSION waits for us; one that committed while we
 * waited is a clear error, not "could not open relation".
 */
static void
keep_sequence(Oid seqid)
{
	Relation	seq = try_relation_open(seqid, AccessShareLock);

	if (seq == NULL)
	{
		ids.valid = false;
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("a sequence of extension dlock was dropped"),
				 errhint("The extension was dropped, or dropped and created again, while this call ran: call again.")));
	}
	relation_close(seq, NoLock);
}

/*
 * The horizon: a time that no lease granted in memory mode outlives (lock
 * delay included), kept in dlock.horizon_seq; 0 when it was never set or
 * the extension predates it.  Read as the storage's owner.
 */
static int64
read_sequence(Oid seqid)
{
	LOCAL_FCINFO(fcinfo, 1);
	Section		s;
	Datum		d;

	if (!OidIsValid(seqid))
		return 0;
	keep_sequence(seqid);
	section_begin(&s);
	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = ObjectIdGetDatum(seqid);
	fcinfo->args[0].isnull = false;
	d = pg_sequence_last_value(fcinfo);
	section_end(&s);
	return fcinfo->isnull ? 0 : DatumGetInt64(d);
}

/*
 * The horizon: the later of dlock.horizon_seq, which pg_dump saves so that
 * a restore elsewhere waits for it too, and dlock.horizon_mark (0.6),
 * which it does not save, so that a data-only restore of an older dump,
 * which sets dlock.horizon_seq back, cannot set the horizon back.
 */
static TimestampTz
read_horizon(void)
{
	return Max(read_sequence(ids.horizon), read_sequence(ids.horizon_mark));
}

/*
 * The latest end (plus lock delay) of a lease held in dlock.leases: what a
 * switch from table mode to memory mode must wait out.
 */
static TimestampTz
table_max_end(void)
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
 * Fill *lease with the lease that every key has until the barrier: held
 * by an owner nobody knows, ending at until.  It is a placeholder, marked
 * unknown, and nothing may match it: its owner is random (and owns() and
 * begin_owner_op refuse it anyway), its token is -1, which no token can
 * equal since fence.c refuses every token below 1 before comparing.
 */
static void
unknown_lease(DlockLease *lease, TimestampTz until, const pg_uuid_t *owner)
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
static void
memory_state(TimestampTz *barrier, TimestampTz *horizon, pg_uuid_t *unknown,
			 bool take_slot)
{
	TimestampTz h;
	TimestampTz b;
	bool		in_recovery;

	/* a session that predates ALTER EXTENSION UPDATE to 0.4 looks again */
	if (!OidIsValid(ids.horizon))
	{
		ids.valid = false;
		storage_ids();
	}
	if (!OidIsValid(ids.horizon))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dlock.storage = memory needs version 0.4 of extension dlock"),
				 errhint("Run ALTER EXTENSION dlock UPDATE.")));
	if (dlock_mem_db_get(ids.seq, barrier, horizon, unknown, take_slot))
		return;
	in_recovery = RecoveryInProgress();
	h = read_horizon();
	b = Max(h, table_max_end());
	/*
	 * A reader takes no slot (they are few, and shared by every database):
	 * it reads the durable state each time until a writer takes one.
	 */
	if (in_recovery || !take_slot)
	{
		*barrier = b;
		*horizon = h;
		memset(unknown, 0, sizeof(pg_uuid_t));
		return;
	}
	*barrier = b;
	*horizon = h;
	dlock_mem_db_set(ids.seq, barrier, horizon, unknown);
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
		return;
	}
	if (dlock_lease_is_live(lease, now))
		return;
	if (!have_unknown)
	{
		dlock_random(unknown.data, UUID_LEN, "owner token");
		have_unknown = true;
	}
	unknown_lease(lease, h, &unknown);
}

/*
 * Read the current state of key into *lease, with a fresh snapshot.  No
 * lock of any key is needed or taken; the caller decides which one makes
 * the answer stable.  Before the barrier (memory_state, table_barrier)
 * every key reads as held by an unknown owner.
 */
void
dlock_read_lease(const char *key, int len, DlockLease *lease)
{
	Relation	rel;
	HeapTuple	tup;

	if (dlock_memory_mode())
	{
		TimestampTz barrier;
		TimestampTz horizon;
		pg_uuid_t	unknown;

		storage_ids();
		memory_state(&barrier, &horizon, &unknown, false);
		if (barrier != 0 && GetCurrentTimestamp() < barrier)
			unknown_lease(lease, barrier, &unknown);
		else
			dlock_mem_read(key, len, lease);
		return;
	}

	rel = open_leases(AccessShareLock);
	tup = fetch_row(rel, key, len);
	row_to_lease(rel, tup, lease);
	if (tup)
		heap_freetuple(tup);
	table_close(rel, AccessShareLock);
	if (!table_barrier_passed)
		table_barrier(lease);
	else
		mark_before_switch(lease);
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
 * Refuse to change a lease in a read-only transaction (or on a standby).
 * The lease API calls this first, so that it fails the same way whether or
 * not the key happens to be held.
 */
void
dlock_check_writable(void)
{
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot change a dlock lease in a read-only transaction"),
				 errhint("Leases are granted, renewed and released on the primary, in read-write transactions.")));
}

/*
 * Raise synchronous_commit for the rest of the transaction, like SET
 * LOCAL, so that the waits below include the synchronous standbys.
 */
static void
raise_synchronous_commit(void)
{
	if (synchronous_commit < SYNCHRONOUS_COMMIT_ON)
		(void) set_config_option("synchronous_commit", "on",
								 PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_LOCAL, true, 0, false);
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
	/* the local flush, even if a function's SET clause reverts the setting */
	ForceSyncCommit();
	/* ... and, through the setting, the wait for synchronous standbys */
	raise_synchronous_commit();

	/*
	 * The setting above lives in the current GUC nest level: a function's
	 * own SET synchronous_commit clause, a later SET LOCAL or a rollback to
	 * a savepoint can undo it before the commit.  storage_xact_callback
	 * raises it again at pre-commit, at the top level, where nothing can.
	 */
	durable_lxid = MyProc->lxid;
}

/* A sequence as its page holds it (read_sequence_page). */
typedef struct SeqPage
{
	XLogRecPtr	lsn;			/* the page's LSN: its last change's WAL */
	int64		high;			/* the highest value it may ever have
								 * returned, the values logged ahead
								 * included: what it restarts from after a
								 * crash */
} SeqPage;

static void read_sequence_page(Oid seqid, SeqPage *page);

/* The LSN of the page of sequence seqid: its last change's WAL. */
static XLogRecPtr
sequence_lsn(Oid seqid)
{
	SeqPage		page;

	read_sequence_page(seqid, &page);
	return page.lsn;
}

/*
 * Make the latest value of sequence seqid durable, before the caller can
 * see it: after a crash or a failover the sequence must not go back behind
 * it, even if this transaction never commits (a rollback, a crash before
 * commit, a client that used the value before its commit).  token says
 * whether the value is a fencing token (else the horizon), for messages.
 *
 * A sequence logs ahead (one WAL record every 32 values), so the record
 * covering our value is at or before the LSN of the sequence's page.  That
 * is usually flushed already and this costs a buffer read; otherwise we
 * flush it and, with synchronous standbys, wait for them to have it.
 * Call with synchronous_commit already raised (raise_synchronous_commit).
 */
static void
read_sequence_page(Oid seqid, SeqPage *page)
{
	Relation	seq;
	Buffer		buf;
	Page		p;
	HeapTupleData tuple;
	Form_pg_sequence_data data;

	/*
	 * Locked until the transaction ends, as nextval and setval lock it, so
	 * that the next call finds the lock taken already; then the relcache
	 * tells whether the sequence still exists (try_relation_open would ask
	 * the catalog cache first, and unlocking costs as much as locking).
	 */
	LockRelationOid(seqid, AccessShareLock);
	seq = RelationIdGetRelation(seqid);
	if (!RelationIsValid(seq))
	{
		ids.valid = false;
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("a sequence of extension dlock was dropped"),
				 errhint("The extension was dropped, or dropped and created again, while this call ran: call again.")));
	}
	buf = ReadBuffer(seq, 0);

	LockBuffer(buf, BUFFER_LOCK_SHARE);
	p = BufferGetPage(buf);
	page->lsn = PageGetLSN(p);
	/* a sequence's page holds one tuple; dlock's all count up by 1 */
	tuple.t_data = (HeapTupleHeader) PageGetItem(p, PageGetItemId(p, FirstOffsetNumber));
	data = (Form_pg_sequence_data) GETSTRUCT(&tuple);
	page->high = data->is_called ? data->last_value + data->log_cnt :
		data->last_value - 1;
	UnlockReleaseBuffer(buf);
	RelationClose(seq);
}

static void confirm_lsn(XLogRecPtr lsn, bool token);

static void
secure_sequence(Oid seqid, bool token)
{
	confirm_lsn(sequence_lsn(seqid), token);
}

/*
 * Flush the WAL up to lsn and, when synchronous replication is requested,
 * wait until the synchronous standbys configured now have it.  token says
 * what the WAL stands for, for messages (see secure_sequence).
 */
static void
confirm_lsn(XLogRecPtr lsn, bool token)
{
	bool		cut;
	bool		again;
	bool		waits;

	XLogFlush(lsn);				/* returns at once when already flushed */
	if (!SyncRepRequested())
		return;

	/*
	 * Only one backend at a time may wait for a given LSN: the queue of
	 * waiters must not hold two with the same one (it asserts that).
	 * Without synchronous standbys nothing waits and no lock is needed.
	 */
	waits = SyncRepStandbyNames != NULL && SyncRepStandbyNames[0] != '\0';
	if (waits)
		dlock_syncrep_wait_lock(lsn, true);
	do
	{
		/*
		 * SyncRepWaitForLSN expects interrupts held, as at commit: it
		 * watches for cancel and termination itself, and then ends the wait
		 * early with only a warning, clearing the cancel but not
		 * InterruptPending.  So a wait cut short leaves InterruptPending set
		 * and none of the flags of the interrupts that wait for their turn
		 * (a timeout for idle statistics, a barrier, ...).  When one of those
		 * is pending too, we cannot tell: we process it and wait again,
		 * which returns at once if the LSN was confirmed.
		 */
		CHECK_FOR_INTERRUPTS();
		HOLD_INTERRUPTS();
		SyncRepWaitForLSN(lsn, false);
		again = InterruptPending && !ProcDiePending && !QueryCancelPending &&
			!ClientConnectionLost &&
			(ProcSignalBarrierPending || LogMemoryContextPending ||
			 IdleInTransactionSessionTimeoutPending ||
			 IdleSessionTimeoutPending || IdleStatsUpdateTimeoutPending ||
			 CheckClientConnectionPending || ParallelMessagePending);
		cut = InterruptPending && !again;
		RESUME_INTERRUPTS();
	} while (again);
	if (waits)
		dlock_syncrep_wait_lock(lsn, false);
	if (cut)
		ereport(ERROR,
				(errcode(ERRCODE_QUERY_CANCELED),
				 token ?
				 errmsg("fencing token not confirmed by the synchronous standbys") :
				 errmsg("lease horizon not confirmed by the synchronous standbys"),
				 token ?
				 errdetail("The wait for synchronous replication was interrupted before the standbys confirmed the token's WAL; the grant is rolled back and the token is never used.") :
				 errdetail("The wait for synchronous replication was interrupted before the standbys confirmed how long leases may last; the grant or renewal is rolled back."),
				 errhint("Try again; check that the synchronous standbys are connected.")));
}

/* The WAL to confirm for the token draw_token drew last. */
static XLogRecPtr drawn_lsn = InvalidXLogRecPtr;

/* Set sequence seqid to value (called), as the storage's owner. */
static void
set_sequence(Oid seqid, int64 value)
{
	Section		s;

	section_begin(&s);
	(void) DirectFunctionCall3(setval3_oid, ObjectIdGetDatum(seqid),
							   Int64GetDatum(value), BoolGetDatum(true));
	section_end(&s);
}

/*
 * Draw a new fencing token.
 *
 * Since 0.6 tokens come from dlock.token_seq, which pg_dump does not save,
 * so that a data-only restore of an older dump cannot set the counter
 * back.  dlock.fence_seq, which pg_dump does save, is kept at or above
 * every token token_seq may ever have returned (its values logged ahead
 * included: one setval every 32 tokens), so that a whole dump restored
 * into a new database starts its tokens above every token issued before
 * the dump: there token_seq starts behind fence_seq, and is moved past it
 * before anything is drawn.  Moving it takes a lock that only these two
 * moves take, and reads both again under it, so neither ever moves back.
 * Before 0.6 (no token_seq), tokens come from fence_seq.
 */
static int64
draw_token(void)
{
	SeqPage		tok;
	SeqPage		copy;
	int64		token;

	if (!OidIsValid(ids.token))
	{
		token = nextval_internal(ids.seq, false);

		/*
		 * A session that found the storage before ALTER EXTENSION UPDATE to
		 * 0.6 committed has no token_seq cached: look again, after the
		 * draw.  If token_seq exists now, the token just drawn may also be
		 * one that token_seq returns (it was moved past fence_seq as it
		 * stood before our nextval): it is never shown, and we draw from
		 * token_seq, past fence_seq as it stands now.
		 */
		ids.valid = false;
		storage_ids();
		if (!OidIsValid(ids.token))
		{
			drawn_lsn = sequence_lsn(ids.seq);
			return token;
		}
	}
	read_sequence_page(ids.token, &tok);
	read_sequence_page(ids.seq, &copy);
	if (tok.high < copy.high)
	{
		LockRelationOid(ids.seq, ShareUpdateExclusiveLock);
		read_sequence_page(ids.token, &tok);
		read_sequence_page(ids.seq, &copy);
		if (tok.high < copy.high)
			set_sequence(ids.token, copy.high);
		UnlockRelationOid(ids.seq, ShareUpdateExclusiveLock);
	}
	/* runs no user code and checks no privilege: no need to be the owner */
	token = nextval_internal(ids.token, false);
	read_sequence_page(ids.token, &tok);
	drawn_lsn = tok.lsn;
	if (tok.high > copy.high)
	{
		LockRelationOid(ids.seq, ShareUpdateExclusiveLock);
		read_sequence_page(ids.seq, &copy);
		if (copy.high < tok.high)
		{
			set_sequence(ids.seq, tok.high);
			drawn_lsn = Max(drawn_lsn, sequence_lsn(ids.seq));
		}
		UnlockRelationOid(ids.seq, ShareUpdateExclusiveLock);
	}
	return token;
}

/*
 * Can token have been issued: is it at most the highest token the counter
 * may ever have returned (its values logged ahead included)?  A token above
 * that was never issued, whatever a lease row says (fence.c).  The highest
 * value read is kept for the backend (it only grows), so that the pages
 * are read again only for a token above it, about once every 32 tokens.
 */
bool
dlock_token_issued(int64 token)
{
	SeqPage		tok;
	SeqPage		copy;

	if (token <= known_high)
		return true;
	storage_ids();
	read_sequence_page(ids.seq, &copy);
	known_high = copy.high;
	if (OidIsValid(ids.token))
	{
		read_sequence_page(ids.token, &tok);
		known_high = Max(known_high, tok.high);
	}
	return token <= known_high;
}

/* Make the fencing token just drawn safe to show (secure_sequence). */
static void
secure_drawn_fence(void)
{
	confirm_lsn(drawn_lsn, true);
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
 * setval by anyone else (a restore) is noticed at the next grant.  The sequence itself is read under that
 * lock and never set back: whoever set it since it was cached (a restore's
 * setval) is obeyed, and if that time is still to come the database's
 * barrier moves with it: then false is returned, and a grant must not go
 * on (the key may be held until then).
 */
static bool
secure_horizon(TimestampTz need)
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
	memory_state(&barrier, &horizon, &unknown, true);
	if (need <= horizon)
	{
		XLogRecPtr	lsn = sequence_lsn(ids.horizon);

		if (lsn == dlock_mem_db_horizon_lsn(ids.seq, 0))
		{
			/*
			 * The horizon we rely on was made durable when it was set, but
			 * perhaps under other settings: with synchronous_standby_names
			 * empty then and a standby's name in it now, it never reached
			 * that standby.  Confirm it under today's settings; when it was
			 * confirmed already this is one comparison with what the
			 * standbys acknowledged.
			 */
			raise_synchronous_commit();
			confirm_lsn(lsn, false);
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
	LockRelationOid(ids.horizon, ShareUpdateExclusiveLock);
	for (;;)
	{
		XLogRecPtr	lsn;

		memory_state(&barrier, &horizon, &unknown, true);
		lsn = sequence_lsn(ids.horizon);
		current = read_sequence(ids.horizon);
		if (current > horizon && current == dlock_mem_db_pending(ids.seq))
		{
			/* ours, whose confirmation was cancelled: confirm it now */
			raise_synchronous_commit();
			secure_sequence(ids.horizon, false);
			dlock_mem_db_advance(ids.seq, current, false);
			horizon = current;
		}
		else if (current > horizon)
		{
			/*
			 * Set by somebody else (a restore): leases may run until then.
			 * Relied on from now on, so confirmed like ours.
			 */
			raise_synchronous_commit();
			secure_sequence(ids.horizon, false);
			if (current > GetCurrentTimestamp())
				moved_by_others = true;
			dlock_mem_db_advance(ids.seq, current, current > GetCurrentTimestamp());
			horizon = current;
		}
		if (need > horizon || current < horizon)
		{
			Section		s;
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
			if (!OidIsValid(ids.horizon_mark))
			{
				ids.valid = false;
				storage_ids();
			}
			dlock_mem_db_set_pending(ids.seq, next);
			section_begin(&s);
			(void) DirectFunctionCall3(setval3_oid, ObjectIdGetDatum(ids.horizon),
									   Int64GetDatum(next), BoolGetDatum(true));
			/* the copy that no dump saves, only ever moved ahead */
			if (OidIsValid(ids.horizon_mark) &&
				read_sequence(ids.horizon_mark) < next)
				(void) DirectFunctionCall3(setval3_oid,
										   ObjectIdGetDatum(ids.horizon_mark),
										   Int64GetDatum(next), BoolGetDatum(true));
			section_end(&s);
			raise_synchronous_commit();
			confirm_lsn(Max(sequence_lsn(ids.horizon),
							OidIsValid(ids.horizon_mark) ?
							sequence_lsn(ids.horizon_mark) : InvalidXLogRecPtr),
						false);
			dlock_mem_db_advance(ids.seq, next, false);
			/* somebody else's setval since ours: look again */
			lsn = sequence_lsn(ids.horizon);
			if (read_sequence(ids.horizon) != next)
				continue;
		}
		/* whatever set it last, it is relied on from now: confirmed */
		raise_synchronous_commit();
		confirm_lsn(lsn, false);
		/* what the sequence's page said before we read it is what we know */
		(void) dlock_mem_db_horizon_lsn(ids.seq, lsn);
		break;
	}
	UnlockRelationOid(ids.horizon, ShareUpdateExclusiveLock);
	return !moved_by_others;
}

/* Fill *owner with a version 4 UUID from the strong random source. */
static void
new_owner(pg_uuid_t *owner)
{
	dlock_random(owner->data, UUID_LEN, "owner token");
	owner->data[6] = (owner->data[6] & 0x0f) | 0x40;	/* version 4 */
	owner->data[8] = (owner->data[8] & 0x3f) | 0x80;	/* RFC 4122 variant */
}

/* Forget what this transaction verified about key: it changed the lease. */
static void
forget_verified(const char *key, int len)
{
	DlockKeyState *st;
	char	   *k;

	if (KEY_STATES() == NULL)
		return;
	k = pnstrdup(key, len);
	st = dlock_key_state(k, false);
	if (st)
		st->verified = false;
	pfree(k);
}

/*
 * Fill *lease with a new lease of key for [now, end): a new owner, and the
 * connection's session mark if it is session-bound; no token yet.
 */
static void
new_lease(DlockLease *lease, const char *key, int len, TimestampTz now,
		  TimestampTz end, TimestampTz hold_limit,
		  const DlockGrantOptions *opts)
{
	memset(lease, 0, sizeof(DlockLease));
	new_owner(&lease->owner);
	lease->found = true;
	lease->held = true;
	lease->expires_at = end;
	lease->granted_at = now;
	lease->lock_delay = opts->lock_delay;
	lease->hold_limit = hold_limit;
	if (opts->session_bound)
		lease->session_id = dlock_session_mark(key, len);
}

/*
 * dlock_storage_grant in memory mode: the same lease, recorded in memory
 * (memstore.c) instead of a row.  The horizon and the token are durable
 * before this returns; the transaction's commit is left as it is.
 */
static bool
memory_grant(text *key, TimestampTz now, TimestampTz end,
			 TimestampTz hold_limit, const DlockGrantOptions *opts,
			 DlockLease *lease)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	bool		seq_only;

	dlock_check_writable();
	/* the table's lock, kept: a DROP EXTENSION waits for this transaction */
	table_close(open_leases(AccessShareLock), NoLock);
	/* no transaction id yet, or one that only earlier memory grants took */
	seq_only = !TransactionIdIsValid(GetTopTransactionIdIfAny()) ||
		(seq_only_lxid == MyProc->lxid && XactLastRecEnd == seq_only_end);
	new_lease(lease, k, len, now, end, hold_limit, opts);

	if (!secure_horizon(end + opts->lock_delay))
		return false;			/* every key is held until the new barrier */
	lease->fence = draw_token();
	raise_synchronous_commit();
	secure_drawn_fence();

	dlock_mem_write(k, len, lease, true, opts->holder);
	forget_verified(k, len);

	/*
	 * The sequences' WAL, which may have taken a transaction id so that the
	 * commit would flush it, is flushed already: unless the transaction
	 * writes something else, its commit need not wait for a flush
	 * (storage_xact_callback).
	 */
	seq_only_lxid = seq_only ? MyProc->lxid : InvalidLocalTransactionId;
	seq_only_end = XactLastRecEnd;
	return true;
}

/*
 * Grant key for [now, end) to a new owner, drawing a new token; fill
 * *lease with the new lease and return true.  The caller holds the key's
 * grant lock and has seen no live lease under it.  The token is durable
 * before this returns, and the transaction will commit synchronously.
 * Return false, changing nothing, when the key's row is being deleted by a
 * prune() that has not committed yet: the key is busy until it does.
 */
bool
dlock_storage_grant(text *key, TimestampTz now, TimestampTz end,
					TimestampTz hold_limit, const DlockGrantOptions *opts,
					DlockLease *lease)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	Section		s;
	Relation	rel;
	TupleDesc	desc;
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

	if (dlock_memory_mode())
		return memory_grant(key, now, end, hold_limit, opts, lease);

	rel = open_for_change(&s);
	desc = RelationGetDescr(rel);

	if (opts->session_bound && desc->natts < Natts_leases)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("session-bound leases need dlock 0.3"),
				 errhint("Run ALTER EXTENSION dlock UPDATE.")));

	new_lease(lease, k, len, now, end, hold_limit, opts);
	lease->fence = draw_token();

	values[Anum_leases_key - 1] = PointerGetDatum(cstring_to_text_with_len(k, len));
	values[Anum_leases_fence - 1] = Int64GetDatum(lease->fence);
	values[Anum_leases_owner - 1] = UUIDPGetDatum(&lease->owner);
	values[Anum_leases_expires_at - 1] = TimestampTzGetDatum(end);
	values[Anum_leases_holder - 1] = PointerGetDatum(opts->holder);
	nulls[Anum_leases_holder - 1] = (opts->holder == NULL);
	values[Anum_leases_granted_at - 1] = TimestampTzGetDatum(now);
	values[Anum_leases_pid - 1] = Int32GetDatum(MyProcPid);
	if (application_name != NULL && application_name[0] != '\0')
		values[Anum_leases_application_name - 1] =
			PointerGetDatum(cstring_to_text(application_name));
	else
		nulls[Anum_leases_application_name - 1] = true;
	values[Anum_leases_session_id - 1] = Int64GetDatum(lease->session_id);
	nulls[Anum_leases_session_id - 1] = !opts->session_bound;
	if (opts->lock_delay > 0)
	{
		Interval   *delay = palloc0(sizeof(Interval));

		delay->time = opts->lock_delay;
		values[Anum_leases_lock_delay - 1] = IntervalPGetDatum(delay);
	}
	else
		nulls[Anum_leases_lock_delay - 1] = true;
	values[Anum_leases_hold_limit - 1] = TimestampTzGetDatum(hold_limit);
	nulls[Anum_leases_hold_limit - 1] = (hold_limit == DT_NOEND);
	/* before ALTER EXTENSION UPDATE, the table has only the first columns */
	natts = Min(desc->natts, Natts_leases);

	old = fetch_row(rel, k, len);
	if (old != NULL)
	{
		DlockLease	current;

		row_to_lease(rel, old, &current);
		if (dlock_lease_is_live(&current, now))
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
			close_changed(rel, &s);
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
	close_changed(rel, &s);

	forget_verified(k, len);
	force_synchronous_commit();
	secure_drawn_fence();
	return true;
}

/*
 * Set the end of key's lease to end, keeping its owner (a renewal, whose
 * commit will then be synchronous) or clearing it (a release, whose commit
 * is asynchronous when the transaction writes nothing else: losing it in a
 * crash only delays the key's availability until the lease expires).  The
 * caller holds the key's owner op lock (and its ending lock, for a release
 * or an earlier end) and has checked the owner.
 */
void
dlock_storage_set_end(text *key, TimestampTz end, bool release)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	Section		s;
	Relation	rel;
	HeapTuple	old;
	HeapTuple	tup;
	Datum		values[Natts_leases] = {0};
	bool		nulls[Natts_leases] = {0};
	bool		replace[Natts_leases] = {0};
	bool		release_only;

	if (dlock_memory_mode())
	{
		DlockLease	lease;

		dlock_check_writable();
		table_close(open_leases(AccessShareLock), NoLock);	/* as in a grant */
		dlock_mem_read(k, len, &lease);
		if (!lease.found)
			elog(ERROR, "dlock: lease of a held key vanished");
		if (!release)
			(void) secure_horizon(end + lease.lock_delay);
		lease.expires_at = end;
		if (release)
		{
			lease.held = false;
			memset(&lease.owner, 0, sizeof(pg_uuid_t));
		}
		dlock_mem_write(k, len, &lease, false, NULL);
		forget_verified(k, len);
		return;
	}

	rel = open_for_change(&s);
	/* nothing but releases written so far: no xid, or only our releases */
	release_only = release &&
		(!TransactionIdIsValid(GetTopTransactionIdIfAny()) ||
		 (release_only_lxid == MyProc->lxid &&
		  XactLastRecEnd == release_only_end));
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
	close_changed(rel, &s);

	forget_verified(k, len);
	if (!release)
		force_synchronous_commit();

	/* remember where the WAL of a release-only transaction ends */
	release_only_lxid = release_only ? MyProc->lxid : InvalidLocalTransactionId;
	release_only_end = XactLastRecEnd;
}

/*
 * Return every row of dlock.leases (a List of DlockLeaseRow), as of a
 * fresh snapshot, for the views.
 */
List *
dlock_storage_scan(void)
{
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tup;
	List	   *rows = NIL;

	if (dlock_memory_mode())
	{
		TimestampTz barrier;
		TimestampTz horizon;
		pg_uuid_t	unknown;

		storage_ids();
		memory_state(&barrier, &horizon, &unknown, false);
		/* before the barrier every key is held by an unknown owner */
		if (barrier != 0 && GetCurrentTimestamp() < barrier)
			return NIL;
		return dlock_mem_scan();
	}

	rel = open_leases(AccessShareLock);
	scan = systable_beginscan(rel, InvalidOid, false, SnapshotSelf, 0, NULL);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		DlockLeaseRow *row = palloc0(sizeof(DlockLeaseRow));
		bool		isnull;
		Datum		d;

		row_to_lease(rel, tup, &row->lease);
		/* what a grant would meet: before the horizon, an unknown owner */
		if (!table_barrier_passed)
			table_barrier(&row->lease);
		row->key = DatumGetTextPCopy(column(rel, tup, Anum_leases_key, &isnull));
		d = column(rel, tup, Anum_leases_holder, &isnull);
		if (!isnull)
			row->holder = DatumGetTextPCopy(d);
		d = column(rel, tup, Anum_leases_pid, &isnull);
		row->has_pid = !isnull;
		if (!isnull)
			row->pid = DatumGetInt32(d);
		d = column(rel, tup, Anum_leases_application_name, &isnull);
		if (!isnull)
			row->application_name = DatumGetTextPCopy(d);
		rows = lappend(rows, row);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return rows;
}

/*
 * Return the keys (a List of text) whose lease was released or expired
 * before cutoff, as of a fresh snapshot.
 */
List *
dlock_storage_old_keys(TimestampTz cutoff)
{
	Relation	rel;
	TupleDesc	desc;
	SysScanDesc scan;
	HeapTuple	tup;
	List	   *keys = NIL;

	if (dlock_memory_mode())
	{
		ListCell   *lc;

		storage_ids();
		foreach(lc, dlock_mem_scan())
		{
			DlockLeaseRow *row = (DlockLeaseRow *) lfirst(lc);

			if (dlock_lease_ended_at(&row->lease, MyDatabaseId) < cutoff)
				keys = lappend(keys, row->key);
		}
		return keys;
	}

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
 * cutoff, or in any case when force is set; return whether it did.  The
 * caller holds the key's grant lock.  A row that another prune() is
 * deleting is left to it, without waiting.
 */
bool
dlock_storage_delete_old(text *key, TimestampTz cutoff, bool force)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	Section		s;
	Relation	rel;
	HeapTuple	old;
	DlockLease	lease;
	bool		deleted = false;

	if (dlock_memory_mode())
	{
		dlock_check_writable();
		storage_ids();
		deleted = dlock_mem_delete_old(k, len, cutoff, force);
		if (deleted)
			forget_verified(k, len);
		return deleted;
	}

	rel = open_for_change(&s);
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
	close_changed(rel, &s);
	if (deleted)
		forget_verified(k, len);
	return deleted;
}

/*
 * Return the state of key in the current transaction; create it (nothing
 * known) when create is set, else return NULL when there is none.  The
 * table is kept for the backend and emptied at the first use in each
 * transaction (dlock_xact_hash).
 */
DlockKeyState *
dlock_key_state(const char *key, bool create)
{
	HTAB	   *htab = dlock_xact_hash(&key_states, "dlock fenced keys",
									   DLOCK_MAX_KEY_BYTES + 1,
									   sizeof(DlockKeyState), HASH_STRINGS,
									   create);
	bool		found;
	DlockKeyState *st;

	if (htab == NULL)
		return NULL;
	st = hash_search(htab, key, create ? HASH_ENTER : HASH_FIND, &found);
	if (create && !found)
	{
		st->presented = false;
		st->verified = false;
		st->column_cid = InvalidCommandId;
	}
	return st;
}

/*
 * A subtransaction abort releases the write locks taken inside it: forget
 * every verified lease (they are looked up again, under a new lock).
 */
static void
storage_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						 SubTransactionId parentSubid, void *arg)
{
	HASH_SEQ_STATUS status;
	DlockKeyState *st;

	if (event == SUBXACT_EVENT_ABORT_SUB)
		dlock_mem_subxact_abort(mySubid);
	if (event != SUBXACT_EVENT_ABORT_SUB || KEY_STATES() == NULL)
		return;
	hash_seq_init(&status, key_states.htab);
	while ((st = hash_seq_search(&status)) != NULL)
		st->verified = false;
}

/*
 * At commit, a transaction that wrote nothing but releases commits
 * asynchronously (see Durability above), unless dlock.async_release is
 * off.  "Nothing but" means: it had no transaction id before its first
 * release, and its WAL has not grown since its last one.  Every change to a
 * table takes a transaction id and writes WAL, so it keeps the caller's own
 * setting; a grant or renewal in the same transaction forces a synchronous
 * commit anyway.  What leaves no trace is what PostgreSQL never makes
 * durable in a transaction without writes either: a nextval served from the
 * values a sequence logged ahead, a NOTIFY (README).  Set like SET LOCAL:
 * the session's value comes back after the commit.
 */
static void
storage_xact_callback(XactEvent event, void *arg)
{
	dlock_mem_xact_callback(event);
	if (event == XACT_EVENT_PRE_COMMIT && seq_only_lxid == MyProc->lxid)
	{
		seq_only_lxid = InvalidLocalTransactionId;

		/*
		 * Without a transaction id (the sequences logged nothing this time,
		 * 31 grants in 32) the commit writes no record and never flushes:
		 * setting the GUC would only cost time.
		 */
		if (XactLastRecEnd == seq_only_end &&
			TransactionIdIsValid(GetTopTransactionIdIfAny()) &&
			synchronous_commit > SYNCHRONOUS_COMMIT_OFF)
			(void) set_config_option("synchronous_commit", "off",
									 PGC_USERSET, PGC_S_SESSION,
									 GUC_ACTION_LOCAL, true, 0, false);
	}
	if (event == XACT_EVENT_PRE_COMMIT &&
		release_only_lxid == MyProc->lxid)
	{
		release_only_lxid = InvalidLocalTransactionId;
		if (dlock_async_release && XactLastRecEnd == release_only_end &&
			synchronous_commit > SYNCHRONOUS_COMMIT_OFF)
			(void) set_config_option("synchronous_commit", "off",
									 PGC_USERSET, PGC_S_SESSION,
									 GUC_ACTION_LOCAL, true, 0, false);
	}

	/*
	 * Last, so that nothing above lowers it again: a transaction that
	 * granted or renewed a lease in table mode commits synchronously,
	 * synchronous standbys included, whatever a function's SET clause, a
	 * SET LOCAL or a savepoint rollback did to the setting since.  At
	 * pre-commit we are at the top level: no GUC level is popped before
	 * the commit record is written and waited for.
	 */
	if (event == XACT_EVENT_PRE_COMMIT && durable_lxid == MyProc->lxid)
	{
		durable_lxid = InvalidLocalTransactionId;
		ForceSyncCommit();
		raise_synchronous_commit();
	}
}
