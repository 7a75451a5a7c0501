/*-------------------------------------------------------------------------
 *
 * shmem.c
 *		The module's shared memory, when it is preloaded
 *		(shared_preload_libraries = 'dlock'): one shmem_request_hook and one
 *		shmem_startup_hook, which ask each part for its size and set it up.
 *
 * The parts: the counters of dlock.stats (stats.c), the FIFO queues and
 * waiter counts (wait.c), both under the LWLock tranche "dlock", and, with
 * dlock.storage = memory, the leases (memstore.c, tranche "dlock memory").
 * Without preloading none of them exists, and each part works without it
 * (no counters, no queues, table mode).
 *
 * Owns: the hooks.  Calls stats.c, wait.c and memstore.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"

#include "dlock.h"

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Ask for our shared memory and locks (shmem_request_hook). */
static void
shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(add_size(dlock_wait_shmem_size(),
									dlock_stats_shmem_size()));
	/* locks[0]: the counters' hash; locks[1]: the queues */
	RequestNamedLWLockTranche("dlock", 2);
	dlock_memstore_shmem_request();
}

/* Set up shared memory (shmem_startup_hook); load the saved counters. */
static void
shmem_startup(void)
{
	LWLockPadded *locks;
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	locks = GetNamedLWLockTranche("dlock");
	dlock_wait_shmem_startup(&locks[1].lock);
	found = dlock_stats_shmem_startup(&locks[0].lock);
	LWLockRelease(AddinShmemInitLock);
	dlock_stats_shmem_loaded(found);

	dlock_memstore_shmem_startup();
}

/* Install the hooks; called from _PG_init while preloading. */
void
dlock_shmem_init(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = shmem_startup;
}
