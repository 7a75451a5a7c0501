/*-------------------------------------------------------------------------
 *
 * keylock.c
 *		Key locks, named by what the caller intends, and waiter wake-ups.
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
 *
 *				grant	write	owner op	ending
 *	grant		  x		  x		  x			  x
 *	write		  x		  .		  .			  x
 *	owner op	  x		  .		  .			  .
 *	ending		  x		  x		  .			  .
 *
 * plus the owner-op lock (its own space, ExclusiveLock) that keeps renew
 * and release of one key from running at once.
 *
 * The rules that make this safe in the lock manager's *queue*, not only
 * in the table above:
 *
 * 1. A grant never waits in the lock manager.  It is taken conditionally,
 *	  and only after a read without any lock found no live lease (lease.c).
 *	  A request that waited would make every later conflicting request
 *	  (the holder's renew, its next writer) wait behind it, for a key that
 *	  is not even free.  So a competitor can never delay the holder: it
 *	  sleeps on its latch instead, registered as a waiter (below).
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
 * Wake-ups.  Whoever gives up a key lock wakes the acquirers waiting for
 * the key: at once after an early release of the lock, and after the
 * end of the transaction (a resource-release callback that runs once the
 * transaction's locks are gone, so the woken waiter sees the commit and
 * finds the lock free).  Waiters hold ShareLock on the key's tag in the
 * waiter space, which nobody ever takes in a conflicting mode; a waker
 * asks the lock manager who holds it.  There are two waiter spaces: one
 * for acquirers waiting for a live lease to end (woken only by the end of
 * a transaction that took a lease-changing lock: grant, owner op, ending),
 * one for acquirers waiting for a busy key lock (woken whenever any key
 * lock is given up, a writer's too).  A waiter registers before it looks,
 * so no wake-up can slip between its look and its sleep.  Spurious
 * wake-ups are harmless: a waiter looks again and sleeps again.  (When the
 * module is preloaded only the head of a key's FIFO queue registers; see
 * shmem.c.  Registrations are then also counted in shared memory, per
 * bucket of keys, before the waiter looks: a waker that finds no count
 * after its change skips the lock manager, and a waiter counted too late
 * for it looks after the change.)
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

/* Lock spaces (locktag_field4); 1 and 2 belong to pg_advisory_lock(). */
#define DLOCK_SPACE_KEY			0x444c	/* the key lock */
#define DLOCK_SPACE_OWNER_OPS	0x444d	/* renew/release among themselves */
#define DLOCK_SPACE_WAITERS		0x444e	/* acquirers waiting for a lease */
#define DLOCK_SPACE_BUSY_WAITERS	0x444f	/* ... for a key lock */
#define DLOCK_SPACE_SESSIONS	0x4450	/* a connection's session mark */
#define DLOCK_SPACE_SYNCREP		0x4451	/* a wait for synchronous standbys */

/* A key this transaction has locked, to wake its waiters at the end. */
typedef struct Touched
{
	uint64		hash;			/* hash key */
	bool		lease_change;	/* locked in a mode that changes leases */
} Touched;

static DlockXactHash touched;

/*
 * This backend's registrations as a waiter, per waiter space (index: busy),
 * as counted in shared memory (dlock_waiters_add).  An error while
 * registered gives up the registration's lock with the (sub)transaction;
 * its count goes at the end of the transaction, or at the next
 * registration.
 */
static struct
{
	uint64		hash;
	bool		counted;
}			counted_wait[2];

static void uncount_waits(int busy);

/*
 * The 64-bit hash that names key in every lock space: the first 8 bytes of
 * its SHA-256 (key_hash below caches it).  A fast hash would do for
 * spreading keys, but not against a role that computes a key whose lock
 * collides with a holder's (the key lock is shared then: its transactions
 * could hold the holder up).  For SHA-256 that is a second preimage of 64
 * bits: about 2^64 tries.
 */
static uint64
sha256_key_hash(const char *key, int len)
{
	uint8		digest[DLOCK_SHA256_LEN];
	uint64		h;

	dlock_sha256(key, len, digest);
	memcpy(&h, digest, sizeof(h));
	return h;
}

/*
 * The hash of the last key hashed, kept for the backend: one call on a key
 * hashes it several times (its lock, its waiters, the wake-ups at the end
 * of the transaction), and a SHA-256 costs more than a key
 * lookup.  A pure function of the key, so the cache is never stale.
 */
static char last_key[DLOCK_MAX_KEY_BYTES];
static int	last_len = -1;
static uint64 last_hash;

/* The 64-bit hash of key (sha256_key_hash), from the cache when it can. */
static uint64
key_hash(const char *key, int len)
{
	if (len == last_len && memcmp(key, last_key, len) == 0)
		return last_hash;
	last_hash = sha256_key_hash(key, len);
	if (len <= DLOCK_MAX_KEY_BYTES)
	{
		memcpy(last_key, key, len);
		last_len = len;
	}
	else
		last_len = -1;
	return last_hash;
}

/* Fill *tag with the lock tag of hash h in lock space space. */
static void
hash_locktag(LOCKTAG *tag, uint64 h, uint16 space)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32),
						 (uint32) h, space);
}

/* Set the latch of every backend registered in space for hash h. */
static void
wake_space(uint64 h, uint16 space)
{
	LOCKTAG		tag;
	VirtualTransactionId *vxids;
	int			nwaiters;

	hash_locktag(&tag, h, space);
	vxids = GetLockConflicts(&tag, ExclusiveLock, &nwaiters);
	for (; VirtualTransactionIdIsValid(*vxids); vxids++)
	{
		PGPROC	   *proc = BackendIdGetProc(vxids->backendId);

		/* A proc that has exited since merely gets a spurious wake-up. */
		if (proc != NULL)
			SetLatch(&proc->procLatch);
	}
}

/*
 * Wake the waiters of the key of hash h that wait for its lock to be
 * free, and with lease_change also those waiting for its lease to end.
 * (Writers commit often; the acquirers waiting for a live lease to end
 * need not wake every time one of the holder's writers commits.)
 */
static void
wake_hash(uint64 h, bool lease_change)
{
	/* nobody registered: the common case, told without the lock manager */
	if (!dlock_waiters_maybe(h))
		return;
	wake_space(h, DLOCK_SPACE_BUSY_WAITERS);
	if (lease_change)
		wake_space(h, DLOCK_SPACE_WAITERS);
}

/*
 * Remember that this transaction locked the key of hash h, so that its end
 * wakes the key's waiters.
 */
static void
remember(uint64 h, bool lease_change)
{
	HTAB	   *htab = dlock_xact_hash(&touched, "dlock locked keys",
										   sizeof(uint64), sizeof(Touched),
										   HASH_BLOBS, true);
	Touched    *t;
	bool		found;

	t = hash_search(htab, &h, HASH_ENTER, &found);
	if (!found)
		t->lease_change = false;
	t->lease_change |= lease_change;
}

/*
 * Once a transaction's locks are released (top level), or a subtransaction
 * abort has released those taken inside it, wake the waiters of every key
 * the transaction locked.
 */
static void
keylock_release_callback(ResourceReleasePhase phase, bool isCommit,
						 bool isTopLevel, void *arg)
{
	HASH_SEQ_STATUS status;
	Touched    *t;

	/*
	 * (No check of MyProc->lxid here: the top-level transaction has already
	 * cleared it.  touched.lxid is cleared at the end of every transaction,
	 * so a valid one is this transaction's.)
	 */
	if (phase != RESOURCE_RELEASE_AFTER_LOCKS || (!isTopLevel && isCommit))
		return;
	if (touched.htab == NULL || touched.lxid == InvalidLocalTransactionId)
		return;
	hash_seq_init(&status, touched.htab);
	while ((t = hash_seq_search(&status)) != NULL)
		wake_hash(t->hash, t->lease_change);
	if (isTopLevel)
		touched.lxid = InvalidLocalTransactionId;	/* emptied at next use */
}

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
		uncount_waits(-1);
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT)
		session_mark_check();
	if (event == XACT_EVENT_PRE_PREPARE &&
		dlock_xact_hash(&touched, NULL, 0, 0, 0, false) != NULL &&
		hash_get_num_entries(touched.htab) > 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot PREPARE a transaction that has used dlock"),
				 errdetail("The transaction holds key locks of dlock leases or fenced writes."),
				 errhint("Grant, renew, release and write under leases in transactions that commit directly.")));
}

/* Set up wake-ups; called once from _PG_init. */
void
dlock_keylock_init(void)
{
	RegisterResourceReleaseCallback(keylock_release_callback, NULL);
	RegisterXactCallback(keylock_xact_callback, NULL);
}

/* Take the lock on key in space and mode (waiting unless nowait). */
static bool
take(const char *key, int len, uint16 space, LOCKMODE mode, bool nowait)
{
	LOCKTAG		tag;
	uint64		h = key_hash(key, len);

	hash_locktag(&tag, h, space);
	if (LockAcquire(&tag, mode, false, nowait) == LOCKACQUIRE_NOT_AVAIL)
		return false;
	/* only writers' ShareLock never comes with a change of the lease */
	remember(h, mode != ShareLock);
	return true;
}

/* Give back one hold of the lock on key in space and mode. */
static void
give_back(const char *key, int len, uint16 space, LOCKMODE mode)
{
	LOCKTAG		tag;

	hash_locktag(&tag, key_hash(key, len), space);
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
	wake_hash(key_hash(key, len), false);
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
	wake_hash(key_hash(key, len), false);
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
	wake_hash(key_hash(key, len), false);
}

/*
 * Announce that this backend sleeps until key's lease changes (busy:
 * until key's lock is given up).  Never blocks: nobody takes a conflicting
 * mode in the waiter spaces.
 */
void
dlock_wait_register(const char *key, int len, bool busy)
{
	LOCKTAG		tag;
	uint64		h = key_hash(key, len);

	/* a registration left behind by a subtransaction's abort: drop it */
	if (counted_wait[busy].counted)
		dlock_waiters_add(counted_wait[busy].hash, -1);
	/* counted first: a waker that misses the count sees our look's change */
	dlock_waiters_add(h, 1);
	counted_wait[busy].hash = h;
	counted_wait[busy].counted = true;
	hash_locktag(&tag, h, busy ? DLOCK_SPACE_BUSY_WAITERS : DLOCK_SPACE_WAITERS);
	(void) LockAcquire(&tag, ShareLock, false, false);
}

/* Withdraw the announcement made by dlock_wait_register. */
void
dlock_wait_unregister(const char *key, int len, bool busy)
{
	LOCKTAG		tag;

	hash_locktag(&tag, key_hash(key, len),
				 busy ? DLOCK_SPACE_BUSY_WAITERS : DLOCK_SPACE_WAITERS);
	LockRelease(&tag, ShareLock, false);
	uncount_waits(busy ? 1 : 0);
}

/*
 * Drop the count of our registration in waiter space busy (0 or 1); with
 * -1, of both.  The registration's lock is gone already (or goes with the
 * transaction).
 */
static void
uncount_waits(int busy)
{
	int			i;

	for (i = 0; i < 2; i++)
	{
		if ((busy == -1 || busy == i) && counted_wait[i].counted)
		{
			counted_wait[i].counted = false;
			dlock_waiters_add(counted_wait[i].hash, -1);
		}
	}
}

/* The 64-bit hash of key that names it in shared memory too. */
uint64
dlock_key_hash(const char *key, int len)
{
	return key_hash(key, len);
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
		wake_hash(*h, true);
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
	uint64		h = key_hash(key, len);
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

	hash_locktag(&tag, key_hash(key, len), DLOCK_SPACE_KEY);
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
