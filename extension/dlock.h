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
 *		and the wake-ups that follow every release of a key lock; the mark
 *		that keeps a connection's session-bound leases alive.
 *	memstore.c
 *		The leases themselves in shared memory instead of dlock.leases, with
 *		dlock.storage = memory (storage.c calls it, and keeps the horizon).
 *	shmem.c
 *		What lives in shared memory when the module is preloaded: the
 *		counters behind dlock.stats (kept across clean restarts), the
 *		per-key FIFO queues of waiting acquirers, and the event log lines.
 *
 *-------------------------------------------------------------------------
 */
#ifndef DLOCK_H
#define DLOCK_H

#include "access/xact.h"
#include "access/xlogdefs.h"
#include "datatype/timestamp.h"
#include "fmgr.h"
#include "nodes/pg_list.h"
#include "utils/hsearch.h"
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
	bool		unknown;		/* a placeholder: held by an owner nobody knows
								 * until expires_at (the horizon); its owner
								 * and token match nothing */
	bool		before_switch;	/* table mode: granted before the horizon of a
								 * memory-mode period, whose tokens for the
								 * key dlock.leases does not know */
	pg_uuid_t	owner;
	int64		fence;			/* highest token ever issued for the key */
	TimestampTz expires_at;
	TimestampTz granted_at;
	int64		session_id;		/* session-bound: the connection's mark; else 0 */
	int64		lock_delay;		/* microseconds the key stays ungrantable after
								 * an unreleased expiry; 0 for none */
	TimestampTz hold_limit;		/* latest expiry a renewal may set, or DT_NOEND */
} DlockLease;

/* Why a lease is not live (dlock_lease_state). */
typedef enum DlockLeaseState
{
	DLOCK_NO_ROW,				/* the key has no row */
	DLOCK_RELEASED,				/* released (owner NULL) */
	DLOCK_LIVE,					/* held, unexpired, its connection (if bound) up */
	DLOCK_EXPIRED,				/* held but ran out */
	DLOCK_DISCONNECTED			/* session-bound and its connection is gone */
} DlockLeaseState;

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

/* What the grant that made a lease asked for, besides key and ttl. */
typedef struct DlockGrantOptions
{
	text	   *holder;			/* label, or NULL */
	int64		lock_delay;		/* microseconds, 0 for none */
	bool		session_bound;
} DlockGrantOptions;

/* GUCs (dlock.c) */
extern int	dlock_max_ttl_ms;
extern bool dlock_fence_bypass;
extern int	dlock_max_hold_ms;
extern int	dlock_stats_max;
extern bool dlock_log_events;
extern bool dlock_async_release;
extern int	dlock_horizon_margin_ms;
extern void dlock_settings_check(void);
extern void dlock_random(void *buf, size_t len, const char *what);

/* A backend's hash table for one transaction's entries (dlock_xact_hash). */
typedef struct DlockXactHash
{
	HTAB	   *htab;			/* NULL until first needed */
	LocalTransactionId lxid;	/* the transaction whose entries it holds */
} DlockXactHash;
extern HTAB *dlock_xact_hash(DlockXactHash *xh, const char *name,
							 Size keysize, Size entrysize, int flags,
							 bool create);

/* sha256.c */
#define DLOCK_SHA256_LEN	32
extern void dlock_sha256(const void *data, size_t len,
						 uint8 digest[DLOCK_SHA256_LEN]);

/* lease.c */
extern DlockLeaseState dlock_lease_state(const DlockLease *lease,
										 TimestampTz now);
extern bool dlock_lease_is_live(const DlockLease *lease, TimestampTz now);
extern TimestampTz dlock_lease_ended_at(const DlockLease *lease, Oid db);

/* args.c */
extern void dlock_no_parallel(FunctionCallInfo fcinfo);
extern void dlock_null_argument(FunctionCallInfo fcinfo, const char *name);
extern void dlock_check_key(const char *key, int len);
extern text *dlock_key_arg(FunctionCallInfo fcinfo, int argno);
extern int64 dlock_ttl_arg(FunctionCallInfo fcinfo, int argno);
extern bool dlock_wait_arg(FunctionCallInfo fcinfo, int argno, int64 *usecs);
extern int64 dlock_lock_delay_arg(FunctionCallInfo fcinfo, int argno);
extern int64 dlock_interval_usecs(const Interval *span);
extern bool dlock_bool_arg(FunctionCallInfo fcinfo, int argno, const char *name,
						   bool dflt);
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
extern uint64 dlock_key_hash(const char *key, int len);
extern int64 dlock_session_mark(const char *key, int len);
extern bool dlock_session_alive(int64 session_id);
extern bool dlock_session_alive_in(Oid db, int64 session_id);
typedef enum DlockKeyLockHeld
{
	DLOCK_HELD_NONE,
	DLOCK_HELD_GRANT,			/* the grant lock: this transaction granted it */
	DLOCK_HELD_OTHER			/* a writer's or an owner op's mode */
} DlockKeyLockHeld;
extern DlockKeyLockHeld dlock_key_lock_held(const char *key, int len);
extern void dlock_syncrep_wait_lock(XLogRecPtr lsn, bool lock);

/* storage.c */
extern void dlock_storage_init(void);
extern void dlock_check_writable(void);
extern void dlock_read_lease(const char *key, int len, DlockLease *lease);
extern bool dlock_storage_grant(text *key, TimestampTz now, TimestampTz end,
								TimestampTz hold_limit,
								const DlockGrantOptions *opts,
								DlockLease *lease);
extern void dlock_storage_set_end(text *key, TimestampTz end, bool release);
extern List *dlock_storage_old_keys(TimestampTz cutoff);
extern bool dlock_storage_delete_old(text *key, TimestampTz cutoff,
									 bool force);
extern DlockKeyState *dlock_key_state(const char *key, bool create);
extern bool dlock_token_issued(int64 token);
extern void dlock_install_check_schema(Oid nspid);

/* A row of dlock.leases as the views show it (dlock_storage_scan). */
typedef struct DlockLeaseRow
{
	text	   *key;
	DlockLease	lease;
	text	   *holder;			/* NULL when none */
	bool		has_pid;
	int32		pid;
	text	   *application_name;	/* NULL when unknown */
} DlockLeaseRow;
extern List *dlock_storage_scan(void);

/* memstore.c */
#define DLOCK_STORAGE_TABLE		0
#define DLOCK_STORAGE_MEMORY	1
extern int	dlock_storage_mode;
extern int	dlock_memory_max_keys;
extern int	dlock_memory_max_keys_per_db;
extern int	dlock_memory_max_databases;
extern bool dlock_memory_mode(void);
extern void dlock_memstore_init(void);
extern void dlock_mem_read(const char *key, int len, DlockLease *lease);
extern void dlock_mem_write(const char *key, int len, const DlockLease *lease,
							bool meta, const text *holder);
extern List *dlock_mem_scan(void);
extern bool dlock_mem_delete_old(const char *key, int len, TimestampTz cutoff,
								 bool force);
extern void dlock_mem_xact_callback(XactEvent event);
extern void dlock_mem_subxact_abort(SubTransactionId subid);
extern bool dlock_mem_db_get(Oid seq, TimestampTz *barrier,
							 TimestampTz *horizon, pg_uuid_t *unknown_owner,
							 bool writer);
extern void dlock_mem_db_set(Oid seq, TimestampTz *barrier,
							 TimestampTz *horizon, pg_uuid_t *unknown);
extern void dlock_mem_db_advance(Oid seq, TimestampTz horizon,
								 bool barrier_too);
extern void dlock_mem_db_set_pending(Oid seq, TimestampTz pending);
extern TimestampTz dlock_mem_db_pending(Oid seq);
extern XLogRecPtr dlock_mem_db_horizon_lsn(Oid seq, XLogRecPtr lsn);

/* shmem.c */
typedef enum DlockEvent
{
	DLOCK_EV_CONTENDED,			/* a try found the key held; an acquire waited */
	DLOCK_EV_TIMEOUT,			/* an acquire ended with 55P03 */
	DLOCK_EV_RENEWED,
	DLOCK_EV_LOST_RENEWAL,		/* renew returned NULL */
	DLOCK_EV_REFUSED			/* a fenced write or use_fence refused */
} DlockEvent;
extern void dlock_shmem_init(void);
extern bool dlock_shmem_ready(void);
extern void dlock_count(const char *key, int len, DlockEvent ev);
extern void dlock_count_wait(const char *key, int len, int64 usecs);
extern void dlock_count_grant(const char *key, int len,
							  const DlockLease *prev, const DlockLease *lease,
							  const DlockGrantOptions *opts);
extern void dlock_count_release(const char *key, int len,
								const DlockLease *lease, TimestampTz now);
extern void dlock_notice_end(const char *key, int len,
							 const DlockLease *lease, DlockLeaseState state,
							 TimestampTz now);
extern void dlock_log_refusal(const char *key, int64 token, int64 current,
							  const char *why);
extern bool dlock_queue_enter(const char *key, int len);
extern bool dlock_queue_is_head(void);
extern bool dlock_queue_others(const char *key, int len);
extern void dlock_queue_leave(void);
extern void dlock_waiters_add(uint64 h, int delta);
extern bool dlock_waiters_maybe(uint64 h);

/* fence.c */
extern int64 dlock_fence_write(const char *key, bool has_token, int64 token,
							   bool monotonic, bool written_back,
							   const char *relname);

#endif							/* DLOCK_H */
