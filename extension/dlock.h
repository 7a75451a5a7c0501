/*-------------------------------------------------------------------------
 *
 * dlock.h
 *		Declarations shared by the files of the dlock extension.
 *
 * dlock keeps leases in the table dlock.leases (one row per key ever
 * granted) and draws fencing tokens from the sequence dlock.fence_seq.
 * Every operation on a key is serialized by a heavyweight advisory lock
 * on a hash of the key, in lock spaces of our own (see keylock.c), so the
 * table itself is only ever read with a fresh snapshot while the right
 * key lock is held.
 *
 * Key lock modes, chosen so that the holder's own traffic never blocks
 * itself while grants are strictly ordered against everything else:
 *
 *	grant (try_acquire/acquire), prune	ExclusiveLock
 *	renew								RowShareLock (plus the owner-op lock)
 *	release								RowExclusiveLock (plus the owner-op lock)
 *	fenced write (trigger, use_fence)	ShareLock
 *
 * ExclusiveLock conflicts with all of the others.  RowShareLock and
 * ShareLock do not conflict, so a holder can renew its lease from another
 * connection while one of its transactions is writing under the lease.
 * RowExclusiveLock conflicts with ShareLock: a release waits for the
 * transactions writing under the lease to end.  So while a writer holds
 * its ShareLock, its key's token cannot change and its lease cannot end
 * except by running out, which lets fence.c verify a key once per
 * transaction and then only compare the clock with the expiry.
 *
 *-------------------------------------------------------------------------
 */
#ifndef DLOCK_H
#define DLOCK_H

#include "datatype/timestamp.h"
#include "fmgr.h"
#include "storage/lockdefs.h"
#include "utils/uuid.h"

/* Longest key, in bytes; documented in the README. */
#define DLOCK_MAX_KEY_BYTES		512

/* Longest holder label, in bytes. */
#define DLOCK_MAX_HOLDER_BYTES	1024

/* The state of one key as stored in dlock.leases. */
typedef struct DlockLease
{
	bool		found;			/* the key has a row at all */
	bool		held;			/* owner is set (may still be expired) */
	pg_uuid_t	owner;
	int64		fence;			/* highest token ever issued for the key */
	TimestampTz expires_at;
} DlockLease;

/* GUCs (dlock.c) */
extern int	dlock_max_ttl_ms;
extern bool dlock_fence_bypass;

/* keylock.c */
extern void dlock_null_argument(FunctionCallInfo fcinfo, const char *name);
extern void dlock_check_key(const char *key, int len);
extern bool dlock_lock_key(const char *key, int len, LOCKMODE mode,
						   bool nowait);
extern void dlock_unlock_key(const char *key, int len, LOCKMODE mode);
extern void dlock_lock_owner_ops(const char *key, int len);
extern void dlock_unlock_owner_ops(const char *key, int len);
extern void dlock_register_waiter(const char *key, int len);
extern void dlock_unregister_waiter(const char *key, int len);
extern void dlock_wake_waiters(const char *key, int len);

/* fence.c */
extern void dlock_fence_init(void);
extern void dlock_fence_forget(text *key);

/* lease.c */
extern void dlock_read_lease(text *key, DlockLease *lease);


#endif							/* DLOCK_H */
