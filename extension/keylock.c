/*-------------------------------------------------------------------------
 *
 * keylock.c
 *		Key locks, named by what the caller intends, with their conflict
 *		matrix; the session marks of session-bound leases; the lock that
 *		lets one backend at a time wait for a WAL position.
 *
 * A key is serialized with heavyweight advisory locks whose tag is
 * (database, 64 bits of the key's SHA-256, lock space).  Applications' own
 * pg_advisory_lock() calls use lock spaces 1 and 2; ours are distinct, so
 * the two never collide.  Keys whose hashes collide merely share a lock:
 * that costs concurrency, never correctness, because the lease row itself
 * is looked up by the full key.  pg_locks shows our locks as locktype
 * 'advisory' with objsubid equal to the lock space.
 *
 * The conflict matrix.  Every mode on the key lock, who takes it, and why:
 *
 *	intent		mode				taken by
 *	grant		ExclusiveLock		try_acquire, acquire, prune; NEVER waits
 *	write		ShareLock			fenced writes, use_fence, check_fence
 *	owner op	RowShareLock		renew and release, to check the owner
 *	ending		RowExclusiveLock	release, and a renew that shortens
 *	slot grant	RowExclusiveLock	a grant of a permit or shared lease,
 *									on the key (its slot key has its own
 *									locks, as any key); NEVER waits
 *
 *				grant	write	owner op	ending	slot grant
 *	grant		  x		  x		  x			  x		  x
 *	write		  x		  .		  .			  x		  x
 *	owner op	  x		  .		  .			  .		  .
 *	ending		  x		  x		  .			  .		  .
 *	slot grant	  x		  x		  .			  .		  .
 *
 * plus the owner-op lock (its own space, ExclusiveLock) that keeps renew
 * and release of one key from running at once, and the new-slot lock (its
 * own space, ExclusiveLock, never waited for) that serializes the records
 * of a key's growing slot count.  So a grant of the key's exclusive lease
 * and a grant of one of its slots exclude each other; the exclusive grant
 * also takes, as a grant, the lock of every slot key whose lease is held,
 * which orders it after the writers under those leases.  The slots' own
 * writers and owner ops lock only their slot key.
 *
 * The rules that make this safe in the lock manager's *queue*, not only
 * in the table above:
 *
 * 1. A grant never waits in the lock manager.  It is taken conditionally,
 *	  and only after a read without any lock found no live lease (lease.c).
 *	  A request that waited would make every later conflicting request
 *	  (the holder's renew, its next writer) wait behind it, for a key that
 *	  is not even free.  So a competitor can never delay the holder: it
 *	  sleeps on its latch instead, registered as a waiter (wait.c).
 * 2. Writers never conflict with owner ops: the holder can renew from
 *	  another connection while one of its transactions writes.
 * 3. Ending a lease (release, or a renew that moves the expiry earlier)
 *	  waits for the transactions writing under it.  So while a writer holds
 *	  its ShareLock, its key's token cannot change and its lease cannot end
 *	  or get shorter except by running out, which lets fence.c verify a
 *	  key once per transaction and then only compare the clock with the
 *	  expiry it read.  Ending is taken only after the owner op lock has
 *	  shown the caller to be the owner: a stranger's release never queues
 *	  in front of the holder's writers.
 *
 * Session marks.  A session-bound lease names its connection by a random
 * 64-bit mark, held by that connection as a session-level ExclusiveLock
 * in its own lock space for as long as the connection lives.  The lease is
 * live only while somebody holds that lock: a connection that ends, is
 * terminated or crashes (which restarts the server) gives it up, and so do
 * DISCARD ALL and pg_advisory_unlock_all(), which end a connection's
 * session-level advisory locks: a pooler's reset ends the leases that the
 * previous client bound to the connection.  Nobody else can take a lock
 * in our spaces (pg_advisory_lock() uses spaces 1 and 2), so a mark cannot
 * be kept alive by anyone but its connection.  A connection that exits
 * wakes the waiters of the keys it took session-bound.
 *
 * Waking waiters is wait.c's: every lock taken here is remembered there
 * (dlock_wait_remember), so that the end of the transaction wakes the
 * key's waiters, and every lock given back early wakes them at once.
 *
 * Owns: the lock spaces' use (DLOCK_SPACE_* in dlock.h), the connection's
 * session mark.  Calls wait.c, keyhash.c, common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "storage/sinvaladt.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

#include "dlock.h"

static void session_mark_check(void);

/*
 * Refuse PREPARE TRANSACTION when the transaction holds key locks: their
 * release by COMMIT PREPARED would wake nobody.  At the end of every
 * transaction, notice a session mark given up by DISCARD ALL or
 * pg_advisory_unlock_all().
 */
static void
keylock_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PREPARE)
		dlock_wait_xact_end();
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT)
		session_mark_check();
	if (event == XACT_EVENT_PRE_PREPARE && dlock_wait_keys_locked())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot PREPARE a transaction that has used dlock"),
				 errdetail("The transaction holds key locks of dlock leases or fenced writes."),
				 errhint("Grant, renew, release and write under leases in transactions that commit directly.")));
}

/* Set up the end-of-transaction checks; called once from _PG_init. */
void
dlock_keylock_init(void)
{
	RegisterXactCallback(keylock_xact_callback, NULL);
}

/* Take the lock on key in space and mode (waiting unless nowait). */
static bool
take(const char *key, int len, uint16 space, LOCKMODE mode, bool nowait)
{
	LOCKTAG		tag;
	uint64		h = dlock_key_hash(key, len);

	dlock_hash_locktag(&tag, h, space);
	if (LockAcquire(&tag, mode, false, nowait) == LOCKACQUIRE_NOT_AVAIL)
		return false;
	/* only writers' ShareLock never comes with a change of the lease */
	dlock_wait_remember(h, mode != ShareLock);
	/* the waiters for a slot's key wait on the key (see wake) */
	if (dlock_base_key_len(key, len) != len)
		dlock_wait_remember(dlock_key_hash(key, dlock_base_key_len(key, len)),
							mode != ShareLock);
	return true;
}

/*
 * Wake the waiters of key (with lease_change, also those for its lease),
 * and for a slot key those of its key: acquirers and observers wait on the
 * key, whichever of its slots they will get or see.
 */
static void
wake(const char *key, int len, bool lease_change)
{
	int			base = dlock_base_key_len(key, len);

	dlock_wake_key(dlock_key_hash(key, len), lease_change);
	if (base != len)
		dlock_wake_key(dlock_key_hash(key, base), lease_change);
}

/* Give back one hold of the lock on key in space and mode. */
static void
give_back(const char *key, int len, uint16 space, LOCKMODE mode)
{
	LOCKTAG		tag;

	dlock_hash_locktag(&tag, dlock_key_hash(key, len), space);
	LockRelease(&tag, mode, false);
}

/*
 * Take key's lock for a grant, if it is free at once; never wait (rule 1
 * above).  On success it is held until the end of the transaction, unless
 * given back with dlock_unlock_grant.
 */
bool
dlock_lock_for_grant(const char *key, int len)
{
	return take(key, len, DLOCK_SPACE_KEY, ExclusiveLock, true);
}

/* Give back the lock of a grant that did not happen, and wake waiters. */
void
dlock_unlock_grant(const char *key, int len)
{
	give_back(key, len, DLOCK_SPACE_KEY, ExclusiveLock);
	wake(key, len, false);
}

/*
 * Take key's lock for a write under its lease, waiting for a grant or an
 * ending in progress.  Held until the end of the transaction (or of the
 * subtransaction, if that aborts).
 */
void
dlock_lock_for_write(const char *key, int len)
{
	(void) take(key, len, DLOCK_SPACE_KEY, ShareLock, false);
}

/* Give back one write lock (check_fence keeps none), and wake waiters. */
void
dlock_unlock_write(const char *key, int len)
{
	give_back(key, len, DLOCK_SPACE_KEY, ShareLock);
	wake(key, len, false);
}

/*
 * Take key's lock for a grant of one of its slots (a permit, a shared
 * lease), if it is free at once; never wait.  The mode excludes a grant of
 * the key's exclusive lease and the writers under it (its lease may have
 * just run out), not other slots' grants nor anything of the slots.  Held
 * until the end of the transaction, unless given back with
 * dlock_unlock_slot_grant.
 */
bool
dlock_lock_for_slot_grant(const char *key, int len)
{
	return take(key, len, DLOCK_SPACE_KEY, RowExclusiveLock, true);
}

/* Give back the lock of a slot grant that did not happen, and wake waiters. */
void
dlock_unlock_slot_grant(const char *key, int len)
{
	give_back(key, len, DLOCK_SPACE_KEY, RowExclusiveLock);
	wake(key, len, false);
}

/*
 * Take key's lock for recording that it uses one more slot key, if it is
 * free at once; never wait.  Serializes those records among the slot
 * grants of the key, which do not exclude each other.  Held until the end
 * of the transaction.
 */
bool
dlock_lock_for_new_slot(const char *key, int len)
{
	return take(key, len, DLOCK_SPACE_NEW_SLOT, ExclusiveLock, true);
}

/*
 * Take key's owner-op lock in a mode that only owner ops conflict with, if
 * it is free at once (never wait): a look under it sees no renewal, release
 * or proclaim in flight.  For observe(), which must not hold up grants.
 * Give it back with dlock_unlock_look.
 */
bool
dlock_lock_for_look(const char *key, int len)
{
	return take(key, len, DLOCK_SPACE_OWNER_OPS, ShareLock, true);
}

/* Give back the lock of dlock_lock_for_look (no change: nobody to wake). */
void
dlock_unlock_look(const char *key, int len)
{
	give_back(key, len, DLOCK_SPACE_OWNER_OPS, ShareLock);
}

/*
 * Take key's locks for renew or release: the key lock in a mode that
 * excludes only grants, and the owner-op lock.  The caller then checks the
 * owner, and takes dlock_lock_for_ending before it ends or shortens the
 * lease.
 */
void
dlock_lock_for_owner_op(const char *key, int len)
{
	(void) take(key, len, DLOCK_SPACE_KEY, RowShareLock, false);
	(void) take(key, len, DLOCK_SPACE_OWNER_OPS, ExclusiveLock, false);
}

/*
 * Take key's lock for ending its lease or moving its expiry earlier:
 * waits for the transactions writing under the lease to end.  Only after
 * dlock_lock_for_owner_op and the owner check.
 */
void
dlock_lock_for_ending(const char *key, int len)
{
	(void) take(key, len, DLOCK_SPACE_KEY, RowExclusiveLock, false);
}

/*
 * Give back the locks of an owner op that changed nothing (with ending, if
 * dlock_lock_for_ending was taken too), and wake waiters: a caller without
 * the owner must not hold the key up by leaving its transaction open.
 */
void
dlock_unlock_owner_op(const char *key, int len, bool ending)
{
	if (ending)
		give_back(key, len, DLOCK_SPACE_KEY, RowExclusiveLock);
	give_back(key, len, DLOCK_SPACE_OWNER_OPS, ExclusiveLock);
	give_back(key, len, DLOCK_SPACE_KEY, RowShareLock);
	wake(key, len, false);
}

/* This connection's session mark (0: none taken yet). */
static int64 session_mark = 0;

/* Hashes of the keys this connection took session-bound (shmem exit). */
static HTAB *bound_keys = NULL;

/* Fill *tag with the lock tag of session mark mark. */
static void
mark_locktag(LOCKTAG *tag, int64 mark)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) ((uint64) mark >> 32),
						 (uint32) mark, DLOCK_SPACE_SESSIONS);
}

/*
 * Forget the session mark (given up already) and wake the waiters of every
 * key this connection took session-bound: their leases have ended.
 */
static void
session_mark_lost(void)
{
	HASH_SEQ_STATUS status;
	uint64	   *h;

	session_mark = 0;
	if (bound_keys == NULL)
		return;
	hash_seq_init(&status, bound_keys);
	while ((h = hash_seq_search(&status)) != NULL)
		dlock_wake_key(*h, true);
	hash_destroy(bound_keys);
	bound_keys = NULL;
}

/*
 * At the end of a transaction: if DISCARD ALL or pg_advisory_unlock_all()
 * gave up the session mark, its leases have ended; wake their waiters.
 */
static void
session_mark_check(void)
{
	LOCKTAG		tag;

	if (session_mark == 0)
		return;
	mark_locktag(&tag, session_mark);
	if (!LockHeldByMe(&tag, ExclusiveLock))
		session_mark_lost();
}

/*
 * At exit, give up the session mark and wake the waiters of every key this
 * connection took session-bound: their leases end now, not at their TTL.
 * Runs before the backend's locks are released in general, so the mark is
 * given up first, explicitly.
 */
static void
session_exit(int code, Datum arg)
{
	LOCKTAG		tag;

	if (session_mark == 0)
		return;
	mark_locktag(&tag, session_mark);
	if (LockHeldByMe(&tag, ExclusiveLock))
		LockRelease(&tag, ExclusiveLock, true);
	session_mark_lost();
}

/*
 * Return this connection's session mark for a session-bound grant of key,
 * taking one if it has none (or lost it to DISCARD ALL or
 * pg_advisory_unlock_all(): the leases bound to the old mark stay ended).
 */
int64
dlock_session_mark(const char *key, int len)
{
	LOCKTAG		tag;
	uint64		h = dlock_key_hash(key, len);
	uint64		base_h = dlock_key_hash(key, dlock_base_key_len(key, len));
	bool		found;

	session_mark_check();
	if (session_mark == 0)
	{
		int64		mark;
		static bool exit_registered = false;

		do
		{
			dlock_random(&mark, sizeof(mark), "session mark");
		} while (mark == 0);
		mark_locktag(&tag, mark);
		/* a fresh random tag: nobody else can hold it */
		if (LockAcquire(&tag, ExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
			ereport(ERROR,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("could not take a session mark for a session-bound lease"),
					 errhint("Try again.")));
		session_mark = mark;
		if (!exit_registered)
		{
			before_shmem_exit(session_exit, (Datum) 0);
			exit_registered = true;
		}
	}
	if (bound_keys == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(uint64);
		ctl.entrysize = sizeof(uint64);
		ctl.hcxt = TopMemoryContext;
		bound_keys = hash_create("dlock session-bound keys", 16, &ctl,
								 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	(void) hash_search(bound_keys, &h, HASH_ENTER, &found);
	(void) hash_search(bound_keys, &base_h, HASH_ENTER, &found);
	return session_mark;
}

/*
 * Is the connection that took session mark mark still up (and still
 * holding it)?  Asks the lock manager without waiting: a conditional
 * ShareLock on the mark conflicts exactly with its connection's hold.
 */
bool
dlock_session_alive(int64 mark)
{
	return dlock_session_alive_in(MyDatabaseId, mark);
}

/*
 * Is the connection whose session mark is mark, in database db, still up?
 * (Memory mode looks at other databases' entries when it needs room.)
 */
bool
dlock_session_alive_in(Oid db, int64 mark)
{
	LOCKTAG		tag;

	mark_locktag(&tag, mark);
	tag.locktag_field1 = db;
	if (mark == session_mark && db == MyDatabaseId)
		return LockHeldByMe(&tag, ExclusiveLock);
	if (LockAcquire(&tag, ShareLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
		return true;
	LockRelease(&tag, ShareLock, false);
	return false;
}

/*
 * Which of key's locks does this transaction hold: its grant lock, another
 * mode (it writes under the key, renews or releases it), or none?
 */
DlockKeyLockHeld
dlock_key_lock_held(const char *key, int len)
{
	LOCKTAG		tag;

	dlock_hash_locktag(&tag, dlock_key_hash(key, len), DLOCK_SPACE_KEY);
	if (LockHeldByMe(&tag, ExclusiveLock))
		return DLOCK_HELD_GRANT;
	if (LockHeldByMe(&tag, ShareLock) ||
		LockHeldByMe(&tag, RowShareLock) ||
		LockHeldByMe(&tag, RowExclusiveLock))
		return DLOCK_HELD_OTHER;
	return DLOCK_HELD_NONE;
}

/*
 * Take (lock) or give back the lock that lets one backend at a time wait
 * for the synchronous standbys to confirm WAL position lsn.  Commits never
 * share an LSN, and SyncRepWaitForLSN's queue asserts that no two waiters
 * do; dlock waits for the LSN of a sequence's page, which several backends
 * may need at once: the others wait here (interruptibly) and then find it
 * confirmed.
 */
void
dlock_syncrep_wait_lock(XLogRecPtr lsn, bool lock)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (lsn >> 32),
						 (uint32) lsn, DLOCK_SPACE_SYNCREP);
	if (lock)
		(void) LockAcquire(&tag, ExclusiveLock, false, false);
	else
		LockRelease(&tag, ExclusiveLock, false);
}
