/*
 * bench/handoff.c: how fast and how fairly dlock.acquire hands a key from
 * one client to the next, and what the waiting costs.
 *
 *	handoff --waiters W [--seconds S] [--hold-ms H] [--key K] [--idle-s I]
 *	        [--advisory]
 *
 * Forks W + 1 clients (one holds, W wait; W = 0: one client alone, whose
 * releases never wake anyone, the baseline of a release's cost), each with its own connection
 * (libpq's PG* environment).  Each loops for S seconds: acquire K (ttl 10 s,
 * no wait limit), hold it H ms (sleeping on the client), release it.  With
 * I > 0, first the parent holds K for I seconds while all clients wait in
 * acquire, and the waiting backends' CPU over that time is measured.
 * Prints "name value" lines (see bench/README.md): among them release_p50_ms
 * (release sent to returned) and handoff_from_sent_p50_ms (a release sent
 * to the next client's grant returned); times come from
 * CLOCK_MONOTONIC, which all processes of the machine share.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#define ACQUIRE_SQL (advisory ? \
	"SELECT 'advisory', 0 FROM (SELECT pg_advisory_lock(hashtext($1))) AS l" : \
	"SELECT owner, fence FROM dlock.acquire($1, '10s')")
#define RELEASE_SQL (advisory ? \
	"SELECT pg_advisory_unlock(hashtext($1)) AND $2::text IS NOT NULL" : \
	"SELECT dlock.release($1, $2)")

/* --advisory: the same with pg_advisory_lock, the baseline of a hand-off */
static int	advisory = 0;

enum
{
	MSG_PID, MSG_READY, MSG_DONE, MSG_FAIL
};

typedef struct Msg
{
	int			worker;
	int			kind;
	long		value;
} Msg;

/* one cycle: acquire sent, grant returned, release sent, release returned (ns) */
typedef struct Rec
{
	int64_t		t0, t1, tr, t2;
	int			worker;
} Rec;

static int	nclients;
static pid_t *children;
static int	to_parent[2];
static int	gate[3][2];		/* closed by the parent to open phase 1..3 */

static int64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void
sleep_ms(double ms)
{
	struct timespec ts = {(time_t) (ms / 1000), (long) (fmod(ms, 1000) * 1e6)};

	while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR)
		;
}

static void
send_msg(int worker, int kind, long value)
{
	Msg			m = {worker, kind, value};

	if (write(to_parent[1], &m, sizeof(m)) != sizeof(m))
		_exit(1);
}

static void
worker_fail(int id, const char *what, PGconn *conn)
{
	fprintf(stderr, "handoff: client %d: %s: %s", id, what,
			conn ? PQerrorMessage(conn) : "?\n");
	send_msg(id, MSG_FAIL, 0);
	_exit(1);
}

/* block until the parent closes gate g */
static void
wait_gate(int g)
{
	char		c;

	while (read(gate[g][0], &c, 1) < 0 && errno == EINTR)
		;
}

static int
prepare(PGconn *conn, const char *name, const char *sql)
{
	PGresult   *res = PQprepare(conn, name, sql, 0, NULL);
	int			ok = PQresultStatus(res) == PGRES_COMMAND_OK;

	PQclear(res);
	return ok;
}

/* acquire, hold, release key once; fill r */
static void
cycle(int id, PGconn *conn, const char *key, double hold_ms, Rec *r)
{
	const char *params[2] = {key, NULL};
	char		owner[64];
	PGresult   *res;

	r->worker = id;
	r->t0 = now_ns();
	res = PQexecPrepared(conn, "acq", 1, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1 ||
		PQgetisnull(res, 0, 0))
		worker_fail(id, "acquire", conn);
	r->t1 = now_ns();
	snprintf(owner, sizeof(owner), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	sleep_ms(hold_ms);
	params[1] = owner;
	r->tr = now_ns();
	res = PQexecPrepared(conn, "rel", 2, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK ||
		strcmp(PQgetvalue(res, 0, 0), "t") != 0)
		worker_fail(id, "release (lost the lease?)", conn);
	r->t2 = now_ns();
	PQclear(res);
}

static void
worker(int id, int out_fd, const char *key, double seconds, double hold_ms)
{
	PGconn	   *conn = PQconnectdb("fallback_application_name=dlock-handoff");
	Rec		   *recs = NULL;
	size_t		n = 0, cap = 0;
	int64_t		deadline;
	Rec			warm;

	if (PQstatus(conn) != CONNECTION_OK)
		worker_fail(id, "connect", conn);
	if (!prepare(conn, "acq", ACQUIRE_SQL) || !prepare(conn, "rel", RELEASE_SQL))
		worker_fail(id, "prepare", conn);
	send_msg(id, MSG_PID, PQbackendPID(conn));
	wait_gate(0);
	cycle(id, conn, key, hold_ms, &warm);	/* the idle wait, and warm-up */
	send_msg(id, MSG_READY, 0);
	wait_gate(1);
	deadline = now_ns() + (int64_t) (seconds * 1e9);
	while (now_ns() < deadline)
	{
		if (n == cap && !(recs = realloc(recs, (cap = cap ? 2 * cap : 4096) * sizeof(Rec))))
			worker_fail(id, "out of memory", NULL);
		cycle(id, conn, key, hold_ms, &recs[n++]);
	}
	if (write(out_fd, recs, n * sizeof(Rec)) != (ssize_t) (n * sizeof(Rec)))
		worker_fail(id, "writing records", NULL);
	send_msg(id, MSG_DONE, (long) n);
	wait_gate(2);				/* the parent reads our backend's CPU first */
	PQfinish(conn);
	_exit(0);
}

static void
die(const char *msg)
{
	fprintf(stderr, "handoff: %s\n", msg);
	for (int i = 0; i < nclients; i++)
		if (children[i] > 0)
			kill(children[i], SIGTERM);
	while (wait(NULL) > 0)
		;
	exit(1);
}

/* wait for one message of kind from every client */
static void
collect(int kind, long *values)
{
	for (int got = 0; got < nclients; got++)
	{
		Msg			m;

		if (read(to_parent[0], &m, sizeof(m)) != sizeof(m))
			die("a client vanished");
		if (m.kind == MSG_FAIL)
			die("a client failed");
		if (m.kind != kind)
			die("protocol error");
		if (values)
			values[m.worker] = m.value;
	}
}

/* CPU seconds (user + system) of the given processes, from /proc */
static double
cpu_seconds(const long *pids, int n)
{
	long		ticks = 0;

	for (int i = 0; i < n; i++)
	{
		char		path[64], buf[1024], *p;
		unsigned long utime, stime;
		FILE	   *f;
		size_t		len;

		snprintf(path, sizeof(path), "/proc/%ld/stat", pids[i]);
		if (!(f = fopen(path, "r")))
			return NAN;			/* server not on this machine */
		len = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[len] = '\0';
		/* fields after the command name in parentheses; utime is the 14th */
		if (!(p = strrchr(buf, ')')) ||
			sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
				   &utime, &stime) != 2)
			return NAN;
		ticks += utime + stime;
	}
	return (double) ticks / sysconf(_SC_CLK_TCK);
}

static int
cmp_double(const void *a, const void *b)
{
	double		x = *(const double *) a, y = *(const double *) b;

	return (x > y) - (x < y);
}

static int
cmp_grant(const void *a, const void *b)
{
	int64_t		x = ((const Rec *) a)->t1, y = ((const Rec *) b)->t1;

	return (x > y) - (x < y);
}

/* nearest-rank percentile of sorted v[0..n-1] */
static double
pct(const double *v, size_t n, double q)
{
	size_t		i = (size_t) ceil(q * n);

	return n ? v[i ? i - 1 : 0] : NAN;
}

/* hold key from a connection of our own while every client waits for it */
static double
idle_wait_cpu(const char *key, double idle_s, const long *pids)
{
	PGconn	   *conn = PQconnectdb("fallback_application_name=dlock-handoff");
	const char *params[2] = {key, NULL};
	char		owner[64], pidlist[4096];
	PGresult   *res;
	double		c0, c1;
	int			len = 0;

	if (PQstatus(conn) != CONNECTION_OK)
		die(PQerrorMessage(conn));
	res = PQexecParams(conn, ACQUIRE_SQL, 1, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
		die(PQerrorMessage(conn));
	snprintf(owner, sizeof(owner), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	for (int i = 0; i < nclients; i++)
		len += snprintf(pidlist + len, sizeof(pidlist) - len, "%s%ld",
						i ? "," : "{", pids[i]);
	snprintf(pidlist + len, sizeof(pidlist) - len, "}");
	params[0] = pidlist;
	close(gate[0][1]);
	/* poll until every client's backend is waiting in its acquire */
	for (int tries = 0;; tries++)
	{
		res = PQexecParams(conn,
						   "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])"
						   " AND state = 'active' AND wait_event IS NOT NULL",
						   1, NULL, params, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			die(PQerrorMessage(conn));
		if (atoi(PQgetvalue(res, 0, 0)) == nclients)
			break;
		PQclear(res);
		if (tries > 1000)
			die("the clients did not all start waiting within 10 s");
		sleep_ms(10);
	}
	PQclear(res);
	c0 = cpu_seconds(pids, nclients);
	sleep_ms(idle_s * 1000);
	c1 = cpu_seconds(pids, nclients);
	params[0] = key;
	params[1] = owner;
	res = PQexecParams(conn, RELEASE_SQL, 2, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		die(PQerrorMessage(conn));
	PQclear(res);
	PQfinish(conn);
	return c1 - c0;
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"waiters", required_argument, NULL, 'w'},
		{"seconds", required_argument, NULL, 's'},
		{"hold-ms", required_argument, NULL, 'h'},
		{"key", required_argument, NULL, 'k'},
		{"idle-s", required_argument, NULL, 'i'},
		{"advisory", no_argument, &advisory, 1},
		{NULL, 0, NULL, 0}
	};
	int			waiters = 1, c;
	double		seconds = 30, hold_ms = 1, idle_s = 0, idle_cpu = NAN;
	const char *key = "handoff";
	long	   *pids, *counts;
	int		   *fds;
	size_t		n = 0, nho = 0, regrants = 0, negative = 0;
	Rec		   *recs;
	double	   *waits, *ho, *hos, *rel, ho_sum = 0, cpu0, cpu1, wall;
	int64_t		start, end, min_t0 = INT64_MAX;
	size_t		overtakes = 0;
	struct rusage ru;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1)
	{
		switch (c)
		{
			case 'w': waiters = atoi(optarg); break;
			case 's': seconds = atof(optarg); break;
			case 'h': hold_ms = atof(optarg); break;
			case 'k': key = optarg; break;
			case 'i': idle_s = atof(optarg); break;
			case 0: break;
			default:
				fprintf(stderr, "usage: handoff --waiters W [--seconds S] [--hold-ms H] [--key K] [--idle-s I] [--advisory]\n");
				return 2;
		}
	}
	if (waiters < 0 || waiters > 500 || seconds <= 0 || hold_ms < 0 || idle_s < 0)
	{
		fprintf(stderr, "handoff: bad arguments\n");
		return 2;
	}
	nclients = waiters + 1;
	children = calloc(nclients, sizeof(pid_t));
	pids = calloc(nclients, sizeof(long));
	counts = calloc(nclients, sizeof(long));
	fds = calloc(nclients, sizeof(int));
	if (pipe(to_parent) || pipe(gate[0]) || pipe(gate[1]) || pipe(gate[2]))
		die("pipe failed");
	for (int i = 0; i < nclients; i++)
	{
		FILE	   *f = tmpfile();

		if (!f)
			die("tmpfile failed");
		fds[i] = fileno(f);
		fflush(stdout);
		if ((children[i] = fork()) < 0)
			die("fork failed");
		if (children[i] == 0)
		{
			for (int g = 0; g < 3; g++)
				close(gate[g][1]);
			worker(i, fds[i], key, seconds, hold_ms);
		}
	}
	collect(MSG_PID, pids);
	if (idle_s > 0)
		idle_cpu = idle_wait_cpu(key, idle_s, pids);
	else
		close(gate[0][1]);
	collect(MSG_READY, NULL);
	cpu0 = cpu_seconds(pids, nclients);
	start = now_ns();
	close(gate[1][1]);
	collect(MSG_DONE, counts);
	end = now_ns();
	cpu1 = cpu_seconds(pids, nclients);
	close(gate[2][1]);
	for (int i = 0; i < nclients; i++)
	{
		int			status;

		if (waitpid(children[i], &status, 0) < 0 || !WIFEXITED(status) ||
			WEXITSTATUS(status) != 0)
			die("a client failed at the end");
		children[i] = 0;
		n += counts[i];
	}
	getrusage(RUSAGE_CHILDREN, &ru);

	/* merge: grants are exclusive, so grant return order is grant order */
	recs = malloc((n + 1) * sizeof(Rec));
	waits = malloc((n + 1) * sizeof(double));
	ho = malloc((n + 1) * sizeof(double));
	hos = malloc((n + 1) * sizeof(double));
	rel = malloc((n + 1) * sizeof(double));
	for (size_t i = 0, got = 0; i < (size_t) nclients; got += counts[i++])
		if (pread(fds[i], recs + got, counts[i] * sizeof(Rec), 0) !=
			(ssize_t) (counts[i] * sizeof(Rec)))
			die("reading records failed");
	qsort(recs, n, sizeof(Rec), cmp_grant);
	for (size_t i = 0; i < n; i++)
	{
		waits[i] = (recs[i].t1 - recs[i].t0) / 1e6;
		rel[i] = (recs[i].t2 - recs[i].tr) / 1e6;
		if (i == 0)
			continue;
		if (recs[i].worker == recs[i - 1].worker)
		{
			regrants++;			/* not a hand-off: it took its own key back */
			continue;
		}
		hos[nho] = (recs[i].t1 - recs[i - 1].tr) / 1e6;
		ho[nho] = (recs[i].t1 - recs[i - 1].t2) / 1e6;
		negative += ho[nho] < 0;
		ho_sum += ho[nho++];
	}
	/*
	 * A grant overtook a waiter if a later grant's acquire was sent earlier.
	 * The clients' first acquires all start at once: they do not count.
	 */
	for (size_t i = n; i-- > 0;)
	{
		if (recs[i].t0 > min_t0)
			overtakes += recs[i].t0 > recs[0].t1;
		else
			min_t0 = recs[i].t0;
	}
	qsort(waits, n, sizeof(double), cmp_double);
	qsort(ho, nho, sizeof(double), cmp_double);
	qsort(hos, nho, sizeof(double), cmp_double);
	qsort(rel, n, sizeof(double), cmp_double);
	wall = (end - start) / 1e9;

	printf("clients %d\n", nclients);
	printf("cycles %zu\n", n);
	printf("grants_per_s %.1f\n", n / wall);
	printf("regrants %zu\n", regrants);
	printf("overtakes %zu\n", overtakes);
	printf("handoffs %zu\n", nho);
	printf("handoff_negative %zu\n", negative);
	printf("handoff_p50_ms %.3f\n", pct(ho, nho, 0.50));
	printf("handoff_p99_ms %.3f\n", pct(ho, nho, 0.99));
	printf("handoff_max_ms %.3f\n", pct(ho, nho, 1.0));
	printf("handoff_from_sent_p50_ms %.3f\n", pct(hos, nho, 0.50));
	printf("handoff_from_sent_p99_ms %.3f\n", pct(hos, nho, 0.99));
	printf("release_p50_ms %.3f\n", pct(rel, n, 0.50));
	printf("release_p99_ms %.3f\n", pct(rel, n, 0.99));
	printf("wait_p50_ms %.3f\n", pct(waits, n, 0.50));
	printf("wait_p99_ms %.3f\n", pct(waits, n, 0.99));
	printf("wait_max_ms %.3f\n", pct(waits, n, 1.0));
	printf("wait_max_holds %.1f\n",
		   pct(waits, n, 1.0) / (hold_ms + (nho ? ho_sum / nho : 0)));
	printf("wait_max_cycles %.1f\n", n ? pct(waits, n, 1.0) / (wall * 1000 / n) : NAN);
	printf("backend_cpu_per_wall %.3f\n", (cpu1 - cpu0) / wall);
	printf("backend_cpu_ms_per_grant %.3f\n", n ? (cpu1 - cpu0) * 1000 / n : NAN);
	printf("client_cpu_per_wall %.3f\n",
		   (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
			(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6) / wall);
	printf("idle_wait_cpu_s %.2f\n", idle_cpu);
	return 0;
}
