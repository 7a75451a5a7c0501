/*-------------------------------------------------------------------------
 *
 * dlock.h
 *		Declarations shared by the files of the dlock extension.
 *
 * The files, each with what it owns, from the top down.  A file calls only
 * files below it in this list (tools/layers checks it, from the symbols
 * each object file defines and needs, in every CI run):
 *
 *	dlock.c			_PG_init: defines the settings, sets up every part
 *	shmem.c			the shared-memory request and startup hooks
 *	election.c		SQL: campaign, proclaim, leader, observe
 *	lease.c			SQL: try_acquire, acquire, renew, release, prune,
 *					forget, lease_status; the rules of granting
 *	trigger.c		SQL: the fence_guard trigger (a row's key and token)
 *	fence.c			SQL: use_fence, fenced, check_fence; judging a write,
 *					and the transaction's verified keys
 *	stats.c			SQL: dlock.stats, stats_reset; the counters in shared
 *					memory, their eviction, save and load; what the lease
 *					API reports
 *	events.c		the LOG lines of dlock.log_events
 *	storage.c		the seam: read, grant, set end, scan, prune a lease, in
 *					table mode or memory mode (picked once per call)
 *	horizon.c		memory mode's horizon and barrier, the unknown owner;
 *					the barrier in table mode after a switch back
 *	leasetable.c	the rows of dlock.leases, read and written with heap calls
 *	memstore.c		memory mode's shared hash of leases, its transaction
 *					overlay, and its per-database slots (with their
 *					blocks of tokens)
 *	durable.c		tokens (drawn, made durable, judged issued), WAL
 *					confirmed by the synchronous standbys, commit modes
 *	objects.c		the extension's relations found through pg_depend, its
 *					sequences, running as their owner
 *	liveness.c		whether a lease is live, and when it ended
 *	keylock.c		the key locks by intent, with the conflict matrix;
 *					session marks; one waiter per WAL position
 *	wait.c			waiting: FIFO queues, waiter spaces, wake-ups, waiter
 *					counts, sleeping; SQL: the view dlock.waiters
 *	keyhash.c		the key's SHA-256 hash and its lock tag
 *	args.c			checking a call's arguments, parallel mode, read-only
 *	settings.c		the dlock.* settings
 *	common.c		random bytes, per-transaction hash tables
 *
 * extension/README has the design notes: the lock matrix, why waits never
 * queue in the lock manager, durability and the horizon argument.
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
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "miscadmin.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/uuid.h"

/*
 * Everything declared below is internal to the module: hidden, so that no
 * other library loaded into the server can collide with it, and so that
 * calls between our files go straight to the function instead of through
 * the PLT, as calls of static functions do.  The SQL-callable functions
 * (PG_FUNCTION_INFO_V1) and _PG_init are declared in their own files and
 * stay visible.
 */
#pragma GCC visibility push(hidden)

/* SQLSTATE of every refused fenced write; documented in docs/reference.md. */
#define ERRCODE_DLOCK_FENCE_REFUSED		MAKE_SQLSTATE('L','F','0','0','1')

/*
 * Lock spaces (locktag_field4) of dlock's advisory lock tags; 1 and 2
 * belong to pg_advisory_lock().
 */
#define DLOCK_SPACE_KEY			0x444c	/* the key lock (keylock.c) */
#define DLOCK_SPACE_OWNER_OPS	0x444d	/* renew/release among themselves */
#define DLOCK_SPACE_WAITERS		0x444e	/* acquirers waiting for a lease (wait.c) */
#define DLOCK_SPACE_BUSY_WAITERS	0x444f	/* ... for a key lock (wait.c) */
#define DLOCK_SPACE_SESSIONS	0x4450	/* a connection's session mark */
#define DLOCK_SPACE_SYNCREP		0x4451	/* a wait for synchronous standbys */
#define DLOCK_SPACE_NEW_SLOT	0x4452	/* a key's slot count grows (keylock.c) */

/* Longest key, in bytes; documented in docs/reference.md. */
#define DLOCK_MAX_KEY_BYTES		512

/*
 * Permits and shared leases.  The holders of a key that admits several
 * (a semaphore's permits, shared leases) each have a lease of their own,
 * stored under a slot key: the key, the unit separator U+001F (which no
 * lock key may contain), and the slot number, 1 to DLOCK_MAX_SLOTS.  The
 * key's own lease, the head, is the exclusive one; its nslots says how
 * many slot keys the key has used.
 */
#define DLOCK_SLOT_SEPARATOR	'\x1f'
#define DLOCK_MAX_SLOTS			1000
#define DLOCK_MAX_STORED_KEY_BYTES	(DLOCK_MAX_KEY_BYTES + 5)

/* Longest holder label, in bytes. */
#define DLOCK_MAX_HOLDER_BYTES	1024

/* Longest value of an election (campaign, proclaim), in bytes. */
#define DLOCK_MAX_VALUE_BYTES	1024

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
	int32		nslots;			/* a head: slot keys used (permits, shared) */
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
 * (fence.c keeps these; fence.c and trigger.c fill them in).
 */
typedef struct DlockKeyState
{
	char		key[DLOCK_MAX_STORED_KEY_BYTES + 1];	/* hash key */
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
	text	   *value;			/* campaign's value, or NULL */
	int64		lock_delay;		/* microseconds, 0 for none */
	bool		session_bound;
	int32		permits;		/* 1: exclusive; N > 1: one of N permits; 0:
								 * shared (dlock_permits_arg) */
	int32		nslots;			/* the head's nslots, kept across grants */
} DlockGrantOptions;

/* Storage modes (dlock.storage). */
#define DLOCK_STORAGE_TABLE		0
#define DLOCK_STORAGE_MEMORY	1

/* A row of dlock.leases as the views show it (dlock_storage_scan). */
typedef struct DlockLeaseRow
{
	text	   *key;
	DlockLease	lease;
	text	   *holder;			/* NULL when none */
	text	   *value;			/* NULL when none */
	bool		has_pid;
	int32		pid;
	text	   *application_name;	/* NULL when unknown */
} DlockLeaseRow;

/* What counts and log lines are made of (stats.c). */
typedef enum DlockEvent
{
	DLOCK_EV_CONTENDED,			/* a try found the key held; an acquire waited */
	DLOCK_EV_TIMEOUT,			/* an acquire ended with 55P03 */
	DLOCK_EV_RENEWED,
	DLOCK_EV_LOST_RENEWAL,		/* renew returned NULL */
	DLOCK_EV_REFUSED			/* a fenced write or use_fence refused */
} DlockEvent;

/* A backend's hash table for one transaction's entries (dlock_xact_hash). */
typedef struct DlockXactHash
{
	HTAB	   *htab;			/* NULL until first needed */
	LocalTransactionId lxid;	/* the transaction whose entries it holds */
} DlockXactHash;
extern HTAB *dlock_xact_hash(DlockXactHash *xh, const char *name,
							 Size keysize, Size entrysize, int flags,
							 bool create);

/* What dlock_section_begin saves for dlock_section_end (objects.c). */
typedef struct DlockSection
{
	Oid			userid;
	int			sec_context;
	int			nestlevel;
} DlockSection;

/* shmem.c */
extern void dlock_shmem_init(void);

/* election.c: SQL functions only */

/* lease.c */
typedef struct DlockAcquireArgs
{
	text	   *key;
	int64		ttl;
	bool		bounded;		/* wait has a limit ... */
	int64		wait;			/* ... of this many microseconds */
	int			wait_argno;		/* the wait argument, for messages */
	DlockGrantOptions opts;
} DlockAcquireArgs;
extern void dlock_acquire_lease(FunctionCallInfo fcinfo,
								const DlockAcquireArgs *args,
								DlockLease *lease);
extern Datum dlock_lease_result(FunctionCallInfo fcinfo, text *key,
								DlockLease *lease);
/* The key an owner operation works on: the key, or one of its slot keys. */
typedef struct DlockOwnerKey
{
	text	   *key;			/* as text */
	const char *k;				/* its bytes */
	int			len;
	char		buf[DLOCK_MAX_STORED_KEY_BYTES + 1];
} DlockOwnerKey;
extern bool dlock_begin_owner_op(text *key, const pg_uuid_t *owner,
								 DlockOwnerKey *ok, DlockLease *lease,
								 TimestampTz *now);

/* fence.c */
extern void dlock_fence_init(void);
extern int64 dlock_fence_write(const char *key, bool has_token, int64 token,
							   bool monotonic, bool written_back,
							   const char *relname);
extern DlockKeyState *dlock_key_state(const char *key, bool create);
extern void dlock_forget_verified(const char *key, int len);

/* stats.c */
extern Size dlock_stats_shmem_size(void);
extern bool dlock_stats_shmem_startup(LWLock *lock);
extern void dlock_stats_shmem_loaded(bool found);
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
extern void dlock_notice_end_in_view(const char *key, int len,
									 const DlockLease *lease,
									 DlockLeaseState state, TimestampTz now);

/* events.c */
extern void dlock_log_expired(const char *key, int len,
							  const DlockLease *lease, DlockLeaseState state,
							  int64 held);
extern void dlock_log_refusal(const char *key, int64 token, int64 current,
							  const char *why);
extern void dlock_log_grant(const char *key, int len, const DlockLease *prev,
							const DlockLease *lease,
							const DlockGrantOptions *opts, bool takeover);
extern void dlock_log_release(const char *key, int len,
							  const DlockLease *lease, int64 held);
extern void dlock_log_proclaim(const char *key, int len,
							   const DlockLease *lease, const text *value);

/* storage.c */
extern void dlock_storage_init(void);
extern void dlock_read_lease(const char *key, int len, DlockLease *lease);
extern bool dlock_storage_grant(text *key, TimestampTz now, TimestampTz end,
								TimestampTz hold_limit,
								const DlockGrantOptions *opts,
								DlockLease *lease);
extern void dlock_storage_set_end(text *key, TimestampTz end, bool release);
extern void dlock_storage_set_value(text *key, text *value);
extern bool dlock_storage_set_slots(text *key, int32 nslots);
extern DlockLeaseRow *dlock_storage_read_row(const char *key, int len);
extern List *dlock_storage_scan(void);
extern List *dlock_storage_old_keys(TimestampTz cutoff);
extern bool dlock_storage_delete_old(text *key, TimestampTz cutoff,
									 bool force);

/* horizon.c */
extern void dlock_unknown_lease(DlockLease *lease, TimestampTz until,
								const pg_uuid_t *owner);
extern void dlock_memory_state(TimestampTz *barrier, TimestampTz *horizon,
							   pg_uuid_t *unknown, bool take_slot);
extern bool dlock_secure_horizon(TimestampTz need);
extern void dlock_horizon_table_read(DlockLease *lease);
extern void dlock_horizon_table_scanned(DlockLease *lease);

/* leasetable.c */
/* A change of dlock.leases in progress (dlock_table_begin_change). */
typedef struct DlockTableChange
{
	Relation	rel;
	DlockSection section;
} DlockTableChange;
extern void dlock_table_keep(void);
extern void dlock_table_read(const char *key, int len, DlockLease *lease);
extern void dlock_table_begin_change(DlockTableChange *c);
extern void dlock_table_end_change(DlockTableChange *c);
extern void dlock_table_check_grant(DlockTableChange *c,
									const DlockGrantOptions *opts);
extern bool dlock_table_put_grant(DlockTableChange *c, const char *k, int len,
								  const DlockLease *lease,
								  const DlockGrantOptions *opts);
extern void dlock_table_put_end(DlockTableChange *c, const char *k, int len,
								TimestampTz end, bool release);
extern void dlock_table_put_value(DlockTableChange *c, const char *k, int len,
								  const text *value);
extern DlockLeaseRow *dlock_table_read_row(const char *key, int len);
extern bool dlock_table_put_slots(DlockTableChange *c, const char *k, int len,
								  int32 nslots);
extern List *dlock_table_scan(void);
extern List *dlock_table_old_keys(TimestampTz cutoff);
extern bool dlock_table_delete_old(const char *k, int len, TimestampTz cutoff,
								   bool force);
extern TimestampTz dlock_table_max_end(void);

/* memstore.c */
extern bool dlock_memory_mode(void);
extern void dlock_memstore_init(void);
extern void dlock_memstore_shmem_request(void);
extern void dlock_memstore_shmem_startup(void);
extern void dlock_mem_read(const char *key, int len, DlockLease *lease);
extern void dlock_mem_write(const char *key, int len, const DlockLease *lease,
							const DlockGrantOptions *grant);
extern void dlock_mem_write_value(const char *key, int len, const text *value);
extern DlockLeaseRow *dlock_mem_read_row(const char *key, int len);
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
extern int64 dlock_mem_draw_token(XLogRecPtr *confirm);

/* A sequence as its page holds it (dlock_read_sequence_page). */
typedef struct DlockSeqPage
{
	XLogRecPtr	lsn;			/* the page's LSN: its last change's WAL */
	int64		high;			/* the highest value it may ever have
								 * returned, the values logged ahead
								 * included: what it restarts from after a
								 * crash */
} DlockSeqPage;

/* durable.c */
extern void dlock_raise_synchronous_commit(void);
extern void dlock_force_synchronous_commit(void);
extern void dlock_confirm_lsn(XLogRecPtr lsn, bool token);
extern int64 dlock_draw_token(void);
extern void dlock_secure_drawn_token(void);
extern XLogRecPtr dlock_drawn_lsn(void);
extern void dlock_token_pages(DlockSeqPage *tok, DlockSeqPage *copy);
extern bool dlock_token_lock(bool wait);
extern void dlock_token_unlock(void);
extern bool dlock_token_reserve(int64 last, DlockSeqPage *tok,
								DlockSeqPage *copy);
extern void dlock_token_confirm(XLogRecPtr lsn);
extern bool dlock_token_issued(int64 token);
extern bool dlock_seq_only_so_far(void);
extern void dlock_note_seq_only(bool seq_only);
extern bool dlock_release_only_so_far(bool release);
extern void dlock_note_release_only(bool release_only);
extern void dlock_durable_xact_callback(XactEvent event);

/* objects.c */
typedef struct DlockObjects
{
	bool		valid;
	Oid			leases;			/* dlock.leases */
	Oid			seq;			/* dlock.fence_seq */
	Oid			horizon;		/* dlock.horizon_seq (0.4), or InvalidOid */
	Oid			token;			/* dlock.token_seq (0.6), or InvalidOid */
	Oid			horizon_mark;	/* dlock.horizon_mark (0.6), or InvalidOid */
	Oid			owner;			/* owner of dlock.leases */
} DlockObjects;


extern DlockObjects dlock_objects;
extern uint64 dlock_objects_generation;
extern void dlock_objects_init(void);
extern void dlock_objects_lookup(void);
extern void dlock_objects_find_again(void);
extern void dlock_install_check_schema(Oid nspid);
extern void dlock_section_begin(DlockSection *s);
extern void dlock_section_end(DlockSection *s);
extern int64 dlock_read_sequence(Oid seqid);
extern void dlock_read_sequence_page(Oid seqid, DlockSeqPage *page);
extern XLogRecPtr dlock_sequence_lsn(Oid seqid);
extern void dlock_set_sequence(Oid seqid, int64 value);

/*
 * Make dlock_objects valid, looking the storage up again after an
 * invalidation (processed first, so that a stale cache is noticed).
 * Inline: every read of a lease calls it.
 */
static inline void
dlock_objects_find(void)
{
	AcceptInvalidationMessages();
	if (!dlock_objects.valid)
		dlock_objects_lookup();
}

/* liveness.c */
extern DlockLeaseState dlock_lease_state(const DlockLease *lease,
										 TimestampTz now);
extern bool dlock_lease_is_live(const DlockLease *lease, TimestampTz now);
extern TimestampTz dlock_lease_ended_at(const DlockLease *lease, Oid db);

/* keylock.c */
typedef enum DlockKeyLockHeld
{
	DLOCK_HELD_NONE,
	DLOCK_HELD_GRANT,			/* the grant lock: this transaction granted it */
	DLOCK_HELD_OTHER			/* a writer's or an owner op's mode */
} DlockKeyLockHeld;
extern void dlock_keylock_init(void);
extern bool dlock_lock_for_grant(const char *key, int len);
extern void dlock_unlock_grant(const char *key, int len);
extern void dlock_lock_for_write(const char *key, int len);
extern void dlock_unlock_write(const char *key, int len);
extern bool dlock_lock_for_slot_grant(const char *key, int len);
extern void dlock_unlock_slot_grant(const char *key, int len);
extern bool dlock_lock_for_new_slot(const char *key, int len);
extern bool dlock_lock_for_look(const char *key, int len);
extern void dlock_unlock_look(const char *key, int len);
extern void dlock_lock_for_owner_op(const char *key, int len);
extern void dlock_lock_for_ending(const char *key, int len);
extern void dlock_unlock_owner_op(const char *key, int len, bool ending);
extern DlockKeyLockHeld dlock_key_lock_held(const char *key, int len);
extern int64 dlock_session_mark(const char *key, int len);
extern bool dlock_session_alive(int64 session_id);
extern bool dlock_session_alive_in(Oid db, int64 session_id);
extern void dlock_syncrep_wait_lock(XLogRecPtr lsn, bool lock);

/* wait.c */
extern void dlock_wait_init(void);
extern Size dlock_wait_shmem_size(void);
extern void dlock_wait_shmem_startup(LWLock *lock);
extern void dlock_wait_remember(uint64 h, bool lease_change);
extern void dlock_wake_key(uint64 h, bool lease_change);
extern bool dlock_wait_keys_locked(void);
extern void dlock_wait_xact_end(void);
extern void dlock_wait_register(const char *key, int len, bool busy);
extern void dlock_wait_unregister(const char *key, int len, bool busy);
extern bool dlock_queue_enter(const char *key, int len, int32 permits);
extern bool dlock_queue_is_head(void);
extern bool dlock_queue_others(const char *key, int len);
extern void dlock_queue_leave(void);
extern void dlock_sleep_until(TimestampTz wake_at);

/* keyhash.c */
extern uint64 dlock_key_hash(const char *key, int len);
extern int	dlock_slot_key(char *buf, const char *key, int len, int slot);
extern int	dlock_base_key_len(const char *key, int len);
extern int	dlock_key_slot(const char *key, int len);

/*
 * Fill *tag with the lock tag of hash h (dlock_key_hash) in lock space space
 * (DLOCK_SPACE_*), in this database.  Inline: every key lock taken or given
 * back builds one.
 */
static inline void
dlock_hash_locktag(LOCKTAG *tag, uint64 h, uint16 space)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32),
						 (uint32) h, space);
}

/* args.c */
extern void dlock_no_parallel(FunctionCallInfo fcinfo);
extern void dlock_check_writable(void);
extern void dlock_null_argument(FunctionCallInfo fcinfo, const char *name);
extern void dlock_check_key(const char *key, int len);
extern text *dlock_key_arg(FunctionCallInfo fcinfo, int argno);
extern int64 dlock_ttl_arg(FunctionCallInfo fcinfo, int argno);
extern bool dlock_wait_arg(FunctionCallInfo fcinfo, int argno, int64 *usecs);
extern int64 dlock_lock_delay_arg(FunctionCallInfo fcinfo, int argno);
extern int64 dlock_interval_usecs(const Interval *span);
extern Datum dlock_usecs_interval(int64 usecs);
extern bool dlock_bool_arg(FunctionCallInfo fcinfo, int argno, const char *name,
						   bool dflt);
extern int64 dlock_age_arg(FunctionCallInfo fcinfo, int argno);
extern pg_uuid_t *dlock_owner_arg(FunctionCallInfo fcinfo, int argno);
extern text *dlock_holder_arg(FunctionCallInfo fcinfo, int argno);
extern text *dlock_value_arg(FunctionCallInfo fcinfo, int argno);
extern char *dlock_interval_text(FunctionCallInfo fcinfo, int argno);
extern int32 dlock_permits_arg(FunctionCallInfo fcinfo, int permits_argno,
							   int mode_argno);

/* settings.c */
extern int	dlock_max_ttl_ms;
extern bool dlock_fence_bypass;
extern int	dlock_max_hold_ms;
extern int	dlock_stats_max;
extern bool dlock_log_events;
extern bool dlock_notify;
extern bool dlock_async_release;
extern int	dlock_horizon_margin_ms;
extern int	dlock_storage_mode;
extern int	dlock_memory_max_keys;
extern int	dlock_memory_max_keys_per_db;
extern int	dlock_memory_max_databases;
extern void dlock_define_settings(void);
extern void dlock_settings_check(void);

/* common.c */
extern void dlock_random(void *buf, size_t len, const char *what);
extern HTAB *dlock_xact_hash(DlockXactHash *xh, const char *name,
							 Size keysize, Size entrysize, int flags,
							 bool create);

#pragma GCC visibility pop

#endif							/* DLOCK_H */
