/*
 * bench/lockbench.c: lock cycles per second, and their latency, of dlock,
 * its PostgreSQL baselines and Redis, and of fenced writes against plain
 * ones, driven the same way, for bench/locks.
 *
 *	lockbench --workload W [--clients N] [--seconds S | --cycles C]
 *			  [--keys K] [--key-prefix P] [--key-suffix X] [--ttl-s T]
 *			  [--wait-s V] [--sync on|off] [--redis SOCKET]
 *			  [--permits N] [--mode exclusive|shared] [--unprepared]
 *
 * Starts N threads, each with its own connection (PostgreSQL: libpq's PG*
 * environment; Redis: the unix socket SOCKET), waits until all are
 * connected, then lets them loop for S seconds, or until they have
 * completed C cycles together.  Every operation is one round trip.
 *
 * Lock workloads: one cycle takes a lock on a key drawn at random out of K
 * (K = 1: one hot key for everyone), P<k>X with k < K, and releases it:
 *
 *	dlock		SELECT owner FROM dlock.try_acquire($1, $2)	 (ttl T s)
 *				SELECT dlock.release($1, $2)
 *	dlock-wait	SELECT owner FROM dlock.acquire($1, $2, wait => $3)	(V s)
 *				SELECT dlock.release($1, $2)
 *	campaign	SELECT owner FROM dlock.campaign($1, 'lockbench', $2, wait => $3)
 *				SELECT dlock.release($1, $2)	(dlock 0.7: an election)
 *	advisory	SELECT pg_try_advisory_lock($1)	 (the key as a bigint, 1..K)
 *				SELECT pg_advisory_unlock($1)
 *	advisory-wait	SELECT pg_advisory_lock($1), then pg_advisory_unlock($1)
 *	sqllease	INSERT ... ON CONFLICT DO UPDATE ... WHERE expired RETURNING owner
 *				DELETE ... WHERE key = $1 AND owner = $2
 *	redis		SET key owner NX PX T*1000
 *				EVALSHA <compare-and-delete script> 1 key owner
 *
 * One-operation workloads: one cycle is one statement, for client i
 * (from 0), on what bench/locks set up beforehand:
 *
 *	renew		SELECT dlock.renew('renew:i', owner, T s): the client takes
 *				the lease at connect (try_acquire, ttl T s) and releases it
 *				at the end
 *	update-plain	UPDATE stock_plain SET qty = qty + 1 WHERE id = i
 *	update-fenced	UPDATE stock_fenced SET qty = qty + 1
 *				WHERE id = i AND dlock.fenced('stock:' || i, token)
 *				(stock_fenced has dlock.fence_guard('stock:{id}'))
 *	update-fenced-join	the same, presenting the token in the other
 *				one-statement form: UPDATE stock_fenced SET qty = qty + 1
 *				FROM (SELECT dlock.use_fence('stock:' || i, token)) AS f
 *				WHERE id = i
 *	bulk-plain	UPDATE bulk_plain SET qty = qty + 1 WHERE cid = i  (1000 rows)
 *	bulk-fenced	UPDATE bulk_fenced ... FROM (SELECT dlock.use_fence('bulk:' || i,
 *				token)) AS f WHERE cid = i	(fence_guard('bulk:{cid}'))
 *
 * The fenced workloads read the token of their client's lease (granted by
 * bench/locks with a long TTL) from the table lease_tokens of
 * bench/locks_setup.sql at connect (not from dlock.leases, which holds no
 * lease with dlock.storage = memory).
 *
 * --permits N (2 and up) and --mode shared (dlock 0.7) add "permits => N"
 * and "mode => 'shared'" to the acquire of dlock and dlock-wait: one of N
 * permits of the key, or a shared lease.  Without them the statements are
 * exactly those above, which every dlock version accepts.
 *
 * PostgreSQL statements are prepared once per connection (with
 * --unprepared, each is sent with its text every time, PQexecParams, so the
 * server parses and plans it every time, as for a client that does not
 * prepare), the Lua script is loaded once per connection; --sync sets
 * synchronous_commit at connect.
 * An attempt that finds the key taken is "busy": it is counted apart and is
 * not a cycle.  A cycle's latency runs from sending its first statement to
 * receiving its last result (CLOCK_MONOTONIC); the grant latency of a lock
 * cycle is that of its acquire alone (for dlock-wait and advisory-wait it
 * includes the wait).  With --seconds, cycles that end after the S seconds
 * are not counted.
 *
 * Prints "name value" lines: workload, clients, seconds, elapsed_s, cycles,
 * cycles_per_s, busy, busy_per_s, p50_ms, p99_ms, max_ms and, for lock
 * workloads, grant_p50_ms, grant_p99_ms, grant_max_ms; then, on PostgreSQL,
 * backend_cpu_us_per_cycle: the CPU time (user + system, /proc/<pid>/stat,
 * in clock ticks) that the clients' backends used from the start of the
 * clock to the end of the last client's loop, per counted cycle (nan when
 * the server runs elsewhere).  Any error from a
 * server, a release that finds the lock gone, a renewal that finds the
 * lease lost or an UPDATE that finds no row ends the program with status 1.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE			/* pthread barriers; PGXS defines it too */
#endif

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

/* type OIDs for the prepared statements' parameters */
#define INT4OID 23
#define INT8OID 20

typedef enum
{
	W_DLOCK, W_DLOCK_WAIT, W_ADVISORY, W_ADVISORY_WAIT, W_SQLLEASE, W_REDIS,
	W_CAMPAIGN, W_RENEW, W_UPDATE_PLAIN, W_UPDATE_FENCED, W_UPDATE_FENCED_JOIN,
	W_BULK_PLAIN, W_BULK_FENCED,
	W_COUNT
} Workload;

static const char *const workload_names[W_COUNT] = {
	"dlock", "dlock-wait", "advisory", "advisory-wait", "sqllease", "redis",
	"campaign", "renew", "update-plain", "update-fenced", "update-fenced-join",
	"bulk-plain", "bulk-fenced",
};

/*
 * The first (or only) statement of each PostgreSQL workload, with the
 * number of its parameters and their types (0: let the server infer).
 */
static const char *const first_sql[W_COUNT] = {
	[W_DLOCK] = "SELECT owner FROM dlock.try_acquire($1, $2)",
	[W_DLOCK_WAIT] = "SELECT owner FROM dlock.acquire($1, $2, wait => $3)",
	[W_ADVISORY] = "SELECT pg_try_advisory_lock($1)",
	[W_ADVISORY_WAIT] = "SELECT pg_advisory_lock($1)",
	/* bench/sqllease_roundtrip.sql, with the key and the ttl as parameters */
	[W_SQLLEASE] = "INSERT INTO sql_leases AS l (key, owner, expires_at) "
	"VALUES ($1, gen_random_uuid(), clock_timestamp() + $2::interval) "
	"ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at "
	"WHERE l.expires_at < clock_timestamp() "
	"RETURNING owner",
	[W_CAMPAIGN] = "SELECT owner FROM dlock.campaign($1, 'lockbench', $2, wait => $3)",
	[W_RENEW] = "SELECT dlock.renew($1, $2, $3)",
	[W_UPDATE_PLAIN] = "UPDATE stock_plain SET qty = qty + 1 WHERE id = $1",
	[W_UPDATE_FENCED] = "UPDATE stock_fenced SET qty = qty + 1 "
	"WHERE id = $1 AND dlock.fenced('stock:' || $1, $2)",
	[W_UPDATE_FENCED_JOIN] = "UPDATE stock_fenced SET qty = qty + 1 "
	"FROM (SELECT dlock.use_fence('stock:' || $1, $2)) AS f WHERE id = $1",
	[W_BULK_PLAIN] = "UPDATE bulk_plain SET qty = qty + 1 WHERE cid = $1",
	[W_BULK_FENCED] = "UPDATE bulk_fenced SET qty = qty + 1 "
	"FROM (SELECT dlock.use_fence('bulk:' || $1, $2)) AS f WHERE cid = $1",
};
static const int first_nparams[W_COUNT] = {
	[W_DLOCK] = 2, [W_DLOCK_WAIT] = 3, [W_CAMPAIGN] = 3, [W_ADVISORY] = 1,
	[W_ADVISORY_WAIT] = 1,
	[W_SQLLEASE] = 2, [W_RENEW] = 3, [W_UPDATE_PLAIN] = 1, [W_UPDATE_FENCED] = 2,
	[W_UPDATE_FENCED_JOIN] = 2, [W_BULK_PLAIN] = 1, [W_BULK_FENCED] = 2,
};
static const unsigned int id_token_types[2] = {INT4OID, INT8OID};

/* the release of the PostgreSQL lock workloads; NULL: one statement a cycle */
static const char *const release_sql[W_COUNT] = {
	[W_DLOCK] = "SELECT dlock.release($1, $2)",
	[W_DLOCK_WAIT] = "SELECT dlock.release($1, $2)",
	[W_CAMPAIGN] = "SELECT dlock.release($1, $2)",
	[W_ADVISORY] = "SELECT pg_advisory_unlock($1)",
	[W_ADVISORY_WAIT] = "SELECT pg_advisory_unlock($1)",
	[W_SQLLEASE] = "DELETE FROM sql_leases WHERE key = $1 AND owner = $2::uuid",
};

/* Redis: delete the key only if it still holds our owner value */
#define RELEASE_LUA \
	"if redis.call('get', KEYS[1]) == ARGV[1] then " \
	"return redis.call('del', KEYS[1]) else return 0 end"

static Workload workload;
static int	nclients = 1;
static int	seconds = 5;
static long target_cycles;		/* --cycles; 0: run for --seconds */
static long nkeys = 100000;
static const char *key_prefix = "lb:";
static const char *key_suffix = "";
static int	ttl_s = 30;
static int	wait_s = 60;
static const char *sync_commit;
static const char *redis_socket;
static int	permits = 1;		/* --permits; 1: the argument left out */
static bool shared_mode;		/* --mode shared */

static pthread_barrier_t ready;	/* all connected; then the deadline is set */
static pthread_barrier_t go;
static pthread_barrier_t finished;	/* all loops over, connections still open */
static bool unprepared;			/* --unprepared */
static const unsigned int *first_types;	/* the first statement's parameter types */
static int64_t deadline;
static long completed;			/* cycles of all clients, for --cycles */

/* latencies in ms, growing as needed */
typedef struct LatVec
{
	double	   *v;
	long		n;
	long		max;
} LatVec;

typedef struct Client
{
	pthread_t	thread;
	int			id;
	long		backend_pid;	/* PostgreSQL: the connection's backend */
	uint64_t	rng;
	long		cycles;
	long		busy;
	LatVec		cycle_ms;		/* one per cycle */
	LatVec		grant_ms;		/* one per cycle of a lock workload */
} Client;

/* CLOCK_MONOTONIC in nanoseconds */
static int64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* splitmix64: each thread's own random numbers, no locking */
static uint64_t
next_random(uint64_t *state)
{
	uint64_t	z = (*state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Print what went wrong and end the program with status 1. */
static void
die(const char *what, const char *detail)
{
	fprintf(stderr, "lockbench: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
	exit(1);
}

/* Is a lock workload (acquire + release), as opposed to one statement? */
static bool
is_lock_workload(Workload w)
{
	return w == W_REDIS || release_sql[w] != NULL;
}

/* Append one latency (ns interval) to a LatVec in ms. */
static void
latvec_add(LatVec *l, int64_t t0, int64_t t1)
{
	if (l->n == l->max)
	{
		l->max = l->max ? l->max * 2 : 4096;
		l->v = realloc(l->v, l->max * sizeof(double));
		if (l->v == NULL)
			die("out of memory", NULL);
	}
	l->v[l->n++] = (t1 - t0) / 1e6;
}

/* Should the client stop before starting another cycle at time t? */
static bool
time_is_up(int64_t t)
{
	if (target_cycles > 0)
		return __atomic_load_n(&completed, __ATOMIC_RELAXED) >= target_cycles;
	return t >= deadline;
}

/*
 * Count one cycle that started at t0, was granted at tg (0: not a lock
 * workload) and ended at t1, unless it ended after the deadline.
 */
static void
record(Client *c, int64_t t0, int64_t tg, int64_t t1)
{
	if (target_cycles == 0 && t1 >= deadline)
		return;
	latvec_add(&c->cycle_ms, t0, t1);
	if (tg != 0)
		latvec_add(&c->grant_ms, t0, tg);
	c->cycles++;
	if (target_cycles > 0)
		__atomic_add_fetch(&completed, 1, __ATOMIC_RELAXED);
}

/* Count a busy attempt, unless it ended after the deadline. */
static void
record_busy(Client *c)
{
	if (target_cycles > 0 || now_ns() < deadline)
		c->busy++;
}

static const char *acquire_sql(void);

/*
 * Run the statement "first" or "release" of the workload, prepared (or
 * with its text, --unprepared); fail on any error.
 */
static PGresult *
pg_exec(PGconn *conn, const char *stmt, int nparams, const char *const *values)
{
	PGresult   *res;
	ExecStatusType st;

	if (!unprepared)
		res = PQexecPrepared(conn, stmt, nparams, values, NULL, NULL, 0);
	else if (strcmp(stmt, "first") == 0)
		res = PQexecParams(conn, acquire_sql(), nparams, first_types, values, NULL, NULL, 0);
	else
		res = PQexecParams(conn, release_sql[workload], nparams, NULL, values, NULL, NULL, 0);
	st = PQresultStatus(res);

	if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK)
		die(stmt, PQerrorMessage(conn));
	return res;
}

/* Run one unprepared statement with text parameters; fail on any error. */
static PGresult *
pg_query(PGconn *conn, const char *sql, int nparams, const char *const *values)
{
	PGresult   *res = PQexecParams(conn, sql, nparams, NULL, values, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(res);

	if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK)
		die(sql, PQerrorMessage(conn));
	return res;
}

/* Prepare one statement; fail on any error. */
static void
pg_prepare(PGconn *conn, const char *name, const char *sql, int nparams,
		   const unsigned int *types)
{
	PGresult   *res = PQprepare(conn, name, sql, nparams, types);

	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		die(name, PQerrorMessage(conn));
	PQclear(res);
}

/* One cycle of a lock workload on PostgreSQL: acquire + release. */
static void
pg_lock_cycle(Client *c, PGconn *conn, const char *ttl, const char *wait)
{
	int64_t		t0 = now_ns(),
				tg,
				t1;
	long		k = (long) (next_random(&c->rng) % (uint64_t) nkeys);
	bool		advisory = workload == W_ADVISORY || workload == W_ADVISORY_WAIT;
	int			nrelease = advisory ? 1 : 2;
	char		key[160];
	char		owner[64];
	const char *params[3];
	PGresult   *res;
	bool		got;

	if (advisory)
		snprintf(key, sizeof(key), "%ld", k + 1);
	else
		snprintf(key, sizeof(key), "%s%ld%s", key_prefix, k, key_suffix);
	params[0] = key;
	params[1] = ttl;
	params[2] = wait;
	res = pg_exec(conn, "first", first_nparams[workload], params);
	tg = now_ns();
	if (workload == W_ADVISORY)
		got = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	else if (workload == W_ADVISORY_WAIT)
		got = PQntuples(res) == 1;
	else
	{
		got = PQntuples(res) == 1 && !PQgetisnull(res, 0, 0);
		if (got)
			snprintf(owner, sizeof(owner), "%s", PQgetvalue(res, 0, 0));
	}
	PQclear(res);
	if (!got)
	{
		/* a waiting acquire either grants or raises an error */
		if (workload == W_ADVISORY_WAIT || workload == W_DLOCK_WAIT ||
			workload == W_CAMPAIGN)
			die("a waiting acquire returned no lock", key);
		record_busy(c);
		return;
	}

	params[1] = owner;
	res = pg_exec(conn, "release", nrelease, params);
	if (workload == W_SQLLEASE ? strcmp(PQcmdTuples(res), "1") != 0
		: strcmp(PQgetvalue(res, 0, 0), "t") != 0)
		die("release found the lock gone", key);
	PQclear(res);
	t1 = now_ns();
	record(c, t0, tg, t1);
}

/*
 * One cycle of a one-statement workload: the statement prepared as
 * "first" with the client's parameters.
 */
static void
pg_single_cycle(Client *c, PGconn *conn, const char *const *params)
{
	int64_t		t0 = now_ns(),
				t1;
	PGresult   *res = pg_exec(conn, "first", first_nparams[workload], params);

	if (workload == W_RENEW)
	{
		if (PQntuples(res) != 1 || PQgetisnull(res, 0, 0))
			die("renew found the lease lost", params[0]);
	}
	else if (workload == W_UPDATE_PLAIN || workload == W_UPDATE_FENCED ||
			 workload == W_UPDATE_FENCED_JOIN)
	{
		if (strcmp(PQcmdTuples(res), "1") != 0)
			die("the UPDATE found no row for client", params[0]);
	}
	else if (atol(PQcmdTuples(res)) < 1)
		die("the bulk UPDATE found no rows for client", params[0]);
	PQclear(res);
	t1 = now_ns();
	record(c, t0, 0, t1);
}

/*
 * The first statement of the workload: first_sql, with the acquire's
 * permits and mode of --permits and --mode added as constants.
 */
static const char *
acquire_sql(void)
{
	static char sql[256];
	const char *base = first_sql[workload];
	size_t		len = strlen(base);

	if (permits == 1 && !shared_mode)
		return base;
	/* dlock and dlock-wait only (checked in main): base ends with ')' */
	snprintf(sql, sizeof(sql), "%.*s", (int) (len - 1), base);
	if (permits > 1)
		snprintf(sql + strlen(sql), sizeof(sql) - strlen(sql), ", permits => %d", permits);
	if (shared_mode)
		snprintf(sql + strlen(sql), sizeof(sql) - strlen(sql), ", mode => 'shared'");
	snprintf(sql + strlen(sql), sizeof(sql) - strlen(sql), ")");
	return sql;
}

/* One client's connection and loop on PostgreSQL. */
static void
run_pg(Client *c)
{
	PGconn	   *conn = PQconnectdb("");
	char		ttl[32];
	char		wait[32];
	char		id[32];
	char		key[160];
	char		owner[64] = "";
	char		token[32] = "";
	const char *params[3];
	PGresult   *res;
	bool		lock = is_lock_workload(workload);

	if (PQstatus(conn) != CONNECTION_OK)
		die("connection failed", PQerrorMessage(conn));
	c->backend_pid = PQbackendPID(conn);
	if (sync_commit)
	{
		const char *v[1] = {sync_commit};

		PQclear(pg_query(conn, "SELECT pg_catalog.set_config('synchronous_commit', $1, false)",
						 1, v));
	}
	snprintf(ttl, sizeof(ttl), "%d s", ttl_s);
	snprintf(wait, sizeof(wait), "%d s", wait_s);
	snprintf(id, sizeof(id), "%d", c->id);

	/* the client's own lease (renew) or the token of its lease (fenced) */
	if (workload == W_RENEW)
	{
		params[0] = key;
		params[1] = ttl;
		snprintf(key, sizeof(key), "renew:%d", c->id);
		res = pg_query(conn, "SELECT owner FROM dlock.try_acquire($1, $2)", 2, params);
		if (PQntuples(res) != 1)
			die("the client's own renew key is held by someone else", key);
		snprintf(owner, sizeof(owner), "%s", PQgetvalue(res, 0, 0));
		PQclear(res);
	}
	else if (workload == W_UPDATE_FENCED || workload == W_UPDATE_FENCED_JOIN ||
			 workload == W_BULK_FENCED)
	{
		params[0] = key;
		snprintf(key, sizeof(key), "%s:%d",
				 workload == W_BULK_FENCED ? "bulk" : "stock", c->id);
		res = pg_query(conn, "SELECT fence FROM lease_tokens WHERE key = $1", 1, params);
		if (PQntuples(res) != 1)
			die("no lease for the client's rows (bench/locks grants them)", key);
		snprintf(token, sizeof(token), "%s", PQgetvalue(res, 0, 0));
		PQclear(res);
	}

	if (!unprepared)
	{
		pg_prepare(conn, "first", acquire_sql(), first_nparams[workload], first_types);
		if (lock)
			pg_prepare(conn, "release", release_sql[workload], 0, NULL);
	}

	/* the parameters of a one-statement workload never change */
	if (workload == W_RENEW)
	{
		params[0] = key;
		params[1] = owner;
		params[2] = ttl;
	}
	else
	{
		params[0] = id;
		params[1] = token;
	}

	pthread_barrier_wait(&ready);
	pthread_barrier_wait(&go);

	while (!time_is_up(now_ns()))
	{
		if (lock)
			pg_lock_cycle(c, conn, ttl, wait);
		else
			pg_single_cycle(c, conn, params);
	}

	if (workload == W_RENEW)
	{
		params[0] = key;
		params[1] = owner;
		res = pg_query(conn, "SELECT dlock.release($1, $2)", 2, params);
		if (strcmp(PQgetvalue(res, 0, 0), "t") != 0)
			die("release of the renewed lease found it gone", key);
		PQclear(res);
	}
	pthread_barrier_wait(&finished);	/* the parent reads our backend's CPU */
	PQfinish(conn);
}

/* Run one Redis command; fail on a connection error or an error reply. */
static redisReply *
redis_cmd(redisContext *rc, const char *fmt, const char *a, const char *b, const char *d)
{
	redisReply *r = redisCommand(rc, fmt, a, b, d);

	if (r == NULL)
		die("redis", rc->errstr);
	if (r->type == REDIS_REPLY_ERROR)
		die("redis error", r->str);
	return r;
}

/* One client's loop on Redis. */
static void
run_redis(Client *c)
{
	redisContext *rc = redisConnectUnix(redis_socket);
	redisReply *r;
	char		sha[64];
	char		key[160];
	char		owner[40];
	char		px[32];

	if (rc == NULL || rc->err)
		die("redis connection failed", rc ? rc->errstr : redis_socket);
	r = redis_cmd(rc, "SCRIPT LOAD %s", RELEASE_LUA, NULL, NULL);
	if (r->type != REDIS_REPLY_STRING)
		die("SCRIPT LOAD gave no hash", NULL);
	snprintf(sha, sizeof(sha), "%s", r->str);
	freeReplyObject(r);
	snprintf(px, sizeof(px), "%d", ttl_s * 1000);

	pthread_barrier_wait(&ready);
	pthread_barrier_wait(&go);

	for (;;)
	{
		int64_t		t0 = now_ns(),
					tg,
					t1;
		long		k = (long) (next_random(&c->rng) % (uint64_t) nkeys);
		bool		got;

		if (time_is_up(t0))
			break;
		snprintf(key, sizeof(key), "%s%ld%s", key_prefix, k, key_suffix);
		/* a random 128-bit owner, as a uuid would be */
		snprintf(owner, sizeof(owner), "%016llx%016llx",
				 (unsigned long long) next_random(&c->rng),
				 (unsigned long long) next_random(&c->rng));
		r = redis_cmd(rc, "SET %s %s NX PX %s", key, owner, px);
		tg = now_ns();
		got = r->type == REDIS_REPLY_STATUS;
		freeReplyObject(r);
		if (!got)
		{
			record_busy(c);
			continue;
		}
		r = redis_cmd(rc, "EVALSHA %s 1 %s %s", sha, key, owner);
		if (r->type != REDIS_REPLY_INTEGER || r->integer != 1)
			die("release found the lock gone", key);
		freeReplyObject(r);
		t1 = now_ns();
		record(c, t0, tg, t1);
	}
	pthread_barrier_wait(&finished);
	redisFree(rc);
}

/* A client thread: its own connection and loop. */
static void *
client_main(void *arg)
{
	Client	   *c = arg;

	if (workload == W_REDIS)
		run_redis(c);
	else
		run_pg(c);
	return NULL;
}

/* qsort comparator for doubles */
static int
cmp_double(const void *a, const void *b)
{
	double		x = *(const double *) a,
				y = *(const double *) b;

	return (x > y) - (x < y);
}

/* the p-th percentile (nearest rank) of n sorted values */
static double
percentile(const double *v, long n, double p)
{
	long		i;

	if (n == 0)
		return 0;
	i = (long) (p / 100 * n + 0.999999) - 1;
	if (i < 0)
		i = 0;
	if (i >= n)
		i = n - 1;
	return v[i];
}

/*
 * Merge the clients' latencies of one kind (offset of the LatVec in Client)
 * and print its p50, p99 and max as <prefix>p50_ms etc.
 */
static void
print_latencies(Client *clients, size_t offset, const char *prefix)
{
	long		n = 0;
	double	   *all;
	int			i;

	for (i = 0; i < nclients; i++)
		n += ((LatVec *) ((char *) &clients[i] + offset))->n;
	all = malloc((n ? n : 1) * sizeof(double));
	if (all == NULL)
		die("out of memory", NULL);
	n = 0;
	for (i = 0; i < nclients; i++)
	{
		LatVec	   *l = (LatVec *) ((char *) &clients[i] + offset);

		if (l->n > 0)
			memcpy(all + n, l->v, l->n * sizeof(double));
		n += l->n;
	}
	qsort(all, n, sizeof(double), cmp_double);
	printf("%sp50_ms %.3f\n", prefix, percentile(all, n, 50));
	printf("%sp99_ms %.3f\n", prefix, percentile(all, n, 99));
	printf("%smax_ms %.3f\n", prefix, n ? all[n - 1] : 0.0);
	free(all);
}

/*
 * CPU seconds (user + system) that the clients' backends have used, from
 * /proc/<pid>/stat; NAN when one cannot be read (the server runs
 * elsewhere) or for Redis.
 */
static double
backend_cpu_s(Client *clients)
{
	long		ticks = 0;
	int			i;

	for (i = 0; i < nclients; i++)
	{
		char		path[64],
					buf[1024],
				   *p;
		unsigned long utime,
					stime;
		FILE	   *f;
		size_t		len;

		if (clients[i].backend_pid <= 0)
			return NAN;
		snprintf(path, sizeof(path), "/proc/%ld/stat", clients[i].backend_pid);
		if (!(f = fopen(path, "r")))
			return NAN;
		len = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[len] = '\0';
		/* the fields after the command name in parentheses; utime is the 14th */
		if (!(p = strrchr(buf, ')')) ||
			sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
				   &utime, &stime) != 2)
			return NAN;
		ticks += utime + stime;
	}
	return (double) ticks / sysconf(_SC_CLK_TCK);
}

/* Print the usage and end the program with status 2. */
static void
usage(void)
{
	fprintf(stderr,
			"usage: lockbench --workload W [--clients N] [--seconds S | --cycles C]\n"
			"                 [--keys K] [--key-prefix P] [--key-suffix X] [--ttl-s T]\n"
			"                 [--wait-s V] [--sync on|off] [--redis SOCKET]\n"
			"                 [--permits N] [--mode exclusive|shared] [--unprepared]\n"
			"W: dlock, dlock-wait, campaign, advisory, advisory-wait, sqllease, redis\n"
			"   (needs --redis), renew, update-plain, update-fenced, update-fenced-join,\n"
			"   bulk-plain, bulk-fenced; --permits and --mode: dlock and dlock-wait\n");
	exit(2);
}

/* Parse the options, run the clients, print the results. */
int
main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"workload", required_argument, NULL, 'w'},
		{"clients", required_argument, NULL, 'c'},
		{"seconds", required_argument, NULL, 's'},
		{"cycles", required_argument, NULL, 'n'},
		{"keys", required_argument, NULL, 'k'},
		{"key-prefix", required_argument, NULL, 'p'},
		{"key-suffix", required_argument, NULL, 'u'},
		{"ttl-s", required_argument, NULL, 't'},
		{"wait-s", required_argument, NULL, 'x'},
		{"sync", required_argument, NULL, 'y'},
		{"redis", required_argument, NULL, 'r'},
		{"permits", required_argument, NULL, 'P'},
		{"mode", required_argument, NULL, 'm'},
		{"unprepared", no_argument, NULL, 'U'},
		{NULL, 0, NULL, 0}
	};
	int			opt;
	int			i;
	int			have_workload = 0;
	Client	   *clients;
	long		cycles = 0,
				busy = 0;
	int64_t		start,
				end;
	double		elapsed,
				per,
				cpu0,
				cpu1;
	uint64_t	seed = (uint64_t) now_ns();

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1)
	{
		switch (opt)
		{
			case 'w':
				for (i = 0; i < W_COUNT; i++)
					if (strcmp(optarg, workload_names[i]) == 0)
						break;
				if (i == W_COUNT)
					usage();
				workload = (Workload) i;
				have_workload = 1;
				break;
			case 'c':
				nclients = atoi(optarg);
				break;
			case 's':
				seconds = atoi(optarg);
				break;
			case 'n':
				target_cycles = atol(optarg);
				if (target_cycles < 1)
					usage();
				break;
			case 'k':
				nkeys = atol(optarg);
				break;
			case 'p':
				if (strlen(optarg) > 100)
					usage();
				key_prefix = optarg;
				break;
			case 'u':
				if (strlen(optarg) > 30)
					usage();
				key_suffix = optarg;
				break;
			case 't':
				ttl_s = atoi(optarg);
				break;
			case 'x':
				wait_s = atoi(optarg);
				break;
			case 'y':
				if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0)
					usage();
				sync_commit = optarg;
				break;
			case 'r':
				redis_socket = optarg;
				break;
			case 'U':
				unprepared = true;
				break;
			case 'P':
				permits = atoi(optarg);
				if (permits < 1 || permits > 1000)
					usage();
				break;
			case 'm':
				if (strcmp(optarg, "shared") == 0)
					shared_mode = true;
				else if (strcmp(optarg, "exclusive") == 0)
					shared_mode = false;
				else
					usage();
				break;
			default:
				usage();
		}
	}
	if (!have_workload || optind < argc || nclients < 1 || seconds < 1 ||
		nkeys < 1 || ttl_s < 1 || wait_s < 1 ||
		(workload == W_REDIS) != (redis_socket != NULL) ||
		((permits > 1 || shared_mode) && workload != W_DLOCK && workload != W_DLOCK_WAIT) ||
		(permits > 1 && shared_mode))
		usage();

	clients = calloc(nclients, sizeof(Client));
	if (clients == NULL)
		die("out of memory", NULL);
	pthread_barrier_init(&ready, NULL, nclients + 1);
	pthread_barrier_init(&go, NULL, nclients + 1);
	pthread_barrier_init(&finished, NULL, nclients + 1);
	first_types = workload == W_UPDATE_FENCED || workload == W_UPDATE_FENCED_JOIN ||
		workload == W_BULK_FENCED || workload == W_UPDATE_PLAIN || workload == W_BULK_PLAIN ?
		id_token_types : NULL;
	for (i = 0; i < nclients; i++)
	{
		clients[i].id = i;
		clients[i].rng = seed + (uint64_t) i * 0x632be59bd9b4e019ULL;
		if (pthread_create(&clients[i].thread, NULL, client_main, &clients[i]) != 0)
			die("pthread_create failed", strerror(errno));
	}
	/* every client is connected and prepared: start the clock */
	pthread_barrier_wait(&ready);
	cpu0 = backend_cpu_s(clients);
	start = now_ns();
	deadline = target_cycles > 0 ? INT64_MAX : start + (int64_t) seconds * 1000000000;
	pthread_barrier_wait(&go);
	pthread_barrier_wait(&finished);
	cpu1 = backend_cpu_s(clients);
	for (i = 0; i < nclients; i++)
	{
		pthread_join(clients[i].thread, NULL);
		cycles += clients[i].cycles;
		busy += clients[i].busy;
	}
	end = now_ns();
	elapsed = (end - start) / 1e9;
	/* with --seconds, only what happened within the S seconds counts */
	per = target_cycles > 0 ? elapsed : seconds;

	printf("workload %s\n", workload_names[workload]);
	printf("clients %d\n", nclients);
	printf("seconds %d\n", target_cycles > 0 ? 0 : seconds);
	printf("elapsed_s %.3f\n", elapsed);
	printf("cycles %ld\n", cycles);
	printf("cycles_per_s %.1f\n", cycles / per);
	printf("busy %ld\n", busy);
	printf("busy_per_s %.1f\n", busy / per);
	print_latencies(clients, offsetof(Client, cycle_ms), "");
	if (is_lock_workload(workload))
		print_latencies(clients, offsetof(Client, grant_ms), "grant_");
	if (workload != W_REDIS)
		printf("backend_cpu_us_per_cycle %.1f\n", cycles ? (cpu1 - cpu0) * 1e6 / cycles : NAN);
	return 0;
}
