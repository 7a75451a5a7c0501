/*-------------------------------------------------------------------------
 *
 * trigger.c
 *		dlock.fence_guard: the BEFORE ROW trigger that lets a row be
 *		written only under the current lease of its key.
 *
 * The trigger's arguments (key template, token column, mode) are parsed
 * once per trigger and statement and kept in fn_extra.  A row's key is the
 * template with each {column} replaced by the column's value, rendered in
 * a form that is the same in every session: a key built from a row must
 * not depend on the writer's TimeZone, DateStyle, IntervalStyle or
 * extra_float_digits, or two sessions would be granted "the" lease of one
 * row under two keys.  So only types with such a form are accepted:
 *
 *	text, varchar, name, "char"		the text itself
 *	char(n)							without its trailing blanks
 *	smallint, integer, bigint, oid,
 *	numeric, uuid, enums			their output (independent of settings)
 *	boolean							true / false
 *	date, timestamp					ISO 8601 (2026-01-01, 2026-01-01 00:00:00)
 *	timestamptz						ISO 8601 in UTC (2026-01-01 00:00:00+00)
 *	real, double precision			shortest exact form (as extra_float_digits 1)
 *
 * and domains over them.  Other types are refused with 39P01.
 *
 * Owns: each trigger's parsed arguments (fn_extra).  Calls fence.c (judging
 * each key's write, and the tokens presented in this transaction), args.c
 * and settings.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/sysattr.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/shortest_dec.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/date.h"
#include "utils/datetime.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#include "dlock.h"

PG_FUNCTION_INFO_V1(dlock_fence_guard);

/* How a key column's value becomes text. */
typedef enum KeyRender
{
	RENDER_TEXT,				/* the text itself */
	RENDER_BPCHAR,				/* the text less trailing blanks */
	RENDER_OUTPUT,				/* the type's output function */
	RENDER_BOOL,
	RENDER_DATE,
	RENDER_TIMESTAMP,
	RENDER_TIMESTAMPTZ,
	RENDER_FLOAT4,
	RENDER_FLOAT8
} KeyRender;

/* One piece of a key template: literal text, or a column. */
typedef struct TemplatePart
{
	char	   *literal;		/* when attnum is 0 */
	int			attnum;
	char	   *column;
	KeyRender	render;
	FmgrInfo	output;			/* for RENDER_OUTPUT */
} TemplatePart;

/* A trigger's parsed arguments, kept in fn_extra. */
typedef struct GuardPlan
{
	Oid			tgoid;
	Oid			relid;
	int			nparts;
	TemplatePart *parts;
	int			tokatt;			/* token column, or 0 */
	bool		monotonic;
	bool		bypass_logged;	/* this statement logged its bypass */
} GuardPlan;

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
 * Choose how column attnum of rel is rendered in a key; refuse types whose
 * text form depends on session settings, or that we do not know.
 */
static void
choose_render(TemplatePart *part, Trigger *trigger, Relation rel,
			  MemoryContext cxt)
{
	Oid			typid = TupleDescAttr(RelationGetDescr(rel), part->attnum - 1)->atttypid;
	Oid			base = getBaseType(typid);

	switch (base)
	{
		case TEXTOID:
		case VARCHAROID:
			part->render = RENDER_TEXT;
			return;
		case BPCHAROID:
			part->render = RENDER_BPCHAR;
			return;
		case BOOLOID:
			part->render = RENDER_BOOL;
			return;
		case DATEOID:
			part->render = RENDER_DATE;
			return;
		case TIMESTAMPOID:
			part->render = RENDER_TIMESTAMP;
			return;
		case TIMESTAMPTZOID:
			part->render = RENDER_TIMESTAMPTZ;
			return;
		case FLOAT4OID:
			part->render = RENDER_FLOAT4;
			return;
		case FLOAT8OID:
			part->render = RENDER_FLOAT8;
			return;
		case INT2OID:
		case INT4OID:
		case INT8OID:
		case OIDOID:
		case NUMERICOID:
		case UUIDOID:
		case NAMEOID:
		case CHAROID:
			break;
		default:
			if (!type_is_enum(base))
				ereport(ERROR,
						(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
						 errmsg("trigger \"%s\" on table \"%s\" misuses dlock.fence_guard()",
								trigger->tgname, RelationGetRelationName(rel)),
						 errdetail("The key template names column \"%s\" of type %s, which cannot be part of a lock key: its text form depends on session settings, or dlock does not know it.",
								   part->column, format_type_be(typid)),
						 errhint("Use columns of type text, varchar, char(n), an integer type, numeric, uuid, boolean, date, timestamp, timestamptz, real, double precision or an enum in the key template.")));
			break;
	}
	{
		Oid			outfunc;
		bool		isvarlena;

		getTypeOutputInfo(base, &outfunc, &isvarlena);
		fmgr_info_cxt(outfunc, &part->output, cxt);
		part->render = RENDER_OUTPUT;
	}
}

/*
 * Parse the trigger's arguments into a GuardPlan in cxt, raising 39P01 for
 * every misuse.
 */
static GuardPlan *
build_plan(Trigger *trigger, Relation rel, MemoryContext cxt)
{
	TupleDesc	desc = RelationGetDescr(rel);
	char	  **args = trigger->tgargs;
	MemoryContext old = MemoryContextSwitchTo(cxt);
	GuardPlan  *plan = palloc0(sizeof(GuardPlan));
	const char *template;
	const char *p;
	int			maxparts;

	if (trigger->tgnargs < 1 || trigger->tgnargs > 3)
		misuse(trigger, rel,
			   psprintf("It takes one to three arguments (key template, token column, mode), but was given %d.",
						trigger->tgnargs));
	template = args[0];
	if (template[0] == '\0')
		misuse(trigger, rel, "The key template is empty.");

	/* split the template into literals and {column}s */
	maxparts = 2 * strlen(template) + 1;
	plan->parts = palloc0(sizeof(TemplatePart) * maxparts);
	p = template;
	while (*p)
	{
		TemplatePart *part = &plan->parts[plan->nparts++];
		const char *open = strchr(p, '{');
		const char *close;

		if (open != p)
		{
			part->literal = open ? pnstrdup(p, open - p) : pstrdup(p);
			p = open ? open : p + strlen(p);
			continue;
		}
		close = strchr(p, '}');
		if (close == NULL)
			misuse(trigger, rel,
				   psprintf("The key template \"%s\" has an unterminated placeholder.",
							template));
		part->column = pnstrdup(p + 1, close - p - 1);
		part->attnum = SPI_fnumber(desc, part->column);
		if (part->attnum <= 0)
			misuse(trigger, rel,
				   psprintf("The key template \"%s\" names column \"%s\", which table \"%s\" does not have.",
							template, part->column, RelationGetRelationName(rel)));
		if (TupleDescAttr(desc, part->attnum - 1)->attgenerated)
			misuse(trigger, rel,
				   psprintf("The key template \"%s\" names the generated column \"%s\": BEFORE triggers run before it is computed, so the row's key would be wrong.",
							template, part->column));
		choose_render(part, trigger, rel, cxt);
		p = close + 1;
	}

	if (trigger->tgnargs >= 2 && args[1][0] != '\0')
	{
		plan->tokatt = SPI_fnumber(desc, args[1]);
		if (plan->tokatt <= 0)
			misuse(trigger, rel,
				   psprintf("The token column \"%s\" does not exist in table \"%s\".",
							args[1], RelationGetRelationName(rel)));
		if (TupleDescAttr(desc, plan->tokatt - 1)->attgenerated)
			misuse(trigger, rel,
				   psprintf("The token column \"%s\" is a generated column; it must be written by the writer.",
							args[1]));
		if (TupleDescAttr(desc, plan->tokatt - 1)->atttypid != INT8OID)
			misuse(trigger, rel,
				   psprintf("The token column \"%s\" is of type %s; it must be bigint.",
							args[1],
							format_type_be(TupleDescAttr(desc, plan->tokatt - 1)->atttypid)));
	}
	if (trigger->tgnargs == 3)
	{
		if (strcmp(args[2], "monotonic") == 0)
			plan->monotonic = true;
		else if (strcmp(args[2], "lease") != 0)
			misuse(trigger, rel,
				   psprintf("The mode \"%s\" is unknown; use 'lease' or 'monotonic'.",
							args[2]));
	}
	plan->tgoid = trigger->tgoid;
	plan->relid = RelationGetRelid(rel);
	MemoryContextSwitchTo(old);
	return plan;
}

/* The trigger's plan: from fn_extra, or parsed now and kept there. */
static GuardPlan *
guard_plan(FunctionCallInfo fcinfo, Trigger *trigger, Relation rel)
{
	GuardPlan  *plan = (GuardPlan *) fcinfo->flinfo->fn_extra;

	if (plan == NULL || plan->tgoid != trigger->tgoid ||
		plan->relid != RelationGetRelid(rel))
	{
		plan = build_plan(trigger, rel, fcinfo->flinfo->fn_mcxt);
		fcinfo->flinfo->fn_extra = plan;
	}
	return plan;
}

/* Append value d of a key column, rendered as part says, to buf. */
static void
append_value(StringInfo buf, TemplatePart *part, Datum d)
{
	struct pg_tm tm;
	fsec_t		fsec;
	char		out[MAXDATELEN + 1];

	switch (part->render)
	{
		case RENDER_TEXT:
		case RENDER_BPCHAR:
			{
				text	   *t = DatumGetTextPP(d);
				int			len = VARSIZE_ANY_EXHDR(t);

				if (part->render == RENDER_BPCHAR)
					while (len > 0 && VARDATA_ANY(t)[len - 1] == ' ')
						len--;
				appendBinaryStringInfo(buf, VARDATA_ANY(t), len);
				return;
			}
		case RENDER_OUTPUT:
			appendStringInfoString(buf, OutputFunctionCall(&part->output, d));
			return;
		case RENDER_BOOL:
			appendStringInfoString(buf, DatumGetBool(d) ? "true" : "false");
			return;
		case RENDER_DATE:
			{
				DateADT		date = DatumGetDateADT(d);

				if (DATE_NOT_FINITE(date))
					EncodeSpecialDate(date, out);
				else
				{
					j2date(date + POSTGRES_EPOCH_JDATE,
						   &tm.tm_year, &tm.tm_mon, &tm.tm_mday);
					EncodeDateOnly(&tm, USE_ISO_DATES, out);
				}
				break;
			}
		case RENDER_TIMESTAMP:
		case RENDER_TIMESTAMPTZ:
			{
				Timestamp	ts = DatumGetTimestamp(d);

				if (TIMESTAMP_NOT_FINITE(ts))
					EncodeSpecialTimestamp(ts, out);
				/* no time zone pointer: broken down in UTC */
				else if (timestamp2tm(ts, NULL, &tm, &fsec, NULL, NULL) == 0)
				{
					/* UTC is a zone it knows: print +00 for timestamptz */
					tm.tm_isdst = 0;
					EncodeDateTime(&tm, fsec,
								   part->render == RENDER_TIMESTAMPTZ, 0, NULL,
								   USE_ISO_DATES, out);
				}
				else
					ereport(ERROR,
							(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
							 errmsg("timestamp out of range in column \"%s\" of a lock key",
									part->column)));
				break;
			}
		case RENDER_FLOAT4:
			(void) float_to_shortest_decimal_buf(DatumGetFloat4(d), out);
			break;
		case RENDER_FLOAT8:
			(void) double_to_shortest_decimal_buf(DatumGetFloat8(d), out);
			break;
	}
	appendStringInfoString(buf, out);
}

/*
 * Build the lock key of tuple from the plan's template.  A NULL value
 * raises: a row without a key cannot be protected.
 */
static char *
build_key(GuardPlan *plan, HeapTuple tuple, Trigger *trigger, Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	StringInfoData buf;
	int			i;

	initStringInfo(&buf);
	for (i = 0; i < plan->nparts; i++)
	{
		TemplatePart *part = &plan->parts[i];
		bool		isnull;
		Datum		d;

		if (part->attnum == 0)
		{
			appendStringInfoString(&buf, part->literal);
			continue;
		}
		d = heap_getattr(tuple, part->attnum, desc, &isnull);
		if (isnull)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("column \"%s\" of the lock key is null", part->column),
					 errdetail("Trigger \"%s\" on table \"%s\" builds the lock key \"%s\" from the row; a row without a key cannot be protected.",
							   trigger->tgname, RelationGetRelationName(rel),
							   trigger->tgargs[0]),
					 errhint("Give the column a value, or declare it NOT NULL.")));
		append_value(&buf, part, d);
	}
	dlock_check_key(buf.data, buf.len);
	return buf.data;
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
 * Let an administrator's write through when dlock.fence_bypass is on and
 * the writing role may set it; log it once per trigger and statement.
 */
static void
bypass(GuardPlan *plan, Relation rel, const char *key)
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
	if (!plan->bypass_logged)
	{
		ereport(LOG,
				(errmsg("dlock: fencing bypassed by role \"%s\" for writes to table \"%s\", first key \"%s\"",
						GetUserNameFromId(role, false),
						RelationGetRelationName(rel), key)));
		plan->bypass_logged = true;
	}
}

/*
 * Check one key a row write touches and return the token it writes under:
 * the one presented with use_fence for key, else the column token (when
 * column_has), else one that an UPDATE of the same statement presented in
 * the token column for this key (the DELETE half of an UPDATE that moves
 * the row to another partition).  old_stamp, when has_old_stamp, is the
 * token stamped on the existing row (monotonic mode refuses lower tokens).
 */
static int64
guard_key(GuardPlan *plan, const char *key, bool column_has,
		  int64 column_token, bool written_back, bool has_old_stamp,
		  int64 old_stamp, const char *relname)
{
	DlockKeyState *st = dlock_key_state(key, false);
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
	else if (st && st->column_cid == GetCurrentCommandId(false))
	{
		has_token = true;
		token = st->column_fence;
	}

	token = dlock_fence_write(key, has_token, token, plan->monotonic,
							  written_back, relname);
	if (plan->monotonic && has_old_stamp && old_stamp > token)
		ereport(ERROR,
				(errcode(ERRCODE_DLOCK_FENCE_REFUSED),
				 errmsg("stale fencing token for key \"%s\"", key),
				 errdetail("The row in table \"%s\" was written under token " INT64_FORMAT "; this write presented " INT64_FORMAT ".",
						   relname, old_stamp, token),
				 errhint("A newer holder has written this row.  Do not retry with the old token.")));
	return token;
}

/*
 * dlock.fence_guard(key_template [, token_column [, mode]]): BEFORE ROW
 * trigger that lets a row be written only under the current lease of its
 * key (docs/reference.md has the rules).
 */
Datum
dlock_fence_guard(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Trigger    *trigger;
	Relation	rel;
	TupleDesc	desc;
	GuardPlan  *plan;
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

	dlock_settings_check();
	trigger = trigdata->tg_trigger;
	rel = trigdata->tg_relation;
	desc = RelationGetDescr(rel);
	relname = RelationGetRelationName(rel);

	if (TRIGGER_FIRED_BY_TRUNCATE(trigdata->tg_event))
		misuse(trigger, rel, "TRUNCATE cannot be fenced: it writes no rows to check.  Revoke TRUNCATE from the roles that write under leases.");
	if (!TRIGGER_FIRED_BEFORE(trigdata->tg_event))
		misuse(trigger, rel, "It must fire BEFORE the write, so that a refused write changes nothing.");
	if (!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		misuse(trigger, rel, "It must fire FOR EACH ROW, to check the key of every row written.");
	plan = guard_plan(fcinfo, trigger, rel);

	if (TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		newtup = trigdata->tg_trigtuple;
	else if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
	{
		oldtup = trigdata->tg_trigtuple;
		newtup = trigdata->tg_newtuple;
	}
	else
		oldtup = trigdata->tg_trigtuple;

	/* misuse must be reported even to an administrator's bypass */
	if (newtup)
		newkey = build_key(plan, newtup, trigger, rel);
	if (oldtup)
		oldkey = build_key(plan, oldtup, trigger, rel);

	if (dlock_fence_bypass)
	{
		bypass(plan, rel, newkey ? newkey : oldkey);
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
	if (plan->tokatt > 0 && oldtup)
		has_old_stamp = tuple_token(oldtup, desc, plan->tokatt, &old_stamp);
	if (plan->tokatt > 0 && newtup &&
		(oldtup == NULL ||
		 bms_is_member(plan->tokatt - FirstLowInvalidHeapAttributeNumber,
					   trigdata->tg_updatedcols)))
	{
		column_has = tuple_token(newtup, desc, plan->tokatt, &column_token);
		if (column_has && oldtup && has_old_stamp && column_token == old_stamp)
		{
			column_has = false;
			written_back = true;
		}
	}

	if (oldkey && (newkey == NULL || strcmp(oldkey, newkey) != 0))
		(void) guard_key(plan, oldkey, column_has, column_token, written_back,
						 has_old_stamp, old_stamp, relname);
	if (newkey)
	{
		int64		token = guard_key(plan, newkey, column_has, column_token,
									  written_back, has_old_stamp, old_stamp,
									  relname);
		DlockKeyState *st = dlock_key_state(newkey, false);

		/* stamp the row with the token presented with use_fence */
		if (plan->tokatt > 0 && st && st->presented)
		{
			Datum		value = Int64GetDatum(token);
			bool		isnull = false;

			newtup = heap_modify_tuple_by_cols(newtup, desc, 1, &plan->tokatt,
											   &value, &isnull);
		}
	}

	/*
	 * An UPDATE that presented a token in the token column also presents
	 * it to the DELETE half of the same statement, should the row move to
	 * another partition (that half sees only the old row).
	 */
	if (oldtup && newtup && column_has)
	{
		DlockKeyState *st = dlock_key_state(oldkey, true);

		st->column_cid = GetCurrentCommandId(false);
		st->column_fence = column_token;
	}
	return PointerGetDatum(newtup ? newtup : oldtup);
}
