/*-------------------------------------------------------------------------
 *
 * objects.c
 *		The extension's own relations (the lease table and the sequences),
 *		found through the extension; reading and setting the sequences; and
 *		running as the owner of the storage.
 *
 * Finding.  The table and the sequences are found through the extension's
 * own membership (pg_depend rows of deptype 'e'), never by name: a schema
 * name can be squatted or renamed.  The OIDs are cached for the backend and
 * forgotten by a relcache callback (DROP EXTENSION, or anything else that
 * invalidates them) or a namespace syscache callback (a schema changing
 * owner); each forgetting bumps dlock_objects_generation, so that whatever
 * other files verified against the storage they named (fence.c's verified
 * keys, durable.c's highest token, horizon.c's passed barrier) is checked
 * again too.  Each lookup also checks that the extension's schema belongs
 * to the extension's owner (or a superuser): whoever owns the schema can
 * rename or replace what is in it.
 *
 * Running as the owner.  Writes run as the table's owner with
 * SECURITY_RESTRICTED_OPERATION and a fresh GUC nest level, as
 * REFRESH MATERIALIZED VIEW does, although nothing below runs user code
 * (dlock_section_begin).
 *
 * Owns: the cache of OIDs (dlock_objects) and its generation.  Calls
 * nothing of dlock's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/table.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/pg_class.h"
#include "catalog/pg_depend.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "commands/extension.h"
#include "commands/sequence.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"

#include "dlock.h"

/* The extension's storage, as found through pg_depend (dlock_objects_find). */
DlockObjects dlock_objects;

/* Bumped whenever the cache is forgotten by an invalidation. */
uint64		dlock_objects_generation = 1;

/*
 * Forget the cached OIDs, and (through the generation) what was verified
 * against the storage they name: the next lookup and the next write check
 * again.
 */
static void
forget_objects(void)
{
	dlock_objects.valid = false;
	dlock_objects_generation++;
}

/* Forget the storage when one of our relations is invalidated. */
static void
storage_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == dlock_objects.leases ||
		relid == dlock_objects.seq || relid == dlock_objects.horizon ||
		relid == dlock_objects.token || relid == dlock_objects.horizon_mark)
		forget_objects();
}

/* Forget it too when any schema changes (its owner, say). */
static void
storage_syscache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	forget_objects();
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
		elog(ERROR, "dlock: cache lookup failed for schema %u", nspid);
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
			 errhint("For a new install, let CREATE EXTENSION create the schema: drop or rename schema %s first.  If dlock is installed there already, drop nothing (that would forget the leases and the token counter): after checking what is in it, ALTER SCHEMA %s OWNER TO %s.",
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

/*
 * Fill dlock_objects: the extension's table and sequences, found through
 * pg_depend (dlock_objects_find, inline in dlock.h, calls this when the
 * cache is not valid).
 */
void
dlock_objects_lookup(void)
{
	Oid			ext = get_extension_oid("dlock", true);
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData skey[2];
	HeapTuple	tup;
	Oid			extowner = InvalidOid;
	Oid			extnsp = InvalidOid;
	DlockObjects found = {0};

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
		elog(ERROR, "dlock: extension dlock (%u) vanished", ext);
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
		elog(ERROR, "dlock: cache lookup failed for relation %u", found.leases);
	found.owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	found.valid = true;
	dlock_objects = found;
}



/* Set up the cache's invalidation; called once from _PG_init. */
void
dlock_objects_init(void)
{
	CacheRegisterRelcacheCallback(storage_relcache_callback, (Datum) 0);
	CacheRegisterSyscacheCallback(NAMESPACEOID, storage_syscache_callback,
								  (Datum) 0);
}

/*
 * Become the owner of the storage, in a security-restricted operation with
 * a fresh GUC nest level, until dlock_section_end.  An error in between undoes
 * both at (sub)transaction abort.
 */
void
dlock_section_begin(DlockSection *s)
{
	GetUserIdAndSecContext(&s->userid, &s->sec_context);
	SetUserIdAndSecContext(dlock_objects.owner,
						   s->sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	s->nestlevel = NewGUCNestLevel();
}

/* Undo dlock_section_begin. */
void
dlock_section_end(DlockSection *s)
{
	AtEOXact_GUC(false, s->nestlevel);
	SetUserIdAndSecContext(s->userid, s->sec_context);
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
		dlock_objects.valid = false;
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("a sequence of extension dlock was dropped"),
				 errhint("The extension was dropped, or dropped and created again, while this call ran: call again.")));
	}
	relation_close(seq, NoLock);
}

/*
 * The last value of sequence seqid, read as the storage's owner; 0 when
 * seqid is invalid (the extension predates the sequence) or the sequence
 * was never set.  (horizon.c reads the horizon this way.)
 */
int64
dlock_read_sequence(Oid seqid)
{
	LOCAL_FCINFO(fcinfo, 1);
	DlockSection s;
	Datum		d;

	if (!OidIsValid(seqid))
		return 0;
	keep_sequence(seqid);
	dlock_section_begin(&s);
	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = ObjectIdGetDatum(seqid);
	fcinfo->args[0].isnull = false;
	d = pg_sequence_last_value(fcinfo);
	dlock_section_end(&s);
	return fcinfo->isnull ? 0 : DatumGetInt64(d);
}

/*
 * Read the page of sequence seqid into *page: its LSN, and the highest value
 * it may ever have returned.  The page's LSN bounds the WAL record that
 * covers every value it returned (durable.c flushes up to it).
 */
void
dlock_read_sequence_page(Oid seqid, DlockSeqPage *page)
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
		dlock_objects.valid = false;
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

/* The LSN of the page of sequence seqid: its last change's WAL. */
XLogRecPtr
dlock_sequence_lsn(Oid seqid)
{
	DlockSeqPage page;

	dlock_read_sequence_page(seqid, &page);
	return page.lsn;
}

/* Set sequence seqid to value (called), as the storage's owner. */
void
dlock_set_sequence(Oid seqid, int64 value)
{
	DlockSection s;

	dlock_section_begin(&s);
	(void) DirectFunctionCall3(setval3_oid, ObjectIdGetDatum(seqid),
							   Int64GetDatum(value), BoolGetDatum(true));
	dlock_section_end(&s);
}

/*
 * Look the storage up again, invalidated or not: a session that found it
 * before an ALTER EXTENSION UPDATE committed does not know the relations
 * that the update added.
 */
void
dlock_objects_find_again(void)
{
	dlock_objects.valid = false;
	dlock_objects_find();
}
