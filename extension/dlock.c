/*-------------------------------------------------------------------------
 *
 * dlock.c
 *		Module entry point: the settings of the dlock extension.
 *
 * The module needs no shared_preload_libraries entry: all lease state is
 * in tables and all coordination goes through the lock manager.  Shared
 * memory state (statistics, waiter queues) will be optional and will be
 * set up here when the module is preloaded.
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
#include "utils/guc.h"
#include "utils/lsyscache.h"

#include "dlock.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(dlock_install_check);

/* dlock.max_ttl: the longest lease a single grant or renewal may ask for */
int			dlock_max_ttl_ms = 24 * 60 * 60 * 1000;

/* dlock.fence_bypass: let an administrator write without a fencing token */
bool		dlock_fence_bypass = false;

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

	MarkGUCPrefixReserved("dlock");

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
