/*-------------------------------------------------------------------------
 *
 * leader.c
 *	  dlock leader: who leads an election, once, or as it changes.
 *
 * The one-shot form asks dlock.leader(); when nobody leads, it asks
 * dlock.observe() without waiting why not: the last term was resigned, it
 * expired, or there is no term on record.
 *
 * --watch first prints the state as the one-shot form does, from a call of
 * dlock.observe() that does not wait, then runs observe()'s long-poll loop:
 * each call returns as soon as the election changes (a new epoch, the end
 * of the term, a new value) and the loop prints one line per change.  Each call is one statement, so
 * the loop works behind a transaction-pooling PgBouncer; what the loop has
 * seen (the epoch, the value, whether the term's end was seen) lives here,
 * so a dropped connection costs only a reconnection: the first call over
 * the new one returns at once if anything changed meanwhile.
 *
 * The line format (print_state) is documented in docs/client.md and in
 * "dlock leader --help"; keep the three in step.
 *
 * client/leader.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres_fe.h"

#include <poll.h>

#include "client.h"

/* Times as RFC 3339 in UTC, whatever the session's TimeZone and DateStyle */
#define UTC_TEXT(col) \
	"pg_catalog.to_char(pg_catalog.timezone('UTC'::pg_catalog.text, " col "), " \
	"'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

static const char *const sql_leader =
"SELECT l.fence, " UTC_TEXT("l.since") ", " UTC_TEXT("l.expires_at") ", l.value "
"FROM dlock.leader($1) AS l";

static const char *const sql_observe =
"SELECT o.state, o.fence, " UTC_TEXT("o.expires_at") ", o.value "
"FROM dlock.observe($1, $2::pg_catalog.int8, $3::pg_catalog.interval, $4, "
"$5::pg_catalog.bool) AS o";

/*
 * How long one observe call waits in the server (at first; halved down to
 * the least each time a statement_timeout cancels it), and our margin on
 * top
 */
#define OBSERVE_WAIT_MS		30000
#define OBSERVE_WAIT_MIN_MS 1000
#define ANSWER_SLACK_MS		10000

/* Reconnection: the first delay, the longest, and one attempt's limit */
#define BACKOFF_FIRST_MS	100
#define BACKOFF_MAX_MS		5000
#define CONNECT_TIMEOUT_MS	10000

/*
 * One state of an election, as printed; every field malloc'd, or NULL when
 * unknown (printed empty, or null in JSON)
 */
typedef struct LeaderState
{
	char	   *state;			/* leader, resigned, expired, none */
	char	   *epoch;
	char	   *since;
	char	   *expires_at;
	char	   *value;
} LeaderState;

/* What the watch loop has seen: the arguments of its next observe call */
typedef struct Watch
{
	DlockOptions *o;
	const char *name;
	PGconn	   *conn;
	char	   *epoch;			/* after_fence: the highest epoch seen */
	char	   *value;			/* seen_value; NULL: none */
	bool		seen_end;
	bool		started;		/* the first state has been printed */
	int			wait_ms;		/* observe's wait */
	int			backoff_ms;
	char	   *last_error;		/* the last connection failure printed */
} Watch;

/* Column col of row row (malloc'd), or NULL for an SQL NULL */
static char *
column(const PGresult *res, int row, int col)
{
	return PQgetisnull(res, row, col) ? NULL : pg_strdup(PQgetvalue(res, row, col));
}

static void
free_state(LeaderState *st)
{
	free(st->state);
	free(st->epoch);
	free(st->since);
	free(st->expires_at);
	free(st->value);
	memset(st, 0, sizeof(LeaderState));
}

/* The word printed for one of observe()'s states */
static const char *
state_word(const char *server_state)
{
	if (strcmp(server_state, "held") == 0)
		return "leader";
	if (strcmp(server_state, "released") == 0)
		return "resigned";
	if (strcmp(server_state, "expired") == 0)
		return "expired";
	if (strcmp(server_state, "none") == 0)
		return "none";
	/* a state of a later version: pass it on rather than guess */
	return server_state;
}

/*
 * A field of a text line: a backslash, tab, newline and carriage return are
 * escaped as in COPY's text format, so that a line is one state and a tab
 * always separates fields.
 */
static void
print_text_field(const char *s)
{
	if (s == NULL)
		return;
	for (; *s; s++)
	{
		switch (*s)
		{
			case '\\':
				fputs("\\\\", stdout);
				break;
			case '\t':
				fputs("\\t", stdout);
				break;
			case '\n':
				fputs("\\n", stdout);
				break;
			case '\r':
				fputs("\\r", stdout);
				break;
			default:
				putchar(*s);
		}
	}
}

static void
print_json_field(const char *name, const char *s, bool number)
{
	printf("\"%s\":", name);
	if (s == NULL)
		fputs("null", stdout);
	else if (number)
		fputs(s, stdout);
	else
		dlock_print_json_string(s);
}

/*
 * Print one state as one line, at once (a watch's reader must not wait for
 * a buffer to fill):
 *	 text: STATE <tab> EPOCH <tab> SINCE <tab> EXPIRES_AT <tab> VALUE
 *	 json: {"state":...,"epoch":...,"since":...,"expires_at":...,"value":...}
 */
static void
print_state(const DlockOptions *o, const LeaderState *st)
{
	if (o->format == DLOCK_FORMAT_JSON)
	{
		putchar('{');
		print_json_field("state", st->state, false);
		putchar(',');
		print_json_field("epoch", st->epoch, true);
		putchar(',');
		print_json_field("since", st->since, false);
		putchar(',');
		print_json_field("expires_at", st->expires_at, false);
		putchar(',');
		print_json_field("value", st->value, false);
		fputs("}\n", stdout);
	}
	else
	{
		print_text_field(st->state);
		putchar('\t');
		print_text_field(st->epoch);
		putchar('\t');
		print_text_field(st->since);
		putchar('\t');
		print_text_field(st->expires_at);
		putchar('\t');
		print_text_field(st->value);
		putchar('\n');
	}
	if (fflush(stdout) != 0 || ferror(stdout))
		dlock_fatal(DLOCK_EXIT_SOFTWARE, "could not write to standard output: %m");
}

/* Fill *st from row 0 of dlock.leader()'s result */
static void
state_from_leader(const PGresult *res, LeaderState *st)
{
	st->state = pg_strdup("leader");
	st->epoch = column(res, 0, 0);
	st->since = column(res, 0, 1);
	st->expires_at = column(res, 0, 2);
	st->value = column(res, 0, 3);
}

/* Fill *st from row 0 of dlock.observe()'s result (no since: it has none) */
static void
state_from_observe(const PGresult *res, LeaderState *st)
{
	st->state = pg_strdup(state_word(PQgetvalue(res, 0, 0)));
	st->epoch = column(res, 0, 1);
	st->since = NULL;
	st->expires_at = column(res, 0, 2);
	st->value = column(res, 0, 3);
}

/*
 * dlock leader NAME: print the state, exit 0 when someone leads, 3 when
 * nobody does.
 */
static int
leader_once(DlockOptions *o)
{
	const char *name = o->args[0];
	PGconn	   *conn = dlock_connect(&o->conn);
	const char *values[5];
	LeaderState st;
	int			tries;

	memset(&st, 0, sizeof(st));
	for (tries = 0;; tries++)
	{
		PGresult   *res;

		values[0] = name;
		res = dlock_exec_or_exit(conn, sql_leader, 1, values);
		if (PQntuples(res) > 0)
		{
			state_from_leader(res, &st);
			PQclear(res);
			break;
		}
		PQclear(res);

		/* nobody leads: why (an observe call that does not wait) */
		values[1] = "0";
		values[2] = "0 seconds";
		values[3] = NULL;
		values[4] = "false";
		res = dlock_exec_or_exit(conn, sql_observe, 5, values);
		if (PQntuples(res) == 0)
		{
			/* no lease on record at all */
			st.state = pg_strdup("none");
			PQclear(res);
			break;
		}
		state_from_observe(res, &st);
		PQclear(res);

		/*
		 * Someone was elected in between: ask dlock.leader() again, for
		 * the term's start.  A few times at most; then print what observe
		 * said, without the start.
		 */
		if (strcmp(st.state, "leader") != 0 || tries >= 3)
			break;
		free_state(&st);
	}
	PQfinish(conn);
	print_state(o, &st);
	return strcmp(st.state, "leader") == 0 ? 0 : DLOCK_EXIT_NO_LEADER;
}

/*
 * Send a query over the watch's connection and wait for its result until
 * until, or for a signal.  DLOCK_WAIT_SIGNAL means: stop, a signal came.
 */
static DlockWait
ask(Watch *w, const char *sql, int nparams, const char *const *values,
	int64 until, PGresult **res)
{
	*res = NULL;
	if (!dlock_send(w->conn, sql, nparams, values))
		return DLOCK_WAIT_BROKEN;
	for (;;)
	{
		DlockWait	rc = dlock_wait(w->conn, until, dlock_signal_fd, res);

		if (rc != DLOCK_WAIT_SIGNAL)
			return rc;
		if (dlock_take_signal() != 0)
			return DLOCK_WAIT_SIGNAL;
	}
}

/*
 * A signal ends the watch: cancel the call in flight (else its backend
 * would wait out observe's wait for nobody), close, and exit 0.
 */
static void
stop_watch(Watch *w)
{
	if (w->conn != NULL)
	{
		if (PQtransactionStatus(w->conn) == PQTRANS_ACTIVE)
		{
			PGcancel   *cancel = PQgetCancel(w->conn);
			char		errbuf[256];

			if (cancel)
			{
				(void) PQcancel(cancel, errbuf, sizeof(errbuf));
				PQfreeCancel(cancel);
			}
		}
		PQfinish(w->conn);
	}
	exit(0);
}

/*
 * Sleep ms milliseconds, or until a signal to stop arrives (then stop).
 */
static void
sleep_or_stop(Watch *w, int ms)
{
	int64		until = dlock_now_ms() + ms;

	for (;;)
	{
		struct pollfd fd;
		int64		left = until - dlock_now_ms();

		if (left <= 0)
			return;
		fd.fd = dlock_signal_fd;
		fd.events = POLLIN;
		fd.revents = 0;
		if (poll(&fd, 1, (int) left) > 0 && dlock_take_signal() != 0)
			stop_watch(w);
	}
}

/*
 * Report a connection failure (one line; the same message again only once
 * it has changed, so that a long outage does not flood the log).
 */
static void
report_failure(Watch *w, const char *what, char *msg)
{
	if (w->last_error == NULL || strcmp(w->last_error, msg) != 0)
		dlock_error("%s: %s (retrying)", what, msg);
	free(w->last_error);
	w->last_error = msg;
}

/* Drop the connection after a failure, saying why */
static void
drop_connection(Watch *w, char *msg)
{
	report_failure(w, "lost the connection to the server", msg);
	if (w->conn != NULL)
		PQfinish(w->conn);
	w->conn = NULL;
}

/*
 * Connect again, with a growing delay before each attempt (up to
 * BACKOFF_MAX_MS), until it works or a signal stops us.
 */
static void
reconnect(Watch *w)
{
	while (w->conn == NULL)
	{
		PGconn	   *conn;
		DlockWait	rc;

		sleep_or_stop(w, w->backoff_ms);
		w->backoff_ms = Min(w->backoff_ms * 2, BACKOFF_MAX_MS);

		conn = dlock_connect_start(&w->o->conn);
		if (conn == NULL)
		{
			report_failure(w, "could not connect to the server", pg_strdup("out of memory"));
			continue;
		}
		for (;;)
		{
			rc = dlock_connect_wait(conn, dlock_now_ms() + CONNECT_TIMEOUT_MS,
									dlock_signal_fd);
			if (rc != DLOCK_WAIT_SIGNAL)
				break;
			if (dlock_take_signal() != 0)
			{
				PQfinish(conn);
				stop_watch(w);
			}
		}
		if (rc == DLOCK_WAIT_DONE)
		{
			if (w->last_error != NULL)
				dlock_error("connected to the server again");
			free(w->last_error);
			w->last_error = NULL;
			w->conn = conn;
			return;
		}
		if (rc == DLOCK_WAIT_TIMEOUT)
			report_failure(w, "could not connect to the server",
						   psprintf("no answer within %d ms", CONNECT_TIMEOUT_MS));
		else
		{
			char	   *msg = dlock_one_line(PQerrorMessage(conn));

			if (msg[0] == '\0')
			{
				free(msg);
				msg = pg_strdup("the connection attempt failed");
			}
			report_failure(w, "could not connect to the server", msg);
		}
		PQfinish(conn);
	}
}

/*
 * A query of the watch failed with an error result.  Connection trouble
 * and transient refusals are retried (after the next delay); anything
 * else (no extension, no permission, an invalid NAME) ends the watch with
 * its exit status.
 */
static void
query_failed(Watch *w, PGresult *res)
{
	int			status = dlock_result_exit(res, w->conn);
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	char	   *msg = dlock_result_message(res, w->conn);
	bool		transient;

	transient = state != NULL &&
		(strcmp(state, "57014") == 0 || /* query_canceled, statement_timeout */
		 strcmp(state, "55P03") == 0 || /* lock_not_available */
		 strcmp(state, "40001") == 0 || /* serialization_failure */
		 strcmp(state, "40P01") == 0);	/* deadlock_detected */
	PQclear(res);
	if (status == DLOCK_EXIT_UNAVAILABLE || PQstatus(w->conn) == CONNECTION_BAD)
	{
		drop_connection(w, msg);
		return;
	}
	if (state != NULL && strcmp(state, "57014") == 0 &&
		w->wait_ms > OBSERVE_WAIT_MIN_MS)
	{
		/* most likely a statement_timeout shorter than our wait */
		w->wait_ms = Max(w->wait_ms / 2, OBSERVE_WAIT_MIN_MS);
		dlock_error("%s (retrying, waiting %d ms per call)", msg, w->wait_ms);
		free(msg);
		return;
	}
	if (transient)
	{
		dlock_error("%s (retrying)", msg);
		free(msg);
		sleep_or_stop(w, w->backoff_ms);
		w->backoff_ms = Min(w->backoff_ms * 2, BACKOFF_MAX_MS);
		return;
	}
	PQfinish(w->conn);
	dlock_fatal(status, "%s", msg);
}

/*
 * The start of the term with epoch st->epoch (dlock.observe() does not say
 * it), from dlock.leader(); left unknown when the term is already over or
 * the query fails (the next observe call deals with that).
 */
static void
look_up_since(Watch *w, LeaderState *st)
{
	const char *values[1];
	PGresult   *res;
	DlockWait	rc;

	values[0] = w->name;
	rc = ask(w, sql_leader, 1, values, dlock_now_ms() + ANSWER_SLACK_MS, &res);
	if (rc == DLOCK_WAIT_SIGNAL)
		stop_watch(w);
	if (rc == DLOCK_WAIT_DONE && PQresultStatus(res) == PGRES_TUPLES_OK &&
		PQntuples(res) > 0 && st->epoch != NULL && !PQgetisnull(res, 0, 0) &&
		strcmp(PQgetvalue(res, 0, 0), st->epoch) == 0)
		st->since = column(res, 0, 1);
	if (rc == DLOCK_WAIT_DONE)
		PQclear(res);
	else if (rc != DLOCK_WAIT_SIGNAL)
	{
		/* the answer is still due, or the connection broke: start over */
		PQfinish(w->conn);
		w->conn = NULL;
	}
}

/* dlock leader --watch NAME: print every change until a signal stops us */
static int
leader_watch(DlockOptions *o)
{
	Watch		watch;
	Watch	   *w = &watch;

	memset(w, 0, sizeof(Watch));
	w->o = o;
	w->name = o->args[0];
	w->epoch = pg_strdup("0");
	w->value = NULL;
	w->seen_end = false;
	w->backoff_ms = BACKOFF_FIRST_MS;
	w->wait_ms = OBSERVE_WAIT_MS;

	w->conn = dlock_connect(&o->conn);
	dlock_signals_install(false);
	/* a server shutting down sends its FATAL as a notice: reported anyway */
	dlock_quiet_notices = true;

	for (;;)
	{
		const char *values[5];
		char		wait[32];
		PGresult   *res;
		DlockWait	rc;
		LeaderState st;

		if (w->conn == NULL)
			reconnect(w);

		/* the first call does not wait: it is the state to start from */
		values[0] = w->name;
		values[1] = w->epoch;
		dlock_interval_param(wait, sizeof(wait), w->started ? w->wait_ms : 0);
		values[2] = wait;
		values[3] = w->value;
		values[4] = w->seen_end ? "true" : "false";
		rc = ask(w, sql_observe, 5, values,
				 dlock_now_ms() + w->wait_ms + ANSWER_SLACK_MS, &res);
		if (rc == DLOCK_WAIT_SIGNAL)
			stop_watch(w);
		if (rc == DLOCK_WAIT_TIMEOUT)
		{
			drop_connection(w, psprintf("no answer from the server within %d ms",
										w->wait_ms + ANSWER_SLACK_MS));
			continue;
		}
		if (rc == DLOCK_WAIT_BROKEN)
		{
			char	   *msg = dlock_one_line(PQerrorMessage(w->conn));

			if (msg[0] == '\0')
			{
				free(msg);
				msg = pg_strdup("the connection to the server was lost");
			}
			drop_connection(w, msg);
			continue;
		}
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			query_failed(w, res);
			continue;
		}
		w->backoff_ms = BACKOFF_FIRST_MS;
		memset(&st, 0, sizeof(st));
		if (PQntuples(res) == 0 && w->started)
		{
			/* the wait ran out without a change: ask again */
			PQclear(res);
			continue;
		}
		if (PQntuples(res) == 0)
		{
			/*
			 * No lease on record (observe() reports none only once there
			 * was one): nobody leads, and any grant is news.
			 */
			st.state = pg_strdup("none");
		}
		else
			state_from_observe(res, &st);
		PQclear(res);
		w->started = true;

		/* what the next call has seen: observe()'s loop, as specified */
		if (st.epoch != NULL)
		{
			free(w->epoch);
			w->epoch = pg_strdup(st.epoch);
		}
		free(w->value);
		w->value = st.value ? pg_strdup(st.value) : NULL;
		w->seen_end = strcmp(st.state, "leader") != 0;

		if (strcmp(st.state, "leader") == 0)
			look_up_since(w, &st);
		print_state(o, &st);
		free_state(&st);
	}
	return 0;					/* not reached */
}

/* dlock leader [--watch] NAME */
int
dlock_cmd_leader(DlockOptions *o)
{
	if (o->watch)
		return leader_watch(o);
	return leader_once(o);
}
