/*-------------------------------------------------------------------------
 *
 * keylock.c
 *		Key validation, key locks and waiter wake-ups.
 *
 * A key is serialized with a heavyweight advisory lock whose tag is
 * (database, 64-bit hash of the key, lock space).  Applications' own
 * pg_advisory_lock() calls use lock spaces 1 (one bigint) and 2 (two
 * integers); ours are distinct values, so the two can never collide.  Two
 * keys whose hashes collide merely share a lock: that costs concurrency,
 * never correctness, because the lease row itself is looked up by the full
 * key.  pg_locks shows our locks as locktype 'advisory' with objsubid equal
 * to the lock space.
 *
 * Waiting acquirers hold a ShareLock on the key's tag in the waiter space
 * while they sleep.  A release asks the lock manager who holds that tag
 * and sets their latches, so a waiter wakes on the event instead of
 * polling; expiry needs no signal, waiters sleep until the expiry time.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "storage/sinvaladt.h"
#include "utils/lsyscache.h"

#include "dlock.h"

/* Lock spaces (locktag_field4); 1 and 2 belong to pg_advisory_lock(). */
#define DLOCK_SPACE_KEY			0x444c	/* grants, writes, renew/release */
#define DLOCK_SPACE_OWNER_OPS	0x444d	/* renew/release among themselves */
#define DLOCK_SPACE_WAITERS		0x444e	/* sleeping acquirers */

/* Fill *tag with the lock tag of key in lock space space. */
static void
key_locktag(LOCKTAG *tag, const char *key, int len, uint16 space)
{
	uint64		h = hash_bytes_extended((const unsigned char *) key, len, 0);

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32),
						 (uint32) h, space);
}

/*
 * Raise the error for a NULL argument name of the SQL function called
 * through fcinfo: dlock never treats NULL as a value.
 */
void
dlock_null_argument(FunctionCallInfo fcinfo, const char *name)
{
	ereport(ERROR,
			(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			 errmsg("%s must not be null", name),
			 errdetail("%s() was called with a NULL %s.",
					   get_func_name(fcinfo->flinfo->fn_oid), name),
			 errhint("Pass a value: dlock functions return NULL only to report a refused grant or a lost lease.")));
}

/*
 * Raise an error unless key (len bytes, not NULL) is a valid lock key.
 */
void
dlock_check_key(const char *key, int len)
{
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lock key must not be empty"),
				 errdetail("The key given was an empty string."),
				 errhint("Name the resource the lock protects, for example 'stock-sync:warehouse-42'.")));
	if (len > DLOCK_MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lock key is too long"),
				 errdetail("The key is %d bytes long; the limit is %d bytes.",
						   len, DLOCK_MAX_KEY_BYTES),
				 errhint("Use a shorter key, for example a hash of the resource name.")));
}

/*
 * Take the key lock in mode for the rest of the transaction.  With nowait,
 * return false instead of waiting when it is not free at once.
 */
bool
dlock_lock_key(const char *key, int len, LOCKMODE mode, bool nowait)
{
	LOCKTAG		tag;

	key_locktag(&tag, key, len, DLOCK_SPACE_KEY);
	return LockAcquire(&tag, mode, false, nowait) != LOCKACQUIRE_NOT_AVAIL;
}

/*
 * Give back one hold of the key lock in mode, taken by dlock_lock_key.
 * A lock this transaction took more than once stays held.
 */
void
dlock_unlock_key(const char *key, int len, LOCKMODE mode)
{
	LOCKTAG		tag;

	key_locktag(&tag, key, len, DLOCK_SPACE_KEY);
	LockRelease(&tag, mode, false);
}

/*
 * Serialize renew and release of one key among themselves, for the rest
 * of the transaction.  They take only RowShareLock on the key lock (so
 * that fenced writers do not block them); this second lock keeps two of
 * them from updating the same row at once, which would otherwise fail
 * with a serialization error at REPEATABLE READ.
 */
void
dlock_lock_owner_ops(const char *key, int len)
{
	LOCKTAG		tag;

	key_locktag(&tag, key, len, DLOCK_SPACE_OWNER_OPS);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
}

/* Give back the lock taken by dlock_lock_owner_ops. */
void
dlock_unlock_owner_ops(const char *key, int len)
{
	LOCKTAG		tag;

	key_locktag(&tag, key, len, DLOCK_SPACE_OWNER_OPS);
	LockRelease(&tag, ExclusiveLock, false);
}

/*
 * Announce that this backend sleeps until key is released.  The lock
 * never blocks: nobody takes a conflicting mode on the waiter space.
 */
void
dlock_register_waiter(const char *key, int len)
{
	LOCKTAG		tag;

	key_locktag(&tag, key, len, DLOCK_SPACE_WAITERS);
	(void) LockAcquire(&tag, ShareLock, false, false);
}

/* Withdraw the announcement made by dlock_register_waiter. */
void
dlock_unregister_waiter(const char *key, int len)
{
	LOCKTAG		tag;

	key_locktag(&tag, key, len, DLOCK_SPACE_WAITERS);
	LockRelease(&tag, ShareLock, false);
}

/*
 * Wake every backend sleeping in acquire() on key.  Called by release and
 * renew (which may move the expiry earlier) while they hold the key lock:
 * a woken waiter then reads the lease state only once that change has
 * committed or aborted.
 */
void
dlock_wake_waiters(const char *key, int len)
{
	LOCKTAG		tag;
	VirtualTransactionId *vxids;
	int			nwaiters;

	key_locktag(&tag, key, len, DLOCK_SPACE_WAITERS);
	vxids = GetLockConflicts(&tag, ExclusiveLock, &nwaiters);
	for (; VirtualTransactionIdIsValid(*vxids); vxids++)
	{
		PGPROC	   *proc = BackendIdGetProc(vxids->backendId);

		/* A proc that has exited since merely gets a spurious wake-up. */
		if (proc != NULL)
			SetLatch(&proc->procLatch);
	}
}
