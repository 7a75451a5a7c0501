/*
 * bench/observe.c: how soon clients waiting in dlock.observe() (or
 * listening on dlock.notify's channel) learn of a change of a key, and what
 * their backends' waiting costs.
 *
 *	observe --observers W [--seconds S] [--interval-ms I] [--key K]
 *			[--event proclaim|release] [--listen] [--idle-s D]
 *
 * Forks one changer and W observers, each with its own connection (libpq's
 * PG* environment).  The changer makes one change every I ms (default 20,
 * each interval drawn uniformly from 0.5 I to 1.5 I) for S seconds (default
 * 5):
 *
 *	proclaim	it leads the election K (dlock.campaign, value v0, ttl
 *				5 min) and proclaims v1, v2, ...
 *	release		it takes K (try_acquire, ttl 5 min) and releases it, in
 *				turn: every grant and every release is a change
 *
 * An observer loops on
 *
 *	SELECT fence, value, state FROM dlock.observe(K, F, '60 s',
 *						seen_value => V, seen_end => E)
 *
 * with F, V and E what its previous call returned (F its token, V its
 * value, E whether its lease had ended), so that each call returns at the
 * next change.  With --listen an observer instead LISTENs on channel
 * "dlock" and the changer's session sets dlock.notify = on: each change
 * sends one NOTIFY, whose payload names the event and the token.
 *
 * Each change records when its statement was sent (t_send) and when its
 * answer came back (t_ack): its commit, after which dlock wakes the
 * observers, lies between the two.  Each observer's return records when
 * its call was sent and when its answer came (t_ret), and which change it
 * reports (by the value, or by token and state).  A return is a wake-up
 * when its call was sent before the change was (it waited for it); one
 * whose call was sent later returned at once (late: not a wake-up, it
 * only catches up).  The latency of a wake-up is t_ret - t_ack ("from
 * ack": negative when the observer's answer came before the changer's)
 * and t_ret - t_send ("from send": an upper bound).  With W observers,
 * "all" is, per change, the latest of its wake-ups.
 *
 * With D > 0, before the loop, every observer waits on the unchanged key
 * for D seconds (the changer holds it with a 5-minute lease), and the CPU
 * their backends use meanwhile is read from /proc/<pid>/stat.
 *
 * Prints "name value" lines (see bench/README.md); times come from
 * CLOCK_MONOTONIC, which all processes of the machine share.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE			/* MAP_ANONYMOUS */

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#define OBSERVE_SQL "SELECT fence, value, state FROM dlock.observe($1, $2, '60 s', " \
	"seen_value => $3, seen_end => $4)"
#define LOOK_SQL "SELECT fence, value, state FROM dlock.observe($1, 0, '0')"
#define CAMPAIGN_SQL "SELECT owner, fence FROM dlock.campaign($1, 'v0', '5 min')"
#define PROCLAIM_SQL "SELECT dlock.proclaim($1, $2, $3)"
#define GRANT_SQL "SELECT owner, fence FROM dlock.try_acquire($1, '5 min')"
#define RELEASE_SQL "SELECT dlock.release($1, $2)"

#define MAX_EVENTS 200000

enum
{
	MSG_PID, MSG_DONE, MSG_FAIL
};

typedef struct Msg
{
	int			worker;
	int			kind;
	long		value;
} Msg;

/* what a change or a return is about */
enum
{
	EV_GRANT, EV_RELEASE, EV_PROCLAIM, EV_OTHER
};

/* one change, in shared memory */
typedef struct Event
{
	int64_t		t_send, t_ack;
	long		fence;
	int			kind;
} Event;

typedef struct Shared
{
	volatile int done;			/* the changer made its last change */
	volatile long nevents;		/* events[0 .. nevents - 1] are final */
	Event		events[MAX_EVENTS];
} Shared;

/* one observer's return */
typedef struct Rec
{
	int64_t		t_call, t_ret;
	long		fence;
	long		value;			/* proclaim: the index of the change */
	int			kind;
} Rec;

static int	nclients;			/* 1 changer + W observers */
static pid_t *children;
static int	to_parent[2];
static int	gate[3][2];			/* closed by the parent to open phase 0..2 */
static Shared *shared;
static bool listen_mode;
static bool proclaim_mode = true;

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
	fprintf(stderr, "observe: client %d: %s: %s", id, what,
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

/* Run sql (text parameters) and expect one row; fail otherwise. */
static PGresult *
one_row(int id, PGconn *conn, const char *sql, int n, const char *const *params)
{
	PGresult   *res = PQexecParams(conn, sql, n, NULL, params, NULL, NULL, 0);

	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
		worker_fail(id, sql, conn);
	return res;
}

/* The kind of a change named by an observe() state or a NOTIFY event. */
static int
kind_of(const char *s)
{
	if (strcmp(s, "held") == 0 || strcmp(s, "grant") == 0)
		return EV_GRANT;
	if (strcmp(s, "released") == 0 || strcmp(s, "release") == 0)
		return EV_RELEASE;
	if (strcmp(s, "proclaim") == 0)
		return EV_PROCLAIM;
	return EV_OTHER;
}

/* Record a change that was sent at t_send and acknowledged now. */
static void
add_event(int64_t t_send, long fence, int kind)
{
	long		n = shared->nevents;

	if (n == MAX_EVENTS)
		return;
	shared->events[n].t_send = t_send;
	shared->events[n].t_ack = now_ns();
	shared->events[n].fence = fence;
	shared->events[n].kind = kind;
	__atomic_store_n(&shared->nevents, n + 1, __ATOMIC_RELEASE);
}

/*
 * The changer: lead or hold the key, report its pid, then make a change
 * every interval (jittered) for seconds, and a last one that only wakes
 * the observers up to let them see shared->done.
 */
static void
changer(const char *key, double seconds, double interval_ms)
{
	PGconn	   *conn = PQconnectdb("fallback_application_name=dlock-observe");
	const char *params[3] = {key, NULL, NULL};
	char		owner[64], value[32];
	long		fence;
	PGresult   *res;
	int64_t		deadline, t;
	long		i = 0;
	bool		held = true;

	if (PQstatus(conn) != CONNECTION_OK)
		worker_fail(0, "connect", conn);
	res = one_row(0, conn, proclaim_mode ? CAMPAIGN_SQL : GRANT_SQL, 1, params);
	snprintf(owner, sizeof(owner), "%s", PQgetvalue(res, 0, 0));
	fence = atol(PQgetvalue(res, 0, 1));
	PQclear(res);
	if (listen_mode)
	{
		/* dlock is loaded now: the setting is known (superuser only) */
		res = PQexec(conn, "SET dlock.notify = on");
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
			worker_fail(0, "SET dlock.notify = on", conn);
		PQclear(res);
	}
	send_msg(0, MSG_PID, PQbackendPID(conn));
	wait_gate(1);
	deadline = now_ns() + (int64_t) (seconds * 1e9);
	srandom((unsigned) getpid());
	for (;;)
	{
		bool		last;

		sleep_ms(interval_ms * (0.5 + (double) random() / RAND_MAX));
		last = now_ns() >= deadline;
		if (last)
			__atomic_store_n(&shared->done, 1, __ATOMIC_RELEASE);
		t = now_ns();
		if (proclaim_mode)
		{
			snprintf(value, sizeof(value), "v%ld", ++i);
			params[1] = owner;
			params[2] = value;
			res = one_row(0, conn, PROCLAIM_SQL, 3, params);
			if (strcmp(PQgetvalue(res, 0, 0), "t") != 0)
				worker_fail(0, "proclaim found the lease lost", NULL);
			PQclear(res);
			if (!last)
				add_event(t, fence, EV_PROCLAIM);	/* events[i - 1] is v<i> */
		}
		else if (held)
		{
			params[1] = owner;
			res = one_row(0, conn, RELEASE_SQL, 2, params);
			if (strcmp(PQgetvalue(res, 0, 0), "t") != 0)
				worker_fail(0, "release found the lease lost", NULL);
			PQclear(res);
			if (!last)
				add_event(t, fence, EV_RELEASE);
			held = false;
		}
		else
		{
			res = one_row(0, conn, GRANT_SQL, 1, params);
			snprintf(owner, sizeof(owner), "%s", PQgetvalue(res, 0, 0));
			fence = atol(PQgetvalue(res, 0, 1));
			PQclear(res);
			if (!last)
				add_event(t, fence, EV_GRANT);
			held = true;
		}
		if (last)
			break;
	}
	if (held)
	{
		params[1] = owner;
		PQclear(one_row(0, conn, RELEASE_SQL, 2, params));
	}
	send_msg(0, MSG_DONE, shared->nevents);
	wait_gate(2);
	PQfinish(conn);
	_exit(0);
}

/* Append r to the observer's records. */
static void
push(int id, Rec **recs, size_t *n, size_t *cap, const Rec *r)
{
	if (*n == *cap && !(*recs = realloc(*recs, (*cap = *cap ? 2 * *cap : 4096) * sizeof(Rec))))
		worker_fail(id, "out of memory", NULL);
	(*recs)[(*n)++] = *r;
}

/* Fill r from a row (fence, value, state) of observe(). */
static void
read_row(PGresult *res, Rec *r)
{
	const char *v = PQgetisnull(res, 0, 1) ? "" : PQgetvalue(res, 0, 1);

	r->fence = PQgetisnull(res, 0, 0) ? 0 : atol(PQgetvalue(res, 0, 0));
	r->value = v[0] == 'v' ? atol(v + 1) : 0;
	r->kind = kind_of(PQgetvalue(res, 0, 2));
	if (proclaim_mode && r->value > 0)
		r->kind = EV_PROCLAIM;
}

/* An observer looping on observe(). */
static void
observer(int id, int out_fd, const char *key)
{
	PGconn	   *conn = PQconnectdb("fallback_application_name=dlock-observe");
	Rec		   *recs = NULL, r;
	size_t		n = 0, cap = 0;
	char		fence[32], value[32];
	const char *params[4] = {key, fence, value, NULL};
	bool		have_value;
	PGresult   *res;

	if (PQstatus(conn) != CONNECTION_OK)
		worker_fail(id, "connect", conn);
	res = PQprepare(conn, "obs", OBSERVE_SQL, 4, NULL);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		worker_fail(id, "prepare", conn);
	PQclear(res);
	send_msg(id, MSG_PID, PQbackendPID(conn));
	wait_gate(0);
	/* the key as it is now */
	res = one_row(id, conn, LOOK_SQL, 1, params);
	for (;;)
	{
		snprintf(fence, sizeof(fence), "%s", PQgetisnull(res, 0, 0) ? "0" : PQgetvalue(res, 0, 0));
		have_value = !PQgetisnull(res, 0, 1);
		snprintf(value, sizeof(value), "%s", have_value ? PQgetvalue(res, 0, 1) : "");
		params[2] = have_value ? value : NULL;
		params[3] = strcmp(PQgetvalue(res, 0, 2), "held") == 0 ? "false" : "true";
		PQclear(res);
		if (__atomic_load_n(&shared->done, __ATOMIC_ACQUIRE))
			break;
		r.t_call = now_ns();
		res = PQexecPrepared(conn, "obs", 4, params, NULL, NULL, 0);
		r.t_ret = now_ns();
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			worker_fail(id, "observe", conn);
		if (PQntuples(res) != 1)
			worker_fail(id, "observe timed out (60 s)", NULL);
		read_row(res, &r);
		push(id, &recs, &n, &cap, &r);
	}
	if (write(out_fd, recs, n * sizeof(Rec)) != (ssize_t) (n * sizeof(Rec)))
		worker_fail(id, "writing records", NULL);
	send_msg(id, MSG_DONE, (long) n);
	wait_gate(2);
	PQfinish(conn);
	_exit(0);
}

/* the value of "name": in a dlock NOTIFY payload (a flat JSON object) */
static const char *
json_field(const char *payload, const char *name)
{
	char		pat[32];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", name);
	p = strstr(payload, pat);
	return p ? p + strlen(pat) : "";
}

/* An observer listening on channel "dlock". */
static void
listener(int id, int out_fd)
{
	PGconn	   *conn = PQconnectdb("fallback_application_name=dlock-observe");
	Rec		   *recs = NULL, r;
	size_t		n = 0, cap = 0;
	long		nproclaims = 0;
	PGresult   *res;
	PGnotify   *note;

	if (PQstatus(conn) != CONNECTION_OK)
		worker_fail(id, "connect", conn);
	res = PQexec(conn, "LISTEN dlock");
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		worker_fail(id, "LISTEN", conn);
	PQclear(res);
	send_msg(id, MSG_PID, PQbackendPID(conn));
	wait_gate(0);
	while (!__atomic_load_n(&shared->done, __ATOMIC_ACQUIRE))
	{
		int			sock = PQsocket(conn);
		fd_set		fds;
		struct timeval tv = {0, 100000};

		FD_ZERO(&fds);
		FD_SET(sock, &fds);
		if (select(sock + 1, &fds, NULL, NULL, &tv) < 0 && errno != EINTR)
			worker_fail(id, "select", NULL);
		if (!PQconsumeInput(conn))
			worker_fail(id, "reading notifications", conn);
		while ((note = PQnotifies(conn)) != NULL)
		{
			const char *ev = json_field(note->extra, "event");
			char		kind[16] = "";

			r.t_ret = now_ns();
			r.t_call = 0;		/* always listening */
			sscanf(ev, "\"%15[a-z]\"", kind);
			r.kind = kind_of(kind);
			r.fence = atol(json_field(note->extra, "fence"));
			/* the k-th proclaim sent is the k-th change (one changer) */
			r.value = r.kind == EV_PROCLAIM ? ++nproclaims : 0;
			push(id, &recs, &n, &cap, &r);
			PQfreemem(note);
		}
	}
	if (write(out_fd, recs, n * sizeof(Rec)) != (ssize_t) (n * sizeof(Rec)))
		worker_fail(id, "writing records", NULL);
	send_msg(id, MSG_DONE, (long) n);
	wait_gate(2);
	PQfinish(conn);
	_exit(0);
}

static void
die(const char *msg)
{
	fprintf(stderr, "observe: %s\n", msg);
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

/* nearest-rank percentile of sorted v[0..n-1] */
static double
pct(const double *v, size_t n, double q)
{
	size_t		i = (size_t) ceil(q * n);

	return n ? v[i ? i - 1 : 0] : NAN;
}

/*
 * Wait until every observer's backend waits: in observe(), active and in
 * a wait event; listening, idle.  From a connection of the parent's own.
 */
static void
wait_for_observers(const long *pids)
{
	PGconn	   *conn = PQconnectdb("fallback_application_name=dlock-observe");
	char		pidlist[8192];
	const char *params[1] = {pidlist};
	int			len = 0;

	if (PQstatus(conn) != CONNECTION_OK)
		die(PQerrorMessage(conn));
	for (int i = 1; i < nclients; i++)
		len += snprintf(pidlist + len, sizeof(pidlist) - len, "%s%ld",
						i > 1 ? "," : "{", pids[i]);
	snprintf(pidlist + len, sizeof(pidlist) - len, "}");
	for (int tries = 0;; tries++)
	{
		PGresult   *res = PQexecParams(conn, listen_mode ?
									   "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])"
									   " AND state = 'idle'" :
									   "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])"
									   " AND state = 'active' AND wait_event IS NOT NULL",
									   1, NULL, params, NULL, NULL, 0);
		bool		all;

		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			die(PQerrorMessage(conn));
		all = atoi(PQgetvalue(res, 0, 0)) == nclients - 1;
		PQclear(res);
		if (all)
			break;
		if (tries > 1000)
			die("the observers did not all start waiting within 10 s");
		sleep_ms(10);
	}
	PQfinish(conn);
}

/* the change that r reports, or NULL */
static const Event *
find_event(const Rec *r, long nev)
{
	long		lo = 0, hi = nev - 1;

	if (r->kind == EV_PROCLAIM)
		return r->value >= 1 && r->value <= nev &&
			shared->events[r->value - 1].kind == EV_PROCLAIM ?
			&shared->events[r->value - 1] : NULL;
	/* grants and releases: ordered by (fence, grant before release) */
	while (lo <= hi)
	{
		long		mid = (lo + hi) / 2;
		const Event *e = &shared->events[mid];

		if (e->fence == r->fence && e->kind == r->kind)
			return e;
		if (e->fence < r->fence || (e->fence == r->fence && e->kind < r->kind))
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return NULL;
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"observers", required_argument, NULL, 'w'},
		{"seconds", required_argument, NULL, 's'},
		{"interval-ms", required_argument, NULL, 'i'},
		{"key", required_argument, NULL, 'k'},
		{"event", required_argument, NULL, 'e'},
		{"listen", no_argument, NULL, 'l'},
		{"idle-s", required_argument, NULL, 'd'},
		{NULL, 0, NULL, 0}
	};
	int			observers = 1, c;
	double		seconds = 5, interval_ms = 20, idle_s = 0, idle_cpu = NAN;
	const char *key = "observe";
	long	   *pids, *counts, nev;
	int		   *fds;
	size_t		n = 0, nwake = 0, late = 0, unmatched = 0, negative = 0;
	Rec		   *recs;
	double	   *from_ack, *from_send, *rtt, *all, cpu0, cpu1, wall;
	int64_t		start, end, *last_ret;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1)
	{
		switch (c)
		{
			case 'w': observers = atoi(optarg); break;
			case 's': seconds = atof(optarg); break;
			case 'i': interval_ms = atof(optarg); break;
			case 'k': key = optarg; break;
			case 'e':
				if (strcmp(optarg, "proclaim") == 0)
					proclaim_mode = true;
				else if (strcmp(optarg, "release") == 0)
					proclaim_mode = false;
				else
					observers = -1;
				break;
			case 'l': listen_mode = true; break;
			case 'd': idle_s = atof(optarg); break;
			default: observers = -1; break;
		}
	}
	if (observers < 1 || observers > 500 || seconds <= 0 || interval_ms <= 0 ||
		idle_s < 0 || optind < argc)
	{
		fprintf(stderr, "usage: observe --observers W [--seconds S] [--interval-ms I] [--key K]\n"
				"               [--event proclaim|release] [--listen] [--idle-s D]\n");
		return 2;
	}
	nclients = observers + 1;
	children = calloc(nclients, sizeof(pid_t));
	pids = calloc(nclients, sizeof(long));
	counts = calloc(nclients, sizeof(long));
	fds = calloc(nclients, sizeof(int));
	shared = mmap(NULL, sizeof(Shared), PROT_READ | PROT_WRITE,
				  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED)
		die("mmap failed");
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
			if (i == 0)
				changer(key, seconds, interval_ms);
			else if (listen_mode)
				listener(i, fds[i]);
			else
				observer(i, fds[i], key);
		}
	}
	/* the changer sends its pid once it leads (or holds) the key */
	collect(MSG_PID, pids);
	close(gate[0][1]);
	wait_for_observers(pids);
	if (idle_s > 0)
	{
		cpu0 = cpu_seconds(pids + 1, observers);
		sleep_ms(idle_s * 1000);
		idle_cpu = cpu_seconds(pids + 1, observers) - cpu0;
	}
	cpu0 = cpu_seconds(pids + 1, observers);
	start = now_ns();
	close(gate[1][1]);
	collect(MSG_DONE, counts);
	end = now_ns();
	cpu1 = cpu_seconds(pids + 1, observers);
	close(gate[2][1]);
	for (int i = 0; i < nclients; i++)
	{
		int			status;

		if (waitpid(children[i], &status, 0) < 0 || !WIFEXITED(status) ||
			WEXITSTATUS(status) != 0)
			die("a client failed at the end");
		children[i] = 0;
		if (i > 0)
			n += counts[i];
	}
	nev = shared->nevents;

	recs = malloc((n + 1) * sizeof(Rec));
	from_ack = malloc((n + 1) * sizeof(double));
	from_send = malloc((n + 1) * sizeof(double));
	rtt = malloc((nev + 1) * sizeof(double));
	all = malloc((nev + 1) * sizeof(double));
	last_ret = calloc(nev + 1, sizeof(int64_t));
	for (size_t i = 1, got = 0; i < (size_t) nclients; got += counts[i++])
		if (pread(fds[i], recs + got, counts[i] * sizeof(Rec), 0) !=
			(ssize_t) (counts[i] * sizeof(Rec)))
			die("reading records failed");
	for (size_t i = 0; i < n; i++)
	{
		const Event *e = find_event(&recs[i], nev);

		if (e == NULL)
		{
			unmatched++;		/* the state before the loop, or its end */
			continue;
		}
		if (recs[i].t_call >= e->t_send)
		{
			late++;
			continue;
		}
		from_ack[nwake] = (recs[i].t_ret - e->t_ack) / 1e6;
		from_send[nwake] = (recs[i].t_ret - e->t_send) / 1e6;
		negative += from_ack[nwake] < 0;
		nwake++;
		if (recs[i].t_ret > last_ret[e - shared->events])
			last_ret[e - shared->events] = recs[i].t_ret;
	}
	{
		size_t		nall = 0;

		for (long i = 0; i < nev; i++)
		{
			rtt[i] = (shared->events[i].t_ack - shared->events[i].t_send) / 1e6;
			if (last_ret[i] > 0)
				all[nall++] = (last_ret[i] - shared->events[i].t_ack) / 1e6;
		}
		qsort(rtt, nev, sizeof(double), cmp_double);
		qsort(all, nall, sizeof(double), cmp_double);
		qsort(from_ack, nwake, sizeof(double), cmp_double);
		qsort(from_send, nwake, sizeof(double), cmp_double);
		wall = (end - start) / 1e9;

		printf("observers %d\n", observers);
		printf("event %s\n", proclaim_mode ? "proclaim" : "release");
		printf("via %s\n", listen_mode ? "listen" : "observe");
		printf("changes %ld\n", nev);
		printf("changes_per_s %.1f\n", nev / wall);
		printf("change_p50_ms %.3f\n", pct(rtt, nev, 0.50));
		printf("returns %zu\n", n);
		printf("wakeups %zu\n", nwake);
		printf("wakeups_per_change %.2f\n", nev ? (double) nwake / nev : NAN);
		printf("late %zu\n", late);
		printf("unmatched %zu\n", unmatched);
		printf("from_ack_p50_ms %.3f\n", pct(from_ack, nwake, 0.50));
		printf("from_ack_p99_ms %.3f\n", pct(from_ack, nwake, 0.99));
		printf("from_ack_max_ms %.3f\n", pct(from_ack, nwake, 1.0));
		printf("from_ack_negative %zu\n", negative);
		printf("from_send_p50_ms %.3f\n", pct(from_send, nwake, 0.50));
		printf("from_send_p99_ms %.3f\n", pct(from_send, nwake, 0.99));
		printf("all_from_ack_p50_ms %.3f\n", pct(all, nall, 0.50));
		printf("all_from_ack_p99_ms %.3f\n", pct(all, nall, 0.99));
		printf("loop_cpu_per_wall %.3f\n", (cpu1 - cpu0) / wall);
		printf("cpu_ms_per_wakeup %.3f\n", nwake ? (cpu1 - cpu0) * 1000 / nwake : NAN);
		printf("idle_s %.1f\n", idle_s);
		printf("idle_cpu_s %.2f\n", idle_cpu);
	}
	return 0;
}
