/*-------------------------------------------------------------------------
 *
 * shmem.c
 *		What dlock keeps in shared memory when it is preloaded
 *		(shared_preload_libraries = 'dlock'): the counters behind
 *		dlock.stats, and the FIFO queues of waiting acquirers.  Also the
 *		LOG lines of dlock.log_events, which need no shared memory.
 *
 * Counters.  One entry per (database, key) with activity, up to
 * dlock.stats_max keys, plus one totals entry per database that every
 * event is added to as well (so a key evicted to make room, the least
 * active first, still counts in its database's totals).  The hash table is
 * guarded by one LWLock, taken shared to update an entry (each entry has a
 * spinlock for its counters) and exclusive to add or evict entries, as
 * pg_stat_statements does.  Counting needs no transaction, so attempts
 * that change nothing (a refused try, a refused write that rolls back)
 * count too.  The counters are written to pg_stat/dlock.stat at a clean
 * shutdown and read back at startup; a crash loses them.
 *
 * An expiry is counted once per lease: each key's entry remembers the
 * highest token whose end it has counted.  (A key evicted from the table
 * forgets that; a lease of it already counted may be counted again.)
 *
 * Queues.  Waiting acquirers of a key are served in arrival order: each
 * waiter takes a ticket in its backend's slot, and only the waiter with
 * the lowest ticket for a key (the head) looks at the key and registers
 * for wake-ups (keylock.c); the others sleep until the head leaves, which
 * wakes the next.  While anyone waits for a key, try_acquire refuses it,
 * so nobody jumps the queue.  Without preloading there are no queues:
 * every waiter is woken and the first to look wins.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>
#include <sys/stat.h>

#include "catalog/pg_control.h"
#include "commands/dbcommands.h"
#include "common/controldata_utils.h"
#include "common/hashfn.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "dlock.h"

PG_FUNCTION_INFO_V1(dlock_stats);
PG_FUNCTION_INFO_V1(dlock_stats_reset);
PG_FUNCTION_INFO_V1(dlock_lease_status);

/* Where the counters live across a clean restart, and its format. */
#define STATS_FILE		PGSTAT_STAT_PERMANENT_DIRECTORY "/dlock.stat"
#define STATS_FILE_TMP	STATS_FILE ".tmp"
static const uint32 STATS_FILE_HEADER = 0x444c0301;

/* Share of the least active keys evicted when the table is full. */
#define EVICT_FRACTION	0.05

/* Entries for per-database totals, beyond dlock.stats_max keys. */
#define TOTALS_ENTRIES	64

typedef struct StatsKey
{
	Oid			dbid;
	bool		total;			/* the totals entry of dbid (key empty) */
	char		key[DLOCK_MAX_KEY_BYTES + 1];
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

typedef struct StatsEntry
{
	StatsKey	key;			/* hash key: must be first */
	slock_t		mutex;			/* protects the fields below */
	Counters	c;
	double		usage;			/* activity, for eviction */
	int64		ended_fence;	/* highest token whose end was counted */
} StatsEntry;

/* One backend's place in a key's queue; ticket 0 when it waits for none. */
typedef struct WaitSlot
{
	Oid			dbid;
	uint64		hash;
	uint64		ticket;
} WaitSlot;

/*
 * Counts of queued and of registered waiters per bucket of key hashes (a
 * bucket per hash modulo WAIT_BUCKETS, across databases), so that the
 * common case, nobody waiting for the key, is told by one atomic read: a
 * try_acquire then needs no scan of the queue, and the end of a
 * transaction no question to the lock manager per key it locked.
 */
#define WAIT_BUCKETS	1024

typedef struct DlockShared
{
	LWLock	   *stats_lock;		/* the hash table; see the file header */
	LWLock	   *queue_lock;		/* slots and next_ticket */
	int			nkeys;			/* key entries (not totals) */
	uint64		next_ticket;
	pg_atomic_uint32 queued[WAIT_BUCKETS];	/* slots with a ticket */
	pg_atomic_uint32 waiting[WAIT_BUCKETS];	/* dlock_waiters_add */
	int			nslots;
	WaitSlot	slots[FLEXIBLE_ARRAY_MEMBER];	/* by pgprocno */
} DlockShared;

static DlockShared *shared = NULL;
static HTAB *stats_htab = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* This backend's slot while it is queued, else NULL. */
static WaitSlot *my_slot = NULL;

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

static Size
shared_size(void)
{
	return add_size(offsetof(DlockShared, slots),
					mul_size(MaxBackends, sizeof(WaitSlot)));
}

/* Ask for our shared memory and locks (shmem_request_hook). */
static void
shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(add_size(shared_size(),
									hash_estimate_size(dlock_stats_max + TOTALS_ENTRIES,
													   sizeof(StatsEntry))));
	RequestNamedLWLockTranche("dlock", 2);
}

static void shmem_shutdown(int code, Datum arg);
static void load_stats(void);

/* Set up shared memory (shmem_startup_hook); load the saved counters. */
static void
shmem_startup(void)
{
	bool		found;
	HASHCTL		info;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	shared = ShmemInitStruct("dlock", shared_size(), &found);
	if (!found)
	{
		LWLockPadded *locks = GetNamedLWLockTranche("dlock");

		int			i;

		memset(shared, 0, shared_size());
		shared->stats_lock = &locks[0].lock;
		shared->queue_lock = &locks[1].lock;
		for (i = 0; i < WAIT_BUCKETS; i++)
		{
			pg_atomic_init_u32(&shared->queued[i], 0);
			pg_atomic_init_u32(&shared->waiting[i], 0);
		}
		shared->nslots = MaxBackends;
		shared->next_ticket = 1;
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
	LWLockRelease(AddinShmemInitLock);

	if (!IsUnderPostmaster)
		on_shmem_exit(shmem_shutdown, (Datum) 0);
	if (!found)
		load_stats();
}

/* Install the hooks; called from _PG_init while preloading. */
void
dlock_shmem_init(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = shmem_startup;
}

/* Is shared memory set up (the module was preloaded)? */
bool
dlock_shmem_ready(void)
{
	return shared != NULL && stats_htab != NULL;
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

static int
usage_cmp(const void *a, const void *b)
{
	double		ua = (*(StatsEntry *const *) a)->usage;
	double		ub = (*(StatsEntry *const *) b)->usage;

	return (ua > ub) - (ua < ub);
}

/*
 * Make room for a key: evict the least active keys (their activity stays
 * in their database's totals).  Caller holds stats_lock exclusively.
 */
static void
evict(void)
{
	HASH_SEQ_STATUS status;
	StatsEntry **entries;
	StatsEntry *e;
	int			n = 0;
	int			nvictims;
	int			i;

	entries = palloc(hash_get_num_entries(stats_htab) * sizeof(StatsEntry *));
	hash_seq_init(&status, stats_htab);
	while ((e = hash_seq_search(&status)) != NULL)
	{
		if (e->key.total)
			continue;
		entries[n++] = e;
		e->usage *= 0.99;		/* old activity counts for less */
	}
	qsort(entries, n, sizeof(StatsEntry *), usage_cmp);
	nvictims = Max(10, (int) (n * EVICT_FRACTION));
	nvictims = Min(nvictims, n);
	for (i = 0; i < nvictims; i++)
	{
		hash_search(stats_htab, &entries[i]->key, HASH_REMOVE, NULL);
		shared->nkeys--;
	}
	pfree(entries);
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
	if (!k->total && shared->nkeys >= dlock_stats_max)
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
		e->usage = 0;
		e->ended_fence = 0;
		SpinLockInit(&e->mutex);
		if (!k->total)
			shared->nkeys++;
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
		memcpy(k->key, key, Min(len, DLOCK_MAX_KEY_BYTES));
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

	if (!dlock_shmem_ready())
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
			e->usage += 1.0;
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
 * Event log lines (dlock.log_events)
 * ---------------------------------------------------------------------
 */

/* Append s to buf as a double-quoted value, escaping what a parser needs. */
static void
append_quoted(StringInfo buf, const char *s, int len)
{
	int			i;

	appendStringInfoChar(buf, '"');
	for (i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (c == '"' || c == '\\')
			appendStringInfo(buf, "\\%c", c);
		else if (c == '\n')
			appendStringInfoString(buf, "\\n");
		else if (c == '\t')
			appendStringInfoString(buf, "\\t");
		else if (c < 0x20 || c == 0x7f)
			appendStringInfo(buf, "\\x%02x", c);
		else
			appendStringInfoChar(buf, (char) c);
	}
	appendStringInfoChar(buf, '"');
}

/* Append ts in UTC, ISO 8601 with microseconds, whatever the session's settings. */
static void
append_time(StringInfo buf, TimestampTz ts)
{
	struct pg_tm tm;
	fsec_t		fsec;

	if (TIMESTAMP_NOT_FINITE(ts) ||
		timestamp2tm(ts, NULL, &tm, &fsec, NULL, NULL) != 0)
		appendStringInfoString(buf, "infinity");
	else
		appendStringInfo(buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
						 tm.tm_year, tm.tm_mon, tm.tm_mday,
						 tm.tm_hour, tm.tm_min, tm.tm_sec, (int) fsec);
}

/* Start a log line: dlock event=EV at=... db=... key="...". */
static void
start_line(StringInfo buf, const char *ev, const char *key, int len)
{
	char	   *db = get_database_name(MyDatabaseId);

	initStringInfo(buf);
	appendStringInfo(buf, "dlock event=%s at=", ev);
	append_time(buf, GetCurrentTimestamp());
	if (db == NULL)
		db = "";
	appendStringInfoString(buf, " db=");
	append_quoted(buf, db, strlen(db));
	appendStringInfoString(buf, " key=");
	append_quoted(buf, key, len);
}

static void
emit(StringInfo buf)
{
	ereport(LOG,
			(errmsg_internal("%s", buf->data),
			 errhidestmt(true),
			 errhidecontext(true)));
	pfree(buf->data);
}

/* Log the end by expiry of *lease, held for held microseconds. */
static void
log_expired(const char *key, int len, const DlockLease *lease,
			DlockLeaseState state, int64 held)
{
	StringInfoData buf;

	if (!dlock_log_events)
		return;
	start_line(&buf, "expired", key, len);
	appendStringInfo(&buf, " fence=" INT64_FORMAT " reason=%s held_ms=" INT64_FORMAT
					 " expires_at=",
					 lease->fence,
					 state == DLOCK_DISCONNECTED ? "disconnected" : "ttl",
					 held / 1000);
	append_time(&buf, lease->expires_at);
	emit(&buf);
}

/* Log a refused fenced write. */
void
dlock_log_refusal(const char *key, int64 token, int64 current, const char *why)
{
	StringInfoData buf;

	if (!dlock_log_events)
		return;
	start_line(&buf, "refused", key, strlen(key));
	if (token > 0)
		appendStringInfo(&buf, " token=" INT64_FORMAT, token);
	else
		appendStringInfoString(&buf, " token=none");
	appendStringInfo(&buf, " current=" INT64_FORMAT " reason=%s", current, why);
	emit(&buf);
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
	if (!dlock_shmem_ready())
		return;					/* once-only needs the shared table */
	held = held_until_end(lease, now);
	d.expired = 1;
	d.holds = 1;
	d.hold_total = held;
	d.hold_max = held;
	if (record(key, len, &d, lease->fence, !from_view))
		log_expired(key, len, lease, state, held);
}

void
dlock_notice_end(const char *key, int len, const DlockLease *lease,
				 DlockLeaseState state, TimestampTz now)
{
	notice_end(key, len, lease, state, now, false);
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

		if (dlock_shmem_ready())
			dlock_notice_end(key, len, prev, state, now);
		else
			log_expired(key, len, prev, state, held_until_end(prev, now));
	}
	d.acquired = 1;
	d.taken_over = takeover ? 1 : 0;
	(void) record(key, len, &d, 0, true);

	if (dlock_log_events)
	{
		StringInfoData buf;

		start_line(&buf, takeover ? "takeover" : "grant", key, len);
		appendStringInfo(&buf, " fence=" INT64_FORMAT, lease->fence);
		if (takeover)
			appendStringInfo(&buf, " previous_fence=" INT64_FORMAT, prev->fence);
		appendStringInfoString(&buf, " holder=");
		if (opts->holder)
			append_quoted(&buf, VARDATA_ANY(opts->holder),
						  VARSIZE_ANY_EXHDR(opts->holder));
		else
			appendStringInfoString(&buf, "\"\"");
		appendStringInfo(&buf, " pid=%d ttl_ms=" INT64_FORMAT " session_bound=%s expires_at=",
						 MyProcPid, (lease->expires_at - lease->granted_at) / 1000,
						 opts->session_bound ? "true" : "false");
		append_time(&buf, lease->expires_at);
		emit(&buf);
	}
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

	if (dlock_log_events)
	{
		StringInfoData buf;

		start_line(&buf, "release", key, len);
		appendStringInfo(&buf, " fence=" INT64_FORMAT " held_ms=" INT64_FORMAT,
						 lease->fence, held / 1000);
		emit(&buf);
	}
}

/* ---------------------------------------------------------------------
 * Saving and loading the counters
 * ---------------------------------------------------------------------
 */

/* Write the counters to STATS_FILE at a clean shutdown (postmaster). */
static void
shmem_shutdown(int code, Datum arg)
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
		if (fwrite(&e->key, sizeof(StatsKey), 1, file) != 1 ||
			fwrite(&e->c, sizeof(Counters), 1, file) != 1 ||
			fwrite(&e->usage, sizeof(double), 1, file) != 1 ||
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
		k.key[DLOCK_MAX_KEY_BYTES] = '\0';
		if (!k.total && shared->nkeys >= dlock_stats_max)
			continue;
		e = hash_search(stats_htab, &k, HASH_ENTER_NULL, &found);
		if (e == NULL || found)
			continue;
		SpinLockInit(&e->mutex);
		e->c = c;
		e->usage = usage;
		e->ended_fence = ended;
		if (!k.total)
			shared->nkeys++;
	}
done:
	FreeFile(file);
	unlink(STATS_FILE);
}

/* ---------------------------------------------------------------------
 * FIFO queues of waiting acquirers
 * ---------------------------------------------------------------------
 */

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
dlock_queue_enter(const char *key, int len)
{
	static bool exit_registered = false;
	WaitSlot   *slot;
	uint64		hash;

	if (!dlock_shmem_ready() || MyProc == NULL ||
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

	if (!dlock_shmem_ready())
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
 * Count a registration (delta 1) or its withdrawal (-1) of a waiter for the
 * key of hash h (keylock.c).  The increment is a full barrier: it is seen
 * by anyone whose later look could have been missed by the waiter's look
 * that follows it.
 */
void
dlock_waiters_add(uint64 h, int delta)
{
	if (!dlock_shmem_ready())
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
bool
dlock_waiters_maybe(uint64 h)
{
	if (!dlock_shmem_ready())
		return true;
	pg_memory_barrier();
	return pg_atomic_read_u32(&shared->waiting[h % WAIT_BUCKETS]) != 0;
}

/* ---------------------------------------------------------------------
 * The views
 * ---------------------------------------------------------------------
 */

static Datum
usecs_interval(int64 usecs)
{
	Interval   *iv = palloc0(sizeof(Interval));

	iv->time = usecs;
	return IntervalPGetDatum(iv);
}

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
		values[10] = usecs_interval(c->hold_total);
		values[11] = usecs_interval(c->hold_max);
		values[12] = usecs_interval(c->holds > 0 ? c->hold_total / c->holds : 0);
		nulls[12] = (c->holds == 0);
		values[13] = usecs_interval(c->wait_total);
		values[14] = usecs_interval(c->wait_max);
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
	if (!dlock_shmem_ready())
	{
		foreach(lc, rows)
			stats_row(rsinfo, ((DlockLeaseRow *) lfirst(lc))->key, NULL, false);
		stats_row(rsinfo, NULL, NULL, false);
		return (Datum) 0;
	}
	notice_rows(rows, now);
	{
		HASH_SEQ_STATUS status;
		StatsEntry *e;
		Counters	totals = {0};

		LWLockAcquire(shared->stats_lock, LW_SHARED);
		hash_seq_init(&status, stats_htab);
		while ((e = hash_seq_search(&status)) != NULL)
		{
			Counters	c;

			if (e->key.dbid != MyDatabaseId)
				continue;
			SpinLockAcquire(&e->mutex);
			c = e->c;
			SpinLockRelease(&e->mutex);
			if (e->key.total)
				totals = c;
			else if (!counters_zero(&c))
				stats_row(rsinfo, cstring_to_text(e->key.key), &c, true);
		}
		LWLockRelease(shared->stats_lock);
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

	if (!dlock_shmem_ready())
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

/*
 * dlock.lease_status(): the rows of the view dlock.lease_status.  Owners
 * never appear; session-bound leases whose connection has ended show as
 * expired.
 */
Datum
dlock_lease_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TimestampTz now = GetCurrentTimestamp();
	List	   *rows;
	ListCell   *lc;

	dlock_no_parallel(fcinfo);
	InitMaterializedSRF(fcinfo, 0);
	rows = dlock_storage_scan();
	foreach(lc, rows)
	{
		DlockLeaseRow *row = lfirst(lc);
		DlockLeaseState state = dlock_lease_state(&row->lease, now);
		Datum		values[10];
		bool		nulls[10] = {0};

		if (row->lease.unknown)
		{
			/*
			 * Before the horizon the key is held by an owner nobody knows:
			 * show what a grant would meet, with nothing of a lease that is
			 * not the one in force.
			 */
			memset(nulls, true, sizeof(nulls));
			values[0] = PointerGetDatum(row->key);
			nulls[0] = false;
			values[4] = TimestampTzGetDatum(row->lease.expires_at);
			nulls[4] = false;
			values[5] = usecs_interval(row->lease.expires_at - now);
			nulls[5] = false;
			values[6] = CStringGetTextDatum("held");
			nulls[6] = false;
			values[9] = BoolGetDatum(false);
			nulls[9] = false;
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
			continue;
		}
		values[0] = PointerGetDatum(row->key);
		values[1] = PointerGetDatum(row->holder);
		nulls[1] = (row->holder == NULL);
		values[2] = Int64GetDatum(row->lease.fence);
		values[3] = TimestampTzGetDatum(row->lease.granted_at);
		values[4] = TimestampTzGetDatum(row->lease.expires_at);
		values[5] = usecs_interval(row->lease.expires_at - now);
		nulls[5] = (state != DLOCK_LIVE);
		values[6] = CStringGetTextDatum(state == DLOCK_LIVE ? "held" :
										state == DLOCK_RELEASED ? "released" :
										"expired");
		values[7] = Int32GetDatum(row->pid);
		nulls[7] = !row->has_pid;
		values[8] = PointerGetDatum(row->application_name);
		nulls[8] = (row->application_name == NULL);
		values[9] = BoolGetDatum(row->lease.session_id != 0);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		if (row->lease.held && state != DLOCK_LIVE)
			notice_end(VARDATA_ANY(row->key), VARSIZE_ANY_EXHDR(row->key),
					   &row->lease, state, now, true);
	}
	return (Datum) 0;
}
