/*-------------------------------------------------------------------------
 *
 * durable.c
 *		What dlock makes durable, and when: fencing tokens (drawn, made
 *		durable before anyone sees them, and judged issued or not), WAL
 *		confirmed by today's synchronous standbys, and the commit mode of
 *		the transactions that grant, renew and release.
 *
 * Tokens.  A token is made durable before it is returned, committed or
 * not: the sequence's WAL record that covers it is flushed and, with
 * synchronous standbys, confirmed by them (dlock_secure_drawn_token); in
 * memory mode, the WAL of the block it comes from (dlock_token_reserve).
 *
 * Commit mode.  A grant or renewal in table mode forces its transaction's
 * commit to be synchronous, so a lease that was returned survives a crash;
 * the setting raised for that is raised again at pre-commit, where no GUC
 * level can undo it.  A release is the opposite: when it is all its
 * transaction wrote, the commit is made asynchronous, saving a WAL flush
 * per lock cycle.  Losing a release in a crash only keeps the key held by
 * its owner until the lease expires, as if the release had not been called;
 * and any later grant of the key commits synchronously after it in the
 * WAL, so it flushes the release too.  A transaction that wrote anything
 * else keeps its own setting: a release never weakens the durability of the
 * caller's table writes.  dlock.async_release = off turns this off.  In
 * memory mode a grant's WAL (the sequences') is flushed before it returns,
 * so a transaction that wrote nothing else commits without waiting for a
 * flush.
 *
 * Owns: which transaction must commit synchronously or may commit
 * asynchronously, the WAL of the last token drawn, the highest token known
 * issued.  Calls objects.c (the sequences), keylock.c (one waiter per LSN)
 * and settings.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/parallel.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "commands/sequence.h"
#include "miscadmin.h"
#include "replication/syncrep.h"
#include "replication/walsender.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/guc.h"

#include "dlock.h"

/*
 * The transaction whose only writes so far are releases, and the end of its
 * WAL after the last one (dlock_note_release_only,
 * dlock_durable_xact_callback).
 */
static LocalTransactionId release_only_lxid = InvalidLocalTransactionId;
static XLogRecPtr release_only_end = InvalidXLogRecPtr;

/*
 * Memory mode: the transaction whose transaction id and WAL so far come only
 * from memory grants (a sequence logging ahead, the horizon), all flushed
 * before the grant returned, and the end of its WAL then (dlock_note_seq_only).
 */
static LocalTransactionId seq_only_lxid = InvalidLocalTransactionId;
static XLogRecPtr seq_only_end = InvalidXLogRecPtr;

/*
 * Table mode: the transaction that granted or renewed a lease, whose commit
 * must be synchronous whatever the settings say by then
 * (dlock_force_synchronous_commit, dlock_durable_xact_callback).
 */
static LocalTransactionId durable_lxid = InvalidLocalTransactionId;

/* The highest token the counter may have returned, as last read ... */
static int64 known_high = 0;

/* ... while dlock_objects_generation was this. */
static uint64 known_high_generation = 0;

/* The WAL to confirm for the token draw_token drew last. */
static XLogRecPtr drawn_lsn = InvalidXLogRecPtr;

/*
 * Raise synchronous_commit for the rest of the transaction, like SET
 * LOCAL, so that the waits below include the synchronous standbys.
 */
void
dlock_raise_synchronous_commit(void)
{
	if (synchronous_commit < SYNCHRONOUS_COMMIT_ON)
		(void) set_config_option("synchronous_commit", "on",
								 PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_LOCAL, true, 0, false);
}

/*
 * Make sure this transaction commits synchronously: a grant or renewal
 * must survive a crash once the caller has seen it.  Set for the
 * transaction only, like SET LOCAL; the session's setting comes back
 * afterwards.
 */
void
dlock_force_synchronous_commit(void)
{
	/* the local flush, even if a function's SET clause reverts the setting */
	ForceSyncCommit();
	/* ... and, through the setting, the wait for synchronous standbys */
	dlock_raise_synchronous_commit();

	/*
	 * The setting above lives in the current GUC nest level: a function's
	 * own SET synchronous_commit clause, a later SET LOCAL or a rollback to
	 * a savepoint can undo it before the commit.  dlock_durable_xact_callback
	 * raises it again at pre-commit, at the top level, where nothing can.
	 */
	durable_lxid = MyProc->lxid;
}

/*
 * Flush the WAL up to lsn and, when synchronous replication is requested,
 * wait until the synchronous standbys configured now have it.  token says
 * what the WAL stands for (a token, else the horizon), for messages.
 */
void
dlock_confirm_lsn(XLogRecPtr lsn, bool token)
{
	bool		cut;
	bool		again;
	bool		waits;

	XLogFlush(lsn);				/* returns at once when already flushed */
	if (!SyncRepRequested())
		return;

	/*
	 * Only one backend at a time may wait for a given LSN: the queue of
	 * waiters must not hold two with the same one (it asserts that).
	 * Without synchronous standbys nothing waits and no lock is needed.
	 */
	waits = SyncRepStandbyNames != NULL && SyncRepStandbyNames[0] != '\0';
	if (waits)
		dlock_syncrep_wait_lock(lsn, true);
	do
	{
		/*
		 * SyncRepWaitForLSN expects interrupts held, as at commit: it
		 * watches for cancel and termination itself, and then ends the wait
		 * early with only a warning, clearing the cancel but not
		 * InterruptPending.  So a wait cut short leaves InterruptPending set
		 * and none of the flags of the interrupts that wait for their turn
		 * (a timeout for idle statistics, a barrier, ...).  When one of those
		 * is pending too, we cannot tell: we process it and wait again,
		 * which returns at once if the LSN was confirmed.
		 */
		CHECK_FOR_INTERRUPTS();
		HOLD_INTERRUPTS();
		SyncRepWaitForLSN(lsn, false);
		again = InterruptPending && !ProcDiePending && !QueryCancelPending &&
			!ClientConnectionLost &&
			(ProcSignalBarrierPending || LogMemoryContextPending ||
			 IdleInTransactionSessionTimeoutPending ||
			 IdleSessionTimeoutPending || IdleStatsUpdateTimeoutPending ||
			 CheckClientConnectionPending || ParallelMessagePending);
		cut = InterruptPending && !again;
		RESUME_INTERRUPTS();
	} while (again);
	if (waits)
		dlock_syncrep_wait_lock(lsn, false);
	if (cut)
		ereport(ERROR,
				(errcode(ERRCODE_QUERY_CANCELED),
				 token ?
				 errmsg("fencing token not confirmed by the synchronous standbys") :
				 errmsg("lease horizon not confirmed by the synchronous standbys"),
				 token ?
				 errdetail("The wait for synchronous replication was interrupted before the standbys confirmed the token's WAL; the grant is rolled back and the token is never used.") :
				 errdetail("The wait for synchronous replication was interrupted before the standbys confirmed how long leases may last; the grant or renewal is rolled back."),
				 errhint("Try again; check that the synchronous standbys are connected.")));
}

/*
 * Draw a new fencing token.
 *
 * Since 0.6 tokens come from dlock.token_seq, which pg_dump does not save,
 * so that a data-only restore of an older dump cannot set the counter
 * back.  dlock.fence_seq, which pg_dump does save, is kept at or above
 * every token token_seq may ever have returned (its values logged ahead
 * included: one setval every 32 tokens), so that a whole dump restored
 * into a new database starts its tokens above every token issued before
 * the dump: there token_seq starts behind fence_seq, and is moved past it
 * before anything is drawn.  Moving it takes a lock that only these two
 * moves take, and reads both again under it, so neither ever moves back.
 * Before 0.6 (no token_seq), tokens come from fence_seq.
 */
int64
dlock_draw_token(void)
{
	DlockSeqPage tok;
	DlockSeqPage copy;
	int64		token;

	if (!OidIsValid(dlock_objects.token))
	{
		token = nextval_internal(dlock_objects.seq, false);

		/*
		 * A session that found the storage before ALTER EXTENSION UPDATE to
		 * 0.6 committed has no token_seq cached: look again, after the
		 * draw.  If token_seq exists now, the token just drawn may also be
		 * one that token_seq returns (it was moved past fence_seq as it
		 * stood before our nextval): it is never shown, and we draw from
		 * token_seq, past fence_seq as it stands now.
		 */
		dlock_objects_find_again();
		if (!OidIsValid(dlock_objects.token))
		{
			drawn_lsn = dlock_sequence_lsn(dlock_objects.seq);
			return token;
		}
	}
	dlock_read_sequence_page(dlock_objects.token, &tok);
	dlock_read_sequence_page(dlock_objects.seq, &copy);
	if (tok.high < copy.high)
	{
		LockRelationOid(dlock_objects.seq, ShareUpdateExclusiveLock);
		dlock_read_sequence_page(dlock_objects.token, &tok);
		dlock_read_sequence_page(dlock_objects.seq, &copy);
		if (tok.high < copy.high)
			dlock_set_sequence(dlock_objects.token, copy.high);
		UnlockRelationOid(dlock_objects.seq, ShareUpdateExclusiveLock);
	}
	/* runs no user code and checks no privilege: no need to be the owner */
	token = nextval_internal(dlock_objects.token, false);
	dlock_read_sequence_page(dlock_objects.token, &tok);
	drawn_lsn = tok.lsn;
	if (tok.high > copy.high)
	{
		LockRelationOid(dlock_objects.seq, ShareUpdateExclusiveLock);
		dlock_read_sequence_page(dlock_objects.seq, &copy);
		if (copy.high < tok.high)
		{
			dlock_set_sequence(dlock_objects.seq, tok.high);
			drawn_lsn = Max(drawn_lsn, dlock_sequence_lsn(dlock_objects.seq));
		}
		UnlockRelationOid(dlock_objects.seq, ShareUpdateExclusiveLock);
	}
	return token;
}

/*
 * Memory mode's blocks of tokens (memstore.c keeps the block, per database).
 * Drawing one token at a time from dlock.token_seq costs a sequence update
 * per grant and a WAL flush (and, with synchronous standbys, a round trip)
 * every 32 grants, the sequence's log-ahead, which every grant whose token
 * that record covers waits for.  Instead, memory mode reserves a block of
 * tokens at once: both sequences are set to the block's last token, that
 * WAL is flushed and confirmed, and only then are its tokens handed out
 * from shared memory.  After a crash or a failover the sequences restart
 * past the whole block, so no token is reissued, as with the log-ahead.
 *
 * The block is trusted only while both sequences' pages still carry the
 * LSNs its reservation left there: anyone else's setval (a restore of
 * fence_seq, the counter set back by hand) or nextval after it changes
 * them, and the next draw reserves afresh from what the sequences say
 * (memstore.c).  The reservation takes the same lock as the moves in
 * dlock_draw_token.
 */

/* The pages of dlock.token_seq and of its copy dlock.fence_seq (0.6). */
void
dlock_token_pages(DlockSeqPage *tok, DlockSeqPage *copy)
{
	dlock_read_sequence_page(dlock_objects.token, tok);
	dlock_read_sequence_page(dlock_objects.seq, copy);
}

/*
 * Take the lock under which the sequences are moved (without waiting
 * unless wait); false if it is busy.
 */
bool
dlock_token_lock(bool wait)
{
	if (!wait)
		return ConditionalLockRelationOid(dlock_objects.seq,
										  ShareUpdateExclusiveLock);
	LockRelationOid(dlock_objects.seq, ShareUpdateExclusiveLock);
	return true;
}

void
dlock_token_unlock(void)
{
	UnlockRelationOid(dlock_objects.seq, ShareUpdateExclusiveLock);
}

/*
 * Reserve every token up to last: set dlock.token_seq and its copy to last.
 * Call with dlock_token_lock held, and last above what both may have
 * returned.  *tok and *copy are the pages as the reservation left them;
 * the block may be used once the WAL up to the later of their LSNs is
 * confirmed (dlock_token_confirm).  False when either sequence does not
 * stand at last afterwards: someone else set it meanwhile, and the block
 * must not be used.
 */
bool
dlock_token_reserve(int64 last, DlockSeqPage *tok, DlockSeqPage *copy)
{
	dlock_set_sequence(dlock_objects.token, last);
	dlock_set_sequence(dlock_objects.seq, last);
	dlock_token_pages(tok, copy);
	return tok->high == last && copy->high == last;
}

/*
 * Flush the WAL of a reservation (up to lsn) and wait for today's
 * synchronous standbys to have it.
 */
void
dlock_token_confirm(XLogRecPtr lsn)
{
	dlock_raise_synchronous_commit();
	dlock_confirm_lsn(lsn, true);
}

/* The WAL that covers the token dlock_draw_token drew last. */
XLogRecPtr
dlock_drawn_lsn(void)
{
	return drawn_lsn;
}

/*
 * Can token have been issued: is it at most the highest token the counter
 * may ever have returned (its values logged ahead included)?  A token above
 * that was never issued, whatever a lease row says (fence.c).  The highest
 * value read is kept for the backend (it only grows), so that the pages
 * are read again only for a token above it, about once every 32 tokens.
 */
bool
dlock_token_issued(int64 token)
{
	DlockSeqPage tok;
	DlockSeqPage copy;

	if (token <= known_high && known_high_generation == dlock_objects_generation)
		return true;
	dlock_objects_find();
	known_high_generation = dlock_objects_generation;
	dlock_read_sequence_page(dlock_objects.seq, &copy);
	known_high = copy.high;
	if (OidIsValid(dlock_objects.token))
	{
		dlock_read_sequence_page(dlock_objects.token, &tok);
		known_high = Max(known_high, tok.high);
	}
	return token <= known_high;
}

/*
 * Make the fencing token just drawn safe to show: flush the sequence's WAL
 * record that covers it and, with synchronous standbys, wait for them to
 * have it (dlock_confirm_lsn).  A sequence logs ahead (one WAL record
 * every 32 values), so that record is at or before the LSN of the
 * sequence's page after the draw: usually flushed already, and this costs
 * a comparison.  Call with synchronous_commit already raised.
 */
void
dlock_secure_drawn_token(void)
{
	dlock_confirm_lsn(drawn_lsn, true);
}

/*
 * At commit, a transaction that wrote nothing but releases commits
 * asynchronously (see the header), unless dlock.async_release is
 * off.  "Nothing but" means: it had no transaction id before its first
 * release, and its WAL has not grown since its last one.  Every change to a
 * table takes a transaction id and writes WAL, so it keeps the caller's own
 * setting; a grant or renewal in the same transaction forces a synchronous
 * commit anyway.  What leaves no trace is what PostgreSQL never makes
 * durable in a transaction without writes either: a nextval served from the
 * values a sequence logged ahead, a NOTIFY (docs/guarantees.md).  Set
 * like SET LOCAL: the session's value comes back after the commit.
 */
void
dlock_durable_xact_callback(XactEvent event)
{
	if (event == XACT_EVENT_PRE_COMMIT && seq_only_lxid == MyProc->lxid)
	{
		seq_only_lxid = InvalidLocalTransactionId;

		/*
		 * Without a transaction id (the sequences logged nothing this time,
		 * 31 grants in 32) the commit writes no record and never flushes:
		 * setting the GUC would only cost time.
		 */
		if (XactLastRecEnd == seq_only_end &&
			TransactionIdIsValid(GetTopTransactionIdIfAny()) &&
			synchronous_commit > SYNCHRONOUS_COMMIT_OFF)
			(void) set_config_option("synchronous_commit", "off",
									 PGC_USERSET, PGC_S_SESSION,
									 GUC_ACTION_LOCAL, true, 0, false);
	}
	if (event == XACT_EVENT_PRE_COMMIT &&
		release_only_lxid == MyProc->lxid)
	{
		release_only_lxid = InvalidLocalTransactionId;
		if (dlock_async_release && XactLastRecEnd == release_only_end &&
			synchronous_commit > SYNCHRONOUS_COMMIT_OFF)
			(void) set_config_option("synchronous_commit", "off",
									 PGC_USERSET, PGC_S_SESSION,
									 GUC_ACTION_LOCAL, true, 0, false);
	}

	/*
	 * Last, so that nothing above lowers it again: a transaction that
	 * granted or renewed a lease in table mode commits synchronously,
	 * synchronous standbys included, whatever a function's SET clause, a
	 * SET LOCAL or a savepoint rollback did to the setting since.  At
	 * pre-commit we are at the top level: no GUC level is popped before
	 * the commit record is written and waited for.
	 */
	if (event == XACT_EVENT_PRE_COMMIT && durable_lxid == MyProc->lxid)
	{
		durable_lxid = InvalidLocalTransactionId;
		ForceSyncCommit();
		dlock_raise_synchronous_commit();
	}
}

/*
 * Memory mode, before a grant: has this transaction written nothing so far
 * but the sequences' WAL of earlier memory grants (or nothing at all)?
 * The caller passes the answer to dlock_note_seq_only after the grant.
 */
bool
dlock_seq_only_so_far(void)
{
	return !TransactionIdIsValid(GetTopTransactionIdIfAny()) ||
		(seq_only_lxid == MyProc->lxid && XactLastRecEnd == seq_only_end);
}

/*
 * After a memory grant, whose WAL is flushed already: unless the
 * transaction writes something else (seq_only, from dlock_seq_only_so_far),
 * its commit need not wait for a flush (dlock_durable_xact_callback).
 */
void
dlock_note_seq_only(bool seq_only)
{
	seq_only_lxid = seq_only ? MyProc->lxid : InvalidLocalTransactionId;
	seq_only_end = XactLastRecEnd;
}

/*
 * Before a change of a lease row: is it a release (release), in a
 * transaction that wrote nothing but releases so far (no transaction id,
 * or only our releases')?  The caller passes the answer to
 * dlock_note_release_only after the change.
 */
bool
dlock_release_only_so_far(bool release)
{
	return release &&
		(!TransactionIdIsValid(GetTopTransactionIdIfAny()) ||
		 (release_only_lxid == MyProc->lxid &&
		  XactLastRecEnd == release_only_end));
}

/*
 * After a change of a lease row: remember where the WAL of a release-only
 * transaction (release_only, from dlock_release_only_so_far) ends.
 */
void
dlock_note_release_only(bool release_only)
{
	release_only_lxid = release_only ? MyProc->lxid : InvalidLocalTransactionId;
	release_only_end = XactLastRecEnd;
}
