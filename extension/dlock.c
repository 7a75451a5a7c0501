/*-------------------------------------------------------------------------
 *
 * dlock.c
 *		Module entry point: _PG_init, which defines the settings and sets up
 *		every part, and the check the install and upgrade scripts run.
 *
 * The module needs no shared_preload_libraries entry: in table mode all
 * lease state is in the extension's table and sequences, and all
 * coordination goes through the lock manager.  When it is preloaded it
 * also keeps counters and FIFO queues of waiters in shared memory, and can
 * keep the leases there (dlock.storage = memory); shmem.c sets that up.
 *
 * Owns: nothing.  Calls the init function of every part; nothing calls it.
 * dlock.h has the map of the files.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "commands/extension.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/lsyscache.h"

#include "dlock.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(dlock_install_check);

void		_PG_init(void);

/*
 * Define the settings, then set up every part.  The order of the
 * registrations is the order of the callbacks at the end of a transaction
 * (each list is called newest first).
 */
void
_PG_init(void)
{
	dlock_define_settings();

	if (process_shared_preload_libraries_in_progress)
	{
		dlock_shmem_init();
		dlock_memstore_init();
	}

	dlock_wait_init();
	dlock_keylock_init();
	dlock_objects_init();
	dlock_storage_init();
	dlock_fence_init();
}

/*
 * dlock.install_check(): run by the install and upgrade scripts, which
 * create it in the schema they install into and drop it again.  Refuses a
 * schema that the installing role does not own (objects.c).
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
