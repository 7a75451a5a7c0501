/*-------------------------------------------------------------------------
 *
 * stats.c
 *		The counters behind dlock.stats, kept in shared memory when the
 *		module is preloaded (shared_preload_libraries = 'dlock'): counting,
 *		eviction, saving them across clean restarts, the function behind
 *		the view, and dlock.stats_reset().  Also what the lease API reports
 *		of each grant, release and noticed expiry: the counters here and the
 *		log lines through events.c.
 *
 * Counters.  One entry per (database, key) with activity, up to
 * dlock.stats_max keys, plus one totals entry per database that every
 * event is added to as well (so a key evicted to make room, the least
 * active first, still counts in its database's totals).  The hash table is
 * guarded by one LWLock, taken shared to update an entry (each entry has a
 * spinlock for its counters) and exclusive to add or evict entries, as
 * pg_stat_statements does.  Each key's usage (its activity, which decides
 * what is evicted) lives apart from its entry, in an array of the shared
 * struct, so that an eviction reads that array instead of every entry (see
 * evict).  Counting needs no transaction, so attempts that change nothing
 * (a refused try, a refused write that rolls back) count too.  The
 * counters are written to pg_stat/dlock.stat at a clean shutdown and read
 * back at startup; a crash loses them.
 *
 * An expiry is counted once per lease: each key's entry remembers the
 * highest token whose end it has counted.  (A key evicted from the table
 * forgets that; a lease of it already counted may be counted again.)
 *
 * Owns: the shared hash "dlock stats" (with the struct "dlock stats header")
 * and its LWLock.  Calls events.c, storage.c (the leases the view notices),
 * liveness.c, args.c, settings.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>
#include <sys/stat.h>

#include "catalog/pg_control.h"
#include "common/controldata_utils.h"
#include "common/hashfn.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "port/pg_bitutils.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "dlock.h"

PG_FUNCTION_INFO_V1(dlock_stats);
PG_FUNCTION_INFO_V1(dlock_stats_reset);

/* Where the counters live across a clean restart, and its format. */
#define STATS_FILE		PGSTAT_STAT_PERMANENT_DIRECTORY "/dlock.stat"
#define STATS_FILE_TMP	STATS_FILE ".tmp"
static const uint32 STATS_FILE_HEADER = 0x444c0701;	/* 0.7: longer keys */

/*
 * Share of the least active keys evicted when the table is full.  Each
 * eviction reads the usage of every key, under stats_lock held
 * exclusively, so it makes room for many new keys at once: with 10 %
 * rather than 5 %, each new key pays for half as much of that reading.
 * The table then holds 90 % to 100 % of dlock.stats_max keys.
 */
#define EVICT_FRACTION	0.10

/*
 * What each eviction keeps of every key's usage, so that old activity
 * counts for less: 0.99 per 5 % of dlock.stats_max keys admitted, as when
 * an eviction freed 5 %, so that a busy key outlives as many new keys as
 * it did then.
 */
#define USAGE_DECAY		(0.99 * 0.99)

/* Entries for per-database totals, beyond dlock.stats_max keys. */
#define TOTALS_ENTRIES	64

typedef struct StatsKey
{
	Oid			dbid;
	bool		total;			/* the totals entry of dbid (key empty) */
	char		key[DLOCK_MAX_STORED_KEY_BYTES + 1];	/* a slot key has its own */
} StatsKey;

typedef struct Counters
{
	int64		acquired;
	int64		contended;
	int64		timeouts;
	int64		expired;
	int64		taken_over;
	int64		renewed;
	int64		released;
	int64		lost_renewals;
	int64		refused;
	int64		holds;			/* leases whose hold time is in hold_total */
	int64		hold_total;		/* microseconds */
	int64		hold_max;
	int64		wait_total;
	int64		wait_max;
} Counters;

/* A key's counters in the view: its own and its slots' (dlock_stats). */
typedef struct KeyCounters
{
	char		key[DLOCK_MAX_KEY_BYTES + 1];	/* hash key */
	Counters	c;
} KeyCounters;

typedef struct StatsEntry
{
	StatsKey	key;			/* hash key: must be first */
	slock_t		mutex;			/* protects c, ended_fence, and its usage */
	Counters	c;
	int64		ended_fence;	/* highest token whose end was counted */
	int			slot;			/* its usage: shared->keys[slot]; -1: totals */
} StatsEntry;

/* A slot of shared->keys: a key entry and its activity, for eviction. */
typedef struct KeyUsage
{
	double		usage;
	StatsEntry *entry;
} KeyUsage;

/*
 * Every slot of keys is either listed in free_slots[0 .. nfree - 1] or in
 * use by the key entry it points to, whose slot field names it, for the
 * entry's lifetime.  Taking or freeing a slot needs stats_lock exclusively;
 * a key's usage may be changed under the lock shared with the key entry's
 * mutex held.
 */
typedef struct StatsShared
{
	LWLock	   *stats_lock;		/* the hash table; see the file header */
	int			nfree;			/* free slots; 0: dlock_stats_max keys */
	int		   *free_slots;		/* dlock_stats_max, after keys */
	KeyUsage	keys[FLEXIBLE_ARRAY_MEMBER];	/* dlock_stats_max */
} StatsShared;

static StatsShared *shared = NULL;
static HTAB *stats_htab = NULL;

static uint32
stats_hash(const void *key, Size keysize)
{
	const StatsKey *k = (const StatsKey *) key;

	return hash_bytes((const unsigned char *) k->key, strlen(k->key)) ^
		hash_uint32(k->dbid) ^ (uint32) k->total;
}

static int
stats_match(const void *key1, const void *key2, Size keysize)
{
	const StatsKey *a = (const StatsKey *) key1;
	const StatsKey *b = (const StatsKey *) key2;

	if (a->dbid != b->dbid || a->total != b->total)
		return 1;
	return strcmp(a->key, b->key);
}

/* Is shared memory set up (the module was preloaded)? */
static bool
stats_ready(void)
{
	return shared != NULL && stats_htab != NULL;
}

static Size
stats_shared_size(void)
{
	return add_size(offsetof(StatsShared, keys),
					mul_size(dlock_stats_max,
							 sizeof(KeyUsage) + sizeof(int)));
}

/* Size of the shared struct and hash (shmem.c asks for it when preloading). */
Size
dlock_stats_shmem_size(void)
{
	return add_size(MAXALIGN(stats_shared_size()),
					hash_estimate_size(dlock_stats_max + TOTALS_ENTRIES,
									   sizeof(StatsEntry)));
}

static void stats_shutdown(int code, Datum arg);
static void load_stats(void);

/*
 * Set up the shared hash, with lock as its LWLock, and load the saved
 * counters (shmem.c, at shmem startup, holding AddinShmemInitLock; the
 * counters are loaded after it releases that, in dlock_stats_shmem_loaded).
 */
bool
dlock_stats_shmem_startup(LWLock *lock)
{
	bool		found;
	HASHCTL		info;

	shared = ShmemInitStruct("dlock stats header", stats_shared_size(),
							 &found);
	if (!found)
	{
		int			i;

		shared->stats_lock = lock;
		shared->free_slots = (int *) &shared->keys[dlock_stats_max];
		/* (taken from the end: the first key gets slot 0) */
		for (i = 0; i < dlock_stats_max; i++)
			shared->free_slots[i] = dlock_stats_max - 1 - i;
		shared->nfree = dlock_stats_max;
	}
	info.keysize = sizeof(StatsKey);
	info.entrysize = sizeof(StatsEntry);
	info.hash = stats_hash;
	info.match = stats_match;
	stats_htab = ShmemInitHash("dlock stats",
							   dlock_stats_max + TOTALS_ENTRIES,
							   dlock_stats_max + TOTALS_ENTRIES,
							   &info,
							   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE);
	return found;
}

/*
 * After dlock_stats_shmem_startup, outside AddinShmemInitLock: in the
 * postmaster, save the counters at a clean shutdown; when the memory was
 * new (!found), load those saved by the last one.
 */
void
dlock_stats_shmem_loaded(bool found)
{
	if (!IsUnderPostmaster)
		on_shmem_exit(stats_shutdown, (Datum) 0);
	if (!found)
		load_stats();
}

/* ---------------------------------------------------------------------
 * Counting
 * ---------------------------------------------------------------------
 */

static void
add_counters(Counters *dst, const Counters *d)
{
	dst->acquired += d->acquired;
	dst->contended += d->contended;
	dst->timeouts += d->timeouts;
	dst->expired += d->expired;
	dst->taken_over += d->taken_over;
	dst->renewed += d->renewed;
	dst->released += d->released;
	dst->lost_renewals += d->lost_renewals;
	dst->refused += d->refused;
	dst->holds += d->holds;
	dst->hold_total += d->hold_total;
	dst->hold_max = Max(dst->hold_max, d->hold_max);
	dst->wait_total += d->wait_total;
	dst->wait_max = Max(dst->wait_max, d->wait_max);
}

static bool
counters_zero(const Counters *c)
{
	Counters	zero = {0};

	return memcmp(c, &zero, sizeof(Counters)) == 0;
}

/* A key's usage and slot, as evict() collects them. */
typedef struct EvictCandidate
{
	double		usage;
	int			slot;
} EvictCandidate;

static int
candidate_cmp(const void *a, const void *b)
{
	double		ua = ((const EvictCandidate *) a)->usage;
	double		ub = ((const EvictCandidate *) b)->usage;

	return (ua > ub) - (ua < ub);
}

/*
 * Reorder c[0 .. n-1] so that c[0 .. k-1] are k of the least used (in no
 * particular order; ties broken arbitrarily), 0 <= k < n: Hoare's FIND,
 * O(n) on average where a sort was O(n log n).  Its partitioning splits a
 * run of equal usages (every key touched once) in the middle, so those
 * cost no more.  Should the range shrink too slowly all the same (an
 * unlucky or crafted order), the rest is sorted instead, which is as
 * correct: everything left of lo is no more used, everything right of hi
 * no less, than what lies between.
 */
static void
select_least_used(EvictCandidate *c, int n, int k)
{
	int			lo = 0;
	int			hi = n - 1;
	int			rounds = 2 * (pg_leftmost_one_pos32((uint32) n + 1) + 1);

	while (lo < hi)
	{
		double		a = c[lo].usage;
		double		b = c[lo + (hi - lo) / 2].usage;
		double		z = c[hi].usage;
		double		pivot;
		int			i = lo;
		int			j = hi;

		if (rounds-- == 0)
		{
			qsort(c + lo, hi - lo + 1, sizeof(EvictCandidate), candidate_cmp);
			return;
		}
		/* the median of three, one of the values in range */
		pivot = a < b ? (b < z ? b : Max(a, z)) : (a < z ? a : Max(b, z));
		while (i <= j)
		{
			while (c[i].usage < pivot)
				i++;
			while (c[j].usage > pivot)
				j--;
			if (i <= j)
			{
				EvictCandidate t = c[i];

				c[i++] = c[j];
				c[j--] = t;
			}
		}
		/* now c[lo .. j] <= pivot <= c[i .. hi], j < i */
		if (j < k)
			lo = i;
		if (k < i)
			hi = j;
	}
}

/*
 * Make room for keys: evict the least active EVICT_FRACTION of them (their
 * activity stays in their database's totals), after decaying the usage of
 * all.  It reads shared->keys and the victims' entries, not the others: a
 * scan of the hash table (some 700 bytes an entry, each a cache miss) took
 * 0.6 ms for 5000 keys, reading shared->keys 0.01 ms; then selecting the
 * victims takes 0.04 ms and removing them 0.3 us each.  (So the candidates
 * are palloc'd each time: 80 kB at 5000 keys costs nothing next to that,
 * and no backend keeps them.)  Caller holds stats_lock exclusively, with
 * every slot in use.
 */
static void
evict(void)
{
	KeyUsage   *keys = shared->keys;
	int			n = dlock_stats_max;
	int			nvictims = Min(Max(10, (int) (n * EVICT_FRACTION)), n);
	EvictCandidate *c;
	int			i;

	Assert(shared->nfree == 0);
	c = MemoryContextAllocHuge(CurrentMemoryContext,
							   (Size) n * sizeof(EvictCandidate));
	for (i = 0; i < n; i++)
	{
		keys[i].usage *= USAGE_DECAY;	/* old activity counts for less */
		c[i].usage = keys[i].usage;
		c[i].slot = i;
	}
	if (nvictims < n)
		select_least_used(c, n, nvictims);
	for (i = 0; i < nvictims; i++)
	{
		KeyUsage   *victim = &keys[c[i].slot];

		hash_search(stats_htab, &victim->entry->key, HASH_REMOVE, NULL);
		victim->entry = NULL;
		shared->free_slots[shared->nfree++] = c[i].slot;
	}
	pfree(c);
}

/* Give the new key entry e a free slot, with usage (stats_lock exclusive). */
static void
add_key(StatsEntry *e, double usage)
{
	Assert(shared->nfree > 0);
	e->slot = shared->free_slots[--shared->nfree];
	shared->keys[e->slot].usage = usage;
	shared->keys[e->slot].entry = e;
}

/*
 * Return the entry of k, creating it when there is none and may_create.
 * On return stats_lock is held, shared or exclusive; the caller releases
 * it.  Returns NULL (lock still held) when there is no entry and it may
 * not create one, or the table has no room left.
 */
static StatsEntry *
entry_for(const StatsKey *k, bool may_create)
{
	StatsEntry *e;
	bool		found;

	LWLockAcquire(shared->stats_lock, LW_SHARED);
	e = hash_search(stats_htab, k, HASH_FIND, NULL);
	if (e != NULL || !may_create)
		return e;
	LWLockRelease(shared->stats_lock);
	LWLockAcquire(shared->stats_lock, LW_EXCLUSIVE);
	if (!k->total && shared->nfree == 0)
	{
		e = hash_search(stats_htab, k, HASH_FIND, NULL);
		if (e != NULL)
			return e;
		evict();
	}
	e = hash_search(stats_htab, k, HASH_ENTER_NULL, &found);
	if (e != NULL && !found)
	{
		memset(&e->c, 0, sizeof(Counters));
		e->ended_fence = 0;
		SpinLockInit(&e->mutex);
		e->slot = -1;
		if (!k->total)
			add_key(e, 0);
	}
	return e;
}

static void
make_key(StatsKey *k, const char *key, int len, bool total)
{
	memset(k, 0, sizeof(StatsKey));
	k->dbid = MyDatabaseId;
	k->total = total;
	if (!total)
		memcpy(k->key, key, Min(len, DLOCK_MAX_STORED_KEY_BYTES));
}

/*
 * Add d to key's counters and to its database's totals.  With ended_fence
 * (a lease's token), only if that lease's end has not been counted yet;
 * return whether it was counted.  Without may_create, a key that has no
 * entry is not counted at all: a read of the views notices expiries of
 * every key, and must neither evict the entries that remember which
 * expiries were counted nor recreate evicted ones, which would count
 * those expiries again on every read.  (The next grant, renew, release
 * or write of such a key counts its expiry: at most once more after an
 * eviction.)
 */
static bool
record(const char *key, int len, const Counters *d, int64 ended_fence,
	   bool may_create)
{
	StatsKey	k;
	StatsEntry *e;
	bool		counted = true;

	if (!stats_ready())
		return ended_fence == 0;
	make_key(&k, key, len, false);
	e = entry_for(&k, may_create);
	if (e == NULL && !may_create)
	{
		LWLockRelease(shared->stats_lock);
		return false;
	}
	if (e != NULL)
	{
		SpinLockAcquire(&e->mutex);
		if (ended_fence != 0 && e->ended_fence >= ended_fence)
			counted = false;
		else
		{
			if (ended_fence != 0)
				e->ended_fence = ended_fence;
			add_counters(&e->c, d);
			shared->keys[e->slot].usage += 1.0;
		}
		SpinLockRelease(&e->mutex);
	}
	LWLockRelease(shared->stats_lock);
	if (!counted)
		return false;

	make_key(&k, NULL, 0, true);
	e = entry_for(&k, true);
	if (e != NULL)
	{
		SpinLockAcquire(&e->mutex);
		add_counters(&e->c, d);
		SpinLockRelease(&e->mutex);
	}
	LWLockRelease(shared->stats_lock);
	return true;
}

/* Count one event of kind ev on key. */
void
dlock_count(const char *key, int len, DlockEvent ev)
{
	Counters	d = {0};

	switch (ev)
	{
		case DLOCK_EV_CONTENDED:
			d.contended = 1;
			break;
		case DLOCK_EV_TIMEOUT:
			d.timeouts = 1;
			break;
		case DLOCK_EV_RENEWED:
			d.renewed = 1;
			break;
		case DLOCK_EV_LOST_RENEWAL:
			d.lost_renewals = 1;
			break;
		case DLOCK_EV_REFUSED:
			d.refused = 1;
			break;
	}
	(void) record(key, len, &d, 0, true);
}

/* Count an acquire that waited usecs microseconds (granted or not). */
void
dlock_count_wait(const char *key, int len, int64 usecs)
{
	Counters	d = {0};

	d.contended = 1;
	d.wait_total = usecs;
	d.wait_max = usecs;
	(void) record(key, len, &d, 0, true);
}

/* ---------------------------------------------------------------------
 * What the lease API reports
 * ---------------------------------------------------------------------
 */

/* How long *lease was held when it ended by itself, as of now. */
static int64
held_until_end(const DlockLease *lease, TimestampTz now)
{
	TimestampTz end = Min(lease->expires_at, now);

	return Max(end - lease->granted_at, 0);
}

/*
 * Note that *lease (held, not live, in state) has ended without a release:
 * count and log its expiry, once per lease.  Called wherever dlock reads a
 * key and finds its lease ended: a grant, renew, release or fenced write of
 * the key (dlock_notice_end), or a read of the views (from_view).
 */
static void
notice_end(const char *key, int len, const DlockLease *lease,
		   DlockLeaseState state, TimestampTz now, bool from_view)
{
	Counters	d = {0};
	int64		held;

	if (!lease->found || !lease->held ||
		(state != DLOCK_EXPIRED && state != DLOCK_DISCONNECTED))
		return;
	if (!stats_ready())
		return;					/* once-only needs the shared table */
	held = held_until_end(lease, now);
	d.expired = 1;
	d.holds = 1;
	d.hold_total = held;
	d.hold_max = held;
	if (record(key, len, &d, lease->fence, !from_view))
		dlock_log_expired(key, len, lease, state, held);
}

void
dlock_notice_end(const char *key, int len, const DlockLease *lease,
				 DlockLeaseState state, TimestampTz now)
{
	notice_end(key, len, lease, state, now, false);
}

/*
 * The same for a lease that a read of a view (dlock.lease_status) found
 * ended: counted only for a key that has an entry already (see record).
 */
void
dlock_notice_end_in_view(const char *key, int len, const DlockLease *lease,
						 DlockLeaseState state, TimestampTz now)
{
	notice_end(key, len, lease, state, now, true);
}

/*
 * Count and log a grant of key: *lease is the new lease, *prev what the
 * key's row held before (a takeover when that lease ended unreleased).
 */
void
dlock_count_grant(const char *key, int len, const DlockLease *prev,
				  const DlockLease *lease, const DlockGrantOptions *opts)
{
	Counters	d = {0};
	bool		takeover = prev->found && prev->held;
	TimestampTz now = lease->granted_at;

	if (takeover)
	{
		DlockLeaseState state = prev->expires_at <= now ?
		DLOCK_EXPIRED : DLOCK_DISCONNECTED;

		if (stats_ready())
			dlock_notice_end(key, len, prev, state, now);
		else
			dlock_log_expired(key, len, prev, state, held_until_end(prev, now));
	}
	d.acquired = 1;
	d.taken_over = takeover ? 1 : 0;
	(void) record(key, len, &d, 0, true);

	dlock_log_grant(key, len, prev, lease, opts, takeover);
}

/* Count and log the release at now of *lease (as read before it). */
void
dlock_count_release(const char *key, int len, const DlockLease *lease,
					TimestampTz now)
{
	Counters	d = {0};
	int64		held = Max(now - lease->granted_at, 0);

	d.released = 1;
	d.holds = 1;
	d.hold_total = held;
	d.hold_max = held;
	(void) record(key, len, &d, 0, true);

	dlock_log_release(key, len, lease, held);
}

/* ---------------------------------------------------------------------
 * Saving and loading the counters
 * ---------------------------------------------------------------------
 */

/* Write the counters to STATS_FILE at a clean shutdown (postmaster). */
static void
stats_shutdown(int code, Datum arg)
{
	FILE	   *file;
	HASH_SEQ_STATUS status;
	StatsEntry *e;
	int32		n;

	if (code != 0 || !shared || !stats_htab)
		return;
	file = AllocateFile(STATS_FILE_TMP, PG_BINARY_W);
	if (file == NULL)
		goto error;
	n = hash_get_num_entries(stats_htab);
	if (fwrite(&STATS_FILE_HEADER, sizeof(uint32), 1, file) != 1 ||
		fwrite(&n, sizeof(int32), 1, file) != 1)
		goto error;
	hash_seq_init(&status, stats_htab);
	while ((e = hash_seq_search(&status)) != NULL)
	{
		double		usage = e->slot >= 0 ? shared->keys[e->slot].usage : 0;

		if (fwrite(&e->key, sizeof(StatsKey), 1, file) != 1 ||
			fwrite(&e->c, sizeof(Counters), 1, file) != 1 ||
			fwrite(&usage, sizeof(double), 1, file) != 1 ||
			fwrite(&e->ended_fence, sizeof(int64), 1, file) != 1)
		{
			hash_seq_term(&status);
			goto error;
		}
	}
	if (FreeFile(file))
	{
		file = NULL;
		goto error;
	}
	(void) durable_rename(STATS_FILE_TMP, STATS_FILE, LOG);
	return;

error:
	ereport(LOG,
			(errcode_for_file_access(),
			 errmsg("could not write file \"%s\": %m", STATS_FILE_TMP)));
	if (file)
		FreeFile(file);
	unlink(STATS_FILE_TMP);
}

/*
 * Read the counters saved by the last clean shutdown, then remove the
 * file: after a crash, nothing stale comes back.  Runs in the postmaster
 * before the startup process, so the control file still tells how the
 * server last stopped.  Keys beyond
 * dlock.stats_max are dropped (they are in their totals).
 */
static void
load_stats(void)
{
	FILE	   *file;
	uint32		header;
	int32		n;
	int32		i;

	ControlFileData *control;
	bool		crc_ok;

	/*
	 * After an immediate shutdown the postmaster exits cleanly and the
	 * file was written, but the server crashed as far as the data is
	 * concerned (recovery follows), and core's statistics are discarded
	 * then: so are ours.
	 */
	control = get_controlfile(DataDir, &crc_ok);
	if (!crc_ok || (control->state != DB_SHUTDOWNED &&
					control->state != DB_SHUTDOWNED_IN_RECOVERY))
	{
		unlink(STATS_FILE);
		return;
	}

	file = AllocateFile(STATS_FILE, PG_BINARY_R);
	if (file == NULL)
	{
		if (errno != ENOENT)
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("could not read file \"%s\": %m", STATS_FILE)));
		return;
	}
	if (fread(&header, sizeof(uint32), 1, file) != 1 ||
		header != STATS_FILE_HEADER ||
		fread(&n, sizeof(int32), 1, file) != 1)
		goto done;
	for (i = 0; i < n; i++)
	{
		StatsKey	k;
		Counters	c;
		double		usage;
		int64		ended;
		StatsEntry *e;
		bool		found;

		if (fread(&k, sizeof(StatsKey), 1, file) != 1 ||
			fread(&c, sizeof(Counters), 1, file) != 1 ||
			fread(&usage, sizeof(double), 1, file) != 1 ||
			fread(&ended, sizeof(int64), 1, file) != 1)
			break;
		k.key[DLOCK_MAX_STORED_KEY_BYTES] = '\0';
		if (!k.total && shared->nfree == 0)
			continue;
		e = hash_search(stats_htab, &k, HASH_ENTER_NULL, &found);
		if (e == NULL || found)
			continue;
		SpinLockInit(&e->mutex);
		e->c = c;
		e->ended_fence = ended;
		e->slot = -1;
		if (!k.total)
			add_key(e, usage);
	}
done:
	FreeFile(file);
	unlink(STATS_FILE);
}

/* ---------------------------------------------------------------------
 * The view
 * ---------------------------------------------------------------------
 */

/* Notice the ended leases among rows (a List of DlockLeaseRow). */
static void
notice_rows(List *rows, TimestampTz now)
{
	ListCell   *lc;

	foreach(lc, rows)
	{
		DlockLeaseRow *row = lfirst(lc);

		if (row->lease.held)
			notice_end(VARDATA_ANY(row->key), VARSIZE_ANY_EXHDR(row->key),
					   &row->lease, dlock_lease_state(&row->lease, now),
					   now, true);
	}
}

/* Emit one row of dlock.stats: key (NULL: totals) and counters c. */
static void
stats_row(ReturnSetInfo *rsinfo, text *key, const Counters *c, bool known)
{
	Datum		values[15];
	bool		nulls[15];
	int			i;

	memset(nulls, !known, sizeof(nulls));
	values[0] = PointerGetDatum(key);
	nulls[0] = (key == NULL);
	if (known)
	{
		values[1] = Int64GetDatum(c->acquired);
		values[2] = Int64GetDatum(c->contended);
		values[3] = Int64GetDatum(c->timeouts);
		values[4] = Int64GetDatum(c->expired);
		values[5] = Int64GetDatum(c->taken_over);
		values[6] = Int64GetDatum(c->renewed);
		values[7] = Int64GetDatum(c->released);
		values[8] = Int64GetDatum(c->lost_renewals);
		values[9] = Int64GetDatum(c->refused);
		values[10] = dlock_usecs_interval(c->hold_total);
		values[11] = dlock_usecs_interval(c->hold_max);
		values[12] = dlock_usecs_interval(c->holds > 0 ? c->hold_total / c->holds : 0);
		nulls[12] = (c->holds == 0);
		values[13] = dlock_usecs_interval(c->wait_total);
		values[14] = dlock_usecs_interval(c->wait_max);
	}
	else
	{
		for (i = 1; i < 15; i++)
			values[i] = (Datum) 0;
	}
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * dlock.stats(): the rows of the view dlock.stats.  Without preloading,
 * one row per key of dlock.leases and the totals row, every counter NULL
 * (what the table knows of the past is only each key's latest lease,
 * which dlock.lease_status shows).
 */
Datum
dlock_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TimestampTz now = GetCurrentTimestamp();
	List	   *rows;
	ListCell   *lc;

	dlock_no_parallel(fcinfo);
	InitMaterializedSRF(fcinfo, 0);
	rows = dlock_storage_scan();
	if (!stats_ready())
	{
		foreach(lc, rows)
		{
			text	   *key = ((DlockLeaseRow *) lfirst(lc))->key;
			int			len = VARSIZE_ANY_EXHDR(key);

			/* a key's slots are shown as the key, whose row they have */
			if (dlock_base_key_len(VARDATA_ANY(key), len) == len)
				stats_row(rsinfo, key, NULL, false);
		}
		stats_row(rsinfo, NULL, NULL, false);
		return (Datum) 0;
	}
	notice_rows(rows, now);
	{
		HASH_SEQ_STATUS status;
		StatsEntry *e;
		Counters	totals = {0};
		HTAB	   *bykey;
		HASHCTL		ctl;
		KeyCounters *kc;

		/*
		 * A key's permits and shared leases are counted under their slot
		 * keys (an expiry is counted once per lease, by token, per entry);
		 * the view shows their sum under the key.
		 */
		ctl.keysize = DLOCK_MAX_KEY_BYTES + 1;
		ctl.entrysize = sizeof(KeyCounters);
		ctl.hcxt = CurrentMemoryContext;
		bykey = hash_create("dlock stats by key", 64, &ctl,
							HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
		LWLockAcquire(shared->stats_lock, LW_SHARED);
		hash_seq_init(&status, stats_htab);
		while ((e = hash_seq_search(&status)) != NULL)
		{
			Counters	c;
			char		base[DLOCK_MAX_KEY_BYTES + 1];
			bool		found;

			if (e->key.dbid != MyDatabaseId)
				continue;
			SpinLockAcquire(&e->mutex);
			c = e->c;
			SpinLockRelease(&e->mutex);
			if (e->key.total)
			{
				totals = c;
				continue;
			}
			strlcpy(base, e->key.key,
					Min(dlock_base_key_len(e->key.key, strlen(e->key.key)),
						DLOCK_MAX_KEY_BYTES) + 1);
			kc = hash_search(bykey, base, HASH_ENTER, &found);
			if (!found)
				memset(&kc->c, 0, sizeof(Counters));
			add_counters(&kc->c, &c);
		}
		LWLockRelease(shared->stats_lock);
		hash_seq_init(&status, bykey);
		while ((kc = hash_seq_search(&status)) != NULL)
		{
			if (!counters_zero(&kc->c))
				stats_row(rsinfo, cstring_to_text(kc->key), &kc->c, true);
		}
		stats_row(rsinfo, NULL, &totals, true);
	}
	return (Datum) 0;
}

/*
 * dlock.stats_reset(): zero the counters of this database.  What each key
 * remembers to count an expiry once is kept.
 */
Datum
dlock_stats_reset(PG_FUNCTION_ARGS)
{
	HASH_SEQ_STATUS status;
	StatsEntry *e;

	if (!stats_ready())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dlock counters need the module to be preloaded"),
				 errhint("Add dlock to shared_preload_libraries and restart the server.")));
	LWLockAcquire(shared->stats_lock, LW_EXCLUSIVE);
	hash_seq_init(&status, stats_htab);
	while ((e = hash_seq_search(&status)) != NULL)
	{
		if (e->key.dbid != MyDatabaseId)
			continue;
		SpinLockAcquire(&e->mutex);
		memset(&e->c, 0, sizeof(Counters));
		SpinLockRelease(&e->mutex);
	}
	LWLockRelease(shared->stats_lock);
	PG_RETURN_VOID();
}
