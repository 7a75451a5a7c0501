/*-------------------------------------------------------------------------
 *
 * conn.c
 *	  Connections, queries with deadlines, and error reporting for the dlock
 *	  command-line client.
 *
 * Every failure is reported as exactly one line on stderr that starts with
 * "dlock: ": libpq's multi-line messages are joined, and any password we
 * know of (from -d, PGPASSWORD or the prompt) is blotted out of them.  The
 * exit status follows the server's SQLSTATE (see dlock_result_exit).
 *
 * Waiting is done with poll() on the connection's socket, never inside
 * libpq's blocking calls, wherever a deadline matters: a server that hangs
 * must never keep us past a lease's deadline.
 *
 * client/conn.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres_fe.h"

#include <poll.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "common/string.h"
#include "pqexpbuffer.h"

#define MAX_SECRETS 8

bool		dlock_quiet_notices = false;

/* The oldest extension version that has what the command calls */
const char *dlock_min_version = "0.3";

static const char *secrets[MAX_SECRETS];
static int	nsecrets = 0;

/*
 * Milliseconds on a clock that never jumps.  On Linux CLOCK_BOOTTIME, which
 * is CLOCK_MONOTONIC that also counts time spent suspended: a laptop that
 * sleeps past a lease's TTL must find the lease over when it wakes.
 */
int64
dlock_now_ms(void)
{
	struct timespec ts;

#ifdef CLOCK_BOOTTIME
	if (clock_gettime(CLOCK_BOOTTIME, &ts) == 0)
		return (int64) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
#endif
	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
	{
		/* cannot happen on any supported platform */
		fprintf(stderr, "dlock: clock_gettime failed: %m\n");
		exit(DLOCK_EXIT_SOFTWARE);
	}
	return (int64) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Remember a string that must never appear in anything we print. */
void
dlock_add_secret(const char *secret)
{
	if (secret != NULL && secret[0] != '\0' && nsecrets < MAX_SECRETS)
		secrets[nsecrets++] = pg_strdup(secret);
}

/*
 * Join a (libpq or server) message into one line: newlines and the tabs
 * libpq indents continuation lines with become single spaces, trailing
 * white space goes, and every known password is replaced by asterisks.
 * Returns a malloc'd string.
 */
char *
dlock_one_line(const char *msg)
{
	PQExpBufferData buf;
	const char *p;
	bool		space = false;

	initPQExpBuffer(&buf);
	if (msg == NULL)
		msg = "";
	for (p = msg; *p; p++)
	{
		int			i;
		bool		redacted = false;

		for (i = 0; i < nsecrets; i++)
		{
			size_t		len = strlen(secrets[i]);

			if (strncmp(p, secrets[i], len) == 0)
			{
				if (space)
					appendPQExpBufferChar(&buf, ' ');
				space = false;
				appendPQExpBufferStr(&buf, "********");
				p += len - 1;
				redacted = true;
				break;
			}
		}
		if (redacted)
			continue;
		if (*p == '\n' || *p == '\r' || (*p == '\t' && (p == msg || p[-1] == '\n')))
		{
			space = (buf.len > 0);
			continue;
		}
		if (space)
			appendPQExpBufferChar(&buf, ' ');
		space = false;
		appendPQExpBufferChar(&buf, *p);
	}
	/* no trailing blanks */
	while (buf.len > 0 && (buf.data[buf.len - 1] == ' ' || buf.data[buf.len - 1] == '\t'))
		buf.data[--buf.len] = '\0';
	if (PQExpBufferBroken(&buf))
		return pg_strdup("out of memory");
	return buf.data;
}

/* Print fmt with ap as one "dlock: ..." line on stderr. */
static void
print_error(const char *fmt, va_list ap)
{
	char		msg[2048];
	char	   *line;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	line = dlock_one_line(msg);
	fprintf(stderr, "dlock: %s\n", line);
	fflush(stderr);
	free(line);
}

/* Print one "dlock: ..." line on stderr. */
void
dlock_error(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	print_error(fmt, ap);
	va_end(ap);
}

/* Print one "dlock: ..." line on stderr and exit with status. */
void
dlock_fatal(int status, const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	print_error(fmt, ap);
	va_end(ap);
	exit(status);
}

/*
 * Notices and warnings from the server (none of dlock's functions sends
 * any in normal operation) are printed as one line each, like errors.
 */
static void
notice_processor(void *arg, const char *message)
{
	char	   *line;

	(void) arg;

	/*
	 * dlock run drops them once COMMAND runs: a server shutting down sends
	 * its FATAL to an idle connection as a notice, and what matters (the
	 * lease lost) is reported anyway.
	 */
	if (dlock_quiet_notices)
		return;
	line = dlock_one_line(message);
	fprintf(stderr, "dlock: %s\n", line);
	free(line);
}

/*
 * Fill keywords/values for PQconnectdbParams and friends.  The order is
 * psql's: a conninfo string given with -d is expanded where dbname stands,
 * so what it says overrides -h, -p and -U, as in psql.
 */
static void
fill_params(const DlockConnOptions *co, const char **keywords,
			const char **values)
{
	int			n = 0;

#define PARAM(k, v) \
	do { if ((v) != NULL) { keywords[n] = (k); values[n] = (v); n++; } } while (0)
	PARAM("host", co->host);
	PARAM("port", co->port);
	PARAM("user", co->username);
	PARAM("password", co->password);
	PARAM("dbname", co->dbname);
	PARAM("fallback_application_name", "dlock");
	PARAM("client_encoding", co->client_encoding);
#undef PARAM
	keywords[n] = NULL;
	values[n] = NULL;
}

/*
 * If -d is a connection string or URI, check that libpq can parse it and
 * remember the password it may carry, so that no message ever shows it.
 */
static void
check_conninfo(const char *dbname)
{
	PQconninfoOption *opts;
	PQconninfoOption *o;
	char	   *errmsg = NULL;

	if (dbname == NULL)
		return;
	if (strchr(dbname, '=') == NULL &&
		strncmp(dbname, "postgresql://", 13) != 0 &&
		strncmp(dbname, "postgres://", 11) != 0)
		return;					/* a plain database name */

	opts = PQconninfoParse(dbname, &errmsg);
	if (opts == NULL)
	{
		/*
		 * libpq's message quotes parts of the string, which may hold a
		 * password that we could not find without parsing it: say only
		 * what kind of mistake it is.
		 */
		if (errmsg != NULL)
			PQfreemem(errmsg);
		dlock_fatal(DLOCK_EXIT_UNAVAILABLE,
					"invalid connection string given with -d/--dbname (libpq could not parse it; its message is not shown because it could contain the password)");
	}
	for (o = opts; o->keyword != NULL; o++)
	{
		if (strcmp(o->keyword, "password") == 0 && o->val != NULL)
			dlock_add_secret(o->val);
	}
	PQconninfoFree(opts);
}

/*
 * Connect, blocking, as PostgreSQL's own programs do: prompt for a password
 * when the server asks for one, we have none, -w was not given and stdin is
 * a terminal.  On failure print one line and exit 69.
 */
PGconn *
dlock_connect(DlockConnOptions *co)
{
	const char *keywords[8];
	const char *values[8];
	PGconn	   *conn;

	dlock_add_secret(getenv("PGPASSWORD"));
	check_conninfo(co->dbname);

	for (;;)
	{
		fill_params(co, keywords, values);
		conn = PQconnectdbParams(keywords, values, true);
		if (conn == NULL)
			dlock_fatal(DLOCK_EXIT_UNAVAILABLE, "out of memory");
		if (PQstatus(conn) == CONNECTION_BAD &&
			PQconnectionNeedsPassword(conn) &&
			co->password == NULL &&
			!co->no_password &&
			isatty(fileno(stdin)))
		{
			PQfinish(conn);
			co->password = simple_prompt("Password: ", false);
			dlock_add_secret(co->password);
			continue;
		}
		break;
	}
	if (PQstatus(conn) == CONNECTION_BAD)
	{
		char	   *line = dlock_one_line(PQerrorMessage(conn));

		PQfinish(conn);
		dlock_fatal(DLOCK_EXIT_UNAVAILABLE, "%s", line);
	}
	PQsetNoticeProcessor(conn, notice_processor, NULL);
	return conn;
}

/*
 * Start a non-blocking connection attempt with the same parameters (the
 * password prompted for earlier included).  Returns NULL only when out of
 * memory; a failed start shows as CONNECTION_BAD.
 */
PGconn *
dlock_connect_start(const DlockConnOptions *co)
{
	const char *keywords[8];
	const char *values[8];
	PGconn	   *conn;

	fill_params(co, keywords, values);
	conn = PQconnectStartParams(keywords, values, true);
	if (conn != NULL)
		PQsetNoticeProcessor(conn, notice_processor, NULL);
	return conn;
}

/*
 * Wait until the socket of conn is ready for reading (or writing), the
 * clock reaches until (-1: no limit) or, when signal_fd >= 0, a signal
 * arrives.  Returns 1 when the socket is ready, 0 on timeout, 2 on a
 * signal, -1 when poll fails.
 */
static int
wait_socket(PGconn *conn, bool for_write, int64 until, int signal_fd)
{
	for (;;)
	{
		struct pollfd fds[2];
		int			nfds = 1;
		int			timeout = -1;
		int			rc;

		fds[0].fd = PQsocket(conn);
		fds[0].events = for_write ? POLLOUT : POLLIN;
		fds[0].revents = 0;
		if (signal_fd >= 0)
		{
			fds[1].fd = signal_fd;
			fds[1].events = POLLIN;
			fds[1].revents = 0;
			nfds = 2;
		}
		if (until >= 0)
		{
			int64		left = until - dlock_now_ms();

			if (left <= 0)
				return 0;
			timeout = (int) Min(left, 1000 * 1000);
		}
		rc = poll(fds, nfds, timeout);
		if (rc < 0)
		{
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (nfds == 2 && (fds[1].revents & POLLIN))
			return 2;
		if (fds[0].revents != 0)
			return 1;
	}
}

/*
 * Finish a connection started by dlock_connect_start, waiting no later than
 * until (-1: no limit), or until a signal arrives when signal_fd >= 0.
 * DLOCK_WAIT_DONE when connected; otherwise the caller PQfinishes conn
 * (DLOCK_WAIT_BROKEN: PQerrorMessage says why, if anything).
 */
DlockWait
dlock_connect_wait(PGconn *conn, int64 until, int signal_fd)
{
	PostgresPollingStatusType st = PGRES_POLLING_WRITING;

	if (conn == NULL || PQstatus(conn) == CONNECTION_BAD)
		return DLOCK_WAIT_BROKEN;
	for (;;)
	{
		int			rc;

		if (st == PGRES_POLLING_OK)
			return DLOCK_WAIT_DONE;
		if (st == PGRES_POLLING_FAILED)
			return DLOCK_WAIT_BROKEN;
		rc = wait_socket(conn, st == PGRES_POLLING_WRITING, until, signal_fd);
		if (rc == 0)
			return DLOCK_WAIT_TIMEOUT;
		if (rc == 2)
			return DLOCK_WAIT_SIGNAL;
		if (rc < 0)
			return DLOCK_WAIT_BROKEN;
		st = PQconnectPoll(conn);
	}
}

/*
 * Finish a connection started by dlock_connect_start, waiting no later than
 * until.  False when it failed or the time ran out (the caller PQfinishes).
 */
bool
dlock_connect_until(PGconn *conn, int64 until)
{
	return dlock_connect_wait(conn, until, -1) == DLOCK_WAIT_DONE;
}

/* Send a query without waiting for it (PQsendQueryParams + flush). */
bool
dlock_send(PGconn *conn, const char *sql, int nparams,
		   const char *const *values)
{
	if (PQsetnonblocking(conn, 1) != 0)
		return false;
	return PQsendQueryParams(conn, sql, nparams, NULL, values,
							 NULL, NULL, 0) == 1;
}

/*
 * Wait for the result of the query sent with dlock_send, until the clock
 * reaches until (-1: no limit), or a signal arrives when signal_fd >= 0.
 * On DLOCK_WAIT_DONE *result is the query's result (an error result if
 * any, else the last one); the caller PQclears it.
 */
DlockWait
dlock_wait(PGconn *conn, int64 until, int signal_fd, PGresult **result)
{
	PGresult   *keep = NULL;

	*result = NULL;
	for (;;)
	{
		int			flush = PQflush(conn);
		int			rc;

		if (flush < 0)
			break;
		if (flush == 0 && !PQisBusy(conn))
		{
			PGresult   *r = PQgetResult(conn);

			if (r == NULL)
			{
				if (keep == NULL)
					break;		/* no result at all: treat as broken */
				*result = keep;
				return DLOCK_WAIT_DONE;
			}
			if (keep == NULL ||
				(PQresultStatus(keep) != PGRES_FATAL_ERROR &&
				 PQresultStatus(r) == PGRES_FATAL_ERROR))
			{
				PQclear(keep);
				keep = r;
			}
			else
				PQclear(r);
			continue;
		}
		rc = wait_socket(conn, flush == 1, until, signal_fd);
		if (rc == 0 || rc == 2)
		{
			PQclear(keep);
			return rc == 0 ? DLOCK_WAIT_TIMEOUT : DLOCK_WAIT_SIGNAL;
		}
		if (rc < 0)
			break;
		if (PQconsumeInput(conn) == 0)
		{
			/* collect the error result libpq made of it, if any */
			if (PQstatus(conn) == CONNECTION_BAD && keep == NULL)
			{
				PGresult   *r = PQgetResult(conn);

				if (r != NULL && PQresultStatus(r) == PGRES_FATAL_ERROR)
				{
					*result = r;
					return DLOCK_WAIT_DONE;
				}
				PQclear(r);
			}
			break;
		}
	}
	PQclear(keep);
	return DLOCK_WAIT_BROKEN;
}

/*
 * The exit status for a failed query: by SQLSTATE, or 69 when the
 * connection broke or the server shut it down.
 */
int
dlock_result_exit(const PGresult *res, PGconn *conn)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	const char *primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;

	if (state == NULL)
		return (PQstatus(conn) == CONNECTION_BAD || res == NULL) ?
			DLOCK_EXIT_UNAVAILABLE : DLOCK_EXIT_SOFTWARE;
	if (strcmp(state, "42501") == 0)
		return DLOCK_EXIT_NOPERM;
	if (strcmp(state, "3F000") == 0 ||	/* schema dlock does not exist */
		strcmp(state, "42883") == 0 ||	/* function missing: older version */
		strcmp(state, "42P01") == 0)	/* view missing: older version */
		return DLOCK_EXIT_CONFIG;
	if (strcmp(state, "55000") == 0 && primary != NULL &&
		strstr(primary, "extension dlock is not installed") != NULL)
		return DLOCK_EXIT_CONFIG;
	if (strcmp(state, "55P03") == 0)
		return DLOCK_EXIT_TEMPFAIL;
	if (strncmp(state, "08", 2) == 0 ||	/* connection exception */
		strcmp(state, "57P01") == 0 ||	/* admin_shutdown */
		strcmp(state, "57P02") == 0 ||	/* crash_shutdown */
		strcmp(state, "57P03") == 0)	/* cannot_connect_now */
		return DLOCK_EXIT_UNAVAILABLE;
	return DLOCK_EXIT_SOFTWARE;
}

/*
 * A one-line description of a failed query (malloc'd): the server's
 * message, detail and hint, or libpq's message when the connection broke.
 * For a missing extension it says what to do.
 */
char *
dlock_result_message(const PGresult *res, PGconn *conn)
{
	PQExpBufferData buf;
	char	   *line;
	const char *primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;

	initPQExpBuffer(&buf);
	if (primary != NULL)
	{
		const char *detail = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);
		const char *hint = PQresultErrorField(res, PG_DIAG_MESSAGE_HINT);

		appendPQExpBufferStr(&buf, primary);
		if (detail)
			appendPQExpBuffer(&buf, " DETAIL: %s", detail);
		if (hint)
			appendPQExpBuffer(&buf, " HINT: %s", hint);
		if (dlock_result_exit(res, conn) == DLOCK_EXIT_CONFIG && hint == NULL)
			appendPQExpBuffer(&buf,
							  " (is extension dlock %s or later installed in database \"%s\"?)",
							  dlock_min_version, PQdb(conn));
	}
	else if (res != NULL && PQresultErrorMessage(res)[0] != '\0')
		appendPQExpBufferStr(&buf, PQresultErrorMessage(res));
	else
		appendPQExpBufferStr(&buf, PQerrorMessage(conn));
	if (buf.len == 0)
		appendPQExpBufferStr(&buf, "the connection to the server was lost");
	line = dlock_one_line(buf.data);
	termPQExpBuffer(&buf);
	return line;
}

/*
 * Read a lease row (key, owner, fence, expires_at, remaining_ms) from a
 * grant's result.  False when there is no row (try_acquire refused).
 */
bool
dlock_read_lease(const PGresult *res, DlockLease *lease)
{
	if (PQntuples(res) < 1 || PQnfields(res) < 5 || PQgetisnull(res, 0, 1))
		return false;
	lease->key = pg_strdup(PQgetvalue(res, 0, 0));
	lease->owner = pg_strdup(PQgetvalue(res, 0, 1));
	lease->fence = pg_strdup(PQgetvalue(res, 0, 2));
	lease->expires_at = pg_strdup(PQgetvalue(res, 0, 3));
	lease->remaining_ms = PQgetisnull(res, 0, 4) ? 0 :
		strtoll(PQgetvalue(res, 0, 4), NULL, 10);
	return true;
}

/* An interval parameter for ms milliseconds, in a form any setting reads. */
void
dlock_interval_param(char *buf, size_t len, int ms)
{
	snprintf(buf, len, "%d milliseconds", ms);
}
