/*-------------------------------------------------------------------------
 *
 * settings.c
 *		The dlock.* settings: their variables, their definitions, and the
 *		administrator's role and database settings applied again when the
 *		module is loaded after the connection started.
 *
 * Owns: every dlock.* GUC variable.  Calls nothing of dlock's: every other
 * file reads the settings, so this file is at the bottom of the list in
 * dlock.h (and _PG_init, at the top, calls dlock_define_settings).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_db_role_setting.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "dlock.h"

/* dlock.max_ttl: the longest lease a single grant or renewal may ask for */
int			dlock_max_ttl_ms = 24 * 60 * 60 * 1000;

/* dlock.fence_bypass: let an administrator write without a fencing token */
bool		dlock_fence_bypass = false;

/* dlock.max_hold: the longest a lease may last from its grant, renewals included */
int			dlock_max_hold_ms = 0;

/* dlock.stats_max: keys with counters of their own in shared memory */
int			dlock_stats_max = 5000;

/* dlock.log_events: a LOG line per grant, takeover, expiry, release, refusal */
bool		dlock_log_events = false;

/* dlock.notify: a NOTIFY on channel dlock per grant, release, expiry... */
bool		dlock_notify = false;

/* dlock.async_release: release-only transactions commit asynchronously */
bool		dlock_async_release = true;

/* dlock.horizon_margin: how far past a lease's end the horizon is moved */
int			dlock_horizon_margin_ms = 10 * 1000;

/* dlock.storage: where leases are kept (DLOCK_STORAGE_TABLE or _MEMORY) */
int			dlock_storage_mode = DLOCK_STORAGE_TABLE;

/* dlock.memory_max_keys: entries of memory mode's shared hash */
int			dlock_memory_max_keys = 10000;

/* dlock.memory_max_keys_per_database: one database's share (0: no limit) */
int			dlock_memory_max_keys_per_db = 0;

/* dlock.memory_max_databases: memory mode's per-database slots */
int			dlock_memory_max_databases = 64;

/*
 * Loaded after the connection started (not preloaded), the module must
 * apply the administrator's ALTER ROLE / ALTER DATABASE ... SET dlock.*
 * values once more, in a transaction that commits: see
 * dlock_settings_check.  True once done, or when preloaded.
 */
static bool settings_applied = false;
static bool settings_pending = false;

/*
 * Apply the dlock.* entries of the pg_db_role_setting row of (db, role) at
 * source, as the backend did for every setting when the connection
 * started.  A value of a higher source (a SET, a superuser's startup
 * option) stays in force.
 */
static void
apply_settings(Relation rel, Snapshot snapshot, Oid db, Oid role,
			   GucSource source)
{
	ScanKeyData keys[2];
	SysScanDesc scan;
	HeapTuple	tup;

	ScanKeyInit(&keys[0], Anum_pg_db_role_setting_setdatabase,
				BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(db));
	ScanKeyInit(&keys[1], Anum_pg_db_role_setting_setrole,
				BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(role));
	scan = systable_beginscan(rel, DbRoleSettingDatidRolidIndexId, true,
							  snapshot, 2, keys);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, Anum_pg_db_role_setting_setconfig,
									 RelationGetDescr(rel), &isnull);
		Datum	   *elems;
		bool	   *nulls;
		int			n;
		int			i;

		if (isnull)
			continue;
		deconstruct_array(DatumGetArrayTypeP(d), TEXTOID, -1, false,
						  TYPALIGN_INT, &elems, &nulls, &n);
		for (i = 0; i < n; i++)
		{
			char	   *item;
			char	   *eq;

			if (nulls[i])
				continue;
			item = TextDatumGetCString(elems[i]);
			eq = strchr(item, '=');
			/* names are case-insensitive, and kept as the admin typed them */
			if (eq == NULL || pg_strncasecmp(item, "dlock.", 6) != 0)
				continue;
			*eq = '\0';
			(void) set_config_option(item, eq + 1, PGC_SUSET, source,
									 GUC_ACTION_SET, true, 0, false);
		}
	}
	systable_endscan(scan);
}

/*
 * PostgreSQL 15 keeps a value given for dlock.* before the module is
 * loaded as a placeholder; a startup option (PGOPTIONS) of an ordinary
 * role replaces the placeholder that ALTER ROLE or ALTER DATABASE ... SET
 * made, and when the module loads, the role's value is refused (it may
 * not set it) and the setting falls back to its default: a cap such as
 * dlock.max_hold would be lifted.  So, not preloaded, we apply those
 * settings again before the first use, in the order and with the sources
 * that the connection's start used.  Until a transaction that did so
 * commits, every dlock call does it again (an abort would undo it).
 * Settings from postgresql.conf are not reapplied: preload dlock to have
 * them enforced from the connection's start.
 */
void
dlock_settings_check(void)
{
	Relation	rel;
	Snapshot	snapshot;
	Oid			role = GetSessionUserId();

	if (settings_applied || settings_pending || !IsTransactionState() ||
		!OidIsValid(MyDatabaseId))
		return;
	rel = table_open(DbRoleSettingRelationId, AccessShareLock);
	snapshot = RegisterSnapshot(GetCatalogSnapshot(DbRoleSettingRelationId));
	apply_settings(rel, snapshot, MyDatabaseId, role, PGC_S_DATABASE_USER);
	apply_settings(rel, snapshot, InvalidOid, role, PGC_S_USER);
	apply_settings(rel, snapshot, MyDatabaseId, InvalidOid, PGC_S_DATABASE);
	apply_settings(rel, snapshot, InvalidOid, InvalidOid, PGC_S_GLOBAL);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
	settings_pending = true;
}

/* Settle settings_applied at the end of the transaction that applied them. */
static void
settings_xact_callback(XactEvent event, void *arg)
{
	if (!settings_pending)
		return;
	if (event == XACT_EVENT_COMMIT)
	{
		settings_applied = true;
		settings_pending = false;
	}
	else if (event == XACT_EVENT_ABORT)
		settings_pending = false;
}

/*
 * Define the settings, then reserve the prefix for them; called once from
 * _PG_init.  The postmaster settings can only be defined while preloading.
 */
void
dlock_define_settings(void)
{
	DefineCustomIntVariable("dlock.max_ttl",
							gettext_noop("Longest lease a grant or renewal may ask for."),
							gettext_noop("Leases are renewed while work goes on; a short cap limits how long a crashed holder can keep a key."),
							&dlock_max_ttl_ms,
							24 * 60 * 60 * 1000,
							1,
							INT_MAX,
							PGC_SUSET,
							GUC_UNIT_MS,
							NULL,
							NULL,
							NULL);

	DefineCustomBoolVariable("dlock.fence_bypass",
							 gettext_noop("Lets this transaction write to fenced tables without a fencing token."),
							 gettext_noop("For administrators' repairs: set it with SET LOCAL.  Bypassed writes are logged once per statement and table.  Superusers and roles granted SET on this parameter only."),
							 &dlock_fence_bypass,
							 false,
							 PGC_SUSET,
							 0,
							 NULL,
							 NULL,
							 NULL);

	DefineCustomIntVariable("dlock.max_hold",
							gettext_noop("Longest a lease may be held from its grant, renewals included (0: no limit)."),
							gettext_noop("A grant asking for more is granted for this long; a renewal never extends a lease beyond its grant time plus this limit, as it was when the lease was granted.  Endless renewal keeps everyone else waiting."),
							&dlock_max_hold_ms,
							0,
							0,
							INT_MAX,
							PGC_SUSET,
							GUC_UNIT_MS,
							NULL,
							NULL,
							NULL);

	DefineCustomBoolVariable("dlock.async_release",
							 gettext_noop("Lets a transaction that wrote nothing but releases commit asynchronously."),
							 gettext_noop("Losing such a release in a crash keeps the key held by its owner until the lease expires.  Off: releases commit as synchronous_commit says."),
							 &dlock_async_release,
							 true,
							 PGC_USERSET,
							 0,
							 NULL,
							 NULL,
							 NULL);

	DefineCustomBoolVariable("dlock.log_events",
							 gettext_noop("Logs a line per grant, takeover, noticed expiry, release and refused stale write."),
							 gettext_noop("The lines are LOG messages in a fixed key=value format, starting with \"dlock event=\"."),
							 &dlock_log_events,
							 false,
							 PGC_SUSET,
							 0,
							 NULL,
							 NULL,
							 NULL);

	DefineCustomBoolVariable("dlock.notify",
							 gettext_noop("Sends a NOTIFY on channel \"dlock\" for every grant, takeover, noticed expiry, release and proclaim."),
							 gettext_noop("The payload is a JSON object naming the event, the key and its token; it is sent when the transaction commits."),
							 &dlock_notify,
							 false,
							 PGC_SUSET,
							 0,
							 NULL,
							 NULL,
							 NULL);

	/* a postmaster setting can only be defined while preloading */
	if (process_shared_preload_libraries_in_progress)
	{
		DefineCustomIntVariable("dlock.stats_max",
								gettext_noop("Number of keys whose counters dlock.stats keeps in shared memory."),
								gettext_noop("When more keys are active, the least active are evicted; their activity stays in the totals."),
								&dlock_stats_max,
								5000,
								100,
								INT_MAX / 2,
								PGC_POSTMASTER,
								0,
								NULL,
								NULL,
								NULL);
	}

	/* a postmaster setting can only be defined while preloading */
	if (process_shared_preload_libraries_in_progress)
	{
		static const struct config_enum_entry storage_options[] = {
			{"table", DLOCK_STORAGE_TABLE, false},
			{"memory", DLOCK_STORAGE_MEMORY, false},
			{NULL, 0, false}
		};

		DefineCustomEnumVariable("dlock.storage",
								 gettext_noop("Where leases are kept: in the table dlock.leases, or in shared memory."),
								 gettext_noop("In memory, a grant writes no row and commits without a WAL flush; after every restart, crash or promotion each key stays held until the longest lease granted before could have ended."),
								 &dlock_storage_mode,
								 DLOCK_STORAGE_TABLE,
								 storage_options,
								 PGC_POSTMASTER,
								 0,
								 NULL,
								 NULL,
								 NULL);
		DefineCustomIntVariable("dlock.horizon_margin",
								gettext_noop("With dlock.storage = memory, how far past the end of a lease the horizon is moved when the lease outlives it."),
								gettext_noop("Larger: fewer durable writes of the horizon (one per margin at most); smaller: a shorter wait after a restart, which lasts until the longest lease could have ended plus up to this margin."),
								&dlock_horizon_margin_ms,
								10 * 1000,
								0,
								INT_MAX,
								PGC_SIGHUP,
								GUC_UNIT_MS,
								NULL,
								NULL,
								NULL);
		DefineCustomIntVariable("dlock.memory_max_keys",
								gettext_noop("Keys whose leases shared memory can hold, with dlock.storage = memory."),
								gettext_noop("Each takes about 1.7 kB; a grant of a new key fails when they are all in use, until dlock.prune() frees some."),
								&dlock_memory_max_keys,
								10000,
								100,
								100000000,
								PGC_POSTMASTER,
								0,
								NULL,
								NULL,
								NULL);
		DefineCustomIntVariable("dlock.memory_max_keys_per_database",
								gettext_noop("Keys one database may have in shared memory at once, with dlock.storage = memory; 0 for no limit but dlock.memory_max_keys."),
								gettext_noop("Keeps one database's live leases from taking the whole pool shared by all databases."),
								&dlock_memory_max_keys_per_db,
								0,
								0,
								100000000,
								PGC_SIGHUP,
								0,
								NULL,
								NULL,
								NULL);
		DefineCustomIntVariable("dlock.memory_max_databases",
								gettext_noop("Databases that can keep leases in shared memory at once, with dlock.storage = memory."),
								gettext_noop("A database takes a slot at its first grant, renewal or release, not by reading, and gives it back once it has no entry left and its horizon has passed."),
								&dlock_memory_max_databases,
								64,
								1,
								65536,
								PGC_POSTMASTER,
								0,
								NULL,
								NULL,
								NULL);
	}

	MarkGUCPrefixReserved("dlock");

	if (process_shared_preload_libraries_in_progress)
		settings_applied = true;	/* defined before any connection */
	else
		RegisterXactCallback(settings_xact_callback, NULL);
}
