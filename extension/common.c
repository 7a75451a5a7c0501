/*-------------------------------------------------------------------------
 *
 * common.c
 *		Small helpers every part of dlock uses: strong random bytes, and a
 *		backend's hash tables of one transaction's entries.
 *
 * Owns: the backend's block of random bytes.  Calls nothing of dlock's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "dlock.h"

/*
 * Strong random bytes, drawn from pg_strong_random in blocks: one draw
 * costs about as much as a whole grant otherwise, and every grant needs 16
 * bytes for its owner.  The block is this process's own: it is refilled
 * when the process id changes, so a child never uses bytes its parent
 * drew, and each byte handed out is wiped from it.
 */
#define RANDOM_BLOCK	512

static uint8 random_block[RANDOM_BLOCK];
static int	random_used = RANDOM_BLOCK;
static int	random_pid = 0;

void
dlock_random(void *buf, size_t len, const char *what)
{
	uint8	   *out = buf;

	while (len > 0)
	{
		size_t		n;

		if (random_pid != MyProcPid || random_used == RANDOM_BLOCK)
		{
			if (!pg_strong_random(random_block, RANDOM_BLOCK))
				ereport(ERROR,
						(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
						 errmsg("could not generate a random %s", what)));
			random_used = 0;
			random_pid = MyProcPid;
		}
		n = Min(len, (size_t) (RANDOM_BLOCK - random_used));
		memcpy(out, random_block + random_used, n);
		memset(random_block + random_used, 0, n);
		random_used += n;
		out += n;
		len -= n;
	}
}

/*
 * A hash table of one transaction's entries, kept for the backend: creating
 * a table costs more than the lookups of a typical transaction, which
 * touches one key or two.  Return xh's table for the current transaction,
 * first emptying it of an earlier transaction's entries; NULL, without
 * create, when the transaction has put nothing there.  A table that grew
 * past a few dozen entries is dropped rather than emptied, so that one bulk
 * transaction does not keep its memory for the life of the connection.
 */
#define XACT_HASH_KEEP	64

HTAB *
dlock_xact_hash(DlockXactHash *xh, const char *name, Size keysize,
				Size entrysize, int flags, bool create)
{
	if (xh->htab != NULL && xh->lxid == MyProc->lxid &&
		xh->lxid != InvalidLocalTransactionId)
		return xh->htab;
	if (!create)
		return NULL;
	if (xh->htab != NULL && hash_get_num_entries(xh->htab) > XACT_HASH_KEEP)
	{
		hash_destroy(xh->htab);
		xh->htab = NULL;
	}
	if (xh->htab == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = keysize;
		ctl.entrysize = entrysize;
		ctl.hcxt = TopMemoryContext;
		xh->htab = hash_create(name, 16, &ctl, flags | HASH_ELEM | HASH_CONTEXT);
	}
	else
	{
		HASH_SEQ_STATUS status;
		void	   *entry;

		/* (removing the entry just returned is allowed during a scan) */
		hash_seq_init(&status, xh->htab);
		while ((entry = hash_seq_search(&status)) != NULL)
			(void) hash_search(xh->htab, entry, HASH_REMOVE, NULL);
	}
	xh->lxid = MyProc->lxid;
	return xh->htab;
}
