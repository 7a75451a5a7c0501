/*-------------------------------------------------------------------------
 *
 * memstore.c
 *		Leases kept in shared memory instead of dlock.leases, when the module
 *		is preloaded with dlock.storage = memory.
 *
 * The shared hash holds one entry per (database, key): the key's last
 * committed lease, as a row of dlock.leases would.  A grant, renewal or
 * release writes no WAL and no heap row, so its transaction commits
 * without a flush; that is the whole point of the mode (issue 10).  What
 * stays durable is what must: the fencing token (durable.c flushes the
 * sequence before a token is shown) and the horizon, a time that no lease
 * granted here outlives (horizon.c keeps it in dlock.horizon_seq).  After a
 * restart, a crash or a promotion the entries are gone, and until the
 * horizon has passed every key of the database reads as held by an unknown
 * owner: whoever held a lease before is out of time before anyone else is
 * granted the key.
 *
 * Transactions.  The table gives each change MVCC for free; here a
 * transaction keeps its changes in a private overlay (a hash by key, plus
 * a log for subtransaction aborts) and copies them into shared memory at
 * commit, before its key locks are released.  Everyone else sees the last
 * committed state, as a SnapshotSelf read of the table shows it; the
 * transaction itself sees its own changes.  An abort, of the transaction
 * or of a subtransaction, just drops the overlay's newer changes.  The key
 * locks (keylock.c) serialize changes to a key exactly as in table mode,
 * so no other transaction changes an entry between our change and our
 * commit.
 *
 * Room.  A transaction that changes a key without an entry reserves one at
 * once (an entry that reads as "no row"), so that the copy at commit, which
 * must not fail, always has its entry; a full table fails the change, not
 * the commit.  prune() deletes entries of released and expired leases at
 * once, not at its commit: such an entry means the same as no entry, bar
 * the key's history for the monotonic fencing mode, as in table mode.
 *
 * Locking.  The hash is partitioned by key, each partition under its own
 * LWLock; the per-database slots (barrier, horizon) are under a spinlock.
 *
 * Per-database slots.  Each database that uses memory mode has a slot with
 * its barrier, horizon and unknown owner (horizon.c reads and moves them
 * through dlock_mem_db_*), its count of entries (the per-database cap and
 * the eviction of other databases' ended entries) and what the last
 * make_room found.  They are kept here, not in horizon.c, because they are
 * the hash's own accounting: an entry's database, its eviction, the
 * reclaim of a dropped database's entries and slot all change them under
 * the same locks.
 *
 * Each slot also holds the database's block of fencing tokens
 * (dlock_mem_draw_token; durable.c reserves it from the sequences).
 *
 * Owns: the shared struct "dlock memory", the hash "dlock memory leases"
 * and their locks; the transaction's overlay; the blocks of tokens.  Calls
 * durable.c (reserving tokens), liveness.c (has an entry's lease ended?),
 * common.c and settings.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "dlock.h"

#define MEM_PARTITIONS		16

/*
 * What names an entry: the key, zero-padded, in its database, and the hash
 * of both, computed once by make_tag (memtag_hash returns it, memtag_match
 * compares it first).
 */
typedef struct MemTag
{
	uint32		hashcode;
	Oid			db;
	char		key[DLOCK_MAX_STORED_KEY_BYTES + 1];	/* a key, or a slot key */
} MemTag;

/* One key's lease and what the views show with it: a row of dlock.leases. */
typedef struct MemVersion
{
	DlockLease	lease;			/* found = false: reads as no row */
	int32		pid;
	bool		has_pid;
	int16		holder_len;		/* -1: no holder */
	int16		value_len;		/* -1: no value */
	char		application_name[NAMEDATALEN];	/* "": none */
	char		holder[DLOCK_MAX_HOLDER_BYTES];
	char		value[DLOCK_MAX_VALUE_BYTES];	/* an election's (campaign) */
} MemVersion;

typedef struct MemEntry
{
	MemTag		tag;			/* hash key: must be first */
	int32		pins;			/* transactions with a change of the entry not
								 * yet committed or undone: never evicted */
	MemVersion	v;
} MemEntry;

/* A database's barrier and horizon (see dlock_mem_db_get). */
typedef struct MemDatabase
{
	Oid			db;				/* InvalidOid: free slot */
	Oid			seq;			/* the token sequence they belong to */
	TimestampTz barrier;
	TimestampTz horizon;
	TimestampTz pending;		/* a horizon we set, not yet confirmed */
	XLogRecPtr	horizon_lsn;	/* the horizon sequence's page LSN we know */
	TimestampTz room_checked;	/* the last make_room that freed nothing */
	uint64		room_releases;	/* MemShared.releases then */
	int32		nentries;		/* its entries in the hash */
	TimestampTz last_used;		/* its last grant or renewal began (idle_slot) */
	pg_uuid_t	unknown_owner;
	/* its block of tokens (dlock_mem_draw_token) */
	Oid			tok_seq;		/* the token sequence reserved from; none:
								 * InvalidOid */
	int64		tok_next;		/* the next token to hand out */
	int64		tok_last;		/* the last token reserved */
	XLogRecPtr	tok_lsn;		/* the token sequence's page LSN and its
								 * copy's, as the reservation left them */
	XLogRecPtr	tok_copy_lsn;
	XLogRecPtr	tok_confirm;	/* the reservation's WAL */
	int			tok_refiller;	/* pgprocno + 1 of the backend reserving
								 * more; 0: none */
	bool		tok_moved;		/* it has moved the sequences, to ... */
	XLogRecPtr	tok_moved_lsn;	/* ... these pages' LSNs (see take_token) */
	XLogRecPtr	tok_moved_copy_lsn;
} MemDatabase;

typedef struct MemShared
{
	LWLock	   *partitions[MEM_PARTITIONS];
	pg_atomic_uint64 releases;	/* releases committed, for make_room */
	slock_t		mutex;			/* protects dbs */
	MemDatabase dbs[FLEXIBLE_ARRAY_MEMBER];	/* dlock.memory_max_databases */
} MemShared;

/* A change of this transaction, not yet committed (the overlay). */
typedef struct MemChange
{
	MemTag		tag;
	SubTransactionId subid;		/* the subtransaction that made it */
	bool		created;		/* we reserved the shared entry */
	bool		pinned;			/* it holds our pin of the shared entry */
	struct MemChange *prev_same;	/* our earlier change of the key */
	struct MemChange *prev_log; /* our previous change of any key */
	MemVersion	v;
} MemChange;

/* The overlay's hash entry: the latest change of a key. */
typedef struct MemLatest
{
	MemTag		tag;
	MemChange  *change;			/* NULL when all were undone */
} MemLatest;

static MemShared *mem = NULL;
static HTAB *mem_htab = NULL;

static object_access_hook_type prev_object_access_hook = NULL;

#define MEM_SHARED_SIZE \
	add_size(offsetof(MemShared, dbs), \
			 mul_size(sizeof(MemDatabase), dlock_memory_max_databases))

/*
 * The overlay: the hash lives as long as the backend (creating one per
 * transaction would cost more than a grant's own work), the changes in
 * TopTransactionContext; mine_log is NULL when this transaction changed
 * nothing.  dlock_mem_xact_callback empties it at every transaction end.
 */
static HTAB *mine = NULL;
static MemChange *mine_log = NULL;

/* Is memory mode on: preloaded, dlock.storage = memory, memory set up? */
bool
dlock_memory_mode(void)
{
	return dlock_storage_mode == DLOCK_STORAGE_MEMORY && mem != NULL;
}

/* The hash function of both hashes of MemTags: the hash make_tag stored. */
static uint32
memtag_hash(const void *key, Size keysize)
{
	return ((const MemTag *) key)->hashcode;
}

/* Their match function: 0 when the tags name the same key. */
static int
memtag_match(const void *key1, const void *key2, Size keysize)
{
	const MemTag *a = (const MemTag *) key1;
	const MemTag *b = (const MemTag *) key2;

	if (a->hashcode != b->hashcode || a->db != b->db)
		return 1;
	return strcmp(a->key, b->key);
}

static Size
mem_size(void)
{
	return add_size(MAXALIGN(MEM_SHARED_SIZE),
					hash_estimate_size(dlock_memory_max_keys, sizeof(MemEntry)));
}

/*
 * Ask for the memory and the partition locks (shmem.c's request hook, when
 * preloading).
 */
void
dlock_memstore_shmem_request(void)
{
	if (dlock_storage_mode != DLOCK_STORAGE_MEMORY)
		return;
	RequestAddinShmemSpace(mem_size());
	RequestNamedLWLockTranche("dlock memory", MEM_PARTITIONS);
}

/* Set up the hash, empty after every start (shmem.c's startup hook). */
void
dlock_memstore_shmem_startup(void)
{
	bool		found;
	HASHCTL		info;

	if (dlock_storage_mode != DLOCK_STORAGE_MEMORY)
		return;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	mem = ShmemInitStruct("dlock memory", MEM_SHARED_SIZE, &found);
	if (!found)
	{
		LWLockPadded *locks = GetNamedLWLockTranche("dlock memory");
		int			i;

		memset(mem, 0, MEM_SHARED_SIZE);
		for (i = 0; i < MEM_PARTITIONS; i++)
			mem->partitions[i] = &locks[i].lock;
		SpinLockInit(&mem->mutex);
		pg_atomic_init_u64(&mem->releases, 0);
	}
	info.keysize = sizeof(MemTag);
	info.entrysize = sizeof(MemEntry);
	info.hash = memtag_hash;
	info.match = memtag_match;
	info.num_partitions = MEM_PARTITIONS;
	mem_htab = ShmemInitHash("dlock memory leases",
							 dlock_memory_max_keys, dlock_memory_max_keys,
							 &info,
							 HASH_ELEM | HASH_FUNCTION | HASH_COMPARE |
							 HASH_PARTITION | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

static void forget_database(Oid db, bool locked);

/* The database this backend's transaction drops (mem_object_access). */
static Oid	dropping_db = InvalidOid;

/*
 * DROP DATABASE: remember the database, and forget its entries and free
 * its slot when the drop commits (dlock_mem_xact_callback), not now: the
 * drop may still fail (the database is in use, or is the current one).
 * A database created again later with the same OID (CREATE DATABASE ...
 * OID) must not find the old one's leases, nor its barrier.
 */
static void
mem_object_access(ObjectAccessType access, Oid classId, Oid objectId,
				  int subId, void *arg)
{
	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);
	if (access == OAT_DROP && classId == DatabaseRelationId && mem != NULL)
		dropping_db = objectId;
}

/* Forget the entries and the slot of database db, dropped. */
static void
forget_dropped(Oid db)
{
	int			i;

	forget_database(db, false);
	SpinLockAcquire(&mem->mutex);
	for (i = 0; i < dlock_memory_max_databases; i++)
	{
		if (mem->dbs[i].db == db)
			mem->dbs[i].db = InvalidOid;
	}
	SpinLockRelease(&mem->mutex);
}

/* Install the DROP DATABASE hook; called from _PG_init while preloading. */
void
dlock_memstore_init(void)
{
	prev_object_access_hook = object_access_hook;
	object_access_hook = mem_object_access;
}

/* Fill *tag for key in this database. */
static void
make_tag(MemTag *tag, const char *key, int len)
{
	if (len > DLOCK_MAX_STORED_KEY_BYTES)
		elog(ERROR, "dlock: key of %d bytes in memory mode", len);
	memset(tag, 0, sizeof(MemTag));
	tag->db = MyDatabaseId;
	memcpy(tag->key, key, len);
	tag->hashcode = hash_bytes((const unsigned char *) key, len) ^
		murmurhash32((uint32) MyDatabaseId);
}

static LWLock *
partition_lock(uint32 hashcode)
{
	return mem->partitions[hashcode % MEM_PARTITIONS];
}

/*
 * The overlay; NULL (unless create is set) when this transaction changed
 * nothing.
 */
static HTAB *
overlay(bool create)
{
	if (mine == NULL && create)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(MemTag);
		ctl.entrysize = sizeof(MemLatest);
		ctl.hash = memtag_hash;
		ctl.match = memtag_match;
		ctl.hcxt = TopMemoryContext;
		mine = hash_create("dlock memory changes", 16, &ctl,
						   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE |
						   HASH_CONTEXT);
	}
	return mine_log != NULL || create ? mine : NULL;
}

/* Empty the overlay at the end of a transaction. */
static void
overlay_reset(void)
{
	HASH_SEQ_STATUS status;
	MemLatest  *l;

	mine_log = NULL;
	if (mine == NULL || hash_get_num_entries(mine) == 0)
		return;
	hash_seq_init(&status, mine);
	while ((l = hash_seq_search(&status)) != NULL)
		(void) hash_search(mine, &l->tag, HASH_REMOVE, NULL);
}

/* Our latest uncommitted change of tag, or NULL. */
static MemChange *
my_change(const MemTag *tag)
{
	HTAB	   *o = overlay(false);
	MemLatest  *l;

	if (o == NULL)
		return NULL;
	l = hash_search(o, tag, HASH_FIND, NULL);
	return l ? l->change : NULL;
}

/*
 * Copy the committed version of tag into *v (found = false: none); only its
 * lease unless full is set (the rest is a kilobyte and a half).
 */
static void
read_shared(const MemTag *tag, MemVersion *v, bool full)
{
	LWLock	   *lock = partition_lock(tag->hashcode);
	MemEntry   *e;

	LWLockAcquire(lock, LW_SHARED);
	e = hash_search_with_hash_value(mem_htab, tag, tag->hashcode,
									HASH_FIND, NULL);
	if (e == NULL)
	{
		memset(&v->lease, 0, sizeof(DlockLease));
		v->lease.hold_limit = DT_NOEND;
	}
	else if (full)
		memcpy(v, &e->v, sizeof(MemVersion));
	else
		v->lease = e->v.lease;
	LWLockRelease(lock);
	if (e == NULL && full)
	{
		v->pid = 0;
		v->has_pid = false;
		v->holder_len = -1;
		v->value_len = -1;
		v->application_name[0] = '\0';
	}
}

/*
 * The version of tag this transaction sees: its own change, else the
 * shared one (only its lease unless full is set).
 */
static void
read_version(const MemTag *tag, MemVersion *v, bool full)
{
	MemChange  *c = my_change(tag);

	if (c == NULL)
		read_shared(tag, v, full);
	else if (full)
		memcpy(v, &c->v, sizeof(MemVersion));
	else
		v->lease = c->v.lease;
}

/*
 * Read key's lease as this transaction sees it (storage.c applies the
 * barrier).  No lock of the key is needed; the caller decides which one
 * makes the answer stable, as in table mode.
 */
void
dlock_mem_read(const char *key, int len, DlockLease *lease)
{
	MemTag		tag;
	MemVersion	v;

	make_tag(&tag, key, len);
	read_version(&tag, &v, false);
	*lease = v.lease;
}

static bool reclaim_dropped_databases(void);

#define MEM_EVICT_BATCH		256
#define MEM_ROOM_RECHECK	USECS_PER_SEC

/* Add delta to database db's count of entries (none below 0). */
static void
count_entries(Oid db, int delta)
{
	int			i;

	SpinLockAcquire(&mem->mutex);
	for (i = 0; i < dlock_memory_max_databases; i++)
	{
		MemDatabase *d = &mem->dbs[i];

		if (d->db == db)
		{
			d->nentries = Max(d->nentries + delta, 0);
			break;
		}
	}
	SpinLockRelease(&mem->mutex);
}

/* Has this database as many entries as dlock.memory_max_keys_per_database? */
static bool
over_database_share(void)
{
	bool		over = false;
	int			i;

	if (dlock_memory_max_keys_per_db <= 0)
		return false;
	SpinLockAcquire(&mem->mutex);
	for (i = 0; i < dlock_memory_max_databases; i++)
	{
		MemDatabase *d = &mem->dbs[i];

		if (d->db == MyDatabaseId)
		{
			over = d->nentries >= dlock_memory_max_keys_per_db;
			break;
		}
	}
	SpinLockRelease(&mem->mutex);
	return over;
}

/*
 * May make_room scan the entries?  Not within a second of a scan that
 * freed nothing, unless a lease was released or ended since (an expiry is
 * noticed within the second).  With found_nothing, record such a scan.
 */
static bool
room_worth_scanning(bool found_nothing)
{
	TimestampTz now = GetCurrentTimestamp();
	uint64		releases = pg_atomic_read_u64(&mem->releases);
	bool		worth = true;
	int			i;

	SpinLockAcquire(&mem->mutex);
	for (i = 0; i < dlock_memory_max_databases; i++)
	{
		MemDatabase *d = &mem->dbs[i];

		if (d->db != MyDatabaseId)
			continue;
		if (found_nothing)
		{
			d->room_checked = now;
			d->room_releases = releases;
		}
		else
			worth = (now - d->room_checked >= MEM_ROOM_RECHECK ||
					 now < d->room_checked ||	/* the clock went back */
					 releases != d->room_releases);
		break;
	}
	SpinLockRelease(&mem->mutex);
	return worth;
}

/* An entry make_room may drop: its name and the lease it had then. */
typedef struct MemCandidate
{
	MemTag		tag;
	DlockLease	lease;
} MemCandidate;

/*
 * Remove the entry of tag if nobody has pinned it and its lease is still
 * *lease; return whether it did.
 */
static bool
drop_if_unchanged(const MemTag *tag, const DlockLease *lease)
{
	LWLock	   *lock = partition_lock(tag->hashcode);
	MemEntry   *e;
	bool		dropped = false;

	LWLockAcquire(lock, LW_EXCLUSIVE);
	e = hash_search_with_hash_value(mem_htab, tag, tag->hashcode,
									HASH_FIND, NULL);
	if (e != NULL && e->pins == 0 &&
		memcmp(&e->v.lease, lease, sizeof(DlockLease)) == 0)
	{
		hash_search_with_hash_value(mem_htab, tag, tag->hashcode,
									HASH_REMOVE, NULL);
		dropped = true;
	}
	LWLockRelease(lock);
	if (dropped)
	{
		count_entries(tag->db, -1);
		pg_atomic_fetch_add_u64(&mem->releases, 1);
	}
	return dropped;
}

/*
 * The hash is full (or this database has its whole share, own_only): free
 * what can go without changing what any lease means, and return whether
 * anything was freed.  First the entries of dropped databases; then up to
 * MEM_EVICT_BATCH entries whose lease has ended (released, expired with no
 * lock delay running, or session-bound with its connection gone), of any
 * database unless own_only: an ended lease must never deny anybody a
 * grant.  An entry that a transaction in flight has changed is pinned and
 * never dropped.  Like prune(), this loses such a key's history for the
 * monotonic fencing mode.
 */
static bool
make_room(bool own_only)
{
	HASH_SEQ_STATUS status;
	MemEntry   *e;
	MemCandidate *cand;
	int			ncand = 0;
	int			nbound = 0;
	int			freed = 0;
	TimestampTz now = GetCurrentTimestamp();
	int			i;

	if (reclaim_dropped_databases())
		return true;

	/*
	 * A scan holds every partition lock for as long as it reads the whole
	 * hash: after one that freed nothing, this database's failing grants
	 * do not scan again for a second, or until a lease ends (they must not
	 * slow everybody's commits).
	 */
	if (!room_worth_scanning(false))
		return false;

	/*
	 * Two lists: leases ended by the clock or a release, and session-bound
	 * leases whose connection may be gone, which can only be asked once
	 * the partition locks are released.  The scan stops when the first is
	 * full; live session-bound leases never crowd ended leases out.
	 */
	cand = palloc(sizeof(MemCandidate) * MEM_EVICT_BATCH * 2);
	for (i = 0; i < MEM_PARTITIONS; i++)
		LWLockAcquire(mem->partitions[i], LW_SHARED);
	hash_seq_init(&status, mem_htab);
	while ((e = hash_seq_search(&status)) != NULL)
	{
		DlockLease *l = &e->v.lease;
		MemCandidate *c;

		/*
		 * (Nor the head of a key with permits or shared leases: it records
		 * where they are; prune() drops it once they are all gone.)
		 */
		if (e->pins != 0 || !l->found || l->nslots > 0 ||
			(own_only && e->tag.db != MyDatabaseId))
			continue;
		if (!l->held ||
			(l->expires_at < now &&
			 !(l->lock_delay > 0 && now < l->expires_at + l->lock_delay)))
		{
			c = &cand[ncand];
			c->tag = e->tag;
			c->lease = *l;
			if (++ncand == MEM_EVICT_BATCH)
			{
				hash_seq_term(&status);
				break;
			}
		}
		else if (l->session_id != 0 && nbound < MEM_EVICT_BATCH)
		{
			c = &cand[MEM_EVICT_BATCH + nbound++];
			c->tag = e->tag;
			c->lease = *l;
		}
	}
	for (i = MEM_PARTITIONS - 1; i >= 0; i--)
		LWLockRelease(mem->partitions[i]);

	for (i = 0; i < ncand; i++)
	{
		if (drop_if_unchanged(&cand[i].tag, &cand[i].lease))
			freed++;
	}
	for (i = MEM_EVICT_BATCH; i < MEM_EVICT_BATCH + nbound; i++)
	{
		if (dlock_lease_ended_at(&cand[i].lease, cand[i].tag.db) == DT_NOEND)
			continue;
		if (drop_if_unchanged(&cand[i].tag, &cand[i].lease))
			freed++;
	}
	pfree(cand);
	if (freed == 0)
		(void) room_worth_scanning(true);
	return freed > 0;
}

/*
 * Pin the shared entry of tag for a change of this transaction, reserving
 * it (an entry that reads as "no row") when there is none, so that the
 * copy at commit, which must not fail, always has its entry and nobody
 * drops it meanwhile.  Return whether it was reserved now.  Fails when
 * the table is full, or this database has its whole share.
 */
static bool
pin_entry(const MemTag *tag)
{
	uint32		hashcode = tag->hashcode;
	LWLock	   *lock = partition_lock(hashcode);
	MemEntry   *e;
	bool		over = false;
	int			attempt;

	for (attempt = 0; attempt < 3; attempt++)
	{
		bool		found;

		LWLockAcquire(lock, LW_EXCLUSIVE);
		e = hash_search_with_hash_value(mem_htab, tag, hashcode,
										HASH_FIND, NULL);
		if (e != NULL)
		{
			e->pins++;
			LWLockRelease(lock);
			return false;
		}
		over = over_database_share();
		if (!over)
		{
			e = hash_search_with_hash_value(mem_htab, tag, hashcode,
											HASH_ENTER_NULL, &found);
			if (e != NULL)
			{
				memset(&e->v, 0, sizeof(MemVersion));
				e->v.lease.hold_limit = DT_NOEND;
				e->v.holder_len = -1;
				e->v.value_len = -1;
				e->pins = 1;
			}
		}
		LWLockRelease(lock);
		if (e != NULL)
		{
			count_entries(MyDatabaseId, 1);
			return true;
		}
		if (!make_room(over))
			break;
	}
	if (over)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("database \"%s\" has as many keys in dlock's shared memory as it may",
						get_database_name(MyDatabaseId)),
				 errdetail("dlock.memory_max_keys_per_database is %d, and this database has that many keys with live leases or locked at the moment.",
						   dlock_memory_max_keys_per_db),
				 errhint("Entries of ended leases are dropped when room is needed.  Raise dlock.memory_max_keys_per_database, or lower dlock.max_ttl.")));
	ereport(ERROR,
			(errcode(ERRCODE_OUT_OF_MEMORY),
			 errmsg("dlock's shared memory for leases is full"),
			 errdetail("dlock.memory_max_keys is %d, and that many keys have live leases or are locked at the moment.",
					   dlock_memory_max_keys),
			 errhint("Entries of ended leases, of any database, are dropped when room is needed.  Raise dlock.memory_max_keys (needs a restart), set dlock.memory_max_keys_per_database so that no database takes the whole pool, or lower dlock.max_ttl.")));
	return false;				/* keep compiler quiet */
}

/*
 * Give back our pin of the shared entry of tag; an entry that we reserved
 * and that never got a lease goes with it.
 */
static void
unpin_entry(const MemTag *tag)
{
	LWLock	   *lock = partition_lock(tag->hashcode);
	MemEntry   *e;
	bool		dropped = false;

	LWLockAcquire(lock, LW_EXCLUSIVE);
	e = hash_search_with_hash_value(mem_htab, tag, tag->hashcode,
									HASH_FIND, NULL);
	if (e != NULL)
	{
		if (e->pins > 0)
			e->pins--;
		if (e->pins == 0 && !e->v.lease.found)
		{
			hash_search_with_hash_value(mem_htab, tag, tag->hashcode,
										HASH_REMOVE, NULL);
			dropped = true;
		}
	}
	LWLockRelease(lock);
	if (dropped)
		count_entries(tag->db, -1);
}

/* Set *dst (len bytes at most) from t, NULL for none (*dst_len -1). */
static void
set_text(char *dst, int16 *dst_len, int max, const text *t)
{
	if (t == NULL)
	{
		*dst_len = -1;
		return;
	}
	*dst_len = VARSIZE_ANY_EXHDR(t);
	Assert(*dst_len <= max);
	memcpy(dst, VARDATA_ANY(t), *dst_len);
}

/*
 * Start a change of key in this transaction's overlay, from the version it
 * sees (all of it unless full is false: a grant replaces the rest); it
 * reaches shared memory at commit.  The caller holds the key lock that
 * serializes changes to the key, and fills in the change.  The first
 * change of a key in the transaction pins its shared entry (pin_entry),
 * which fails when there is no room.
 */
static MemChange *
begin_write(const char *key, int len, bool full)
{
	MemTag		tag;
	MemChange  *c;
	MemLatest  *l;
	bool		found;
	bool		created = false;
	bool		pinned = false;
	HTAB	   *o;

	make_tag(&tag, key, len);
	if (my_change(&tag) == NULL)
	{
		created = pin_entry(&tag);
		pinned = true;
	}

	o = overlay(true);
	c = MemoryContextAllocZero(TopTransactionContext, sizeof(MemChange));
	read_version(&tag, &c->v, full);
	c->tag = tag;
	c->subid = GetCurrentSubTransactionId();
	c->created = created;
	c->pinned = pinned;

	l = hash_search(o, &tag, HASH_ENTER, &found);
	c->prev_same = found ? l->change : NULL;
	l->change = c;
	c->prev_log = mine_log;
	mine_log = c;
	return c;
}

/*
 * Record a change of key to *lease in this transaction's overlay: for a
 * grant (grant set), with its holder label and value and the grantor's
 * details; else keeping the current ones.
 */
void
dlock_mem_write(const char *key, int len, const DlockLease *lease,
				const DlockGrantOptions *grant)
{
	MemChange  *c = begin_write(key, len, grant == NULL);

	c->v.lease = *lease;
	if (grant != NULL)
	{
		c->v.pid = MyProcPid;
		c->v.has_pid = true;
		if (application_name != NULL)
			strlcpy(c->v.application_name, application_name, NAMEDATALEN);
		else
			c->v.application_name[0] = '\0';
		set_text(c->v.holder, &c->v.holder_len, DLOCK_MAX_HOLDER_BYTES,
				 grant->holder);
		set_text(c->v.value, &c->v.value_len, DLOCK_MAX_VALUE_BYTES,
				 grant->value);
	}
}

/* Record a new value of key's lease (proclaim), keeping the rest. */
void
dlock_mem_write_value(const char *key, int len, const text *value)
{
	MemChange  *c = begin_write(key, len, true);

	if (!c->v.lease.found)
		elog(ERROR, "dlock: lease of a held key vanished");
	set_text(c->v.value, &c->v.value_len, DLOCK_MAX_VALUE_BYTES, value);
}

/*
 * Undo our changes made in subtransaction subid or later ones (all of them
 * when subid is InvalidSubTransactionId).
 */
static void
undo_changes(SubTransactionId subid)
{
	while (mine_log != NULL && mine_log->subid >= subid)
	{
		MemChange  *c = mine_log;
		MemLatest  *l = hash_search(mine, &c->tag, HASH_FIND, NULL);

		Assert(l != NULL && l->change == c);
		l->change = c->prev_same;
		if (c->pinned)
			unpin_entry(&c->tag);
		mine_log = c->prev_log;
	}
}

/*
 * Copy our latest changes into shared memory and give back their pins; at
 * commit, must not fail.
 */
static void
publish_changes(void)
{
	HASH_SEQ_STATUS status;
	MemLatest  *l;

	hash_seq_init(&status, mine);
	while ((l = hash_seq_search(&status)) != NULL)
	{
		uint32		hashcode;
		LWLock	   *lock;
		MemEntry   *e;
		bool		found;

		if (l->change == NULL)
			continue;
		hashcode = l->tag.hashcode;
		lock = partition_lock(hashcode);
		LWLockAcquire(lock, LW_EXCLUSIVE);
		e = hash_search_with_hash_value(mem_htab, &l->tag, hashcode,
										HASH_ENTER_NULL, &found);
		if (e != NULL)
		{
			/* anything that is not held any more may make room */
			if (!l->change->v.lease.held)
				pg_atomic_fetch_add_u64(&mem->releases, 1);
			memcpy(&e->v, &l->change->v, sizeof(MemVersion));
			if (!found)
				e->pins = 0;
			else if (e->pins > 0)
				e->pins--;
		}
		LWLockRelease(lock);
		if (e == NULL)			/* cannot happen: the entry was pinned */
			elog(WARNING, "dlock: no room in memory to commit a lease change");
		else if (!found)
			count_entries(l->tag.db, 1);
	}
}

/*
 * At commit, before the key locks go, make our changes everyone's; at
 * abort, drop them.  A PREPARE TRANSACTION that changed leases is refused:
 * the changes live in this backend.
 */
void
dlock_mem_xact_callback(XactEvent event)
{
	if (OidIsValid(dropping_db) &&
		(event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT))
	{
		Oid			db = dropping_db;

		dropping_db = InvalidOid;
		if (event == XACT_EVENT_COMMIT && mem != NULL)
			forget_dropped(db);
	}
	if (mem == NULL || mine == NULL || hash_get_num_entries(mine) == 0)
		return;
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			if (mine_log != NULL)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that changed dlock leases in memory mode")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			publish_changes();
			overlay_reset();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			undo_changes(InvalidSubTransactionId);
			overlay_reset();
			break;
		case XACT_EVENT_PREPARE:
			overlay_reset();
			break;
		default:
			break;
	}
}

/* A subtransaction abort drops the changes made inside it. */
void
dlock_mem_subxact_abort(SubTransactionId subid)
{
	if (mem == NULL || mine_log == NULL)
		return;
	undo_changes(subid);
}

/* A row for the views from tag and *v. */
static DlockLeaseRow *
make_row(const MemTag *tag, const MemVersion *v)
{
	DlockLeaseRow *row = palloc0(sizeof(DlockLeaseRow));

	row->key = cstring_to_text(tag->key);
	row->lease = v->lease;
	if (v->holder_len >= 0)
		row->holder = cstring_to_text_with_len(v->holder, v->holder_len);
	if (v->value_len >= 0)
		row->value = cstring_to_text_with_len(v->value, v->value_len);
	row->has_pid = v->has_pid;
	row->pid = v->pid;
	if (v->application_name[0] != '\0')
		row->application_name = cstring_to_text(v->application_name);
	return row;
}

/*
 * Return key's lease, with what the views show, as this transaction sees
 * it; NULL when the key has none (storage.c applies the barrier).
 */
DlockLeaseRow *
dlock_mem_read_row(const char *key, int len)
{
	MemTag		tag;
	MemVersion *v = palloc(sizeof(MemVersion));
	DlockLeaseRow *row = NULL;

	make_tag(&tag, key, len);
	read_version(&tag, v, true);
	if (v->lease.found)
		row = make_row(&tag, v);
	pfree(v);
	return row;
}

/*
 * Return every lease of this database (a List of DlockLeaseRow), as this
 * transaction sees them: the committed ones, with its own changes.  All
 * partitions are locked at once, as pg_locks does, for a consistent copy.
 */
List *
dlock_mem_scan(void)
{
	HASH_SEQ_STATUS status;
	MemEntry   *e;
	List	   *rows = NIL;
	int			i;

	for (i = 0; i < MEM_PARTITIONS; i++)
		LWLockAcquire(mem->partitions[i], LW_SHARED);
	hash_seq_init(&status, mem_htab);
	while ((e = hash_seq_search(&status)) != NULL)
	{
		if (e->tag.db != MyDatabaseId || my_change(&e->tag) != NULL)
			continue;
		if (e->v.lease.found)
			rows = lappend(rows, make_row(&e->tag, &e->v));
	}
	for (i = MEM_PARTITIONS - 1; i >= 0; i--)
		LWLockRelease(mem->partitions[i]);

	/* our own changes (allocated after the locks are gone) */
	if (overlay(false) != NULL)
	{
		HASH_SEQ_STATUS ostatus;
		MemLatest  *l;

		hash_seq_init(&ostatus, mine);
		while ((l = hash_seq_search(&ostatus)) != NULL)
		{
			/* (a key whose changes were all undone was in the first pass) */
			if (l->change != NULL && l->change->v.lease.found)
				rows = lappend(rows, make_row(&l->tag, &l->change->v));
		}
	}
	return rows;
}

/*
 * Delete key's entry if its lease ended (dlock_lease_ended_at) before
 * cutoff, or in any case when force is set; return whether it did.  The
 * caller holds the key's grant lock.  Takes effect at once (see Room
 * above); a key that a transaction in flight changed (this one included)
 * is left alone.
 */
bool
dlock_mem_delete_old(const char *key, int len, TimestampTz cutoff,
					 bool force)
{
	MemTag		tag;
	MemVersion	v;

	make_tag(&tag, key, len);
	if (my_change(&tag) != NULL)
		return false;
	read_shared(&tag, &v, false);
	if (!v.lease.found)
		return false;
	if (!force && dlock_lease_ended_at(&v.lease, MyDatabaseId) >= cutoff)
		return false;
	return drop_if_unchanged(&tag, &v.lease);
}

/*
 * Remove every entry of database db (dropped, or its extension created
 * anew).  locked: the caller holds every partition lock exclusively.
 */
static void
forget_database(Oid db, bool locked)
{
	HASH_SEQ_STATUS status;
	MemEntry   *e;
	int			i;

	if (!locked)
		for (i = 0; i < MEM_PARTITIONS; i++)
			LWLockAcquire(mem->partitions[i], LW_EXCLUSIVE);
	hash_seq_init(&status, mem_htab);
	while ((e = hash_seq_search(&status)) != NULL)
	{
		if (e->tag.db == db)
			hash_search(mem_htab, &e->tag, HASH_REMOVE, NULL);
	}
	if (!locked)
		for (i = MEM_PARTITIONS - 1; i >= 0; i--)
			LWLockRelease(mem->partitions[i]);
	SpinLockAcquire(&mem->mutex);
	for (i = 0; i < dlock_memory_max_databases; i++)
	{
		if (mem->dbs[i].db == db)
			mem->dbs[i].nentries = 0;
	}
	SpinLockRelease(&mem->mutex);
}

/*
 * This database's slot for token sequence seq, or NULL.  (A slot is only
 * ever taken over under the spinlock; callers check it again under it.)
 */
static MemDatabase *
find_slot(Oid seq)
{
	int			i;

	for (i = 0; i < dlock_memory_max_databases; i++)
	{
		MemDatabase *d = &mem->dbs[i];

		if (d->db == MyDatabaseId && d->seq == seq)
			return d;
	}
	return NULL;
}

/*
 * This database's barrier (before it every key is held by *unknown_owner)
 * and horizon, if they are known for token sequence seq since memory was
 * set up; false if not (horizon.c then reads them and calls
 * dlock_mem_db_set).  writer: a grant or renewal asks, which marks the slot
 * used (idle_slot).
 */
bool
dlock_mem_db_get(Oid seq, TimestampTz *barrier, TimestampTz *horizon,
				 pg_uuid_t *unknown_owner, bool writer)
{
	bool		known = false;
	TimestampTz now = writer ? GetCurrentTimestamp() : 0;
	int			i;

	SpinLockAcquire(&mem->mutex);
	for (i = 0; i < dlock_memory_max_databases; i++)
	{
		MemDatabase *d = &mem->dbs[i];

		if (d->db == MyDatabaseId && d->seq == seq)
		{
			*barrier = d->barrier;
			*horizon = d->horizon;
			*unknown_owner = d->unknown_owner;
			if (writer)
				d->last_used = now;
			known = true;
			break;
		}
	}
	SpinLockRelease(&mem->mutex);
	return known;
}

/*
 * Free the slots (and entries) of databases that no longer exist; return
 * whether any was freed.
 */
static bool
reclaim_dropped_databases(void)
{
	Oid		   *dbs = palloc(sizeof(Oid) * dlock_memory_max_databases);
	bool	   *dropped = palloc(sizeof(bool) * dlock_memory_max_databases);
	bool		any = false;
	int			i;

	SpinLockAcquire(&mem->mutex);
	for (i = 0; i < dlock_memory_max_databases; i++)
		dbs[i] = mem->dbs[i].db;
	SpinLockRelease(&mem->mutex);

	for (i = 0; i < dlock_memory_max_databases; i++)
		dropped[i] = OidIsValid(dbs[i]) &&
			!SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dbs[i]));

	SpinLockAcquire(&mem->mutex);
	for (i = 0; i < dlock_memory_max_databases; i++)
	{
		if (dropped[i] && mem->dbs[i].db == dbs[i])
			mem->dbs[i].db = InvalidOid;
		else
			dropped[i] = false;
	}
	SpinLockRelease(&mem->mutex);

	for (i = 0; i < dlock_memory_max_databases; i++)
	{
		if (dropped[i])
		{
			forget_database(dbs[i], false);
			any = true;
		}
	}
	pfree(dbs);
	pfree(dropped);
	return any;
}

/* Fill slot for token sequence seq; the caller holds mem->mutex. */
static void
fill_slot(MemDatabase *slot, Oid seq, TimestampTz barrier,
		  TimestampTz horizon, const pg_uuid_t *unknown)
{
	slot->seq = seq;
	slot->barrier = barrier;
	slot->horizon = horizon;
	slot->pending = 0;
	slot->horizon_lsn = InvalidXLogRecPtr;
	slot->room_checked = 0;
	slot->nentries = 0;
	slot->last_used = 0;
	slot->unknown_owner = *unknown;
	slot->tok_seq = InvalidOid;
	slot->tok_refiller = 0;
	slot->tok_moved = false;
}

/*
 * The slot of a database that may be taken over under the mutex, or NULL:
 * its horizon and barrier have passed, no horizon of its is pending, and it
 * has not been used for MEM_SLOT_IDLE (a slot just taken for a grant is not
 * up for grabs before that grant moves its horizon).  No lease of such a
 * database is live (none outlives the horizon), so its entries are all of
 * ended leases.  One with no entry left is preferred.
 */
#define MEM_SLOT_IDLE	USECS_PER_SEC

static MemDatabase *
idle_slot(TimestampTz now)
{
	MemDatabase *idle = NULL;
	int			i;

	for (i = 0; i < dlock_memory_max_databases; i++)
	{
		MemDatabase *d = &mem->dbs[i];

		if (OidIsValid(d->db) && d->pending == 0 && d->horizon <= now &&
			d->barrier <= now && now - d->last_used >= MEM_SLOT_IDLE &&
			(idle == NULL || d->nentries < idle->nentries))
		{
			idle = d;
			if (d->nentries == 0)
				break;
		}
	}
	return idle;
}

/* This database's slot, or a free one, or NULL; the caller holds the mutex. */
static MemDatabase *
own_or_free_slot(void)
{
	MemDatabase *slot = NULL;
	int			i;

	for (i = 0; i < dlock_memory_max_databases; i++)
	{
		MemDatabase *d = &mem->dbs[i];

		if (d->db == MyDatabaseId)
			return d;
		if (slot == NULL && d->db == InvalidOid)
			slot = d;
	}
	return slot;
}

/*
 * Record this database's barrier and horizon for token sequence seq, unless
 * another backend did first; either way return in *barrier, *horizon and
 * *unknown what the slot holds.  A slot for an older sequence (the
 * extension was dropped and created again) is taken over and its entries
 * forgotten.  When no slot is free, an idle one (idle_slot) is taken over
 * and the other database's entries, all of ended leases, forgotten.  Both
 * happen under every partition lock, taken before the slot is looked at:
 * nobody can write an entry in between, neither into the slot taken over
 * nor for the database that lost it (which takes another slot and writes
 * its entries once the old ones are gone).
 */
void
dlock_mem_db_set(Oid seq, TimestampTz *barrier, TimestampTz *horizon,
				 pg_uuid_t *unknown)
{
	MemDatabase *slot;
	Oid			forget = InvalidOid;
	bool		all_locked = false;
	int			attempt;
	int			i;
	pg_uuid_t	fresh;

	dlock_random(fresh.data, UUID_LEN, "owner token");

	for (attempt = 0; attempt < 3; attempt++)
	{
		TimestampTz now = GetCurrentTimestamp();
		bool		need_locks;

		SpinLockAcquire(&mem->mutex);
		slot = own_or_free_slot();
		need_locks = (slot == NULL && idle_slot(now) != NULL) ||
			(slot != NULL && slot->db == MyDatabaseId && slot->seq != seq);
		if (!need_locks || all_locked)
		{
			if (slot == NULL)
			{
				slot = idle_slot(now);
				if (slot != NULL && slot->nentries > 0)
					forget = slot->db;
			}
			else if (slot->db == MyDatabaseId && slot->seq != seq)
				forget = MyDatabaseId;
			if (slot != NULL && (slot->db != MyDatabaseId || slot->seq != seq))
			{
				slot->db = MyDatabaseId;
				fill_slot(slot, seq, *barrier, *horizon, &fresh);
			}
			if (slot != NULL)
			{
				slot->last_used = now;
				*barrier = slot->barrier;
				*horizon = slot->horizon;
				*unknown = slot->unknown_owner;
			}
			SpinLockRelease(&mem->mutex);
			if (slot != NULL || all_locked)
				break;
		}
		else
		{
			SpinLockRelease(&mem->mutex);
			for (i = 0; i < MEM_PARTITIONS; i++)
				LWLockAcquire(mem->partitions[i], LW_EXCLUSIVE);
			all_locked = true;
			continue;
		}
		if (!reclaim_dropped_databases())
			break;
	}

	if (OidIsValid(forget))
	{
		Assert(all_locked);
		forget_database(forget, true);
	}
	if (all_locked)
		for (i = MEM_PARTITIONS - 1; i >= 0; i--)
			LWLockRelease(mem->partitions[i]);
	if (slot == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("too many databases use dlock in memory mode"),
				 errdetail("At most %d databases can keep leases in memory at once.",
						   dlock_memory_max_databases),
				 errhint("Raise dlock.memory_max_databases (needs a restart).  A database gives its slot up once its horizon has passed and it has not been used for a second.")));
}

/*
 * Raise this database's horizon to at least horizon (now durable), and its
 * barrier too if barrier_too is set.  A pending horizon it reaches is no
 * longer pending.
 */
void
dlock_mem_db_advance(Oid seq, TimestampTz horizon, bool barrier_too)
{
	MemDatabase *d = find_slot(seq);

	if (d == NULL)
		return;
	SpinLockAcquire(&mem->mutex);
	if (d->db == MyDatabaseId && d->seq == seq)
	{
		if (d->horizon < horizon)
			d->horizon = horizon;
		if (barrier_too && d->barrier < horizon)
			d->barrier = horizon;
		if (d->pending <= d->horizon)
			d->pending = 0;
	}
	SpinLockRelease(&mem->mutex);
}

/*
 * Set or read this database's pending horizon: a value written to the
 * horizon sequence whose confirmation (flush, synchronous standbys) has not
 * completed, perhaps cancelled.  The caller holds the horizon lock.
 */
void
dlock_mem_db_set_pending(Oid seq, TimestampTz pending)
{
	MemDatabase *d = find_slot(seq);

	if (d == NULL)
		return;
	SpinLockAcquire(&mem->mutex);
	if (d->db == MyDatabaseId && d->seq == seq)
		d->pending = pending;
	SpinLockRelease(&mem->mutex);
}

TimestampTz
dlock_mem_db_pending(Oid seq)
{
	MemDatabase *d = find_slot(seq);
	TimestampTz pending = 0;

	if (d == NULL)
		return 0;
	SpinLockAcquire(&mem->mutex);
	if (d->db == MyDatabaseId && d->seq == seq)
		pending = d->pending;
	SpinLockRelease(&mem->mutex);
	return pending;
}

/*
 * The LSN of the horizon sequence's page as this database last knew it;
 * with lsn valid, record that instead (the caller holds the horizon lock).
 */
XLogRecPtr
dlock_mem_db_horizon_lsn(Oid seq, XLogRecPtr lsn)
{
	MemDatabase *d = find_slot(seq);
	XLogRecPtr	result = InvalidXLogRecPtr;

	if (d == NULL)
		return InvalidXLogRecPtr;
	SpinLockAcquire(&mem->mutex);
	if (d->db == MyDatabaseId && d->seq == seq)
	{
		if (lsn != InvalidXLogRecPtr)
			d->horizon_lsn = lsn;
		result = d->horizon_lsn;
	}
	SpinLockRelease(&mem->mutex);
	return result;
}

/* ---------------------------------------------------------------------
 * The database's block of fencing tokens (see durable.c)
 * ---------------------------------------------------------------------
 */

/*
 * Tokens reserved at once.  A block costs one WAL flush (and, with
 * synchronous standbys, one round trip) and is reserved again when half of
 * it is left, so the grants that follow never wait for that; a restart
 * skips what was left of it.
 */
#define MEM_TOKEN_BLOCK		1024

typedef enum TokenTake
{
	TOKEN_TAKEN,				/* a token from the block */
	TOKEN_TAKEN_LOW,			/* ... and it is time to reserve more */
	TOKEN_NONE,					/* no block, used up, or no longer trusted */
	TOKEN_NO_SLOT				/* the database has no slot */
} TokenTake;

/* The slot whose refill this backend is doing, for refill_exit. */
static MemDatabase *refilling_slot = NULL;

/*
 * Take the next token of this database's block for token sequence tokseq,
 * if the sequences' pages still say what the block's reservation left
 * there (tok_lsn and copy_lsn, read by the caller).  While a backend
 * extends the block, its tokens are still good, and the pages may also say
 * what that backend's move of the sequences left there; but anybody else's
 * change (a restore raising fence_seq) is noticed at once, even while the
 * refill waits for the synchronous standbys: the caller then waits for the
 * refill to end, and starts a new block past what the sequences say.
 */
static TokenTake
take_token(Oid seq, Oid tokseq, XLogRecPtr tok_lsn, XLogRecPtr copy_lsn,
		   int64 *token, XLogRecPtr *confirm)
{
	MemDatabase *d = find_slot(seq);
	TokenTake	r = TOKEN_NO_SLOT;

	if (d == NULL)
		return r;
	SpinLockAcquire(&mem->mutex);
	if (d->db == MyDatabaseId && d->seq == seq)
	{
		r = TOKEN_NONE;
		if (d->tok_seq == tokseq && d->tok_next <= d->tok_last &&
			((d->tok_lsn == tok_lsn && d->tok_copy_lsn == copy_lsn) ||
			 (d->tok_refiller != 0 && d->tok_moved &&
			  d->tok_moved_lsn == tok_lsn &&
			  d->tok_moved_copy_lsn == copy_lsn)))
		{
			*token = d->tok_next++;
			*confirm = d->tok_confirm;
			r = d->tok_refiller == 0 &&
				d->tok_last - d->tok_next < MEM_TOKEN_BLOCK / 2 ?
				TOKEN_TAKEN_LOW : TOKEN_TAKEN;
		}
	}
	SpinLockRelease(&mem->mutex);
	return r;
}

/* End this backend's refill of slot d: publish the block, or drop it. */
static void
end_refill(MemDatabase *d, Oid seq, Oid tokseq, bool ok, bool extend,
		   int64 first, int64 last, const DlockSeqPage *tok,
		   const DlockSeqPage *copy, XLogRecPtr confirm)
{
	SpinLockAcquire(&mem->mutex);
	if (d->db == MyDatabaseId && d->seq == seq &&
		d->tok_refiller == MyProc->pgprocno + 1)
	{
		d->tok_refiller = 0;
		d->tok_moved = false;
		if (!ok)
			d->tok_seq = InvalidOid;
		else
		{
			if (!extend)
				d->tok_next = first;
			d->tok_seq = tokseq;
			d->tok_last = last;
			d->tok_lsn = tok->lsn;
			d->tok_copy_lsn = copy->lsn;
			d->tok_confirm = confirm;
		}
	}
	SpinLockRelease(&mem->mutex);
	refilling_slot = NULL;
}

/* A backend that exits in the middle of a refill (FATAL) drops the block. */
static void
refill_exit(int code, Datum arg)
{
	if (refilling_slot != NULL)
		end_refill(refilling_slot, refilling_slot->seq, InvalidOid, false,
				   false, 0, 0, NULL, NULL, InvalidXLogRecPtr);
}

/*
 * Move the sequences to last for the refill of slot d (dlock_token_reserve),
 * tell the drawers what that left on the pages, and confirm it; an error
 * drops the block (end_refill) and goes on.
 */
static bool
reserve(MemDatabase *d, Oid seq, int64 last, DlockSeqPage *tok,
		DlockSeqPage *copy, XLogRecPtr *confirm)
{
	bool		ok = false;

	PG_TRY();
	{
		ok = dlock_token_reserve(last, tok, copy);
		*confirm = Max(tok->lsn, copy->lsn);
		if (ok)
		{
			SpinLockAcquire(&mem->mutex);
			if (d->db == MyDatabaseId && d->seq == seq &&
				d->tok_refiller == MyProc->pgprocno + 1)
			{
				d->tok_moved = true;
				d->tok_moved_lsn = tok->lsn;
				d->tok_moved_copy_lsn = copy->lsn;
			}
			SpinLockRelease(&mem->mutex);
			dlock_token_confirm(*confirm);
		}
	}
	PG_CATCH();
	{
		end_refill(d, seq, InvalidOid, false, false, 0, 0, NULL, NULL,
				   InvalidXLogRecPtr);
		PG_RE_THROW();
	}
	PG_END_TRY();
	return ok;
}

/*
 * Reserve more tokens for this database: extend the block when the
 * sequences stand where its reservation left them (ahead: only then),
 * else start a new one past whatever either sequence may have returned.
 * The caller holds dlock_token_lock.  Returns whether a block was
 * published.
 */
static bool
refill(Oid seq, Oid tokseq, bool ahead)
{
	static bool exit_registered = false;
	MemDatabase *d = find_slot(seq);
	DlockSeqPage tok;
	DlockSeqPage copy;
	XLogRecPtr	confirm = InvalidXLogRecPtr;
	bool		extend;
	bool		ok;
	int64		base;

	if (d == NULL)
		return false;
	if (!exit_registered)
	{
		before_shmem_exit(refill_exit, (Datum) 0);
		exit_registered = true;
	}
	dlock_token_pages(&tok, &copy);
	SpinLockAcquire(&mem->mutex);
	if (d->db != MyDatabaseId || d->seq != seq)
	{
		SpinLockRelease(&mem->mutex);
		return false;
	}
	extend = d->tok_seq == tokseq && d->tok_lsn == tok.lsn &&
		d->tok_copy_lsn == copy.lsn && d->tok_last == tok.high &&
		d->tok_last == copy.high;
	if (ahead && !extend)
	{
		/* the drawers' check will find it untrusted and start anew */
		SpinLockRelease(&mem->mutex);
		return false;
	}
	if (!extend)
		d->tok_seq = InvalidOid;
	base = extend ? d->tok_last : Max(tok.high, copy.high);
	d->tok_refiller = MyProc->pgprocno + 1;
	d->tok_moved = false;
	refilling_slot = d;
	SpinLockRelease(&mem->mutex);

	ok = reserve(d, seq, base + MEM_TOKEN_BLOCK, &tok, &copy, &confirm);
	end_refill(d, seq, tokseq, ok, extend, base + 1, base + MEM_TOKEN_BLOCK,
			   &tok, &copy, confirm);
	return ok;
}

/*
 * Draw a fencing token for a memory grant from this database's block,
 * reserving more when needed; *confirm is the WAL to confirm under today's
 * settings before the token is shown (durable.c).  Without a slot, or
 * before 0.6, one token is drawn from the sequence.
 */
int64
dlock_mem_draw_token(XLogRecPtr *confirm)
{
	Oid			seq = dlock_objects.seq;
	Oid			tokseq = dlock_objects.token;

	while (OidIsValid(tokseq))
	{
		DlockSeqPage tok;
		DlockSeqPage copy;
		int64		token = 0;
		TokenTake	r;

		dlock_token_pages(&tok, &copy);
		r = take_token(seq, tokseq, tok.lsn, copy.lsn, &token, confirm);
		if (r == TOKEN_TAKEN_LOW && dlock_token_lock(false))
		{
			/* this grant reserves the next half ahead of the others */
			(void) refill(seq, tokseq, true);
			dlock_token_unlock();
		}
		if (r == TOKEN_TAKEN || r == TOKEN_TAKEN_LOW)
			return token;
		if (r == TOKEN_NO_SLOT)
			break;

		/* wait for a refill in flight, then look again, or refill */
		(void) dlock_token_lock(true);
		dlock_token_pages(&tok, &copy);
		r = take_token(seq, tokseq, tok.lsn, copy.lsn, &token, confirm);
		if (r == TOKEN_NONE && refill(seq, tokseq, false))
		{
			dlock_token_pages(&tok, &copy);
			r = take_token(seq, tokseq, tok.lsn, copy.lsn, &token, confirm);
		}
		dlock_token_unlock();
		if (r == TOKEN_TAKEN || r == TOKEN_TAKEN_LOW)
			return token;
		if (r == TOKEN_NO_SLOT)
			break;
		/* somebody set a sequence meanwhile: start over */
		CHECK_FOR_INTERRUPTS();
	}
	{
		int64		token = dlock_draw_token();

		*confirm = dlock_drawn_lsn();
		return token;
	}
}
