/*-------------------------------------------------------------------------
 *
 * dlock.h
 *		Declarations shared by the files of the dlock extension.
 *
 * The files and what each one owns (callers only ever go down this list):
 *
 *	lease.c, fence.c, trigger.c
 *		The SQL-callable functions: thin callers that check their arguments
 *		(args.c), take the key lock for what they intend (keylock.c) and
 *		read or change the lease (storage.c).  trigger.c builds a row's key
 *		and asks fence.c to judge the write.
 *	args.c
 *		Argument checking: keys, durations, labels, parallel mode.
 *	storage.c
 *		dlock.leases and dlock.fence_seq: finding them through the
 *		extension, reading, writing, durability of grants and tokens, and
 *		the per-transaction view of what a transaction has verified.
 *	keylock.c
 *		The key locks, named by intent, with the conflict matrix; waiters
 *		and the wake-ups that follow every release of a key lock.
 *
 *-------------------------------------------------------------------------
 */
#ifndef DLOCK_H
#define DLOCK_H

#include "datatype/timestamp.h"
#include "fmgr.h"
#include "nodes/pg_list.h"
#include "utils/uuid.h"

/* Longest key, in bytes; documented in the README. */
#define DLOCK_MAX_KEY_BYTES		512

/* Longest holder label, in bytes. */
#define DLOCK_MAX_HOLDER_BYTES	1024

/*
 * Durations beyond this many microseconds (about 31 years) exceed any
 * dlock.max_ttl, mean "no limit" for a wait, and are older than any lease
 * for prune; clamping to it keeps timestamp arithmetic in range.
 */
#define DLOCK_HUGE_USECS		INT64CONST(1000000000000000)

/* The state of one key as stored in dlock.leases. */
typedef struct DlockLease
{
	bool		found;			/* the key has a row at all */
	bool		held;			/* owner is set (may still be expired) */
	pg_uuid_t	owner;
	int64		fence;			/* highest token ever issued for the key */
	TimestampTz expires_at;
} DlockLease;

/*
 * What the current transaction knows about a key it writes under
 * (storage.c keeps these; fence.c and trigger.c fill them in).
 */
typedef struct DlockKeyState
{
	char		key[DLOCK_MAX_KEY_BYTES + 1];	/* hash key */
	bool		presented;		/* use_fence named a token for key */
	int64		presented_fence;
	bool		verified;		/* lease below read under our write lock */
	DlockLease	lease;
	CommandId	column_cid;		/* command whose UPDATE presented ... */
	int64		column_fence;	/* ... this token in a token column */
} DlockKeyState;

/* Is *lease held by someone and unexpired at now? */
static inline bool
dlock_lease_is_live(const DlockLease *lease, TimestampTz now)
{
	return lease->found && lease->held && lease->expires_at > now;
}

/* GUCs (dlock.c) */
extern int	dlock_max_ttl_ms;
extern bool dlock_fence_bypass;

/* args.c */
extern void dlock_no_parallel(FunctionCallInfo fcinfo);
extern void dlock_null_argument(FunctionCallInfo fcinfo, const char *name);
extern void dlock_check_key(const char *key, int len);
extern text *dlock_key_arg(FunctionCallInfo fcinfo, int argno);
extern int64 dlock_ttl_arg(FunctionCallInfo fcinfo, int argno);
extern bool dlock_wait_arg(FunctionCallInfo fcinfo, int argno, int64 *usecs);
extern int64 dlock_age_arg(FunctionCallInfo fcinfo, int argno);
extern pg_uuid_t *dlock_owner_arg(FunctionCallInfo fcinfo, int argno);
extern text *dlock_holder_arg(FunctionCallInfo fcinfo, int argno);
extern char *dlock_interval_text(FunctionCallInfo fcinfo, int argno);

/* keylock.c */
extern void dlock_keylock_init(void);
extern bool dlock_lock_for_grant(const char *key, int len);
extern void dlock_unlock_grant(const char *key, int len);
extern void dlock_lock_for_write(const char *key, int len);
extern void dlock_unlock_write(const char *key, int len);
extern void dlock_lock_for_owner_op(const char *key, int len);
extern void dlock_lock_for_ending(const char *key, int len);
extern void dlock_unlock_owner_op(const char *key, int len, bool ending);
extern void dlock_wait_register(const char *key, int len, bool busy);
extern void dlock_wait_unregister(const char *key, int len, bool busy);

/* storage.c */
extern void dlock_storage_init(void);
extern void dlock_check_writable(void);
extern void dlock_read_lease(const char *key, int len, DlockLease *lease);
extern bool dlock_storage_grant(text *key, TimestampTz now, TimestampTz end,
								text *holder, DlockLease *lease);
extern void dlock_storage_set_end(text *key, TimestampTz end, bool release);
extern List *dlock_storage_old_keys(TimestampTz cutoff);
extern bool dlock_storage_delete_old(text *key, TimestampTz cutoff);
extern DlockKeyState *dlock_key_state(const char *key, bool create);
extern void dlock_install_check_schema(Oid nspid);

/* fence.c */
extern int64 dlock_fence_write(const char *key, bool has_token, int64 token,
							   bool monotonic, bool written_back,
							   const char *relname);

#endif							/* DLOCK_H */
