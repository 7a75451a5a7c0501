/*-------------------------------------------------------------------------
 *
 * dlock.c
 *		Module entry point: the settings of the dlock extension.
 *
 * The module needs no shared_preload_libraries entry: all lease state is
 * in tables and all coordination goes through the lock manager.  When it
 * is preloaded, it also keeps counters and FIFO queues of waiters in
 * shared memory (shmem.c), set up here.
 *
 * Also here: the check the install and upgrade scripts run on the schema
 * they install into.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "commands/extension.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"

#include "dlock.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(dlock_install_check);

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

void		_PG_init(void);

/* Define the settings, then reserve the prefix for them. */
void
_PG_init(void)
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

	MarkGUCPrefixReserved("dlock");

	if (process_shared_preload_libraries_in_progress)
		dlock_shmem_init();

	dlock_keylock_init();
	dlock_storage_init();
}

/*
 * dlock.install_check(): run by the install and upgrade scripts, which
 * create it in the schema they install into and drop it again.  Refuses a
 * schema that the installing role does not own (see storage.c).
 */
Datum
dlock_install_check(PG_FUNCTION_ARGS)
{
	if (!creating_extension)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s() may only be called by CREATE EXTENSION or ALTER EXTENSION",
						get_func_name(fcinfo->flinfo->fn_oid))));
	dlock_install_check_schema(get_func_namespace(fcinfo->flinfo->fn_oid));
	PG_RETURN_VOID();
}
