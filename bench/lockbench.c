/*
 * bench/lockbench.c: lock cycles per second, and their latency, of dlock,
 * its PostgreSQL baselines and Redis, driven the same way, for bench/locks.
 *
 *	lockbench --workload dlock|advisory|sqllease|redis [--clients N]
 *			  [--seconds S] [--keys K] [--ttl-s T] [--sync on|off]
 *			  [--redis SOCKET]
 *
 * Starts N threads, each with its own connection (PostgreSQL: libpq's PG*
 * environment; Redis: the unix socket SOCKET), and lets them loop for S
 * seconds.  One cycle takes a lock on a key drawn at random out of K
 * (K = 1: one hot key for everyone) and releases it, with exactly one round
 * trip per operation:
 *
 *	dlock		SELECT owner FROM dlock.try_acquire($1, $2)	 (ttl T s)
 *				SELECT dlock.release($1, $2)
 *	advisory	SELECT pg_try_advisory_lock($1)	 (the key as a bigint)
 *				SELECT pg_advisory_unlock($1)
 *	sqllease	INSERT ... ON CONFLICT DO UPDATE ... WHERE expired RETURNING owner
 *				DELETE ... WHERE key = $1 AND owner = $2
 *	redis		SET key owner NX PX T*1000
 *				EVALSHA <compare-and-delete script> 1 key owner
 *
 * PostgreSQL statements are prepared once per connection, the Lua script is
 * loaded once per connection; --sync sets synchronous_commit at connect.
 * An attempt that finds the key taken is "busy": it is counted apart and is
 * not a cycle.  A cycle's latency runs from sending the acquire to receiving
 * the release's result (CLOCK_MONOTONIC); cycles that end after the S
 * seconds are not counted.
 *
 * Prints "name value" lines: workload, clients, seconds, cycles,
 * cycles_per_s, busy, busy_per_s, p50_ms, p99_ms, max_ms.  Any error from a
 * server, or a release that finds the lock gone, ends the program with
 * status 1.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE			/* pthread barriers; PGXS defines it too */
#endif

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

typedef enum
{
	W_DLOCK, W_ADVISORY, W_SQLLEASE, W_REDIS
} Workload;

static const char *const workload_names[] = {"dlock", "advisory", "sqllease", "redis"};

/* acquire and release statements of the PostgreSQL workloads */
static const char *const acquire_sql[] = {
	"SELECT owner FROM dlock.try_acquire($1, $2)",
	"SELECT pg_try_advisory_lock($1)",
	/* bench/sqllease_roundtrip.sql, with the key and the ttl as parameters */
	"INSERT INTO sql_leases AS l (key, owner, expires_at) "
	"VALUES ($1, gen_random_uuid(), clock_timestamp() + $2::interval) "
	"ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at "
	"WHERE l.expires_at < clock_timestamp() "
	"RETURNING owner",
};
static const char *const release_sql[] = {
	"SELECT dlock.release($1, $2)",
	"SELECT pg_advisory_unlock($1)",
	"DELETE FROM sql_leases WHERE key = $1 AND owner = $2::uuid",
};

/* Redis: delete the key only if it still holds our owner value */
#define RELEASE_LUA \
	"if redis.call('get', KEYS[1]) == ARGV[1] then " \
	"return redis.call('del', KEYS[1]) else return 0 end"

static Workload workload;
static int	nclients = 1;
static int	seconds = 5;
static long nkeys = 100000;
static int	ttl_s = 30;
static const char *sync_commit;
static const char *redis_socket;

static pthread_barrier_t ready;	/* all connected; then the deadline is set */
static pthread_barrier_t go;
static int64_t deadline;

typedef struct Client
{
	pthread_t	thread;
	int			id;
	uint64_t	rng;
	long		cycles;
	long		busy;
	double	   *lat_ms;			/* one per cycle */
	long		nlat;
	long		maxlat;
} Client;

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

static void
die(const char *what, const char *detail)
{
	fprintf(stderr, "lockbench: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
	exit(1);
}

/* Remember one cycle's latency, growing the array as needed. */
static void
record(Client *c, int64_t t0, int64_t t1)
{
	if (c->nlat == c->maxlat)
	{
		c->maxlat = c->maxlat ? c->maxlat * 2 : 4096;
		c->lat_ms = realloc(c->lat_ms, c->maxlat * sizeof(double));
		if (c->lat_ms == NULL)
			die("out of memory", NULL);
	}
	c->lat_ms[c->nlat++] = (t1 - t0) / 1e6;
	c->cycles++;
}

/* Run one prepared statement; fail on any error. */
static PGresult *
pg_exec(PGconn *conn, const char *stmt, int nparams, const char *const *values)
{
	PGresult   *res = PQexecPrepared(conn, stmt, nparams, values, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(res);

	if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK)
		die(stmt, PQerrorMessage(conn));
	return res;
}

/* One client's loop on PostgreSQL. */
static void
run_pg(Client *c)
{
	PGconn	   *conn = PQconnectdb("");
	char		key[32];
	char		ttl[32];
	char		owner[64];
	PGresult   *res;

	if (PQstatus(conn) != CONNECTION_OK)
		die("connection failed", PQerrorMessage(conn));
	if (sync_commit)
	{
		const char *v[1] = {sync_commit};

		res = PQexecParams(conn, "SELECT pg_catalog.set_config('synchronous_commit', $1, false)",
						   1, NULL, v, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			die("setting synchronous_commit failed", PQerrorMessage(conn));
		PQclear(res);
	}
	res = PQprepare(conn, "acquire", acquire_sql[workload], 0, NULL);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		die("prepare acquire", PQerrorMessage(conn));
	PQclear(res);
	res = PQprepare(conn, "release", release_sql[workload], 0, NULL);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		die("prepare release", PQerrorMessage(conn));
	PQclear(res);
	snprintf(ttl, sizeof(ttl), "%d s", ttl_s);

	pthread_barrier_wait(&ready);
	pthread_barrier_wait(&go);

	for (;;)
	{
		int64_t		t0 = now_ns(),
					t1;
		long		k = (long) (next_random(&c->rng) % (uint64_t) nkeys);
		const char *params[2];
		bool		got;

		if (t0 >= deadline)
			break;
		if (workload == W_ADVISORY)
			snprintf(key, sizeof(key), "%ld", k);
		else
			snprintf(key, sizeof(key), "lb:%ld", k);
		params[0] = key;
		params[1] = ttl;
		res = pg_exec(conn, "acquire", workload == W_ADVISORY ? 1 : 2, params);
		if (workload == W_ADVISORY)
			got = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
		else
		{
			got = PQntuples(res) == 1;
			if (got)
				snprintf(owner, sizeof(owner), "%s", PQgetvalue(res, 0, 0));
		}
		PQclear(res);
		if (!got)
		{
			if (now_ns() < deadline)
				c->busy++;
			continue;
		}

		params[1] = owner;
		res = pg_exec(conn, "release", workload == W_ADVISORY ? 1 : 2, params);
		if (workload == W_SQLLEASE ? strcmp(PQcmdTuples(res), "1") != 0
			: strcmp(PQgetvalue(res, 0, 0), "t") != 0)
			die("release found the lock gone", key);
		PQclear(res);
		t1 = now_ns();
		if (t1 < deadline)
			record(c, t0, t1);
	}
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
	char		key[32];
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
					t1;
		long		k = (long) (next_random(&c->rng) % (uint64_t) nkeys);
		bool		got;

		if (t0 >= deadline)
			break;
		snprintf(key, sizeof(key), "lb:%ld", k);
		/* a random 128-bit owner, as a uuid would be */
		snprintf(owner, sizeof(owner), "%016llx%016llx",
				 (unsigned long long) next_random(&c->rng),
				 (unsigned long long) next_random(&c->rng));
		r = redis_cmd(rc, "SET %s %s NX PX %s", key, owner, px);
		got = r->type == REDIS_REPLY_STATUS;
		freeReplyObject(r);
		if (!got)
		{
			if (now_ns() < deadline)
				c->busy++;
			continue;
		}
		r = redis_cmd(rc, "EVALSHA %s 1 %s %s", sha, key, owner);
		if (r->type != REDIS_REPLY_INTEGER || r->integer != 1)
			die("release found the lock gone", key);
		freeReplyObject(r);
		t1 = now_ns();
		if (t1 < deadline)
			record(c, t0, t1);
	}
	redisFree(rc);
}

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

static void
usage(void)
{
	fprintf(stderr,
			"usage: lockbench --workload dlock|advisory|sqllease|redis [--clients N]\n"
			"                 [--seconds S] [--keys K] [--ttl-s T] [--sync on|off]\n"
			"                 [--redis SOCKET]\n");
	exit(2);
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"workload", required_argument, NULL, 'w'},
		{"clients", required_argument, NULL, 'c'},
		{"seconds", required_argument, NULL, 's'},
		{"keys", required_argument, NULL, 'k'},
		{"ttl-s", required_argument, NULL, 't'},
		{"sync", required_argument, NULL, 'y'},
		{"redis", required_argument, NULL, 'r'},
		{NULL, 0, NULL, 0}
	};
	int			opt;
	int			i;
	int			have_workload = 0;
	Client	   *clients;
	long		cycles = 0,
				busy = 0,
				nlat = 0;
	double	   *all;
	uint64_t	seed = (uint64_t) now_ns();

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1)
	{
		switch (opt)
		{
			case 'w':
				for (i = 0; i < 4; i++)
					if (strcmp(optarg, workload_names[i]) == 0)
						break;
				if (i == 4)
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
			case 'k':
				nkeys = atol(optarg);
				break;
			case 't':
				ttl_s = atoi(optarg);
				break;
			case 'y':
				if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0)
					usage();
				sync_commit = optarg;
				break;
			case 'r':
				redis_socket = optarg;
				break;
			default:
				usage();
		}
	}
	if (!have_workload || optind < argc || nclients < 1 || seconds < 1 ||
		nkeys < 1 || ttl_s < 1 || (workload == W_REDIS) != (redis_socket != NULL))
		usage();

	clients = calloc(nclients, sizeof(Client));
	if (clients == NULL)
		die("out of memory", NULL);
	pthread_barrier_init(&ready, NULL, nclients + 1);
	pthread_barrier_init(&go, NULL, nclients + 1);
	for (i = 0; i < nclients; i++)
	{
		clients[i].id = i;
		clients[i].rng = seed + (uint64_t) i * 0x632be59bd9b4e019ULL;
		if (pthread_create(&clients[i].thread, NULL, client_main, &clients[i]) != 0)
			die("pthread_create failed", strerror(errno));
	}
	/* every client is connected and prepared: start the clock */
	pthread_barrier_wait(&ready);
	deadline = now_ns() + (int64_t) seconds * 1000000000;
	pthread_barrier_wait(&go);
	for (i = 0; i < nclients; i++)
	{
		pthread_join(clients[i].thread, NULL);
		cycles += clients[i].cycles;
		busy += clients[i].busy;
	}

	all = malloc((cycles ? cycles : 1) * sizeof(double));
	if (all == NULL)
		die("out of memory", NULL);
	for (i = 0; i < nclients; i++)
	{
		memcpy(all + nlat, clients[i].lat_ms, clients[i].nlat * sizeof(double));
		nlat += clients[i].nlat;
	}
	qsort(all, nlat, sizeof(double), cmp_double);

	printf("workload %s\n", workload_names[workload]);
	printf("clients %d\n", nclients);
	printf("seconds %d\n", seconds);
	printf("cycles %ld\n", cycles);
	printf("cycles_per_s %.1f\n", (double) cycles / seconds);
	printf("busy %ld\n", busy);
	printf("busy_per_s %.1f\n", (double) busy / seconds);
	printf("p50_ms %.3f\n", percentile(all, nlat, 50));
	printf("p99_ms %.3f\n", percentile(all, nlat, 99));
	printf("max_ms %.3f\n", nlat ? all[nlat - 1] : 0.0);
	return 0;
}
