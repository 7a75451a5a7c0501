/*-------------------------------------------------------------------------
 *
 * storage.c
 *		The one seam between the lease API and where leases are kept: read,
 *		grant, set the end of, scan and prune leases, in the table
 *		dlock.leases (leasetable.c) or, with dlock.storage = memory, in
 *		shared memory (memstore.c).  The mode is picked once per call, by
 *		choosing one of the two sets of methods below.
 *
 * Each method combines its storage with what every grant needs whatever the
 * mode: a new owner and session mark, a token drawn and made durable before
 * it is returned (durable.c), and the commit mode of the transaction.
 *
 * Table mode.  A grant or renewal forces its transaction's commit to be
 * synchronous, so a lease that was returned survives a crash; a release
 * that is all its transaction wrote commits asynchronously (durable.c).
 * After a switch back from memory mode, every key is held by an unknown
 * owner until memory mode's horizon has passed (horizon.c).
 *
 * Memory mode.  The leases live in memstore.c's shared hash instead of the
 * table, and nothing about rows applies: a grant's commit is not forced
 * synchronous.  What stays durable is the token (as above) and the horizon
 * (horizon.c): a time no lease outlives, moved ahead before a lease that
 * would outlive it is returned, and read after every start as the barrier
 * before which every key is held by an unknown owner.
 *
 * Owns: nothing but the choice.  Calls leasetable.c, horizon.c,
 * memstore.c, durable.c, objects.c, liveness.c, keylock.c (session marks),
 * args.c and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "dlock.h"

/* What each storage mode does (see the file header). */
typedef struct StorageMethods
{
	void		(*read) (const char *key, int len, DlockLease *lease);
	bool		(*grant) (text *key, TimestampTz now, TimestampTz end,
						  TimestampTz hold_limit,
						  const DlockGrantOptions *opts, DlockLease *lease);
	void		(*set_end) (text *key, TimestampTz end, bool release);
	void		(*set_value) (text *key, text *value);
	bool		(*set_slots) (text *key, int32 nslots);
	DlockLeaseRow *(*read_row) (const char *key, int len);
	List	   *(*scan) (void);
	List	   *(*old_keys) (TimestampTz cutoff);
	bool		(*delete_old) (text *key, TimestampTz cutoff, bool force);
} StorageMethods;

static const StorageMethods table_methods;
static const StorageMethods memory_methods;

/* The methods of the mode in force. */
#define METHODS()	(dlock_memory_mode() ? &memory_methods : &table_methods)

/* Fill *owner with a version 4 UUID from the strong random source. */
static void
new_owner(pg_uuid_t *owner)
{
	dlock_random(owner->data, UUID_LEN, "owner token");
	owner->data[6] = (owner->data[6] & 0x0f) | 0x40;	/* version 4 */
	owner->data[8] = (owner->data[8] & 0x3f) | 0x80;	/* RFC 4122 variant */
}

/*
 * Fill *lease with a new lease of key for [now, end): a new owner, and the
 * connection's session mark if it is session-bound; no token yet.
 */
static void
new_lease(DlockLease *lease, const char *key, int len, TimestampTz now,
		  TimestampTz end, TimestampTz hold_limit,
		  const DlockGrantOptions *opts)
{
	memset(lease, 0, sizeof(DlockLease));
	new_owner(&lease->owner);
	lease->found = true;
	lease->held = true;
	lease->expires_at = end;
	lease->granted_at = now;
	lease->lock_delay = opts->lock_delay;
	lease->hold_limit = hold_limit;
	lease->nslots = opts->nslots;
	if (opts->session_bound)
		lease->session_id = dlock_session_mark(key, len);
}

/* ---------------------------------------------------------------------
 * Table mode
 * ---------------------------------------------------------------------
 */

/*
 * The lease of key as its row says, and, until memory mode's horizon has
 * passed after a switch back, as the horizon says.
 */
static void
table_read(const char *key, int len, DlockLease *lease)
{
	dlock_table_read(key, len, lease);
	dlock_horizon_table_read(lease);
}

/*
 * Grant in the table: the row of key holds the new lease, its token is
 * durable, and the transaction will commit synchronously.
 */
static bool
table_grant(text *key, TimestampTz now, TimestampTz end,
			TimestampTz hold_limit, const DlockGrantOptions *opts,
			DlockLease *lease)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	DlockTableChange c;
	bool		written;

	dlock_table_begin_change(&c);
	dlock_table_check_grant(&c, opts);
	new_lease(lease, k, len, now, end, hold_limit, opts);
	lease->fence = dlock_draw_token();
	written = dlock_table_put_grant(&c, k, len, lease, opts);
	dlock_table_end_change(&c);
	if (!written)
		return false;			/* the token drawn is never shown */
	dlock_force_synchronous_commit();
	dlock_secure_drawn_token();
	return true;
}

/*
 * Set the end of the row of key: a renewal commits synchronously, a
 * release-only transaction asynchronously (durable.c).
 */
static void
table_set_end(text *key, TimestampTz end, bool release)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	DlockTableChange c;
	bool		release_only;

	dlock_table_begin_change(&c);
	/* nothing but releases written so far: no xid, or only our releases */
	release_only = dlock_release_only_so_far(release);
	dlock_table_put_end(&c, k, len, end, release);
	dlock_table_end_change(&c);
	if (!release)
		dlock_force_synchronous_commit();
	/* remember where the WAL of a release-only transaction ends */
	dlock_note_release_only(release_only);
}

/* Every row, each as a grant would meet it (an unknown owner before the horizon). */
static void
table_set_value(text *key, text *value)
{
	DlockTableChange c;

	dlock_table_begin_change(&c);
	dlock_table_put_value(&c, VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key), value);
	dlock_table_end_change(&c);
	/* acknowledged only once the synchronous standbys have it, as a renewal */
	dlock_force_synchronous_commit();
}

static bool
table_set_slots(text *key, int32 nslots)
{
	DlockTableChange c;
	bool		written;

	dlock_table_begin_change(&c);
	written = dlock_table_put_slots(&c, VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key),
									nslots);
	dlock_table_end_change(&c);
	return written;
}

/*
 * The row of key, as a grant would meet it: before the horizon of a switch
 * back from memory mode, a key without a row is held by an unknown owner
 * too, as in memory mode (observe() and leader() must not call it free
 * while every grant of it is refused).
 */
static DlockLeaseRow *
table_read_row(const char *key, int len)
{
	DlockLeaseRow *row = dlock_table_read_row(key, len);
	DlockLease	none;

	if (row != NULL)
	{
		dlock_horizon_table_scanned(&row->lease);
		return row;
	}
	memset(&none, 0, sizeof(none));
	dlock_horizon_table_scanned(&none);
	if (!none.unknown)
		return NULL;
	row = palloc0(sizeof(DlockLeaseRow));
	row->key = cstring_to_text_with_len(key, len);
	row->lease = none;
	return row;
}

static List *
table_scan(void)
{
	List	   *rows = dlock_table_scan();
	ListCell   *lc;

	foreach(lc, rows)
		dlock_horizon_table_scanned(&((DlockLeaseRow *) lfirst(lc))->lease);
	return rows;
}

/* Delete the row of key if it ended before cutoff (or force). */
static bool
table_delete_old(text *key, TimestampTz cutoff, bool force)
{
	return dlock_table_delete_old(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key),
								  cutoff, force);
}

static const StorageMethods table_methods = {
	.read = table_read,
	.grant = table_grant,
	.set_end = table_set_end,
	.set_value = table_set_value,
	.set_slots = table_set_slots,
	.read_row = table_read_row,
	.scan = table_scan,
	.old_keys = dlock_table_old_keys,
	.delete_old = table_delete_old,
};

/* ---------------------------------------------------------------------
 * Memory mode
 * ---------------------------------------------------------------------
 */

/*
 * Memory mode: this database's barrier, until which every key is held by
 * the unknown owner *unknown (0, or a time past: nobody any more).
 */
static TimestampTz
memory_barrier(pg_uuid_t *unknown)
{
	TimestampTz barrier;
	TimestampTz horizon;

	dlock_objects_find();
	dlock_memory_state(&barrier, &horizon, unknown, false);
	return barrier;
}

/* The lease of key in shared memory, or before the barrier the unknown owner's. */
static void
memory_read(const char *key, int len, DlockLease *lease)
{
	pg_uuid_t	unknown;
	TimestampTz barrier = memory_barrier(&unknown);

	if (barrier != 0 && GetCurrentTimestamp() < barrier)
		dlock_unknown_lease(lease, barrier, &unknown);
	else
		dlock_mem_read(key, len, lease);
}

/*
 * Grant in memory: the same lease, recorded in memstore.c instead of a row.
 * The horizon and the token are durable before this returns; the
 * transaction's commit is left as it is.  Return false, changing nothing,
 * when a restore moved the database's barrier: every key is held until then.
 */
static bool
memory_grant(text *key, TimestampTz now, TimestampTz end,
			 TimestampTz hold_limit, const DlockGrantOptions *opts,
			 DlockLease *lease)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	bool		seq_only;
	XLogRecPtr	token_lsn;

	dlock_check_writable();
	/* the table's lock, kept: a DROP EXTENSION waits for this transaction */
	dlock_table_keep();
	/* no transaction id yet, or one that only earlier memory grants took */
	seq_only = dlock_seq_only_so_far();
	new_lease(lease, k, len, now, end, hold_limit, opts);

	if (!dlock_secure_horizon(end + opts->lock_delay))
		return false;			/* every key is held until the new barrier */
	lease->fence = dlock_mem_draw_token(&token_lsn);
	dlock_raise_synchronous_commit();
	dlock_confirm_lsn(token_lsn, true);

	dlock_mem_write(k, len, lease, opts);

	/*
	 * The sequences' WAL, which may have taken a transaction id so that the
	 * commit would flush it, is flushed already: unless the transaction
	 * writes something else, its commit need not wait for a flush.
	 */
	dlock_note_seq_only(seq_only);
	return true;
}

/* Set the end of key's lease in memory, moving the horizon for a renewal. */
static void
memory_set_end(text *key, TimestampTz end, bool release)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	DlockLease	lease;

	dlock_check_writable();
	dlock_table_keep();			/* as in a grant */
	dlock_mem_read(k, len, &lease);
	if (!lease.found)
		elog(ERROR, "dlock: lease of a held key vanished");
	if (!release)
		(void) dlock_secure_horizon(end + lease.lock_delay);
	lease.expires_at = end;
	if (release)
	{
		lease.held = false;
		memset(&lease.owner, 0, sizeof(pg_uuid_t));
	}
	dlock_mem_write(k, len, &lease, NULL);
}

static void
memory_set_value(text *key, text *value)
{
	dlock_check_writable();
	dlock_table_keep();			/* as in a grant */
	dlock_mem_write_value(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key), value);
}

static bool
memory_set_slots(text *key, int32 nslots)
{
	const char *k = VARDATA_ANY(key);
	int			len = VARSIZE_ANY_EXHDR(key);
	DlockLease	lease;

	dlock_check_writable();
	dlock_table_keep();			/* as in a grant */
	dlock_mem_read(k, len, &lease);
	if (!lease.found)
	{
		/* no lease, token 0: a key whose only leases are its slots' */
		lease.found = true;
		lease.held = false;
		lease.fence = 0;
		lease.granted_at = lease.expires_at = GetCurrentTimestamp();
		lease.hold_limit = DT_NOEND;
	}
	lease.nslots = nslots;
	dlock_mem_write(k, len, &lease, NULL);
	return true;
}

static DlockLeaseRow *
memory_read_row(const char *key, int len)
{
	pg_uuid_t	unknown;
	TimestampTz barrier = memory_barrier(&unknown);
	DlockLeaseRow *row;

	if (barrier != 0 && GetCurrentTimestamp() < barrier)
	{
		/* before the barrier every key is held by an unknown owner */
		row = palloc0(sizeof(DlockLeaseRow));
		row->key = cstring_to_text_with_len(key, len);
		dlock_unknown_lease(&row->lease, barrier, &unknown);
		return row;
	}
	return dlock_mem_read_row(key, len);
}

/* Every entry of this database; none before the barrier. */
static List *
memory_scan(void)
{
	pg_uuid_t	unknown;
	TimestampTz barrier = memory_barrier(&unknown);

	/* before the barrier every key is held by an unknown owner */
	if (barrier != 0 && GetCurrentTimestamp() < barrier)
		return NIL;
	return dlock_mem_scan();
}

/* The keys of this database whose lease ended before cutoff. */
static List *
memory_old_keys(TimestampTz cutoff)
{
	List	   *keys = NIL;
	ListCell   *lc;

	dlock_objects_find();
	foreach(lc, dlock_mem_scan())
	{
		DlockLeaseRow *row = (DlockLeaseRow *) lfirst(lc);

		if (dlock_lease_ended_at(&row->lease, MyDatabaseId) < cutoff)
			keys = lappend(keys, row->key);
	}
	return keys;
}

/* Delete the entry of key if it ended before cutoff (or force), at once. */
static bool
memory_delete_old(text *key, TimestampTz cutoff, bool force)
{
	dlock_check_writable();
	dlock_objects_find();
	return dlock_mem_delete_old(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key),
								cutoff, force);
}

static const StorageMethods memory_methods = {
	.read = memory_read,
	.grant = memory_grant,
	.set_end = memory_set_end,
	.set_value = memory_set_value,
	.set_slots = memory_set_slots,
	.read_row = memory_read_row,
	.scan = memory_scan,
	.old_keys = memory_old_keys,
	.delete_old = memory_delete_old,
};

/* ---------------------------------------------------------------------
 * The seam
 * ---------------------------------------------------------------------
 */

/*
 * Read the current state of key into *lease, with a fresh snapshot.  No
 * lock of any key is needed or taken; the caller decides which one makes
 * the answer stable.  Before the barrier (horizon.c) every key reads as
 * held by an unknown owner.
 */
void
dlock_read_lease(const char *key, int len, DlockLease *lease)
{
	METHODS()->read(key, len, lease);
}

/*
 * Grant key for [now, end) to a new owner, drawing a new token; fill
 * *lease with the new lease and return true.  The caller holds the key's
 * grant lock and has seen no live lease under it.  The token is durable
 * before this returns, and in table mode the transaction will commit
 * synchronously.  Return false, changing nothing, when the key is busy:
 * its row is being deleted by a prune() that has not committed yet, or (in
 * memory mode) a restore moved the barrier.
 */
bool
dlock_storage_grant(text *key, TimestampTz now, TimestampTz end,
					TimestampTz hold_limit, const DlockGrantOptions *opts,
					DlockLease *lease)
{
	return METHODS()->grant(key, now, end, hold_limit, opts, lease);
}

/*
 * Set the end of key's lease to end, keeping its owner (a renewal, whose
 * commit will then be synchronous) or clearing it (a release, whose commit
 * is asynchronous when the transaction writes nothing else: losing it in a
 * crash only delays the key's availability until the lease expires).  The
 * caller holds the key's owner op lock (and its ending lock, for a release
 * or an earlier end) and has checked the owner.
 */
void
dlock_storage_set_end(text *key, TimestampTz end, bool release)
{
	METHODS()->set_end(key, end, release);
}

/*
 * Return every lease of this database (a List of DlockLeaseRow), as of a
 * fresh snapshot, for the views.
 */
/* Set the value of key's lease, held by the caller (proclaim). */
void
dlock_storage_set_value(text *key, text *value)
{
	METHODS()->set_value(key, value);
}

/*
 * Record that key has used nslots slot keys (its permits, its shared
 * leases), creating its row, with no lease, when it has none.  The caller
 * holds the key's new-slot lock.  Return false when the key is busy (a
 * prune() deleting its row has not committed yet).
 */
bool
dlock_storage_set_slots(text *key, int32 nslots)
{
	return METHODS()->set_slots(key, nslots);
}

/*
 * Return key's lease with its holder label and value, as the views show
 * it, or NULL when the key has none; an unknown lease (memory mode's
 * barrier) has no label nor value.
 */
DlockLeaseRow *
dlock_storage_read_row(const char *key, int len)
{
	return METHODS()->read_row(key, len);
}

List *
dlock_storage_scan(void)
{
	return METHODS()->scan();
}

/*
 * Return the keys (a List of text) whose lease was released or expired
 * before cutoff, as of a fresh snapshot.
 */
List *
dlock_storage_old_keys(TimestampTz cutoff)
{
	return METHODS()->old_keys(cutoff);
}

/*
 * Delete the lease of key if it was released or expired before cutoff, or
 * in any case when force is set; return whether it did.  The caller holds
 * the key's grant lock.  A row that another prune() is deleting is left to
 * it, without waiting.
 */
bool
dlock_storage_delete_old(text *key, TimestampTz cutoff, bool force)
{
	return METHODS()->delete_old(key, cutoff, force);
}

/* A subtransaction abort drops memory mode's changes made inside it. */
static void
storage_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						 SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		dlock_mem_subxact_abort(mySubid);
}

/*
 * At the end of a transaction: memory mode publishes or drops its changes,
 * then durable.c settles the commit mode.
 */
static void
storage_xact_callback(XactEvent event, void *arg)
{
	dlock_mem_xact_callback(event);
	dlock_durable_xact_callback(event);
}

/* Set up the end-of-transaction work; called once from _PG_init. */
void
dlock_storage_init(void)
{
	RegisterSubXactCallback(storage_subxact_callback, NULL);
	RegisterXactCallback(storage_xact_callback, NULL);
}
