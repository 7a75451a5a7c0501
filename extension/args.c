/*-------------------------------------------------------------------------
 *
 * args.c
 *		Checking the calls of dlock's SQL functions: their arguments, and
 *		that they may run here at all (not in parallel mode; not in a
 *		read-only transaction when they change a lease).
 *
 * Every argument error is raised here, before any lock is taken or any row
 * read, so a bad call changes nothing.  Durations (ttl, wait, older_than)
 * are lengths of time, not calendar arithmetic: a day is 24 hours and a
 * month 30 days in every time zone, as interval comparison counts them, so
 * '1 day' means the same on the eve of a daylight saving change.
 *
 * Owns: nothing.  Calls settings only.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/int128.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "dlock.h"

/*
 * Refuse to run in parallel mode.  dlock's functions are PARALLEL UNSAFE,
 * but a wrapper wrongly marked PARALLEL SAFE or RESTRICTED can still reach
 * them there, where they can neither take a fresh snapshot nor write.
 */
void
dlock_no_parallel(FunctionCallInfo fcinfo)
{
	if (IsInParallelMode())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("cannot call %s() during a parallel operation",
						get_func_name(fcinfo->flinfo->fn_oid)),
				 errhint("A function that calls it must be marked PARALLEL UNSAFE.")));
	/* every SQL-callable function comes here first (see dlock.c) */
	dlock_settings_check();
}

/*
 * Raise the error for a NULL argument name of the SQL function called
 * through fcinfo: dlock never treats NULL as a value.
 */
void
dlock_null_argument(FunctionCallInfo fcinfo, const char *name)
{
	ereport(ERROR,
			(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			 errmsg("%s must not be null", name),
			 errdetail("%s() was called with a NULL %s.",
					   get_func_name(fcinfo->flinfo->fn_oid), name),
			 errhint("Pass a value: dlock functions return NULL only to report a lost lease.")));
}

/* Raise an error unless key (len bytes) is a valid lock key. */
void
dlock_check_key(const char *key, int len)
{
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lock key must not be empty"),
				 errdetail("The key given was an empty string."),
				 errhint("Name the resource the lock protects, for example 'stock-sync:warehouse-42'.")));
	if (len > DLOCK_MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lock key is too long"),
				 errdetail("The key is %d bytes long; the limit is %d bytes.",
						   len, DLOCK_MAX_KEY_BYTES),
				 errhint("Use a shorter key, for example a hash of the resource name.")));
	if (memchr(key, DLOCK_SLOT_SEPARATOR, len) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lock key must not contain the control character U+001F"),
				 errdetail("dlock stores each permit of a key under the key, U+001F and the permit's number."),
				 errhint("Use printable characters in keys.")));
}

/* Return argument argno, a key, after checking it. */
text *
dlock_key_arg(FunctionCallInfo fcinfo, int argno)
{
	text	   *key;

	if (PG_ARGISNULL(argno))
		dlock_null_argument(fcinfo, "key");
	key = PG_GETARG_TEXT_PP(argno);
	dlock_check_key(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
	return key;
}

/* Argument argno, an interval, as text for a message. */
char *
dlock_interval_text(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		return pstrdup("no limit");
	return DatumGetCString(DirectFunctionCall1(interval_out,
											   PG_GETARG_DATUM(argno)));
}

/*
 * The length of span in microseconds, clamped to +-DLOCK_HUGE_USECS.
 * Computed exactly in 128 bits, so mixed signs (-100000000 days plus
 * 8640000000001 seconds is one second) neither overflow nor slip past the
 * limits.
 */
static int64
span_usecs(const Interval *span)
{
	return dlock_interval_usecs(span);
}

/* Exported span_usecs: a duration in microseconds, clamped. */
int64
dlock_interval_usecs(const Interval *span)
{
	INT128		sum = int64_to_int128(span->time);

	int128_add_int64_mul_int64(&sum, span->day, USECS_PER_DAY);
	int128_add_int64_mul_int64(&sum, span->month,
							   (int64) DAYS_PER_MONTH * USECS_PER_DAY);
	if (int128_compare(sum, int64_to_int128(DLOCK_HUGE_USECS)) > 0)
		return DLOCK_HUGE_USECS;
	if (int128_compare(sum, int64_to_int128(-DLOCK_HUGE_USECS)) < 0)
		return -DLOCK_HUGE_USECS;
	return int128_to_int64(sum);
}

/*
 * Return argument argno, a ttl, in microseconds, after checking that it is
 * positive and within dlock.max_ttl.
 */
int64
dlock_ttl_arg(FunctionCallInfo fcinfo, int argno)
{
	int64		usecs;

	if (PG_ARGISNULL(argno))
		dlock_null_argument(fcinfo, "ttl");
	usecs = span_usecs(PG_GETARG_INTERVAL_P(argno));
	if (usecs <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be positive"),
				 errdetail("The ttl given was %s.",
						   dlock_interval_text(fcinfo, argno)),
				 errhint("Pass how long the lease should last, for example '30 seconds'.")));
	if (usecs > (int64) dlock_max_ttl_ms * 1000)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl exceeds dlock.max_ttl"),
				 errdetail("The ttl given was %s; dlock.max_ttl is %d ms.",
						   dlock_interval_text(fcinfo, argno),
						   dlock_max_ttl_ms),
				 errhint("Use a shorter ttl and renew the lease while you work, or ask an administrator to raise dlock.max_ttl.")));
	return usecs;
}

/*
 * Read argument argno, a wait: return false for no limit of its own (NULL,
 * or decades), else true with the wait in *usecs.
 */
bool
dlock_wait_arg(FunctionCallInfo fcinfo, int argno, int64 *usecs)
{
	if (PG_ARGISNULL(argno))
		return false;
	*usecs = span_usecs(PG_GETARG_INTERVAL_P(argno));
	if (*usecs < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("wait must not be negative"),
				 errdetail("The wait given was %s.",
						   dlock_interval_text(fcinfo, argno)),
				 errhint("Pass how long to wait, '0' to try once, or NULL to wait without a limit of its own.")));
	return *usecs < DLOCK_HUGE_USECS;
}

/* Return argument argno, prune's older_than, in microseconds. */
int64
dlock_age_arg(FunctionCallInfo fcinfo, int argno)
{
	int64		usecs;

	if (PG_ARGISNULL(argno))
		dlock_null_argument(fcinfo, "older_than");
	usecs = span_usecs(PG_GETARG_INTERVAL_P(argno));
	if (usecs < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("older_than must not be negative"),
				 errdetail("The age given was %s.",
						   dlock_interval_text(fcinfo, argno)),
				 errhint("Pass how long a key must have been free, for example '1 day'.")));
	return usecs;
}

/* Return argument argno, an owner. */
pg_uuid_t *
dlock_owner_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		dlock_null_argument(fcinfo, "owner");
	return PG_GETARG_UUID_P(argno);
}

/*
 * Return the holder label of argument argno: the argument, or
 * application_name when it is NULL; NULL when both are empty.
 */
text *
dlock_holder_arg(FunctionCallInfo fcinfo, int argno)
{
	text	   *holder = NULL;

	if (!PG_ARGISNULL(argno))
		holder = PG_GETARG_TEXT_PP(argno);
	else if (application_name != NULL && application_name[0] != '\0')
		holder = cstring_to_text(application_name);
	if (holder != NULL && VARSIZE_ANY_EXHDR(holder) > DLOCK_MAX_HOLDER_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("holder label is too long"),
				 errdetail("The label is %d bytes long; the limit is %d bytes.",
						   (int) VARSIZE_ANY_EXHDR(holder),
						   DLOCK_MAX_HOLDER_BYTES),
				 errhint("Keep it short: it is a label for people reading dlock.leases.")));
	return holder;
}

/*
 * Return argument argno, an election's value (campaign, proclaim): never
 * NULL, at most DLOCK_MAX_VALUE_BYTES long.
 */
text *
dlock_value_arg(FunctionCallInfo fcinfo, int argno)
{
	text	   *value;

	if (PG_ARGISNULL(argno))
		dlock_null_argument(fcinfo, "value");
	value = PG_GETARG_TEXT_PP(argno);
	if (VARSIZE_ANY_EXHDR(value) > DLOCK_MAX_VALUE_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("election value is too long"),
				 errdetail("The value is %d bytes long; the limit is %d bytes.",
						   (int) VARSIZE_ANY_EXHDR(value),
						   DLOCK_MAX_VALUE_BYTES),
				 errhint("Publish where to find the leader (an address, a name), not data.")));
	return value;
}

/*
 * Return what the arguments permits (argno permits_argno) and mode
 * (mode_argno) ask for: 1 for an exclusive lease (the default), N > 1 for
 * one of N permits, 0 for a shared lease.  Absent arguments (a function of
 * an older version) mean the default.
 */
int32
dlock_permits_arg(FunctionCallInfo fcinfo, int permits_argno, int mode_argno)
{
	int32		permits = 1;
	bool		shared = false;

	if (PG_NARGS() > mode_argno)
	{
		char	   *mode;

		if (PG_ARGISNULL(mode_argno))
			dlock_null_argument(fcinfo, "mode");
		mode = text_to_cstring(PG_GETARG_TEXT_PP(mode_argno));
		if (strcmp(mode, "shared") == 0)
			shared = true;
		else if (strcmp(mode, "exclusive") != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid lease mode \"%.*s%s\"",
							pg_mbcliplen(mode, strlen(mode), 32), mode,
							strlen(mode) > 32 ? "..." : ""),
					 errhint("The mode is 'exclusive' (the default) or 'shared'.")));
	}
	if (PG_NARGS() > permits_argno)
	{
		if (PG_ARGISNULL(permits_argno))
			dlock_null_argument(fcinfo, "permits");
		permits = PG_GETARG_INT32(permits_argno);
		if (permits < 1 || permits > DLOCK_MAX_SLOTS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("permits must be between 1 and %d", DLOCK_MAX_SLOTS),
					 errdetail("The permits given were %d.", permits),
					 errhint("Pass how many holders the key admits at once, 1 for an exclusive lease.")));
	}
	if (shared && permits != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a shared lease takes no permits"),
				 errdetail("mode => 'shared' was given with permits => %d.", permits),
				 errhint("Shared leases coexist without a count (up to %d holders); for at most N holders at once, pass permits => N without a mode.",
						 DLOCK_MAX_SLOTS)));
	return shared ? 0 : permits;
}

/*
 * Return argument argno, a lock_delay, in microseconds: 0 when NULL or
 * absent (a function of an older version has no such argument).  Capped
 * like a ttl, by dlock.max_ttl: a delay is a time the key cannot be had.
 */
int64
dlock_lock_delay_arg(FunctionCallInfo fcinfo, int argno)
{
	int64		usecs;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return 0;
	usecs = span_usecs(PG_GETARG_INTERVAL_P(argno));
	if (usecs < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lock_delay must not be negative"),
				 errdetail("The lock_delay given was %s.",
						   dlock_interval_text(fcinfo, argno)),
				 errhint("Pass how long the key should stay ungrantable after the lease expires, or NULL for no delay.")));
	if (usecs > (int64) dlock_max_ttl_ms * 1000)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lock_delay exceeds dlock.max_ttl"),
				 errdetail("The lock_delay given was %s; dlock.max_ttl is %d ms.",
						   dlock_interval_text(fcinfo, argno),
						   dlock_max_ttl_ms),
				 errhint("A delay keeps the key from everyone; keep it to the time in-flight work needs to drain.")));
	return usecs;
}

/*
 * Return boolean argument argno (named name): dflt when absent (a function
 * of an older version); NULL is an error.
 */
bool
dlock_bool_arg(FunctionCallInfo fcinfo, int argno, const char *name, bool dflt)
{
	if (PG_NARGS() <= argno)
		return dflt;
	if (PG_ARGISNULL(argno))
		dlock_null_argument(fcinfo, name);
	return PG_GETARG_BOOL(argno);
}

/*
 * Refuse to change a lease in a read-only transaction (or on a standby).
 * The lease API calls this first, so that it fails the same way whether or
 * not the key happens to be held.
 */
void
dlock_check_writable(void)
{
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot change a dlock lease in a read-only transaction"),
				 errhint("Leases are granted, renewed and released on the primary, in read-write transactions.")));
}

/* An interval of usecs microseconds, for the views. */
Datum
dlock_usecs_interval(int64 usecs)
{
	Interval   *iv = palloc0(sizeof(Interval));

	iv->time = usecs;
	return IntervalPGetDatum(iv);
}
