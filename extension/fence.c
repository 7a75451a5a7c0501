/*-------------------------------------------------------------------------
 *
 * fence.c
 *		Fencing: judging a write under a key's lease, dlock.use_fence and
 *		dlock.check_fence.  trigger.c calls dlock_fence_write for every
 *		key a row write touches.
 *
 * A fenced write takes its key's lock for writing (keylock.c) until its
 * transaction ends, then reads the key's lease with a fresh snapshot.  A
 * grant needs the lock exclusively, so a write and a grant of its key are
 * always ordered: either the writing transaction ends before the grant
 * happens, or the write sees the grant and is refused.  Releases, and
 * renewals that move the expiry earlier, wait for the writers too.  So a
 * transaction verifies a key once; later writes under the same token only
 * compare the clock with the expiry it read (the per-transaction view of
 * verified keys, kept here).  The writer's isolation level does not matter,
 * because the lease is never read with the writer's own snapshot.
 *
 * The verified keys are forgotten when the transaction changes their lease
 * (lease.c calls dlock_forget_verified), when a subtransaction aborts (its
 * write locks are gone), and when the storage they were read from is
 * invalidated (objects.c's generation).
 *
 * Owns: the transaction's verified keys.  Calls stats.c and events.c
 * (counting and logging refusals), storage.c, durable.c (was a token ever
 * issued?), objects.c (its generation), liveness.c, keylock.c, args.c and
 * common.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "dlock.h"

PG_FUNCTION_INFO_V1(dlock_use_fence);
PG_FUNCTION_INFO_V1(dlock_fenced);
PG_FUNCTION_INFO_V1(dlock_check_fence);

typedef enum FenceVerdict
{
	FENCE_OK,
	FENCE_NO_TOKEN,				/* nothing presented */
	FENCE_WRITTEN_BACK,			/* only the row's own token, written back */
	FENCE_NO_LEASE,				/* key never granted (or pruned) */
	FENCE_STALE,				/* a newer lease has been granted */
	FENCE_FOREIGN,				/* token never issued for this key */
	FENCE_RELEASED,				/* the lease was released */
	FENCE_EXPIRED,				/* the lease expired */
	FENCE_DISCONNECTED,			/* session-bound, and its connection ended */
	FENCE_NEVER_ISSUED,			/* below 1: no token is ever that */
	FENCE_UNKNOWN_HOLDER,		/* before the horizon: held by nobody known */
	FENCE_BEFORE_SWITCH			/* monotonic, and the key's history is lost */
} FenceVerdict;

/* The per-transaction view of verified keys (see DlockKeyState). */
static DlockXactHash key_states;

/* key_states' table if this transaction has entries there, else NULL */
#define KEY_STATES() \
	(MyProc != NULL ? dlock_xact_hash(&key_states, NULL, 0, 0, 0, false) : NULL)

/* dlock_objects_generation when key_states was last checked against it */
static uint64 key_states_generation = 0;

/*
 * Forget every verified lease in htab (key_states' table): they are looked
 * up again, under a new lock or in storage found again.
 */
static void
forget_all_verified(HTAB *htab)
{
	HASH_SEQ_STATUS status;
	DlockKeyState *st;

	hash_seq_init(&status, htab);
	while ((st = hash_seq_search(&status)) != NULL)
		st->verified = false;
	key_states_generation = dlock_objects_generation;
}

/*
 * Return the state of key in the current transaction; create it (nothing
 * known) when create is set, else return NULL when there is none.  The
 * table is kept for the backend and emptied at the first use in each
 * transaction (dlock_xact_hash).
 */
DlockKeyState *
dlock_key_state(const char *key, bool create)
{
	HTAB	   *htab = dlock_xact_hash(&key_states, "dlock fenced keys",
									   DLOCK_MAX_STORED_KEY_BYTES + 1,
									   sizeof(DlockKeyState), HASH_STRINGS,
									   create);
	bool		found;
	DlockKeyState *st;

	if (htab == NULL)
		return NULL;
	if (key_states_generation != dlock_objects_generation)
		forget_all_verified(htab);
	st = hash_search(htab, key, create ? HASH_ENTER : HASH_FIND, &found);
	if (create && !found)
	{
		st->presented = false;
		st->verified = false;
		st->column_cid = InvalidCommandId;
	}
	return st;
}

/* Forget what this transaction verified about key: it changed the lease. */
void
dlock_forget_verified(const char *key, int len)
{
	DlockKeyState *st;
	char	   *k;

	if (KEY_STATES() == NULL)
		return;
	/* a slot's lease is verified under its key (judge_unlocked) */
	k = pnstrdup(key, dlock_base_key_len(key, len));
	st = dlock_key_state(k, false);
	if (st)
		st->verified = false;
	pfree(k);
}

/*
 * A subtransaction abort releases the write locks taken inside it: forget
 * every verified lease (they are looked up again, under a new lock).
 */
static void
fence_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB && KEY_STATES() != NULL)
		forget_all_verified(key_states.htab);
}

/* Set up the forgetting at subtransaction aborts; called once from _PG_init. */
void
dlock_fence_init(void)
{
	RegisterSubXactCallback(fence_subxact_callback, NULL);
}

/* The state of key's held lease *lease now; count it if it has ended. */
static DlockLeaseState
look_ended(const char *key, const DlockLease *lease)
{
	TimestampTz now = GetCurrentTimestamp();
	DlockLeaseState state = dlock_lease_state(lease, now);

	if (state == DLOCK_EXPIRED || state == DLOCK_DISCONNECTED)
		dlock_notice_end(key, strlen(key), lease, state, now);
	return state;
}

/*
 * Judge a write under key presenting token (if has_token), and leave the
 * key's lease in *lease.  The caller holds the key's write lock.
 */
static FenceVerdict
judge(const char *key, bool has_token, int64 token, bool monotonic,
	  DlockLease *lease)
{
	dlock_read_lease(key, strlen(key), lease);

	if (!has_token)
		return FENCE_NO_TOKEN;

	/*
	 * Before comparing anything: a token below 1 was never issued, and a
	 * placeholder lease (held by an owner nobody knows until the horizon)
	 * accepts no token at all, whatever its fields say.
	 */
	if (token < 1)
		return FENCE_NEVER_ISSUED;
	if (lease->unknown)
		return FENCE_UNKNOWN_HOLDER;
	if (!lease->found)
		return FENCE_NO_LEASE;
	if (token < lease->fence)
		return FENCE_STALE;
	if (token > lease->fence)
		return FENCE_FOREIGN;

	/*
	 * The token is the lease's; but a lease row can be written by hand or
	 * restored from elsewhere: a token the counter never reached was never
	 * issued, and matches nothing.
	 */
	if (!dlock_token_issued(token))
		return FENCE_NEVER_ISSUED;
	if (monotonic)
		return lease->before_switch ? FENCE_BEFORE_SWITCH : FENCE_OK;
	if (!lease->held)
		return FENCE_RELEASED;
	switch (look_ended(key, lease))
	{
		case DLOCK_EXPIRED:
			return FENCE_EXPIRED;
		case DLOCK_DISCONNECTED:
			return FENCE_DISCONNECTED;
		default:
			return FENCE_OK;
	}
}

/*
 * Judge a write without any lock first, so that a write that cannot be
 * accepted never touches the key lock: a stranger's refused writes and
 * checks must not make a try_acquire of the key find it busy, nor wait for
 * a grant in flight.  A refusal seen this way is final: no change in
 * flight can make valid a token that its presenter could know (a token is
 * only known once its grant has committed, except to the granting
 * transaction itself, which sees its own grant).
 *
 * Also find which lease the token names: the key's own, or one of its
 * permits or shared leases (its slots, dlock.h).  sk (DLOCK_MAX_STORED_KEY_
 * BYTES + 1 bytes) is set to the key that lease is stored under, which the
 * write locks and is judged on again under the lock.
 */
static FenceVerdict
judge_unlocked(const char *key, bool has_token, int64 token, bool monotonic,
			   DlockLease *lease, char *sk)
{
	FenceVerdict v;
	DlockLease	newest;
	int			len = strlen(key);
	int			i;

	strlcpy(sk, key, DLOCK_MAX_STORED_KEY_BYTES + 1);
	v = judge(key, has_token, token, monotonic, lease);
	if (!has_token || token < 1 || !lease->found || lease->unknown ||
		lease->nslots == 0 || lease->fence == token)
		return v;
	newest.found = false;
	for (i = 1; i <= lease->nslots; i++)
	{
		char		buf[DLOCK_MAX_STORED_KEY_BYTES + 1];
		int			sklen = dlock_slot_key(buf, key, len, i);
		DlockLease	slot;

		dlock_read_lease(buf, sklen, &slot);
		if (!slot.found || slot.unknown)
			continue;
		if (slot.fence == token)
		{
			memcpy(sk, buf, sklen + 1);
			return judge(sk, has_token, token, monotonic, lease);
		}
		if (!newest.found || slot.fence > newest.fence)
			newest = slot;
	}
	/* a permit's token, since granted to someone else: stale */
	if (v == FENCE_FOREIGN && newest.found && token < newest.fence)
	{
		*lease = newest;
		v = FENCE_STALE;
	}
	return v;
}

/* Each verdict's name in dlock.log_events lines. */
static const char *const verdict_names[] = {
	"ok", "no_token", "written_back", "no_lease", "stale", "foreign",
	"released", "expired", "disconnected", "never_issued", "unknown_holder", "before_switch"
};

/* Format a token for a message: the number, or "none". */
static char *
token_str(bool has, int64 token)
{
	return has ? psprintf(INT64_FORMAT, token) : pstrdup("none");
}

/*
 * Raise the refusal for verdict.  relname names the table written, or is
 * NULL for use_fence.
 */
static void
refuse(FenceVerdict verdict, const char *key, bool has_token, int64 token,
	   const DlockLease *lease, const char *relname)
{
	const char *msg;
	const char *hint;
	char	   *where;

	switch (verdict)
	{
		case FENCE_NO_TOKEN:
			msg = "no fencing token presented for key \"%s\"";
			hint = "Call dlock.use_fence(key, fence) in the writing transaction, or write the token into the table's token column.";
			break;
		case FENCE_WRITTEN_BACK:
			msg = "the row's own fencing token does not count as presented for key \"%s\"";
			hint = "The UPDATE wrote back the token the row already carries; anyone who reads the row knows it, so that proves nothing.  Present your token with dlock.use_fence(key, fence) in the writing transaction.";
			break;
		case FENCE_NO_LEASE:
			msg = "key \"%s\" has no lease";
			hint = "Acquire the key with dlock.acquire() or dlock.try_acquire() and write under the token it returns.";
			break;
		case FENCE_STALE:
			msg = "stale fencing token for key \"%s\"";
			hint = "A newer lease has been granted: this holder lost the lock.  Do not retry with the old token; acquire the key again and redo the work.";
			break;
		case FENCE_FOREIGN:
			msg = "fencing token was not issued for key \"%s\"";
			hint = "Present the token that dlock.acquire() or dlock.try_acquire() returned for this key.";
			break;
		case FENCE_RELEASED:
			msg = "lease on key \"%s\" has been released";
			hint = "Acquire the key again and redo the work under the new token.";
			break;
		case FENCE_EXPIRED:
			msg = "lease on key \"%s\" has expired";
			hint = "Renew leases before they expire.  Acquire the key again and redo the work under the new token.";
			break;
		case FENCE_DISCONNECTED:
			msg = "session-bound lease on key \"%s\" ended with its connection";
			hint = "The connection that took the lease is gone.  Acquire the key again and redo the work under the new token.";
			break;
		case FENCE_NEVER_ISSUED:
			msg = "fencing token for key \"%s\" was never issued";
			hint = "A token below 1, or above every token dlock has issued, was never issued.  Present the token that dlock.acquire() or dlock.try_acquire() returned for this key.";
			break;
		case FENCE_BEFORE_SWITCH:
			msg = "fencing token for key \"%s\" predates the last switch from memory mode";
			hint = "The tokens issued for the key while dlock.storage was memory are not in dlock.leases and may be greater, so the monotonic mode accepts no token issued before the switch.  Acquire the key again and write under the new token.";
			break;
		case FENCE_UNKNOWN_HOLDER:
			msg = "key \"%s\" is held by an unknown owner until the lease horizon";
			hint = "After a restart, a crash, a failover or a change of dlock.storage, no token is accepted for any key until every lease granted before could have ended.  Acquire the key after that and write under the new token.";
			break;
		default:
			elog(ERROR, "dlock: unexpected fencing verdict %d", (int) verdict);
			return;
	}

	dlock_count(key, strlen(key), DLOCK_EV_REFUSED);
	dlock_log_refusal(key, has_token ? token : 0,
					  lease->found && !lease->unknown ? lease->fence : 0,
					  verdict_names[verdict]);
	where = relname ? psprintf("The write to table \"%s\" presented", relname)
		: pstrdup("The transaction presented");
	ereport(ERROR,
			(errcode(ERRCODE_DLOCK_FENCE_REFUSED),
			 errmsg_internal(msg, key),
			 lease->unknown ?
			 errdetail("%s token %s; key \"%s\" has no known token before the horizon.",
					   where, token_str(has_token, token), key) :
			 lease->found ?
			 errdetail("%s token %s; the current token of key \"%s\" is " INT64_FORMAT ".",
					   where, token_str(has_token, token), key, lease->fence) :
			 errdetail("%s token %s; key \"%s\" has no token.",
					   where, token_str(has_token, token), key),
			 errhint("%s", hint)));
}

/*
 * Did this transaction verify key's lease with token under its write lock
 * (st), and is that lease still good for a write now?  While the lock is
 * held the token cannot change and the lease cannot end or get shorter
 * except by running out (keylock.c), so the clock and, for a session-bound
 * lease, its connection are all there is to look at.
 */
static bool
still_verified(const DlockKeyState *st, int64 token, bool monotonic)
{
	return st != NULL && st->verified && st->lease.fence == token &&
		(monotonic ||
		 (st->lease.held && GetCurrentTimestamp() < st->lease.expires_at &&
		  (st->lease.session_id == 0 ||
		   dlock_session_alive(st->lease.session_id))));
}

/*
 * Check a write under key presenting token (when has_token), in the lease
 * or monotonic mode, and raise LF001 unless it may go ahead.  written_back
 * says that the only token in sight was the row's own, written back.
 * relname names the table (NULL for use_fence).  On success the key's
 * write lock is held until the end of the transaction and the key's
 * verified lease is in the transaction's view.
 */
int64
dlock_fence_write(const char *key, bool has_token, int64 token,
				  bool monotonic, bool written_back, const char *relname)
{
	DlockKeyState *st = dlock_key_state(key, false);
	DlockLease	lease;
	FenceVerdict v;
	char		sk[DLOCK_MAX_STORED_KEY_BYTES + 1];

	/* verified already in this transaction, and still unexpired? */
	if (has_token && still_verified(st, token, monotonic))
		return token;

	v = judge_unlocked(key, has_token, token, monotonic, &lease, sk);
	if (v == FENCE_OK && monotonic && strcmp(sk, key) != 0)
	{
		/*
		 * The monotonic mode accepts a permit's token also once that lease
		 * has ended, but not once the key's exclusive lease was granted
		 * after it: lock the key for writing too (an exclusive grant takes
		 * the slot locks of held leases only) and compare.
		 */
		DlockLease	head;

		dlock_lock_for_write(key, strlen(key));
		dlock_read_lease(key, strlen(key), &head);
		if (head.unknown)
		{
			lease = head;
			v = FENCE_UNKNOWN_HOLDER;
		}
		else if (head.found && head.fence > token)
		{
			lease = head;
			v = FENCE_STALE;
		}
	}
	if (v == FENCE_OK)
	{
		dlock_lock_for_write(sk, strlen(sk));
		v = judge(sk, has_token, token, monotonic, &lease);
	}
	if (v == FENCE_NO_TOKEN && written_back)
		v = FENCE_WRITTEN_BACK;
	if (v != FENCE_OK)
		refuse(v, key, has_token, token, &lease, relname);
	st = dlock_key_state(key, true);
	st->verified = true;
	st->lease = lease;
	return token;
}

/* Return the key argument of a fencing function, checked, as a C string. */
static char *
fence_key_argument(FunctionCallInfo fcinfo)
{
	text	   *key;

	dlock_no_parallel(fcinfo);
	key = dlock_key_arg(fcinfo, 0);
	if (PG_ARGISNULL(1))
		dlock_null_argument(fcinfo, "fence");
	return text_to_cstring(key);
}

/*
 * What dlock.use_fence(key, fence) and dlock.fenced(key, fence) do: declare
 * that the current transaction writes under the lease of key with token
 * fence.  Raises at once unless that is the key's current, unexpired lease.
 * Keeps the key's write lock until the transaction ends, so no new grant of
 * key can come before that.
 */
static void
present_fence(FunctionCallInfo fcinfo)
{
	char	   *key = fence_key_argument(fcinfo);
	int64		fence = PG_GETARG_INT64(1);
	DlockLease	lease;
	FenceVerdict v;
	DlockKeyState *st;
	char		sk[DLOCK_MAX_STORED_KEY_BYTES + 1];

	/* presented and verified already (a call per row, in a WHERE clause) */
	st = dlock_key_state(key, false);
	if (st != NULL && st->presented && st->presented_fence == fence &&
		still_verified(st, fence, false))
		return;

	v = judge_unlocked(key, true, fence, false, &lease, sk);
	if (v == FENCE_OK)
	{
		dlock_lock_for_write(sk, strlen(sk));
		v = judge(sk, true, fence, false, &lease);
	}
	if (v != FENCE_OK)
		refuse(v, key, true, fence, &lease, NULL);
	st = dlock_key_state(key, true);
	st->presented = true;
	st->presented_fence = fence;
	st->verified = true;
	st->lease = lease;
}

Datum
dlock_use_fence(PG_FUNCTION_ARGS)
{
	present_fence(fcinfo);
	PG_RETURN_VOID();
}

/*
 * dlock.fenced(key, fence): use_fence that returns true, to stand in the
 * WHERE clause of the write it protects.  PostgreSQL calls it for each row
 * that passes the clause's other conditions, before the row is written;
 * the calls after the first in a transaction only compare the clock with
 * the verified expiry.
 */
Datum
dlock_fenced(PG_FUNCTION_ARGS)
{
	present_fence(fcinfo);
	PG_RETURN_BOOL(true);
}

/*
 * dlock.check_fence(key, fence): would a write under key presenting fence
 * be accepted now?  A token that could be accepted is checked again under
 * the key's write lock (waiting for a grant or an ending in progress); the
 * answer keeps no lock.
 */
Datum
dlock_check_fence(PG_FUNCTION_ARGS)
{
	char	   *key = fence_key_argument(fcinfo);
	int64		fence = PG_GETARG_INT64(1);
	DlockLease	lease;
	FenceVerdict v;
	char		sk[DLOCK_MAX_STORED_KEY_BYTES + 1];

	v = judge_unlocked(key, true, fence, false, &lease, sk);
	if (v == FENCE_OK)
	{
		dlock_lock_for_write(sk, strlen(sk));
		v = judge(sk, true, fence, false, &lease);
		dlock_unlock_write(sk, strlen(sk));
	}
	PG_RETURN_BOOL(v == FENCE_OK);
}
