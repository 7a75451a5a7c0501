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
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "fmgr.h"
#include "utils/guc.h"

#include "dlock.h"

PG_MODULE_MAGIC;

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
							"Longest lease a grant or renewal may ask for.",
							"Leases are renewed while work goes on; a short cap limits how long a crashed holder can keep a key.",
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
							 "Lets this transaction write to fenced tables without a fencing token.",
							 "For administrators' repairs: set it with SET LOCAL.  Every bypassed write is logged.  Superusers and roles granted SET on this parameter only.",
							 &dlock_fence_bypass,
							 false,
							 PGC_SUSET,
							 0,
							 NULL,
							 NULL,
							 NULL);

	MarkGUCPrefixReserved("dlock");

	dlock_fence_init();
}
