/*-------------------------------------------------------------------------
 *
 * events.c
 *		The LOG lines of dlock.log_events: one per grant, takeover, noticed
 *		expiry, release, proclaim and refused stale write, in a fixed
 *		key=value format that starts with "dlock event=".  And the NOTIFYs
 *		of dlock.notify, on channel "dlock", for the same events but the
 *		refusals, with a JSON payload.
 *
 * Values that a parser must be able to split are double-quoted and
 * escaped; times are UTC, ISO 8601 with microseconds, whatever the
 * session's TimeZone and DateStyle.  The lines need no shared memory.
 * Whether an event happened once (an expiry is logged once per lease) is
 * stats.c's to decide.
 *
 * Owns: nothing.  Calls keyhash.c (a permit's key and number) and settings.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/parallel.h"
#include "access/xlog.h"
#include "commands/async.h"
#include "commands/dbcommands.h"
#include "utils/json.h"
#include "miscadmin.h"
#include "utils/datetime.h"
#include "utils/timestamp.h"

#include "dlock.h"

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
	append_quoted(buf, key, dlock_base_key_len(key, len));
	if (dlock_key_slot(key, len) != 0)
		appendStringInfo(buf, " permit=%d", dlock_key_slot(key, len));
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

/*
 * With dlock.notify, queue a NOTIFY on channel "dlock" for event ev of key
 * (token fence; previous, when not 0, the token it took over from): sent
 * when the transaction commits, dropped if it aborts.  A JSON object,
 * at most about 3.2 kB (a 512-byte key, each byte escaped), within
 * NOTIFY's 8000.  Never during recovery, nor in a parallel worker, where
 * NOTIFY is not allowed.
 */
static void
notify(const char *ev, const char *key, int len, int64 fence, int64 previous)
{
	StringInfoData buf;
	char	   *k;

	if (!dlock_notify || IsParallelWorker() || RecoveryInProgress())
		return;
	initStringInfo(&buf);
	appendStringInfo(&buf, "{\"event\":\"%s\",\"key\":", ev);
	k = pnstrdup(key, dlock_base_key_len(key, len));
	escape_json(&buf, k);
	pfree(k);
	if (dlock_key_slot(key, len) != 0)
		appendStringInfo(&buf, ",\"permit\":%d", dlock_key_slot(key, len));
	appendStringInfo(&buf, ",\"fence\":" INT64_FORMAT, fence);
	if (previous != 0)
		appendStringInfo(&buf, ",\"previous_fence\":" INT64_FORMAT, previous);
	appendStringInfoChar(&buf, '}');
	Async_Notify("dlock", buf.data);
	pfree(buf.data);
}

/* Log the end by expiry of *lease, held for held microseconds. */
void
dlock_log_expired(const char *key, int len, const DlockLease *lease,
				  DlockLeaseState state, int64 held)
{
	StringInfoData buf;

	notify("expired", key, len, lease->fence, 0);
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

/*
 * Log a grant of key: *lease is the new lease, *prev what the key held
 * before when takeover (it ended unreleased), and opts what the grant asked.
 */
void
dlock_log_grant(const char *key, int len, const DlockLease *prev,
				const DlockLease *lease, const DlockGrantOptions *opts,
				bool takeover)
{
	StringInfoData buf;

	notify(takeover ? "takeover" : "grant", key, len, lease->fence,
		   takeover ? prev->fence : 0);
	if (!dlock_log_events)
		return;
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

/* Log the release of *lease (as read before it), held for held microseconds. */
void
dlock_log_release(const char *key, int len, const DlockLease *lease,
				  int64 held)
{
	StringInfoData buf;

	notify("release", key, len, lease->fence, 0);
	if (!dlock_log_events)
		return;
	start_line(&buf, "release", key, len);
	appendStringInfo(&buf, " fence=" INT64_FORMAT " held_ms=" INT64_FORMAT,
					 lease->fence, held / 1000);
	emit(&buf);
}

/* Log a proclaim: the holder of *lease published value. */
void
dlock_log_proclaim(const char *key, int len, const DlockLease *lease,
				   const text *value)
{
	StringInfoData buf;

	notify("proclaim", key, len, lease->fence, 0);
	if (!dlock_log_events)
		return;
	start_line(&buf, "proclaim", key, len);
	appendStringInfo(&buf, " fence=" INT64_FORMAT " value=", lease->fence);
	append_quoted(&buf, VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));
	emit(&buf);
}
