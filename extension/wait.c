/*-------------------------------------------------------------------------
 *
 * wait.c
 *		Waiting for a key: the FIFO queues of acquirers, the waiter spaces
 *		and the wake-ups that follow every key lock given up, the counts of
 *		waiters per bucket of keys, and the sleep itself.
 *
 * Wake-ups.  Whoever gives up a key lock wakes the acquirers waiting for
 * the key: at once after an early release of the lock (keylock.c calls
 * dlock_wake_key), and after the end of the transaction (a resource-release
 * callback that runs once the transaction's locks are gone, so the woken
 * waiter sees the commit and finds the lock free; keylock.c tells us which
 * keys the transaction locked, dlock_wait_remember).  Waiters hold
 * ShareLock on the key's tag in a waiter space, which nobody ever takes in
 * a conflicting mode; a waker asks the lock manager who holds it.  There
 * are two waiter spaces: one for acquirers waiting for a live lease to end
 * (woken only by the end of a transaction that took a lease-changing lock:
 * grant, owner op, ending), one for acquirers waiting for a busy key lock
 * (woken whenever any key lock is given up, a writer's too).  A waiter
 * registers before it looks, so no wake-up can slip between its look and
 * its sleep.  Spurious wake-ups are harmless: a waiter looks again and
 * sleeps again.
 *
 * Counts.  When the module is preloaded, registrations are also counted in
 * shared memory, per bucket of key hashes, before the waiter looks: a
 * waker that finds no count after its change skips the lock manager, and a
 * waiter counted too late for it looks after the change.
 *
 * Queues.  Waiting acquirers of a key are served in arrival order: each
 * waiter takes a ticket in its backend's slot, and only the waiter with
 * the lowest ticket for a key (the head) looks at the key and registers
 * for wake-ups; the others sleep until the head leaves, which wakes the
 * next.  While anyone waits for a key, try_acquire refuses it, so nobody
 * jumps the queue.  Without preloading there are no queues: every waiter
 * is woken and the first to look wins.
 *
 * Owns: the shared struct "dlock waits" (queue slots, tickets, bucket
 * counts) and its LWLock; the backend's registrations and the keys its
 * transaction locked; SQL: the view dlock.waiters.  Calls keyhash.c,
 * args.c and common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/sinvaladt.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/wait_event.h"

#include "dlock.h"

/*
 * One backend's place in a key's queue; ticket 0 when it waits for none.
 * The rest is what the view dlock.waiters shows.
 */
typedef struct WaitSlot
{
	Oid			dbid;
	uint64		hash;
	uint64		ticket;
	int32		permits;		/* what it asks for (DlockGrantOptions) */
	TimestampTz since;
	int16		keylen;
	char		key[DLOCK_MAX_KEY_BYTES];
} WaitSlot;

/*
 * Counts of queued and of registered waiters per bucket of key hashes (a
 * bucket per hash modulo WAIT_BUCKETS, across databases), so that the
 * common case, nobody waiting for the key, is told by one atomic read: a
 * try_acquire then needs no scan of the queue, and the end of a
 * transaction no question to the lock manager per key it locked.
 */

#define WAIT_BUCKETS	1024

typedef struct WaitShared
{
	LWLock	   *queue_lock;		/* slots and next_ticket */
	uint64		next_ticket;
	pg_atomic_uint32 queued[WAIT_BUCKETS];	/* slots with a ticket */
	pg_atomic_uint32 waiting[WAIT_BUCKETS];	/* waiters_add */
	int			nslots;
	WaitSlot	slots[FLEXIBLE_ARRAY_MEMBER];	/* by pgprocno */
} WaitShared;

static WaitShared *shared = NULL;

/* This backend's slot while it is queued, else NULL. */
static WaitSlot *my_slot = NULL;

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

/* Size of the shared struct (shmem.c asks for it when preloading). */
Size
dlock_wait_shmem_size(void)
{
	return add_size(offsetof(WaitShared, slots),
					mul_size(MaxBackends, sizeof(WaitSlot)));
}

/*
 * Set up the shared struct, with lock as the queues' LWLock (shmem.c, at
 * shmem startup, holding AddinShmemInitLock).
 */
void
dlock_wait_shmem_startup(LWLock *lock)
{
	bool		found;

	shared = ShmemInitStruct("dlock waits", dlock_wait_shmem_size(), &found);
	if (!found)
	{
		int			i;

		memset(shared, 0, dlock_wait_shmem_size());
		shared->queue_lock = lock;
		for (i = 0; i < WAIT_BUCKETS; i++)
		{
			pg_atomic_init_u32(&shared->queued[i], 0);
			pg_atomic_init_u32(&shared->waiting[i], 0);
		}
		shared->nslots = MaxBackends;
		shared->next_ticket = 1;
	}
}

/*
 * Count a registration (delta 1) or its withdrawal (-1) of a waiter for the
 * key of hash h.  The increment is a full barrier: it is seen
 * by anyone whose later look could have been missed by the waiter's look
 * that follows it.
 */
static void
waiters_add(uint64 h, int delta)
{
	if (shared == NULL)
		return;
	if (delta > 0)
		pg_atomic_fetch_add_u32(&shared->waiting[h % WAIT_BUCKETS], 1);
	else
		pg_atomic_fetch_sub_u32(&shared->waiting[h % WAIT_BUCKETS], 1);
}

/*
 * May a waiter be registered for the key of hash h?  Called by a waker
 * after its change is made (its locks given up, its commit visible): a
 * waiter that registered before this read is counted, and one that
 * registers after it looks after the change, so it needs no wake-up.
 * Without shared memory, always yes.
 */
static bool
waiters_maybe(uint64 h)
{
	if (shared == NULL)
		return true;
	pg_memory_barrier();
	return pg_atomic_read_u32(&shared->waiting[h % WAIT_BUCKETS]) != 0;
}

/* Set the latch of every backend registered in space for hash h. */
static void
wake_space(uint64 h, uint16 space)
{
	LOCKTAG		tag;
	VirtualTransactionId *vxids;
	int			nwaiters;

	dlock_hash_locktag(&tag, h, space);
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
void
dlock_wake_key(uint64 h, bool lease_change)
{
	/* nobody registered: the common case, told without the lock manager */
	if (!waiters_maybe(h))
		return;
	wake_space(h, DLOCK_SPACE_BUSY_WAITERS);
	if (lease_change)
		wake_space(h, DLOCK_SPACE_WAITERS);
}

/*
 * Remember that this transaction locked the key of hash h, so that its end
 * wakes the key's waiters.
 */
void
dlock_wait_remember(uint64 h, bool lease_change)
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
wait_release_callback(ResourceReleasePhase phase, bool isCommit,
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
		dlock_wake_key(t->hash, t->lease_change);
	if (isTopLevel)
		touched.lxid = InvalidLocalTransactionId;	/* emptied at next use */
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
	uint64		h = dlock_key_hash(key, len);

	/* a registration left behind by a subtransaction's abort: drop it */
	if (counted_wait[busy].counted)
		waiters_add(counted_wait[busy].hash, -1);
	/* counted first: a waker that misses the count sees our look's change */
	waiters_add(h, 1);
	counted_wait[busy].hash = h;
	counted_wait[busy].counted = true;
	dlock_hash_locktag(&tag, h, busy ? DLOCK_SPACE_BUSY_WAITERS : DLOCK_SPACE_WAITERS);
	(void) LockAcquire(&tag, ShareLock, false, false);
}

/* Withdraw the announcement made by dlock_wait_register. */
void
dlock_wait_unregister(const char *key, int len, bool busy)
{
	LOCKTAG		tag;

	dlock_hash_locktag(&tag, dlock_key_hash(key, len),
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
			waiters_add(counted_wait[i].hash, -1);
		}
	}
}

/* Leave the queue if we are in one (at exit, or after an error). */
static void
queue_exit(int code, Datum arg)
{
	dlock_queue_leave();
}

/*
 * Queue up for key.  Return false, queuing nothing, when there are no
 * queues (not preloaded).
 */
bool
dlock_queue_enter(const char *key, int len, int32 permits)
{
	static bool exit_registered = false;
	WaitSlot   *slot;
	uint64		hash;

	if (shared == NULL || MyProc == NULL ||
		MyProc->pgprocno >= shared->nslots)
		return false;
	hash = dlock_key_hash(key, len);
	Assert(my_slot == NULL);
	if (!exit_registered)
	{
		before_shmem_exit(queue_exit, (Datum) 0);
		exit_registered = true;
	}
	slot = &shared->slots[MyProc->pgprocno];
	LWLockAcquire(shared->queue_lock, LW_EXCLUSIVE);
	slot->dbid = MyDatabaseId;
	slot->hash = hash;
	slot->ticket = shared->next_ticket++;
	slot->permits = permits;
	slot->since = GetCurrentTimestamp();
	slot->keylen = Min(len, DLOCK_MAX_KEY_BYTES);
	memcpy(slot->key, key, slot->keylen);
	pg_atomic_fetch_add_u32(&shared->queued[hash % WAIT_BUCKETS], 1);
	LWLockRelease(shared->queue_lock);
	my_slot = slot;
	return true;
}

/* Is this backend first in its key's queue? */
bool
dlock_queue_is_head(void)
{
	bool		head = true;
	int			i;

	if (my_slot == NULL)
		return true;
	LWLockAcquire(shared->queue_lock, LW_SHARED);
	for (i = 0; i < shared->nslots; i++)
	{
		WaitSlot   *s = &shared->slots[i];

		if (s->ticket != 0 && s->ticket < my_slot->ticket &&
			s->hash == my_slot->hash && s->dbid == my_slot->dbid)
		{
			head = false;
			break;
		}
	}
	LWLockRelease(shared->queue_lock);
	return head;
}

/* Does anybody but this backend queue for key? */
bool
dlock_queue_others(const char *key, int len)
{
	bool		others = false;
	uint64		hash;
	int			i;

	if (shared == NULL)
		return false;
	hash = dlock_key_hash(key, len);
	/* (a waiter who queues right after this read came after us, too) */
	if (pg_atomic_read_u32(&shared->queued[hash % WAIT_BUCKETS]) == 0)
		return false;
	LWLockAcquire(shared->queue_lock, LW_SHARED);
	for (i = 0; i < shared->nslots; i++)
	{
		WaitSlot   *s = &shared->slots[i];

		if (s->ticket != 0 && s != my_slot &&
			s->hash == hash && s->dbid == MyDatabaseId)
		{
			others = true;
			break;
		}
	}
	LWLockRelease(shared->queue_lock);
	return others;
}

/*
 * Leave the queue, and wake whoever is first in it now: it is its turn to
 * look at the key.
 */
void
dlock_queue_leave(void)
{
	WaitSlot   *next = NULL;
	int			next_procno = -1;
	int			i;

	if (my_slot == NULL)
		return;
	LWLockAcquire(shared->queue_lock, LW_EXCLUSIVE);
	for (i = 0; i < shared->nslots; i++)
	{
		WaitSlot   *s = &shared->slots[i];

		if (s == my_slot || s->ticket == 0 ||
			s->hash != my_slot->hash || s->dbid != my_slot->dbid)
			continue;
		if (next == NULL || s->ticket < next->ticket)
		{
			next = s;
			next_procno = i;
		}
	}
	my_slot->ticket = 0;
	pg_atomic_fetch_sub_u32(&shared->queued[my_slot->hash % WAIT_BUCKETS], 1);
	LWLockRelease(shared->queue_lock);
	my_slot = NULL;
	if (next_procno >= 0)
		SetLatch(&GetPGProcByNumber(next_procno)->procLatch);
}

/*
 * A waiter's timers are server-clock times (a lease's expiry, the end of a
 * lock delay, the wait's deadline, lock_timeout), but its sleeps are
 * measured on the monotonic clock: after a forward step of the server's
 * clock, a sleep computed before it would last long past the time it was
 * meant to end.  So a waiter sleeps at most DLOCK_WAIT_RECHECK_MS at a
 * time and compares the clock with its timer in between; a backward step
 * needs nothing, since leases then last longer on that same clock.
 */
#define DLOCK_WAIT_RECHECK_MS	1000

/*
 * Sleep on our latch until it is set or the server clock reaches wake_at
 * (DT_NOEND: no timer).
 */
void
dlock_sleep_until(TimestampTz wake_at)
{
	for (;;)
	{
		int			events = WL_LATCH_SET | WL_EXIT_ON_PM_DEATH;
		long		timeout_ms = -1;
		TimestampTz now = GetCurrentTimestamp();
		int			rc;

		if (wake_at != DT_NOEND)
		{
			/* round up, so that a lease is seen expired when we wake */
			timeout_ms = (long) Min((wake_at - now + 999) / 1000,
									DLOCK_WAIT_RECHECK_MS);
			if (timeout_ms < 1)
				timeout_ms = 1;
			events |= WL_TIMEOUT;
		}
		rc = WaitLatch(MyLatch, events, timeout_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		if ((rc & WL_LATCH_SET) || wake_at == DT_NOEND ||
			GetCurrentTimestamp() >= wake_at)
			return;
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * At the end of a transaction (keylock.c's callback): drop the counts of
 * registrations that an error left behind.
 */
void
dlock_wait_xact_end(void)
{
	uncount_waits(-1);
}

/* Has this transaction locked any key (dlock_wait_remember)? */
bool
dlock_wait_keys_locked(void)
{
	return dlock_xact_hash(&touched, NULL, 0, 0, 0, false) != NULL &&
		hash_get_num_entries(touched.htab) > 0;
}

/* Set up the wake-ups at the end of transactions; called once from _PG_init. */
void
dlock_wait_init(void)
{
	RegisterResourceReleaseCallback(wait_release_callback, NULL);
}

/*
 * dlock.waiters(): the rows of the view dlock.waiters, the acquirers
 * queued for keys of this database (only when preloaded: without it there
 * are no queues, and no rows): their pid, the key, the kind of lease they
 * ask for, since when they wait and their place in the key's line (1: the
 * first, which looks at the key; the others wait for it to leave).
 */
PG_FUNCTION_INFO_V1(dlock_waiters);

Datum
dlock_waiters(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	WaitSlot   *copy;
	int			n = 0;
	int		   *procno;
	int			i;
	int			j;

	dlock_no_parallel(fcinfo);
	InitMaterializedSRF(fcinfo, 0);
	if (shared == NULL)
		return (Datum) 0;
	copy = palloc(sizeof(WaitSlot) * shared->nslots);
	procno = palloc(sizeof(int) * shared->nslots);
	LWLockAcquire(shared->queue_lock, LW_SHARED);
	for (i = 0; i < shared->nslots; i++)
	{
		if (shared->slots[i].ticket == 0 || shared->slots[i].dbid != MyDatabaseId)
			continue;
		copy[n] = shared->slots[i];
		procno[n++] = i;
	}
	LWLockRelease(shared->queue_lock);
	for (i = 0; i < n; i++)
	{
		Datum		values[6];
		bool		nulls[6] = {0};
		int			position = 1;
		int32		permits = copy[i].permits;

		for (j = 0; j < n; j++)
			if (copy[j].hash == copy[i].hash && copy[j].ticket < copy[i].ticket)
				position++;
		values[0] = Int32GetDatum(GetPGProcByNumber(procno[i])->pid);
		values[1] = PointerGetDatum(cstring_to_text_with_len(copy[i].key,
															 copy[i].keylen));
		values[2] = CStringGetTextDatum(permits == 0 ? "shared" :
										permits == 1 ? "exclusive" : "permit");
		values[3] = Int32GetDatum(permits);
		nulls[3] = (permits == 0);
		values[4] = TimestampTzGetDatum(copy[i].since);
		values[5] = Int32GetDatum(position);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
