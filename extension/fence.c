/*-------------------------------------------------------------------------
 *
 * fence.c
 *		Fencing: dlock.use_fence, dlock.check_fence and the fence_guard
 *		trigger that refuses writes from holders whose lease is gone.
 *
 * A fenced write takes ShareLock on its key's lock (keylock.c) and keeps
 * it until its transaction ends, then reads the key's lease with a fresh
 * snapshot.  A grant takes ExclusiveLock on the same lock, so a write and
 * a grant of its key are always ordered: either the writing transaction
 * ends before the grant happens, or the write sees the grant and is
 * refused.  The writer's isolation level does not matter, because the
 * lease is never read with the writer's own snapshot.
 *
 * Tokens presented with use_fence, and leases already verified, are
 * remembered for the current transaction only (so they work behind a
 * transaction-pooling proxy, and a bulk write looks each key up once); the
 * table lives in TopTransactionContext and is recognized as stale by the
 * local transaction id when a new transaction starts.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#include "dlock.h"

PG_FUNCTION_INFO_V1(dlock_use_fence);
PG_FUNCTION_INFO_V1(dlock_check_fence);
PG_FUNCTION_INFO_V1(dlock_fence_guard);

/* SQLSTATE of every refused fenced write; documented in the README. */
#define ERRCODE_DLOCK_FENCE_REFUSED		MAKE_SQLSTATE('L','F','0','0','1')

typedef enum FenceMode
{
	FENCE_MODE_LEASE,			/* current token of an unexpired lease */
	FENCE_MODE_MONOTONIC		/* highest token ever issued for the key */
} FenceMode;

typedef enum FenceVerdict
{
	FENCE_OK,
	FENCE_NO_TOKEN,				/* nothing presented */
	FENCE_WRITTEN_BACK,			/* only the row's own token, written back */
	FENCE_NO_LEASE,				/* key never granted (or pruned) */
	FENCE_STALE,				/* a newer lease has been granted */
	FENCE_FOREIGN,				/* token never issued for this key */
	FENCE_RELEASED,				/* the lease was released */
	FENCE_EXPIRED				/* the lease expired */
} FenceVerdict;

/*
 * What this transaction knows about a key it writes under: the token
 * presented with use_fence, and the lease as last read while holding the
 * key's ShareLock.  That lock is kept to the end of the transaction and
 * excludes grants and releases, so until then the key's token cannot
 * change and its lease can only be renewed or run out: a later write under
 * the same token needs no new lookup while the clock is before the expiry
 * read.  A subtransaction abort releases locks taken inside it, so it
 * forgets every verified lease.
 */
typedef struct KeyState
{
	char		key[DLOCK_MAX_KEY_BYTES + 1];	/* hash key */
	bool		presented;		/* use_fence named a token for key */
	int64		presented_fence;
	bool		verified;		/* lease below read under our ShareLock */
	DlockLease	lease;
} KeyState;

static HTAB *key_states = NULL;
static LocalTransactionId key_states_lxid = InvalidLocalTransactionId;

/*
 * Return the state of key in the current transaction; create it (all
 * false) when create is set, else return NULL when there is none.
 */
static KeyState *
key_state(const char *key, bool create)
{
	bool		found;
	KeyState   *st;

	if (key_states_lxid != MyProc->lxid)
	{
		/* the old table went away with its transaction's memory */
		key_states = NULL;
		key_states_lxid = MyProc->lxid;
	}
	if (key_states == NULL)
	{
		HASHCTL		ctl;

		if (!create)
			return NULL;
		ctl.keysize = DLOCK_MAX_KEY_BYTES + 1;
		ctl.entrysize = sizeof(KeyState);
		ctl.hcxt = TopTransactionContext;
		key_states = hash_create("dlock fenced keys", 16, &ctl,
								 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	st = hash_search(key_states, key, create ? HASH_ENTER : HASH_FIND, &found);
	if (create && !found)
	{
		st->presented = false;
		st->verified = false;
	}
	return st;
}

/* Forget verified leases when a subtransaction aborts (see KeyState). */
static void
fence_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	HASH_SEQ_STATUS status;
	KeyState   *st;

	if (event != SUBXACT_EVENT_ABORT_SUB || key_states == NULL ||
		key_states_lxid != MyProc->lxid)
		return;
	hash_seq_init(&status, key_states);
	while ((st = hash_seq_search(&status)) != NULL)
		st->verified = false;
}

/*
 * Forget the verified lease of key: this transaction has just granted,
 * renewed or released it itself (its own locks never conflict with each
 * other, so nothing else would tell us).
 */
void
dlock_fence_forget(text *key)
{
	KeyState   *st;

	if (key_states == NULL || key_states_lxid != MyProc->lxid)
		return;
	st = key_state(text_to_cstring(key), false);
	if (st)
		st->verified = false;
}

/* Set up the fencing module; called once from _PG_init. */
void
dlock_fence_init(void)
{
	RegisterSubXactCallback(fence_subxact_callback, NULL);
}

/*
 * Judge a write under key presenting token (if has_token) in mode, and
 * leave the key's lease in *lease.  The caller holds the key lock in a
 * mode that excludes grants.
 */
static FenceVerdict
judge(const char *key, bool has_token, int64 token, FenceMode mode,
	  DlockLease *lease)
{
	dlock_read_lease(cstring_to_text(key), lease);

	if (!has_token)
		return FENCE_NO_TOKEN;
	if (!lease->found)
		return FENCE_NO_LEASE;
	if (token < lease->fence)
		return FENCE_STALE;
	if (token > lease->fence)
		return FENCE_FOREIGN;
	if (mode == FENCE_MODE_MONOTONIC)
		return FENCE_OK;
	if (!lease->held)
		return FENCE_RELEASED;
	if (lease->expires_at <= GetCurrentTimestamp())
		return FENCE_EXPIRED;
	return FENCE_OK;
}

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
		default:
			elog(ERROR, "unexpected fencing verdict %d", (int) verdict);
			return;
	}

	where = relname ? psprintf("The write to table \"%s\" presented", relname)
		: pstrdup("The transaction presented");
	ereport(ERROR,
			(errcode(ERRCODE_DLOCK_FENCE_REFUSED),
			 errmsg_internal(msg, key),
			 lease->found ?
			 errdetail("%s token %s; the current token of key \"%s\" is " INT64_FORMAT ".",
					   where, token_str(has_token, token), key, lease->fence) :
			 errdetail("%s token %s; key \"%s\" has no token.",
					   where, token_str(has_token, token), key),
			 errhint("%s", hint)));
}

/* Return argument argno of a fencing function: key (checked) as a C string. */
static char *
fence_key_argument(FunctionCallInfo fcinfo)
{
	text	   *key;

	if (PG_ARGISNULL(0))
		dlock_null_argument(fcinfo, "key");
	if (PG_ARGISNULL(1))
		dlock_null_argument(fcinfo, "fence");
	key = PG_GETARG_TEXT_PP(0);
	dlock_check_key(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
	return text_to_cstring(key);
}

/*
 * Take key's lock in share mode (waiting for a grant in progress) and judge
 * a write presenting fence by the lease rule.
 */
static FenceVerdict
lock_and_judge(const char *key, int64 fence, DlockLease *lease)
{
	(void) dlock_lock_key(key, strlen(key), ShareLock, false);
	return judge(key, true, fence, FENCE_MODE_LEASE, lease);
}

/*
 * dlock.use_fence(key, fence): declare that the current transaction writes
 * under the lease of key with token fence.  Raises at once unless that is
 * the key's current, unexpired lease.  Keeps the key's ShareLock until the
 * transaction ends, so no new grant of key can come before that.
 */
Datum
dlock_use_fence(PG_FUNCTION_ARGS)
{
	char	   *key = fence_key_argument(fcinfo);
	int64		fence = PG_GETARG_INT64(1);
	DlockLease	lease;
	FenceVerdict v = lock_and_judge(key, fence, &lease);

	KeyState   *st;

	if (v != FENCE_OK)
		refuse(v, key, true, fence, &lease, NULL);
	st = key_state(key, true);
	st->presented = true;
	st->presented_fence = fence;
	st->verified = true;
	st->lease = lease;
	PG_RETURN_VOID();
}

/*
 * dlock.check_fence(key, fence): would a write under key presenting fence
 * be accepted now?  Waits for a grant of key in progress, then answers
 * without keeping any lock.
 */
Datum
dlock_check_fence(PG_FUNCTION_ARGS)
{
	char	   *key = fence_key_argument(fcinfo);
	int64		fence = PG_GETARG_INT64(1);
	DlockLease	lease;
	FenceVerdict v = lock_and_judge(key, fence, &lease);

	dlock_unlock_key(key, strlen(key), ShareLock);
	PG_RETURN_BOOL(v == FENCE_OK);
}

/* Raise a misuse error of the trigger. */
static void
misuse(Trigger *trigger, Relation rel, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
			 errmsg("trigger \"%s\" on table \"%s\" misuses dlock.fence_guard()",
					trigger->tgname, RelationGetRelationName(rel)),
			 errdetail_internal("%s", detail),
			 errhint("Create it as BEFORE INSERT OR UPDATE OR DELETE ... FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('key-{column}', 'token_column'[, 'monotonic']).")));
}

/*
 * Build the lock key of tuple from the trigger's template: each {column}
 * is replaced by that column's value as text.  A NULL value raises: a row
 * without a key cannot be protected.
 */
static char *
build_key(const char *template, HeapTuple tuple, Trigger *trigger,
		  Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	StringInfoData buf;
	const char *p = template;

	initStringInfo(&buf);
	while (*p)
	{
		const char *close;
		char	   *column;
		char	   *value;
		int			attnum;

		if (*p != '{')
		{
			appendStringInfoChar(&buf, *p++);
			continue;
		}
		close = strchr(p, '}');
		if (close == NULL)
			misuse(trigger, rel,
				   psprintf("The key template \"%s\" has an unterminated placeholder.",
							template));
		column = pnstrdup(p + 1, close - p - 1);
		attnum = SPI_fnumber(desc, column);
		if (attnum <= 0)
			misuse(trigger, rel,
				   psprintf("The key template \"%s\" names column \"%s\", which table \"%s\" does not have.",
							template, column, RelationGetRelationName(rel)));
		if (TupleDescAttr(desc, attnum - 1)->attgenerated)
			misuse(trigger, rel,
				   psprintf("The key template \"%s\" names the generated column \"%s\": BEFORE triggers run before it is computed, so the row's key would be wrong.",
							template, column));
		value = SPI_getvalue(tuple, desc, attnum);
		if (value == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("column \"%s\" of the lock key is null", column),
					 errdetail("Trigger \"%s\" on table \"%s\" builds the lock key \"%s\" from the row; a row without a key cannot be protected.",
							   trigger->tgname, RelationGetRelationName(rel),
							   template),
					 errhint("Give the column a value, or declare it NOT NULL.")));
		appendStringInfoString(&buf, value);
		p = close + 1;
	}
	dlock_check_key(buf.data, buf.len);
	return buf.data;
}

/*
 * Check one key a row write touches and return the token it writes under.
 * The token is the one presented with use_fence for key, else the column
 * token (when column_has).  old_stamp, when has_old_stamp, is the token
 * stamped on the existing row (monotonic mode refuses lower tokens).
 */
static int64
guard_key(const char *key, FenceMode mode, bool column_has, int64 column_token,
		  bool written_back, bool has_old_stamp, int64 old_stamp,
		  const char *relname)
{
	KeyState   *st = key_state(key, false);
	bool		has_token = false;
	int64		token = 0;

	if (st && st->presented)
	{
		has_token = true;
		token = st->presented_fence;
	}
	else if (column_has)
	{
		has_token = true;
		token = column_token;
	}

	if (!(has_token && st && st->verified && st->lease.fence == token &&
		  (mode == FENCE_MODE_MONOTONIC ||
		   (st->lease.held && GetCurrentTimestamp() < st->lease.expires_at))))
	{
		DlockLease	lease;
		FenceVerdict v;

		(void) dlock_lock_key(key, strlen(key), ShareLock, false);
		v = judge(key, has_token, token, mode, &lease);
		if (v == FENCE_NO_TOKEN && written_back)
			v = FENCE_WRITTEN_BACK;
		if (v != FENCE_OK)
			refuse(v, key, has_token, token, &lease, relname);
		st = key_state(key, true);
		st->verified = true;
		st->lease = lease;
	}
	if (mode == FENCE_MODE_MONOTONIC && has_old_stamp && old_stamp > token)
		ereport(ERROR,
				(errcode(ERRCODE_DLOCK_FENCE_REFUSED),
				 errmsg("stale fencing token for key \"%s\"", key),
				 errdetail("The row in table \"%s\" was written under token " INT64_FORMAT "; this write presented " INT64_FORMAT ".",
						   relname, old_stamp, token),
				 errhint("A newer holder has written this row.  Do not retry with the old token.")));
	return token;
}

/* Read the bigint column attnum of tuple; false when it is NULL. */
static bool
tuple_token(HeapTuple tuple, TupleDesc desc, int attnum, int64 *token)
{
	bool		isnull;
	Datum		d = heap_getattr(tuple, attnum, desc, &isnull);

	if (!isnull)
		*token = DatumGetInt64(d);
	return !isnull;
}

/*
 * dlock.fence_guard(key_template [, token_column [, mode]]): BEFORE ROW
 * trigger that lets a row be written only under the current lease of its
 * key (see the README for the rules).
 */
Datum
dlock_fence_guard(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Trigger    *trigger;
	Relation	rel;
	TupleDesc	desc;
	char	  **args;
	int			tokatt = 0;
	FenceMode	mode = FENCE_MODE_LEASE;
	HeapTuple	newtup = NULL;
	HeapTuple	oldtup = NULL;
	char	   *newkey = NULL;
	char	   *oldkey = NULL;
	bool		column_has = false;
	int64		column_token = 0;
	bool		written_back = false;
	bool		has_old_stamp = false;
	int64		old_stamp = 0;
	const char *relname;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("dlock.fence_guard() must be called as a trigger"),
				 errdetail("It was called as a plain function."),
				 errhint("Attach it with CREATE TRIGGER ... BEFORE INSERT OR UPDATE OR DELETE ... FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('key-{column}').")));

	trigger = trigdata->tg_trigger;
	rel = trigdata->tg_relation;
	desc = RelationGetDescr(rel);
	relname = RelationGetRelationName(rel);
	args = trigger->tgargs;

	if (TRIGGER_FIRED_BY_TRUNCATE(trigdata->tg_event))
		misuse(trigger, rel, "TRUNCATE cannot be fenced: it writes no rows to check.  Revoke TRUNCATE from the roles that write under leases.");
	if (!TRIGGER_FIRED_BEFORE(trigdata->tg_event))
		misuse(trigger, rel, "It must fire BEFORE the write, so that a refused write changes nothing.");
	if (!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		misuse(trigger, rel, "It must fire FOR EACH ROW, to check the key of every row written.");
	if (trigger->tgnargs < 1 || trigger->tgnargs > 3)
		misuse(trigger, rel,
			   psprintf("It takes one to three arguments (key template, token column, mode), but was given %d.",
						trigger->tgnargs));
	if (args[0][0] == '\0')
		misuse(trigger, rel, "The key template is empty.");
	if (trigger->tgnargs >= 2 && args[1][0] != '\0')
	{
		tokatt = SPI_fnumber(desc, args[1]);
		if (tokatt <= 0)
			misuse(trigger, rel,
				   psprintf("The token column \"%s\" does not exist in table \"%s\".",
							args[1], relname));
		if (TupleDescAttr(desc, tokatt - 1)->attgenerated)
			misuse(trigger, rel,
				   psprintf("The token column \"%s\" is a generated column; it must be written by the writer.",
							args[1]));
		if (TupleDescAttr(desc, tokatt - 1)->atttypid != INT8OID)
			misuse(trigger, rel,
				   psprintf("The token column \"%s\" is of type %s; it must be bigint.",
							args[1],
							format_type_be(TupleDescAttr(desc, tokatt - 1)->atttypid)));
	}
	if (trigger->tgnargs == 3)
	{
		if (strcmp(args[2], "monotonic") == 0)
			mode = FENCE_MODE_MONOTONIC;
		else if (strcmp(args[2], "lease") != 0)
			misuse(trigger, rel,
				   psprintf("The mode \"%s\" is unknown; use 'lease' or 'monotonic'.",
							args[2]));
	}

	if (TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		newtup = trigdata->tg_trigtuple;
	else if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
	{
		oldtup = trigdata->tg_trigtuple;
		newtup = trigdata->tg_newtuple;
	}
	else
		oldtup = trigdata->tg_trigtuple;

	/* Misuse must be reported even by an administrator's bypass. */
	if (newtup)
		newkey = build_key(args[0], newtup, trigger, rel);
	if (oldtup)
		oldkey = build_key(args[0], oldtup, trigger, rel);

	if (dlock_fence_bypass)
	{
		Oid			role = GetUserId();

		/* SET may have happened under another role: check this one */
		if (!superuser() &&
			pg_parameter_aclcheck("dlock.fence_bypass", role, ACL_SET) != ACLCHECK_OK)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("permission denied to bypass fencing"),
					 errdetail("dlock.fence_bypass is on, but role \"%s\" may not set it.",
							   GetUserNameFromId(role, false)),
					 errhint("Only superusers and roles granted SET ON PARAMETER dlock.fence_bypass may write without a fencing token.")));
		ereport(LOG,
				(errmsg("dlock: fencing bypassed by role \"%s\" for a write to table \"%s\", key \"%s\"",
						GetUserNameFromId(role, false), relname,
						newkey ? newkey : oldkey)));
		return PointerGetDatum(newtup ? newtup : oldtup);
	}

	/*
	 * A token column presents a token only when this write puts a token
	 * there: any value in an INSERT; in an UPDATE, a value the SET list
	 * assigns that differs from the row's.  Whoever can read the row knows
	 * its token, so writing it back (SET fence = fence, an ORM saving the
	 * whole row, a MERGE whose other action assigns the column) proves
	 * nothing; present it with use_fence instead.
	 */
	if (tokatt > 0 && oldtup)
		has_old_stamp = tuple_token(oldtup, desc, tokatt, &old_stamp);
	if (tokatt > 0 && newtup &&
		(oldtup == NULL ||
		 bms_is_member(tokatt - FirstLowInvalidHeapAttributeNumber,
					   trigdata->tg_updatedcols)))
	{
		column_has = tuple_token(newtup, desc, tokatt, &column_token);
		if (column_has && oldtup && has_old_stamp && column_token == old_stamp)
		{
			column_has = false;
			written_back = true;
		}
	}

	if (oldkey && (newkey == NULL || strcmp(oldkey, newkey) != 0))
		(void) guard_key(oldkey, mode, column_has, column_token, written_back,
						 has_old_stamp, old_stamp, relname);
	if (newkey)
	{
		int64		token = guard_key(newkey, mode, column_has, column_token,
									  written_back, has_old_stamp, old_stamp,
									  relname);

		/* Stamp the row with the token presented with use_fence. */
		KeyState   *st = key_state(newkey, false);

		if (tokatt > 0 && st && st->presented)
		{
			Datum		value = Int64GetDatum(token);
			bool		isnull = false;

			newtup = heap_modify_tuple_by_cols(newtup, desc, 1, &tokatt,
											   &value, &isnull);
		}
	}
	return PointerGetDatum(newtup ? newtup : oldtup);
}
