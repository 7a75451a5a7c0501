/*-------------------------------------------------------------------------
 *
 * dlock-chaos.c
 *	  A chaos checker for dlock: workers write under short leases while a
 *	  nemesis stops them, kills their backends and crashes the server; at
 *	  the end the invariants are checked from the database and the logs.
 *
 * Worker processes loop: grant a key for 100-500 ms (try_acquire, or
 * acquire with a short wait), then one to three read-modify-write
 * transactions on a counter row and an appended history row, both on
 * tables protected by dlock.fence_guard, presenting the token either with
 * dlock.use_fence or in the token column; sometimes renew between them,
 * sometimes pause past the lease's expiry before the write or inside its
 * transaction; then release, or let the lease run out.  Each operation is
 * one fixed-size record in the worker's own log file, with the
 * CLOCK_MONOTONIC times (comparable across processes on one machine) of
 * its invocation, of each fenced statement and of its completion.
 *
 * The main process is the nemesis: it SIGSTOPs workers for longer than any
 * TTL, pg_terminate_backend()s their backends and, given the data
 * directory and pg_ctl, crash-restarts the server (immediate stop, SIGKILL
 * of the postmaster, SIGKILL of a backend).  An operation whose outcome
 * cannot be known (the connection died during a grant, a renewal, a
 * release or a COMMIT) is indeterminate: the checker allows both outcomes.
 *
 * The lease's expiry is judged twice.  From the client's side: it is before
 * (completion of the last grant or renewal that may have succeeded) + TTL,
 * since the server computed it from its clock at some moment before that
 * completion.  By the server's clock: the history row's written_at
 * (clock_timestamp() when the INSERT ran) must be before the expires_at
 * that the lease's last grant or renewal returned.
 *
 * Exclusion is judged by the server's clock too: each acknowledged grant of
 * a key must come at or after the end (or the release) of the key's
 * previous acknowledged lease, by token: crash-restarts included, which in
 * memory mode is the horizon's promise.
 *
 * With --forge, a forger process presents forged tokens (0, -1, never
 * issued, a key's last token before a crash in memory mode), quickest while
 * the horizon holds every key after a restart: none may be accepted.  With
 * --switch-modes, half of the restarts come back in the other storage mode.
 *
 * --sabotage breaks one property for real (debug), so that the check must
 * report it: CI shows each check firing that way.
 *
 * --workload election (issue 20) replaces the workers' loop: campaigners
 * dlock.campaign for a few elections and, while leader, renew, proclaim an
 * increasing value and write rows WHERE dlock.fenced(election, epoch) into
 * a history that records the server's clock_timestamp(); observers follow
 * every election with the long poll of dlock.observe, and dlock.leader.
 * The same nemesis runs, and the same checks of grants, tokens, exclusion,
 * expiry and durability apply, with the election's own on top: one client
 * per epoch, epochs and writers never interleaved by the server's clock,
 * no proclaim outside its lease, and what each observer saw never going
 * backwards, never older than what was acknowledged, never a value nobody
 * proclaimed in that epoch.
 *
 * --workload semaphore (issue 20): clients take one of the N permits
 * (permits => N) of a few keys, renew, write rows WHERE dlock.fenced(key,
 * their permit's token) into a history that records the server's
 * clock_timestamp() (and, for a transaction held open, done_at), and
 * release; a fifth of them (readers) take shared leases of other keys, of
 * which the others take the exclusive lease now and then.  The same
 * nemesis and the same checks of tokens, expiry and durability, with the
 * semaphore's own on top: every accepted write's token was granted to its
 * writer; by the server's clock, never more than N permits' writes open
 * at one moment, never more than N permits live; an exclusive lease's
 * writes never overlap another lease's, and no write ends after a later
 * grant that excludes its lease.
 *
 * chaos/dlock-chaos.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres_fe.h"

#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/stringinfo.h"
#include "libpq-fe.h"

#define MAX_WORKERS 64
#define MAX_KEYS 1000
#define MAX_KILLED 4096
#define SHOW_MAX 20				/* violations printed per kind */
#define SLACK_US 2000			/* clock-rate slack when comparing to a
								 * lease's expiry bound */
#define RECONNECT_GIVEUP_S 180	/* a worker that cannot connect this long
								 * gives up */

/* operation types */
#define OP_GRANT	1
#define OP_RENEW	2
#define OP_RELEASE	3
#define OP_WRITE	4
#define OP_FORGE	5			/* the forger: a write or check under a
								 * token no lease of the key can have */
#define OP_PROCLAIM 6			/* election: dlock.proclaim */
#define OP_OBSERVE	7			/* election: a dlock.observe call */
#define OP_LEADER	8			/* election: a dlock.leader call */

/* outcomes */
#define OUT_OK		1			/* granted, renewed, released, committed */
#define OUT_NONE	2			/* key busy, renew NULL, release false */
#define OUT_REFUSED 3			/* LF001 */
#define OUT_FAILED	4			/* certainly had no effect (nemesis error
								 * before COMMIT) */
#define OUT_INDET	5			/* connection lost while it may have taken
								 * effect */
#define OUT_UNEXPECTED 6		/* an error nobody should see */

/* flags */
#define F_USE_FENCE		0x01
#define F_PAUSE_BEFORE	0x02
#define F_PAUSE_INSIDE	0x04
#define F_WAIT			0x08	/* grant by acquire(wait => ...) */

/* the forger's records (OP_FORGE): which token, presented how */
#define F_TOK_ZERO		0x0100	/* token 0 */
#define F_TOK_NEG		0x0200	/* token -1 */
#define F_TOK_NEVER		0x0400	/* a token far above any issued */
#define F_TOK_LAST		0x0800	/* the key's last token acknowledged before
								 * a crash-restart in memory mode */
#define F_TOK_MASK		0x0f00
#define F_VIA_COLUMN	0x1000	/* INSERT with the token in the column */
#define F_VIA_USE_FENCE 0x2000	/* use_fence, then the INSERT */
#define F_VIA_FENCED	0x4000	/* INSERT ... WHERE dlock.fenced(...) */
#define F_VIA_CHECK		0x8000	/* check_fence(...) said true */
#define F_VIA_MASK		0xf000
#define F_MONO			0x10000 /* into the 'monotonic' table */
#define F_MEMORY		0x20000 /* the server was in memory mode */
#define F_HORIZON		0x40000 /* a grant of a fresh key was refused just
								 * before: the horizon held every key */

/* the election workload's records */
#define F_TXN			0x80000 /* write: a transaction of two statements */
#define F_SABOTAGED		0x100000	/* made by a --sabotage */
#define F_NOROW			0x200000	/* observe: wait ran out; leader: no row */
#define F_NOFENCE		0x400000	/* observation: fence NULL */
#define F_NOVALUE		0x800000	/* observation: value NULL */
#define F_ST_HELD		0x1000000	/* observe's state: held (leader: always) */
#define F_ST_RELEASED	0x2000000	/* released */
#define F_ST_EXPIRED	0x4000000	/* expired */
#define F_ST_NONE		0x8000000	/* none: no lease of the key */

/* the semaphore workload's records: the kind of lease (neither: exclusive) */
#define F_PERMITS		0x10000000	/* one of the key's permits */
#define F_SHARED		0x20000000	/* a shared lease */
#define F_KIND_MASK		(F_PERMITS | F_SHARED)

/* One operation of one worker; written to the worker's log as is. */
typedef struct ChaosOp
{
	int64		t_inv;			/* monotonic us: invoked */
	int64		t_done;			/* completed */
	int64		t_fence1;		/* write: first fenced statement invoked */
	int64		t_upd;			/* write: UPDATE of the counter invoked */
	int64		t_ins;			/* write: INSERT of the history row invoked */
	int64		t_commit;		/* write: COMMIT invoked */
	int64		deadline;		/* the lease expires before this */
	int64		expires_srv;	/* grant, renewal: the expires_at returned,
								 * us since the Unix epoch by the server's
								 * clock; 0 if none */
	int64		srv_at;			/* same clock: grant, clock_timestamp()
								 * after the grant (in its statement);
								 * release, before the release */
	int64		fence;
	int64		value;			/* write: counter value written (election:
								 * the write's number in its term);
								 * election value: its n */
	int32		worker;
	int32		op;				/* index of this record in the worker's log */
	int32		key;
	int32		ttl_ms;
	int16		type;
	int16		outcome;
	int32		flags;
	char		sqlstate[8];
	int64		srv_lo;			/* election, server's clock: proclaim,
								 * clock_timestamp() before it;
								 * observation, statement_timestamp() */
	int32		vworker;		/* election value "w<vworker>:<vop>:<n>":
								 * the campaigner, -1 if none, -2 if it
								 * does not parse */
	int32		vop;			/* its grant's record number */
} ChaosOp;

/* options */
static int	duration_s = 60;
static int	nworkers = 8;
static int	nkeys = 4;
static uint64 seed = 0;
static bool seed_given = false;
static const char *dbname = NULL;
static const char *host = NULL;
static const char *port = NULL;
static const char *user = NULL;
static const char *pgdata = NULL;
static const char *pg_ctl = NULL;
static const char *server_log = NULL;
static const char *logdir = NULL;
static bool keep_logs = false;
static bool no_fence = false;
static int	crash_every_s = 10;
static int	nemesis_ms = 300;
static int	sabotage = 0;
static bool forge = false;		/* --forge: run the forger */
static bool switch_modes = false;	/* --switch-modes */
static bool election = false;	/* --workload election */
static int	nobservers = -1;	/* --observers (election), -1 until set */
static int	ncampaigners;		/* the other workers (election) */
static const char *kp = "k";	/* keys in messages: k<n>, or e<n> */
static bool semaphore = false;	/* --workload semaphore */
static int	npermits = 3;		/* --permits (semaphore) */
static bool permits_given = false;
static int	nreaders = -1;		/* --readers (semaphore), -1 until set */
static int	nrw = 0;			/* semaphore: shared/exclusive keys, numbered
								 * after the nkeys semaphore keys */
static int64 el_floor = 0;		/* election: every lease from before the
								 * run has a token up to this one */
static char seq_at_start[32] = "1";	/* dlock.fence_seq before the run */

/* --sabotage kinds (debug: each breaks a property the check must catch) */
#define S_SETVAL		0x01	/* setval the token sequence back mid-run */
#define S_DELETE		0x02	/* delete an acknowledged write's history row */
#define S_FORGE			0x04	/* insert a history row nobody wrote */
#define S_SERVERLOG		0x08	/* append a "terminated by signal 11" line */
#define S_SUPERSEDED	0x10	/* write, fence bypassed, after a newer grant */
#define S_EXPIRED		0x20	/* write, fence bypassed, after the expiry */
#define S_ASYNC			0x40	/* synchronous_commit = off, crash after acks */
#define S_STEAL			0x80	/* dlock.forget a live lease, grant it again */
#define S_FORGE_BYPASS	0x100	/* a forged write with fence_bypass */
#define S_USURP			0x200	/* election: write under another's epoch */
#define S_PROCLAIM_BACK 0x400	/* election: proclaim a lower value */
#define S_STALE_PROCLAIM 0x800	/* election: an old epoch's value proclaimed
								 * under a newer one */
#define S_BORROW		0x1000	/* semaphore: write under another client's
								 * permit */
#define S_OVERCOMMIT	0x2000	/* semaphore: N + 1 permits, written under
								 * at once */
#define S_LOST_RENEWAL	0x4000	/* semaphore: write on after a renewal said
								 * NULL */
#define S_STALE_READER	0x8000	/* semaphore: a shared holder writes on
								 * after an exclusive grant */

static const struct
{
	const char *name;
	int			flag;
}			sabotage_kinds[] = {
	{"setval", S_SETVAL},
	{"delete-history", S_DELETE},
	{"forge-history", S_FORGE},
	{"server-log", S_SERVERLOG},
	{"superseded", S_SUPERSEDED},
	{"expired", S_EXPIRED},
	{"async-commit", S_ASYNC},
	{"steal", S_STEAL},
	{"forge", S_FORGE_BYPASS},
	{"usurp", S_USURP},
	{"proclaim-back", S_PROCLAIM_BACK},
	{"stale-proclaim", S_STALE_PROCLAIM},
	{"borrow", S_BORROW},
	{"overcommit", S_OVERCOMMIT},
	{"lost-renewal", S_LOST_RENEWAL},
	{"stale-reader", S_STALE_READER},
};

/* state */
static volatile sig_atomic_t stop_requested = 0;
static int64 start_us;
static int64 end_us;
static char logdir_buf[MAXPGPATH];
static pid_t worker_pids[MAX_WORKERS + 1];	/* the forger's last */
static int64 stopped_until[MAX_WORKERS];
static uint64 rng_state;

/* nemesis counts */
static long n_sigstops = 0;
static long n_terminates = 0;
static long n_crash_immediate = 0;
static long n_crash_pmkill = 0;
static long n_crash_backendkill = 0;
static int	killed_pids[MAX_KILLED];
static int	nkilled = 0;
static long server_log_start = 0;
static long n_clean_restarts = 0;
static long n_switches = 0;
static bool memory_mode = false;	/* the server's dlock.storage now */

/*
 * Shared by every process of the run (an anonymous shared mapping made
 * before the fork): what the workers acknowledged, what the nemesis did.
 */
typedef struct ChaosShared
{
	int64		acked_writes;	/* writes whose COMMIT returned, for
								 * async-commit */
	int64		key_token[MAX_KEYS];	/* per key, the largest token of an
										 * acknowledged grant */
	int64		last_token[MAX_KEYS];	/* key_token when the last crash
										 * began */
	int64		back_at;		/* monotonic: the server came back from the
								 * last crash-restart */
	int64		restart_us;		/* how long the longest crash-restart took */
	int			pre_memory;		/* in memory mode when it began */
	int			generation;		/* crash-restarts completed */
} ChaosShared;

static ChaosShared *shared;
static volatile int64 *acked_writes;	/* &shared->acked_writes */
#define MAX_CRASHES 4096
static int64 crash_at[MAX_CRASHES][2];	/* monotonic: crash begun, server
										 * back */
static bool crash_pre_memory[MAX_CRASHES];	/* in memory mode when it began */
static bool crash_switch[MAX_CRASHES];	/* came back in the other mode */
static int	ncrashes = 0;

/* Raise *p to at least v, atomically. */
static void
atomic_max(int64 *p, int64 v)
{
	int64		old = *(volatile int64 *) p;

	while (old < v)
	{
		int64		seen = __sync_val_compare_and_swap(p, old, v);

		if (seen == old)
			break;
		old = seen;
	}
}

/* Microseconds on CLOCK_MONOTONIC, the same clock in every process. */
static int64
now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* splitmix64: small, seedable, the same sequence on every platform. */
static uint64
rnd(void)
{
	uint64		z = (rng_state += UINT64CONST(0x9E3779B97F4A7C15));

	z = (z ^ (z >> 30)) * UINT64CONST(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64CONST(0x94D049BB133111EB);
	return z ^ (z >> 31);
}

/* A random integer in [lo, hi]. */
static int64
rnd_range(int64 lo, int64 hi)
{
	return lo + (int64) (rnd() % (uint64) (hi - lo + 1));
}

/* True with probability p. */
static bool
chance(double p)
{
	return (rnd() >> 11) * (1.0 / 9007199254740992.0) < p;
}

/*
 * Sleep until monotonic time t (us), or until a stop is requested.  An
 * absolute deadline, so that a SIGSTOP in the middle does not lengthen it.
 */
static void
sleep_until(int64 t)
{
	struct timespec ts;

	ts.tv_sec = t / 1000000;
	ts.tv_nsec = (t % 1000000) * 1000;
	while (!stop_requested &&
		   clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* Notice processor: the server's warnings during crashes are expected. */
static void
ignore_notice(void *arg, const char *message)
{
}

/* Signal handler: ask the loop we are in to finish. */
static void
handle_stop(SIGNAL_ARGS)
{
	stop_requested = 1;
}

/*
 * Connect with the command line's options.  Timeouts keep a worker from
 * hanging on a server that is down or hung: connect_timeout for the
 * connection, statement_timeout for every statement.  Returns NULL (and
 * prints nothing) when the connection fails, unless verbose.
 */
static PGconn *
connect_db(const char *appname, bool verbose)
{
	const char *keywords[10];
	const char *values[10];
	int			n = 0;
	PGconn	   *conn;
	bool		async = (sabotage & S_ASYNC) &&
		strncmp(appname, "dlock-chaos-w", 13) == 0;

	keywords[n] = "dbname";
	values[n++] = dbname;
	keywords[n] = "host";
	values[n++] = host;
	keywords[n] = "port";
	values[n++] = port;
	keywords[n] = "user";
	values[n++] = user;
	keywords[n] = "connect_timeout";
	values[n++] = "5";
	keywords[n] = "application_name";
	values[n++] = appname;
	keywords[n] = "options";
	/* --sabotage=async-commit: the workers' commits are not durable */
	values[n++] = async ?
		"-c statement_timeout=20s -c idle_in_transaction_session_timeout=60s -c synchronous_commit=off" :
		"-c statement_timeout=20s -c idle_in_transaction_session_timeout=60s";
	keywords[n] = NULL;
	values[n] = NULL;

	conn = PQconnectdbParams(keywords, values, 1);
	if (PQstatus(conn) != CONNECTION_OK)
	{
		if (verbose)
			fprintf(stderr, "dlock-chaos: cannot connect: %s", PQerrorMessage(conn));
		PQfinish(conn);
		return NULL;
	}
	PQsetNoticeProcessor(conn, ignore_notice, NULL);
	return conn;
}

/* Is this SQLSTATE one that the nemesis causes (a lost connection)? */
static bool
nemesis_state(const char *state)
{
	return state[0] == '\0' || strncmp(state, "08", 2) == 0 ||
		strcmp(state, "57P01") == 0 || strcmp(state, "57P02") == 0 ||
		strcmp(state, "57P03") == 0;
}

/* result classes of run() */
#define RC_OK		0
#define RC_LOST		1			/* connection lost or nemesis error */
#define RC_LF001		2
#define RC_BUSY		3			/* 55P03 */
#define RC_OTHER		4			/* unexpected */

/*
 * Run one statement; return its class, put the result (or NULL) in *res
 * and the SQLSTATE in state.  An unexpected error is printed at once.
 */
static int
run(PGconn *conn, const char *sql, int nparams, const char *const *params,
	PGresult **res, char *state, int worker)
{
	PGresult   *r;
	const char *s;

	state[0] = '\0';
	r = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
	*res = r;
	if (r != NULL && (PQresultStatus(r) == PGRES_TUPLES_OK ||
					  PQresultStatus(r) == PGRES_COMMAND_OK))
		return RC_OK;
	s = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
	if (s != NULL)
		strlcpy(state, s, 8);
	if (nemesis_state(state) || PQstatus(conn) != CONNECTION_OK)
		return RC_LOST;
	if (strcmp(state, "LF001") == 0)
		return RC_LF001;
	if (strcmp(state, "55P03") == 0)
		return RC_BUSY;
	fprintf(stderr, "dlock-chaos: VIOLATION: worker %d: unexpected error %s in \"%.60s\": %s",
			worker, state, sql, r ? PQresultErrorMessage(r) : PQerrorMessage(conn));
	return RC_OTHER;
}

/* A worker's lease as the worker believes it to be. */
typedef struct Lease
{
	int			key;
	int			ttl_ms;
	int64		fence;
	char		owner[64];
	int64		deadline;
	bool		written;		/* a write was tried under it */
	int			grant_op;		/* election: its grant's record number */
	int64		n;				/* election: the last value proclaimed */
	int			nwrites;		/* election, semaphore: writes tried under
								 * it */
	int32		kind;			/* semaphore: F_PERMITS, F_SHARED or 0
								 * (exclusive); copied into its records */
	int64		other_fence;	/* semaphore, --sabotage=stale-reader: the
								 * exclusive lease whose write to wait for */
	int64		grant_inv;		/* semaphore: its grant was invoked (the
								 * checker's certainly-live bound starts
								 * there) */
} Lease;

static FILE *oplog;
static int	op_seq = 0;
static int	my_worker;

/*
 * The lease key of key number k; with --workload election, of election
 * number k.
 */
static void
key_name(char *buf, size_t size, int k)
{
	if (semaphore)
		snprintf(buf, size, k < nkeys ? "dlock-chaos:s%d" : "dlock-chaos:r%d",
				 k < nkeys ? k : k - nkeys);
	else
		snprintf(buf, size, election ? "dlock-chaos:e%d" : "dlock-chaos:k%d", k);
}

/*
 * Key number k's name in messages and in the history tables: k<n>, e<n>;
 * semaphore workload, s<n> for a semaphore key, r<n> for a shared/exclusive
 * one (palloc'd).
 */
static const char *
kname(int k)
{
	if (semaphore)
		return k < nkeys ? psprintf("s%d", k) : psprintf("r%d", k - nkeys);
	return psprintf("%s%d", kp, k);
}

/* Start a record. */
static void
op_begin(ChaosOp *r, int type, const Lease *l)
{
	memset(r, 0, sizeof(*r));
	r->type = type;
	r->worker = my_worker;
	r->op = op_seq++;
	r->key = l->key;
	r->ttl_ms = l->ttl_ms;
	r->fence = l->fence;
	r->deadline = l->deadline;
	r->flags = l->kind;
	r->t_inv = now_us();
}

/* Finish a record and append it to the worker's log. */
static void
op_end(ChaosOp *r, int outcome, const char *state)
{
	r->t_done = now_us();
	r->outcome = outcome;
	if (state)
		strlcpy(r->sqlstate, state, sizeof(r->sqlstate));
	if (fwrite(r, sizeof(*r), 1, oplog) != 1)
	{
		fprintf(stderr, "dlock-chaos: worker %d: cannot write its log: %m\n", my_worker);
		exit(3);
	}
}

/*
 * Grant key (a random one if key < 0) with a random TTL.  Returns RC_OK
 * with *l filled, or another class.  With --workload election, campaign
 * for election key instead (dlock.campaign, waiting 20-600 ms), with the
 * value "w<worker>:<this record's number>:0".
 */
static int
do_grant(PGconn *conn, Lease *l, int key)
{
	ChaosOp		r;
	char		keybuf[64],
				ttlbuf[32],
				waitbuf[32],
				holder[32],
				value[64];
	const char *params[5];
	PGresult   *res;
	char		state[8];
	int			rc;
	bool		wait = chance(0.2);

	memset(l, 0, sizeof(*l));
	l->key = key >= 0 ? key : (int) rnd_range(0, nkeys - 1);
	l->ttl_ms = (int) rnd_range(100, 500);
	key_name(keybuf, sizeof(keybuf), l->key);
	snprintf(ttlbuf, sizeof(ttlbuf), "%d ms", l->ttl_ms);
	snprintf(waitbuf, sizeof(waitbuf), "%d ms",
			 (int) (election ? rnd_range(20, 600) : rnd_range(50, 300)));
	snprintf(holder, sizeof(holder), "w%d", my_worker);
	op_begin(&r, OP_GRANT, l);
	l->grant_op = r.op;
	if (election)
	{
		r.flags |= F_WAIT;
		r.vworker = my_worker;
		r.vop = r.op;
		snprintf(value, sizeof(value), "w%d:%d:0", my_worker, r.op);
		params[0] = keybuf;
		params[1] = value;
		params[2] = ttlbuf;
		params[3] = waitbuf;
		params[4] = holder;
		rc = run(conn, "SELECT owner, fence, (extract(epoch FROM expires_at) * 1000000)::bigint, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint FROM dlock.campaign($1, $2, $3::interval, wait => $4::interval, holder => $5)",
				 5, params, &res, state, my_worker);
	}
	else if (wait)
	{
		r.flags |= F_WAIT;
		params[0] = keybuf;
		params[1] = ttlbuf;
		params[2] = waitbuf;
		params[3] = holder;
		rc = run(conn, "SELECT owner, fence, (extract(epoch FROM expires_at) * 1000000)::bigint, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint FROM dlock.acquire($1, $2::interval, wait => $3::interval, holder => $4)",
				 4, params, &res, state, my_worker);
	}
	else
	{
		params[0] = keybuf;
		params[1] = ttlbuf;
		params[2] = holder;
		rc = run(conn, "SELECT owner, fence, (extract(epoch FROM expires_at) * 1000000)::bigint, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint FROM dlock.try_acquire($1, $2::interval, holder => $3)",
				 3, params, &res, state, my_worker);
	}
	if (rc == RC_OK && PQntuples(res) == 1)
	{
		strlcpy(l->owner, PQgetvalue(res, 0, 0), sizeof(l->owner));
		l->fence = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
		r.fence = l->fence;
		r.expires_srv = strtoll(PQgetvalue(res, 0, 2), NULL, 10);
		/* evaluated after the function in FROM returned: after the grant */
		r.srv_at = strtoll(PQgetvalue(res, 0, 3), NULL, 10);
		op_end(&r, OUT_OK, state);
		l->deadline = r.t_done + (int64) l->ttl_ms * 1000;
		/* for the forger: the key's latest acknowledged token */
		atomic_max(&shared->key_token[l->key], l->fence);
	}
	else if (rc == RC_OK || rc == RC_BUSY)
	{
		op_end(&r, OUT_NONE, state);
		rc = RC_BUSY;
	}
	else
		op_end(&r, rc == RC_LOST ? OUT_INDET : OUT_UNEXPECTED, state);
	PQclear(res);
	return rc;
}

/*
 * Semaphore workload: grant key (a semaphore key, or a shared/exclusive
 * one) as kind says: one of its permits (permits => permits), a shared
 * lease, or (0) its exclusive lease, for ttl_ms (0: a random 100-500 ms),
 * with try_acquire (wait_ms < 0) or acquire waiting up to wait_ms.  The
 * server's clock is read after the grant, in its statement, as do_grant
 * does.  Returns RC_OK with *l filled, RC_BUSY (no row, or the wait ran
 * out) or another class.
 */
static int
do_sem_grant(PGconn *conn, Lease *l, int key, int kind, int permits,
			 int ttl_ms, int wait_ms)
{
	ChaosOp		r;
	char		keybuf[64],
				ttlbuf[32],
				waitbuf[32],
				holder[32],
				pbuf[16];
	const char *params[6];
	PGresult   *res;
	char		state[8];
	int			rc;

	memset(l, 0, sizeof(*l));
	l->key = key;
	l->kind = kind;
	l->ttl_ms = ttl_ms > 0 ? ttl_ms : (int) rnd_range(100, 500);
	key_name(keybuf, sizeof(keybuf), key);
	snprintf(ttlbuf, sizeof(ttlbuf), "%d ms", l->ttl_ms);
	snprintf(waitbuf, sizeof(waitbuf), "%d ms", Max(wait_ms, 0));
	snprintf(holder, sizeof(holder), "w%d", my_worker);
	snprintf(pbuf, sizeof(pbuf), "%d", kind == F_PERMITS ? permits : 1);
	params[0] = keybuf;
	params[1] = ttlbuf;
	params[2] = holder;
	params[3] = pbuf;
	params[4] = kind == F_SHARED ? "shared" : "exclusive";
	params[5] = waitbuf;
	op_begin(&r, OP_GRANT, l);
	l->grant_op = r.op;
	l->grant_inv = r.t_inv;
	if (wait_ms >= 0)
	{
		r.flags |= F_WAIT;
		rc = run(conn, "SELECT owner, fence, (extract(epoch FROM expires_at) * 1000000)::bigint, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint FROM dlock.acquire($1, $2::interval, wait => $6::interval, holder => $3, permits => $4::int, mode => $5)",
				 6, params, &res, state, my_worker);
	}
	else
		rc = run(conn, "SELECT owner, fence, (extract(epoch FROM expires_at) * 1000000)::bigint, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint FROM dlock.try_acquire($1, $2::interval, holder => $3, permits => $4::int, mode => $5)",
				 5, params, &res, state, my_worker);
	if (rc == RC_OK && PQntuples(res) == 1)
	{
		strlcpy(l->owner, PQgetvalue(res, 0, 0), sizeof(l->owner));
		l->fence = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
		r.fence = l->fence;
		r.expires_srv = strtoll(PQgetvalue(res, 0, 2), NULL, 10);
		/* evaluated after the function in FROM returned: after the grant */
		r.srv_at = strtoll(PQgetvalue(res, 0, 3), NULL, 10);
		op_end(&r, OUT_OK, state);
		l->deadline = r.t_done + (int64) l->ttl_ms * 1000;
	}
	else if (rc == RC_OK || rc == RC_BUSY)
	{
		op_end(&r, OUT_NONE, state);
		rc = RC_BUSY;
	}
	else
		op_end(&r, rc == RC_LOST ? OUT_INDET : OUT_UNEXPECTED, state);
	PQclear(res);
	return rc;
}

/* Renew the lease; returns the class, RC_BUSY when it was lost. */
static int
do_renew(PGconn *conn, Lease *l)
{
	ChaosOp		r;
	char		keybuf[64],
				ttlbuf[32];
	const char *params[3];
	PGresult   *res;
	char		state[8];
	int			rc;
	int64		newdl;

	key_name(keybuf, sizeof(keybuf), l->key);
	snprintf(ttlbuf, sizeof(ttlbuf), "%d ms", l->ttl_ms);
	params[0] = keybuf;
	params[1] = l->owner;
	params[2] = ttlbuf;
	op_begin(&r, OP_RENEW, l);
	rc = run(conn, "SELECT (extract(epoch FROM dlock.renew($1, $2::uuid, $3::interval)) * 1000000)::bigint",
			 3, params, &res, state, my_worker);
	newdl = now_us() + (int64) l->ttl_ms * 1000;
	if (rc == RC_OK && !PQgetisnull(res, 0, 0))
	{
		r.expires_srv = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
		op_end(&r, OUT_OK, state);
		l->deadline = Max(l->deadline, newdl);
	}
	else if (rc == RC_OK)
	{
		op_end(&r, OUT_NONE, state);
		rc = RC_BUSY;
	}
	else
	{
		op_end(&r, rc == RC_LOST ? OUT_INDET : OUT_UNEXPECTED, state);
		/* it may have been renewed: the bound must cover that */
		l->deadline = Max(l->deadline, newdl);
	}
	PQclear(res);
	return rc;
}

/* Release the lease. */
static int
do_release(PGconn *conn, Lease *l)
{
	ChaosOp		r;
	char		keybuf[64];
	const char *params[2];
	PGresult   *res;
	char		state[8];
	int			rc;

	key_name(keybuf, sizeof(keybuf), l->key);
	params[0] = keybuf;
	params[1] = l->owner;
	op_begin(&r, OP_RELEASE, l);

	/*
	 * The server's clock before the release (the target list is evaluated
	 * in order; and the release is seen by others only once it commits).
	 */
	rc = run(conn, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, dlock.release($1, $2::uuid)",
			 2, params, &res, state, my_worker);
	if (rc == RC_OK)
	{
		r.srv_at = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
		op_end(&r, strcmp(PQgetvalue(res, 0, 1), "t") == 0 ? OUT_OK : OUT_NONE, state);
	}
	else
		op_end(&r, rc == RC_LOST ? OUT_INDET : OUT_UNEXPECTED, state);
	PQclear(res);
	return rc;
}

/* End a failed transaction; a lost connection is dealt with by the caller. */
static void
rollback(PGconn *conn)
{
	PGresult   *res = PQexec(conn, "ROLLBACK");

	PQclear(res);
}

/*
 * A fenced write that failed with rc: record its outcome (failed when the
 * connection was lost, refused for LF001, unexpected otherwise) and roll
 * its transaction back if the connection is still there.  Returns rc.
 */
static int
write_failed(PGconn *conn, ChaosOp *r, int rc, const char *state)
{
	if (rc == RC_LOST)
		op_end(r, OUT_FAILED, state);
	else
	{
		op_end(r, rc == RC_LF001 ? OUT_REFUSED : OUT_UNEXPECTED, state);
		rollback(conn);
	}
	return rc;
}

/*
 * One read-modify-write transaction under the lease: read the key's
 * counter, write counter + 1 to it and append it to the history.  Returns
 * RC_OK (committed), RC_LF001 (refused: the lease is lost), RC_LOST, RC_OTHER.
 * With bypass (--sabotage), no pause, and the fencing trigger is bypassed
 * (dlock.fence_bypass): the write is accepted whatever the lease.
 */
static int
do_write(PGconn *conn, Lease *l, bool bypass)
{
	ChaosOp		r;
	char		kbuf[32],
				keybuf[64],
				fbuf[32],
				vbuf[32],
				wbuf[16],
				obuf[16];
	const char *params[6];
	PGresult   *res = NULL;
	char		state[8];
	int			rc;
	int			pause = (int) rnd_range(0, 9);	/* 0: before, 1: inside */
	int64		value;

	snprintf(kbuf, sizeof(kbuf), "k%d", l->key);
	snprintf(keybuf, sizeof(keybuf), "dlock-chaos:k%d", l->key);
	snprintf(fbuf, sizeof(fbuf), INT64_FORMAT, l->fence);
	if (bypass)
		pause = 2;

	/*
	 * The token column presents a token only when the UPDATE changes it, so
	 * a second write under the same lease uses use_fence.
	 */
	if (pause == 0)
	{
		sleep_until(l->deadline + rnd_range(5, 150) * 1000);
		/* told to stop in the middle: this is no longer a stale write */
		if (stop_requested)
			return RC_BUSY;
	}
	op_begin(&r, OP_WRITE, l);

	/*
	 * A bypassing write presents its token in the column only: use_fence
	 * would refuse it (fence_bypass lets writes through the trigger, not
	 * use_fence), and the sabotage would have to wait for another lease.
	 */
	if (!bypass && (l->written || chance(0.5)))
		r.flags |= F_USE_FENCE;
	if (pause == 0)
		r.flags |= F_PAUSE_BEFORE;
	l->written = true;

	rc = run(conn, "BEGIN", 0, NULL, &res, state, my_worker);
	if (rc != RC_OK)
		goto failed;
	PQclear(res);
	if (bypass)
	{
		rc = run(conn, "SET LOCAL dlock.fence_bypass = on", 0, NULL, &res,
				 state, my_worker);
		if (rc != RC_OK)
			goto failed;
		PQclear(res);
	}
	if (r.flags & F_USE_FENCE)
	{
		params[0] = keybuf;
		params[1] = fbuf;
		r.t_fence1 = now_us();
		rc = run(conn, "SELECT dlock.use_fence($1, $2::bigint)", 2, params,
				 &res, state, my_worker);
		if (rc != RC_OK)
			goto failed;
		PQclear(res);
	}
	params[0] = kbuf;
	rc = run(conn, "SELECT value FROM dlock_chaos_counter WHERE k = $1", 1,
			 params, &res, state, my_worker);
	if (rc != RC_OK)
		goto failed;
	if (PQntuples(res) != 1)
	{
		fprintf(stderr, "dlock-chaos: VIOLATION: worker %d: counter row of %s missing\n",
				my_worker, kbuf);
		strlcpy(state, "ROW", sizeof(state));
		rc = RC_OTHER;
		goto failed;
	}
	value = strtoll(PQgetvalue(res, 0, 0), NULL, 10) + 1;
	PQclear(res);
	r.value = value;
	if (pause == 1)
	{
		sleep_until(l->deadline + rnd_range(5, 150) * 1000);
		if (!stop_requested)
			r.flags |= F_PAUSE_INSIDE;
	}
	snprintf(vbuf, sizeof(vbuf), INT64_FORMAT, value);
	params[0] = kbuf;
	params[1] = vbuf;
	params[2] = fbuf;
	r.t_upd = now_us();
	if (r.t_fence1 == 0)
		r.t_fence1 = r.t_upd;
	if (r.flags & F_USE_FENCE)
		rc = run(conn, "UPDATE dlock_chaos_counter SET value = $2 WHERE k = $1",
				 2, params, &res, state, my_worker);
	else
		rc = run(conn, "UPDATE dlock_chaos_counter SET value = $2, fence = $3 WHERE k = $1",
				 3, params, &res, state, my_worker);
	if (rc != RC_OK)
		goto failed;
	PQclear(res);
	snprintf(wbuf, sizeof(wbuf), "%d", my_worker);
	snprintf(obuf, sizeof(obuf), "%d", r.op);
	params[3] = wbuf;
	params[4] = obuf;
	r.t_ins = now_us();
	rc = run(conn, "INSERT INTO dlock_chaos_history (k, value, fence, worker, op) VALUES ($1, $2, $3, $4, $5)",
			 5, params, &res, state, my_worker);
	if (rc != RC_OK)
		goto failed;
	PQclear(res);
	r.t_commit = now_us();
	rc = run(conn, "COMMIT", 0, NULL, &res, state, my_worker);
	PQclear(res);
	if (rc == RC_OK)
	{
		op_end(&r, OUT_OK, state);
		/* the record is in the stdio buffer: it is read after we exit */
		__sync_fetch_and_add(acked_writes, 1);

		/*
		 * --sabotage=async-commit: give the nemesis time to crash the server
		 * before our next grant's synchronous flush writes this commit out.
		 */
		if (sabotage & S_ASYNC)
			sleep_until(now_us() + 20000);
	}
	else
		op_end(&r, rc == RC_LOST ? OUT_INDET : OUT_UNEXPECTED, state);
	return rc;

failed:
	PQclear(res);
	return write_failed(conn, &r, rc, state);
}

/* how do_el_write writes */
#define EW_NORMAL	0			/* WHERE dlock.fenced, pauses, one in two
								 * in a transaction */
#define EW_FENCED	1			/* WHERE dlock.fenced, no pause, autocommit */
#define EW_NOFENCE	2			/* --sabotage: no dlock.fenced, no pause,
								 * autocommit */
#define EW_USURP	3			/* --sabotage=usurp: fenced, a transaction
								 * held open 400 ms */
#define EW_STALE_HOLD 4			/* --sabotage=stale-reader: no
								 * dlock.fenced, a transaction held open */

/* the semaphore workload's writes (do_el_write, sabotage_overcommit) */
#define SEM_INSERT_FENCED "INSERT INTO dlock_chaos_semaphore (k, fence, worker, op, seq) SELECT $1, $2::bigint, $3::int, $4::int, $5::int WHERE dlock.fenced($6, $2::bigint)"
#define SEM_INSERT "INSERT INTO dlock_chaos_semaphore (k, fence, worker, op, seq) VALUES ($1, $2, $3, $4, $5)"
#define SEM_DONE "UPDATE dlock_chaos_semaphore SET done_at = clock_timestamp() WHERE worker = $1::int AND op = $2::int"

/*
 * Proclaim value n, "w<worker>:<grant's record number>:<n>", as the leader
 * of l's election (dlock.proclaim); the server's clock is read just before
 * (the target list is evaluated in order).  Returns RC_OK (true), RC_BUSY
 * (false: not the holder of a live lease) or another class.
 */
static int
do_proclaim(PGconn *conn, Lease *l, int64 n, int flags)
{
	ChaosOp		r;
	char		keybuf[64],
				value[64];
	const char *params[3];
	PGresult   *res;
	char		state[8];
	int			rc;

	key_name(keybuf, sizeof(keybuf), l->key);
	op_begin(&r, OP_PROCLAIM, l);
	r.flags |= flags;
	r.value = n;
	r.vworker = my_worker;
	r.vop = l->grant_op;
	snprintf(value, sizeof(value), "w%d:%d:" INT64_FORMAT, my_worker, l->grant_op, n);
	params[0] = keybuf;
	params[1] = l->owner;
	params[2] = value;
	rc = run(conn, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, dlock.proclaim($1, $2::uuid, $3)",
			 3, params, &res, state, my_worker);
	/* whatever happened, the next value is larger */
	l->n = Max(l->n, n);
	if (rc == RC_OK)
	{
		r.srv_lo = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
		if (strcmp(PQgetvalue(res, 0, 1), "t") == 0)
			op_end(&r, OUT_OK, state);
		else
		{
			op_end(&r, OUT_NONE, state);
			rc = RC_BUSY;
		}
	}
	else
		op_end(&r, rc == RC_LOST ? OUT_INDET : OUT_UNEXPECTED, state);
	PQclear(res);
	return rc;
}

/*
 * A write of the election's history under l (election workload): a row
 * (election, epoch, worker, op, seq) INSERTed WHERE dlock.fenced(key,
 * epoch); its written_at, the server's clock_timestamp(), is taken after
 * the token was checked.  Half of the writes are one statement in
 * autocommit; the others a transaction that does some work and then sets
 * done_at = clock_timestamp() before its COMMIT: [written_at, done_at] is
 * a time the writer was inside the fence, which no other client's accepted
 * write may overlap.  One in ten pauses past the lease's end before the
 * INSERT (a stale write: it must be refused), one in ten inside a
 * transaction, after the INSERT (the key's lock is then held through the
 * expiry: the next grant must wait for the COMMIT).  --no-fence leaves
 * dlock.fenced out.  Mode EW_FENCED is one fenced statement without a
 * pause, EW_NOFENCE the same without dlock.fenced (--sabotage=expired,
 * superseded); EW_USURP holds its transaction open until another client
 * wrote a row of the same epoch, for up to 2 s, and sets *overlapped if
 * one did.  Returns RC_OK (committed), RC_LF001 (refused), RC_LOST,
 * RC_OTHER, or RC_BUSY if told to stop during the pause before.
 *
 * The semaphore workload writes its own history the same way, a row (key,
 * fence, worker, op, seq) into dlock_chaos_semaphore, seven writes in ten
 * in a transaction held open up to 0.3 TTL (so that the holders' writes
 * overlap); EW_STALE_HOLD writes without dlock.fenced in a transaction
 * held open until a row under l->other_fence that ended after it began is
 * there (committed), for up to 2 s, and sets *overlapped if one is.
 */
static int
do_el_write(PGconn *conn, Lease *l, int mode, int flags, bool *overlapped)
{
	ChaosOp		r;
	char		ebuf[32],
				keybuf[64],
				fbuf[32],
				wbuf[16],
				obuf[16],
				sbuf[16];
	const char *params[6];
	PGresult   *res = NULL;
	char		state[8];
	int			rc;
	int			pause = mode == EW_NORMAL ? (int) rnd_range(0, 9) : 2;
	bool		txn = mode == EW_USURP || mode == EW_STALE_HOLD || pause == 1 ||
		(mode == EW_NORMAL && chance(semaphore ? 0.7 : 0.5));
	bool		fence = mode != EW_NOFENCE && mode != EW_STALE_HOLD && !no_fence;

	if (semaphore)
		strlcpy(ebuf, kname(l->key), sizeof(ebuf));
	else
		snprintf(ebuf, sizeof(ebuf), "e%d", l->key);
	key_name(keybuf, sizeof(keybuf), l->key);
	snprintf(fbuf, sizeof(fbuf), INT64_FORMAT, l->fence);
	if (pause == 0)
	{
		sleep_until(l->deadline + rnd_range(5, 150) * 1000);
		/* told to stop in the middle: this is no longer a stale write */
		if (stop_requested)
			return RC_BUSY;
	}
	op_begin(&r, OP_WRITE, l);
	r.flags |= flags;
	if (pause == 0)
		r.flags |= F_PAUSE_BEFORE;
	if (txn)
		r.flags |= F_TXN;
	r.value = ++l->nwrites;
	r.vworker = my_worker;
	r.vop = l->grant_op;
	snprintf(wbuf, sizeof(wbuf), "%d", my_worker);
	snprintf(obuf, sizeof(obuf), "%d", r.op);
	snprintf(sbuf, sizeof(sbuf), INT64_FORMAT, r.value);
	params[0] = ebuf;
	params[1] = fbuf;
	params[2] = wbuf;
	params[3] = obuf;
	params[4] = sbuf;
	params[5] = keybuf;

	if (txn)
	{
		rc = run(conn, "BEGIN", 0, NULL, &res, state, my_worker);
		if (rc != RC_OK)
			goto failed;
		PQclear(res);
		res = NULL;
	}
	r.t_fence1 = r.t_ins = now_us();
	if (fence)
		rc = run(conn, semaphore ? SEM_INSERT_FENCED :
				 "INSERT INTO dlock_chaos_election (election, epoch, worker, op, seq) SELECT $1, $2::bigint, $3::int, $4::int, $5::int WHERE dlock.fenced($6, $2::bigint)",
				 6, params, &res, state, my_worker);
	else
		rc = run(conn, semaphore ? SEM_INSERT :
				 "INSERT INTO dlock_chaos_election (election, epoch, worker, op, seq) VALUES ($1, $2, $3, $4, $5)",
				 5, params, &res, state, my_worker);
	if (!txn)
	{
		/* one statement in autocommit: it committed, or may have */
		r.t_commit = r.t_ins;
		if (rc == RC_OK && strcmp(PQcmdTuples(res), "1") == 0)
		{
			op_end(&r, OUT_OK, state);
			__sync_fetch_and_add(acked_writes, 1);
		}
		else if (rc == RC_OK)
			op_end(&r, OUT_NONE, state);
		else
			op_end(&r, rc == RC_LOST ? OUT_INDET : rc == RC_LF001 ? OUT_REFUSED : OUT_UNEXPECTED, state);
		PQclear(res);
		if (rc == RC_OK && (sabotage & S_ASYNC))
			sleep_until(now_us() + 20000);
		return rc;
	}
	if (rc != RC_OK)
		goto failed;
	PQclear(res);
	res = NULL;
	if (mode == EW_USURP)
	{
		int64		give_up = now_us() + 2000000;

		while (!stop_requested && now_us() < give_up && !*overlapped)
		{
			sleep_until(now_us() + 10000);
			rc = run(conn, "SELECT count(*) FROM dlock_chaos_election WHERE election = $1 AND epoch = $2::bigint AND worker <> $3::int AND written_at > (SELECT written_at FROM dlock_chaos_election WHERE worker = $3::int AND op = $4::int)",
					 4, params, &res, state, my_worker);
			if (rc != RC_OK)
				goto failed;
			*overlapped = strcmp(PQgetvalue(res, 0, 0), "0") != 0;
			PQclear(res);
			res = NULL;
		}
	}
	else if (mode == EW_STALE_HOLD)
	{
		int64		give_up = now_us() + 2000000;
		char		xbuf[32];
		const char *xparams[4];

		snprintf(xbuf, sizeof(xbuf), INT64_FORMAT, l->other_fence);
		xparams[0] = ebuf;
		xparams[1] = xbuf;
		xparams[2] = wbuf;
		xparams[3] = obuf;
		while (!stop_requested && now_us() < give_up && !*overlapped)
		{
			sleep_until(now_us() + 10000);
			rc = run(conn, "SELECT count(*) FROM dlock_chaos_semaphore WHERE k = $1 AND fence = $2::bigint AND coalesce(done_at, written_at) >= (SELECT written_at FROM dlock_chaos_semaphore WHERE worker = $3::int AND op = $4::int)",
					 4, xparams, &res, state, my_worker);
			if (rc != RC_OK)
				goto failed;
			*overlapped = strcmp(PQgetvalue(res, 0, 0), "0") != 0;
			PQclear(res);
			res = NULL;
		}
	}
	else if (pause == 1)
	{
		sleep_until(l->deadline + rnd_range(5, 150) * 1000);
		if (!stop_requested)
			r.flags |= F_PAUSE_INSIDE;
	}
	else
		sleep_until(now_us() + rnd_range(0, l->ttl_ms * (semaphore ? 300 : 100)));
	rc = run(conn, semaphore ? SEM_DONE :
			 "UPDATE dlock_chaos_election SET done_at = clock_timestamp() WHERE worker = $1::int AND op = $2::int",
			 2, params + 2, &res, state, my_worker);
	if (rc != RC_OK)
		goto failed;
	PQclear(res);
	r.t_commit = now_us();
	rc = run(conn, "COMMIT", 0, NULL, &res, state, my_worker);
	PQclear(res);
	if (rc == RC_OK)
	{
		op_end(&r, OUT_OK, state);
		__sync_fetch_and_add(acked_writes, 1);
		if (sabotage & S_ASYNC)
			sleep_until(now_us() + 20000);
	}
	else
		op_end(&r, rc == RC_LOST ? OUT_INDET : OUT_UNEXPECTED, state);
	return rc;

failed:
	PQclear(res);
	return write_failed(conn, &r, rc, state);
}

/*
 * --sabotage=expired and superseded: wait past the lease's expiry (for
 * superseded, grant the key again on this connection: a larger token,
 * acknowledged), then write under the old lease with the fencing trigger
 * bypassed (election: without dlock.fenced, after a fenced write under the
 * new epoch).  Sets *done once such a write has committed.
 */
static int
sabotage_write(PGconn *conn, Lease *l, bool *done)
{
	Lease		l2;
	bool		regranted = false;
	int			rc;

	sleep_until(l->deadline + 30000);
	if (stop_requested)
		return RC_BUSY;
	if (sabotage & S_SUPERSEDED)
	{
		rc = do_grant(conn, &l2, l->key);
		if (rc != RC_OK)
			return rc;
		regranted = true;

		/*
		 * Election: a write under the new epoch first, so that the old
		 * epoch's write comes after a newer one's by the server's clock.
		 */
		if (election)
		{
			rc = do_el_write(conn, &l2, EW_FENCED, F_SABOTAGED, NULL);
			if (rc == RC_LOST)
				return rc;
		}
	}
	rc = election ? do_el_write(conn, l, EW_NOFENCE, F_SABOTAGED, NULL) : do_write(conn, l, true);
	if (rc == RC_OK)
	{
		*done = true;
		printf("dlock-chaos: sabotage: worker %d wrote %s%d with fence " INT64_FORMAT " (%s) after its lease expired%s\n",
			   my_worker, election ? "e" : "k", l->key, l->fence,
			   election ? "without dlock.fenced" : "fence_bypass",
			   regranted ? " and the key was granted again" : "");
	}
	if (regranted && rc != RC_LOST)
	{
		int			rc2 = do_release(conn, &l2);

		if (rc2 == RC_LOST)
			rc = rc2;
	}
	return rc;
}

/*
 * --sabotage=steal: right after the grant of *l was acknowledged, as an
 * administrator would, drop that live lease with dlock.forget() and grant
 * the key again on this connection (a larger token, acknowledged, while the
 * first lease is live by the server's clock), then release the new lease.
 * Nothing is logged about the forget: the check sees two grants of the key
 * whose lives overlap.  Sets *done once the second grant was acknowledged.
 */
static int
sabotage_steal(PGconn *conn, Lease *l, bool *done)
{
	Lease		l2;
	char		keybuf[64];
	const char *params[1];
	PGresult   *res;
	char		state[8];
	int			rc;
	bool		forgotten;

	key_name(keybuf, sizeof(keybuf), l->key);
	params[0] = keybuf;
	rc = run(conn, "SELECT dlock.forget($1)", 1, params, &res, state, my_worker);
	forgotten = rc == RC_OK && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	if (rc != RC_OK)
		return rc;
	/* the lease is certainly still live: the client-side bound is its end */
	if (!forgotten || now_us() > l->deadline - 20000)
		return RC_BUSY;

	/*
	 * Election: the leader proclaims under the lease it still believes it
	 * holds; dlock.proclaim says false while the lease was certainly live.
	 */
	if (election)
	{
		rc = do_proclaim(conn, l, l->n + 1, F_SABOTAGED);
		if (rc == RC_LOST || rc == RC_OTHER)
			return rc;
	}
	rc = do_grant(conn, &l2, l->key);
	if (rc != RC_OK)
		return rc;
	*done = true;
	printf("dlock-chaos: sabotage: worker %d dropped its live lease of %s%d (fence " INT64_FORMAT ") with dlock.forget and was granted it again (fence " INT64_FORMAT ")\n",
		   my_worker, election ? "e" : "k", l->key, l->fence, l2.fence);
	return do_release(conn, &l2);
}

/*
 * Parse an election value "w<worker>:<op>:<n>" into *w, *op, *n; false if
 * it is not one.
 */
static bool
parse_value(const char *s, int32 *w, int32 *op, int64 *n)
{
	char	   *end;
	long		a,
				b;
	long long	c;

	if (s[0] != 'w')
		return false;
	errno = 0;
	a = strtol(s + 1, &end, 10);
	if (end == s + 1 || *end != ':' || errno != 0 || a < 0 || a > PG_INT32_MAX)
		return false;
	s = end + 1;
	b = strtol(s, &end, 10);
	if (end == s || *end != ':' || errno != 0 || b < 0 || b > PG_INT32_MAX)
		return false;
	s = end + 1;
	c = strtoll(s, &end, 10);
	if (end == s || *end != '\0' || errno != 0 || c < 0)
		return false;
	*w = (int32) a;
	*op = (int32) b;
	*n = (int64) c;
	return true;
}

/*
 * Keep the lease l for ms milliseconds, renewing it every third of its TTL.
 * Returns RC_OK, or the class of a renewal that failed.
 */
static int
hold_lease(PGconn *conn, Lease *l, int ms)
{
	int64		until = now_us() + (int64) ms * 1000;

	while (!stop_requested && now_us() < until)
	{
		int			rc;

		sleep_until(Min(until, now_us() + (int64) l->ttl_ms * 1000 / 3));
		rc = do_renew(conn, l);
		if (rc != RC_OK)
			return rc;
	}
	return RC_OK;
}

/*
 * --sabotage=proclaim-back: as the leader, proclaim n + 2 and keep the
 * lease (renewing it) for a second, so that the observers see it; then
 * proclaim n + 1, a value lower than the one before in the same epoch, and
 * keep it a second more; then resign.  Sets *done once both proclaims were
 * acknowledged.
 */
static int
sabotage_proclaim_back(PGconn *conn, Lease *l, bool *done)
{
	int64		n = l->n;
	int			rc;

	rc = do_proclaim(conn, l, n + 2, F_SABOTAGED);
	if (rc == RC_OK)
		rc = hold_lease(conn, l, 1000);
	if (rc == RC_OK)
		rc = do_proclaim(conn, l, n + 1, F_SABOTAGED);
	if (rc != RC_OK)
		return rc;
	*done = true;
	printf("dlock-chaos: sabotage: worker %d proclaimed " INT64_FORMAT ", then " INT64_FORMAT ", in epoch " INT64_FORMAT " of e%d\n",
		   my_worker, n + 2, n + 1, l->fence, l->key);
	rc = hold_lease(conn, l, 1000);
	if (rc != RC_OK)
		return rc;
	return do_release(conn, l);
}

/*
 * --sabotage=stale-proclaim: wait past the lease's expiry, campaign again
 * (a newer epoch, acknowledged), then proclaim the old lease's next value
 * as if the old lease were still held: logged as the old lease's proclaim,
 * but presented with the new lease's owner, so the server accepts it (as
 * it would a stale leader's, if it did not check).  Keep the new lease a
 * second (renewing it) so that the observers see the value, then resign.
 * The check must report a proclaim outside its lease, and observers that
 * saw an old epoch's value under the new one.  Sets *done once the
 * proclaim was acknowledged.
 */
static int
sabotage_stale_proclaim(PGconn *conn, Lease *l, bool *done)
{
	Lease		l2;
	Lease		stale;
	int			rc;

	sleep_until(l->deadline + 30000);
	if (stop_requested)
		return RC_BUSY;
	rc = do_grant(conn, &l2, l->key);
	if (rc != RC_OK)
		return rc;
	stale = *l;
	strlcpy(stale.owner, l2.owner, sizeof(stale.owner));
	rc = do_proclaim(conn, &stale, l->n + 1, F_SABOTAGED);
	if (rc == RC_OK)
	{
		*done = true;
		printf("dlock-chaos: sabotage: worker %d proclaimed epoch " INT64_FORMAT "'s value " INT64_FORMAT " of e%d with the owner of epoch " INT64_FORMAT "\n",
			   my_worker, l->fence, l->n + 1, l->key, l2.fence);
		rc = hold_lease(conn, &l2, 1000);
	}
	if (rc == RC_LOST)
		return rc;
	return do_release(conn, &l2);
}

/*
 * --sabotage=usurp: a campaigner that holds no lease reads dlock.leader of
 * each election, every 10 ms for up to 2 s; in the first one led by
 * another client granted less than 100 ms before, with 30 ms of its lease
 * left, it writes a row under that leader's epoch WHERE
 * dlock.fenced(election, epoch), logged as its own write, in a transaction
 * held open until the leader wrote a row too (for up to 2 s).  Tokens are
 * not secrets, so the server accepts it: the check must report a write
 * under an epoch its client was not granted, and two clients' writes at
 * overlapping moments.  Sets *done once such a write has committed with
 * the leader's inside it (until then, the worker tries again between its
 * terms).
 */
static int
sabotage_usurp(PGconn *conn, bool *done)
{
	int64		give_up = now_us() + 2000000;
	int			e = 0;

	for (;; e = (e + 1) % nkeys)
	{
		char		keybuf[64];
		const char *params[1] = {keybuf};
		PGresult   *res;
		char		state[8];
		int			rc;
		int32		vw,
					vop;
		int64		n,
					left;
		Lease		l;

		if (stop_requested || now_us() > give_up)
			return RC_BUSY;
		if (e == 0)
			sleep_until(now_us() + 10000);
		key_name(keybuf, sizeof(keybuf), e);
		rc = run(conn, "SELECT fence, value, ((extract(epoch FROM expires_at) - extract(epoch FROM clock_timestamp())) * 1000000)::bigint, clock_timestamp() - since < '100 ms' FROM dlock.leader($1)",
				 1, params, &res, state, my_worker);
		if (rc != RC_OK)
		{
			PQclear(res);
			return rc;
		}
		if (PQntuples(res) != 1 || PQgetisnull(res, 0, 1) ||
			!parse_value(PQgetvalue(res, 0, 1), &vw, &vop, &n) ||
			vw == my_worker || strcmp(PQgetvalue(res, 0, 3), "t") != 0 ||
			(left = strtoll(PQgetvalue(res, 0, 2), NULL, 10)) < 30000)
		{
			PQclear(res);
			continue;
		}
		memset(&l, 0, sizeof(l));
		l.key = e;
		l.fence = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
		l.deadline = now_us() + left;
		l.grant_op = -1;
		PQclear(res);
		rc = do_el_write(conn, &l, EW_USURP, F_SABOTAGED, done);
		if (rc == RC_OK)
			printf("dlock-chaos: sabotage: worker %d wrote e%d under epoch " INT64_FORMAT ", worker %d's, %s\n",
				   my_worker, e, l.fence, vw,
				   *done ? "which wrote meanwhile" : "which did not write meanwhile: again later");
		else
			*done = false;
		return rc;
	}
}

/*
 * One term of a campaigner (election workload) that was just granted *l:
 * one to six rounds of some work, a renewal now and then, the next value
 * proclaimed (seven rounds in ten) and a fenced write (eight in ten); one
 * proclaim in ten comes after a pause past the lease's end (it must be
 * refused).  The term ends at the first call that finds the lease lost;
 * then the leader resigns (dlock.release) half of the time, or lets the
 * lease run out.  Returns RC_LOST when the connection was lost.
 */
static int
el_term(PGconn *conn, Lease *l)
{
	int			rounds = (int) rnd_range(1, 6);
	int			rc = RC_OK;
	bool		alive = true;
	int			i;

	for (i = 0; i < rounds && alive && !stop_requested; i++)
	{
		if (i > 0 && chance(0.4) && now_us() < l->deadline)
		{
			rc = do_renew(conn, l);
			if (rc != RC_OK)
				break;
		}
		/* some work */
		sleep_until(now_us() + rnd_range(0, l->ttl_ms * 100));
		if (chance(0.7))
		{
			int			flags = 0;

			if (chance(0.1))
			{
				sleep_until(l->deadline + rnd_range(5, 150) * 1000);
				if (stop_requested)
					break;
				flags = F_PAUSE_BEFORE;
			}
			rc = do_proclaim(conn, l, l->n + 1, flags);
			if (rc != RC_OK)
				break;
		}
		if (chance(0.8))
		{
			rc = do_el_write(conn, l, EW_NORMAL, 0, NULL);
			if (rc != RC_OK)
				alive = false;
		}
	}
	if (rc != RC_OK)
		return rc;
	if (alive && !stop_requested && chance(0.5))
		return do_release(conn, l);
	return RC_OK;
}

/* What an observer knows of one election: the watch loop's state. */
typedef struct Watch
{
	int64		fence;			/* the last fence seen, 0 at first */
	bool		seen_end;		/* the last row's state was not 'held' */
	bool		has_value;		/* the last row had a value */
	char		value[64];
} Watch;

/*
 * Fill an observation's record from the row of res: fence, value, state,
 * expires_at, statement_timestamp() and clock_timestamp() after the call
 * (the last three in us since the epoch).
 */
static void
observation_row(ChaosOp *r, PGresult *res)
{
	const char *st = PQgetvalue(res, 0, 2);

	if (PQgetisnull(res, 0, 0))
		r->flags |= F_NOFENCE;
	else
		r->fence = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
	r->vworker = -1;
	if (PQgetisnull(res, 0, 1))
		r->flags |= F_NOVALUE;
	else if (!parse_value(PQgetvalue(res, 0, 1), &r->vworker, &r->vop, &r->value))
		r->vworker = -2;
	r->flags |= strcmp(st, "held") == 0 ? F_ST_HELD :
		strcmp(st, "released") == 0 ? F_ST_RELEASED :
		strcmp(st, "expired") == 0 ? F_ST_EXPIRED : F_ST_NONE;
	if (!PQgetisnull(res, 0, 3))
		r->expires_srv = strtoll(PQgetvalue(res, 0, 3), NULL, 10);
	r->srv_lo = strtoll(PQgetvalue(res, 0, 4), NULL, 10);
	r->srv_at = strtoll(PQgetvalue(res, 0, 5), NULL, 10);
}

/*
 * One turn of the watch loop of election e: dlock.observe(key, fence,
 * wait, value, seen_end), waiting 50-800 ms; on a row, fence := its fence
 * (if not NULL), value := its value, seen_end := its state is not 'held'.
 * Returns the class of the call.
 */
static int
do_observe(PGconn *conn, int e, Watch *wa)
{
	ChaosOp		r;
	Lease		l;
	char		keybuf[64],
				fbuf[32],
				waitbuf[32];
	const char *params[5];
	PGresult   *res;
	char		state[8];
	int			rc;

	memset(&l, 0, sizeof(l));
	l.key = e;
	l.fence = wa->fence;
	key_name(keybuf, sizeof(keybuf), e);
	snprintf(fbuf, sizeof(fbuf), INT64_FORMAT, wa->fence);
	snprintf(waitbuf, sizeof(waitbuf), "%d ms", (int) rnd_range(50, 800));
	params[0] = keybuf;
	params[1] = fbuf;
	params[2] = waitbuf;
	params[3] = wa->has_value ? wa->value : NULL;
	params[4] = wa->seen_end ? "true" : "false";
	op_begin(&r, OP_OBSERVE, &l);
	r.fence = 0;
	rc = run(conn, "SELECT o.fence, o.value, o.state, (extract(epoch FROM o.expires_at) * 1000000)::bigint, (extract(epoch FROM statement_timestamp()) * 1000000)::bigint, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint FROM dlock.observe($1, $2::bigint, $3::interval, $4, $5::boolean) o",
			 5, params, &res, state, my_worker);
	if (rc == RC_OK && PQntuples(res) == 0)
	{
		r.flags |= F_NOROW;
		op_end(&r, OUT_OK, state);
	}
	else if (rc == RC_OK)
	{
		observation_row(&r, res);
		if (!PQgetisnull(res, 0, 0))
			wa->fence = r.fence;
		wa->has_value = !PQgetisnull(res, 0, 1);
		if (wa->has_value)
			strlcpy(wa->value, PQgetvalue(res, 0, 1), sizeof(wa->value));
		wa->seen_end = strcmp(PQgetvalue(res, 0, 2), "held") != 0;
		op_end(&r, OUT_OK, state);
	}
	else
		op_end(&r, rc == RC_LOST ? OUT_FAILED : OUT_UNEXPECTED, state);
	PQclear(res);
	return rc;
}

/* Ask dlock.leader(e) and record what it said.  Returns the class. */
static int
do_leader(PGconn *conn, int e)
{
	ChaosOp		r;
	Lease		l;
	char		keybuf[64];
	const char *params[1] = {keybuf};
	PGresult   *res;
	char		state[8];
	int			rc;

	memset(&l, 0, sizeof(l));
	l.key = e;
	key_name(keybuf, sizeof(keybuf), e);
	op_begin(&r, OP_LEADER, &l);
	rc = run(conn, "SELECT l.fence, l.value, 'held', (extract(epoch FROM l.expires_at) * 1000000)::bigint, (extract(epoch FROM statement_timestamp()) * 1000000)::bigint, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint FROM dlock.leader($1) l",
			 1, params, &res, state, my_worker);
	if (rc == RC_OK && PQntuples(res) == 0)
	{
		r.flags |= F_NOROW;
		op_end(&r, OUT_OK, state);
	}
	else if (rc == RC_OK)
	{
		observation_row(&r, res);
		op_end(&r, OUT_OK, state);
	}
	else
		op_end(&r, rc == RC_LOST ? OUT_FAILED : OUT_UNEXPECTED, state);
	PQclear(res);
	return rc;
}

/*
 * The semaphore workload's sabotages (--sabotage), once each, by worker 0
 * (stale-reader: by the first reader), half a second into the run.  Each
 * sets its flag once it was done for real.
 */
static bool sem_borrowed = false;
static bool sem_overcommitted = false;
static bool sem_lost_renewed = false;
static bool sem_stale_read = false;
static bool sem_stolen = false;

#define MAX_OVERCOMMIT 16		/* --sabotage=overcommit: at most this many
								 * permits (and connections) */

/*
 * --sabotage=borrow: between its terms, find (dlock.lease_status, every 10
 * ms for up to 2 s) a live permit of a semaphore key held by another
 * client with 30 ms or more left, and write a row under its token WHERE
 * dlock.fenced(key, token), logged as this client's own write.  Tokens are
 * not secrets, so the server accepts it: the check must report a write
 * under a token its client was not granted.
 */
static int
sabotage_borrow(PGconn *conn, bool *done)
{
	int64		give_up = now_us() + 2000000;
	char		holder[32];
	const char *params[1] = {holder};

	snprintf(holder, sizeof(holder), "w%d", my_worker);
	while (!stop_requested && now_us() < give_up)
	{
		PGresult   *res;
		char		state[8];
		char		victim[32];
		int			rc,
					key;
		int64		left;
		Lease		l;

		sleep_until(now_us() + 10000);
		rc = run(conn, "SELECT key, fence, (extract(epoch FROM remaining) * 1000000)::bigint, holder FROM dlock.lease_status WHERE key LIKE 'dlock-chaos:s%' AND permit IS NOT NULL AND state = 'held' AND holder <> $1 AND remaining > '30 ms' ORDER BY fence DESC LIMIT 1",
				 1, params, &res, state, my_worker);
		if (rc != RC_OK)
		{
			PQclear(res);
			return rc;
		}
		if (PQntuples(res) != 1 ||
			sscanf(PQgetvalue(res, 0, 0), "dlock-chaos:s%d", &key) != 1 ||
			key < 0 || key >= nkeys)
		{
			PQclear(res);
			continue;
		}
		memset(&l, 0, sizeof(l));
		l.key = key;
		l.kind = F_PERMITS;
		l.fence = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
		left = strtoll(PQgetvalue(res, 0, 2), NULL, 10);
		l.ttl_ms = (int) (left / 1000);
		l.deadline = now_us() + left;
		l.grant_op = -1;
		strlcpy(victim, PQgetvalue(res, 0, 3), sizeof(victim));
		PQclear(res);
		rc = do_el_write(conn, &l, EW_FENCED, F_SABOTAGED, NULL);
		if (rc == RC_OK)
		{
			*done = true;
			printf("dlock-chaos: sabotage: worker %d wrote s%d under the permit with fence " INT64_FORMAT ", held by %s\n",
				   my_worker, key, l.fence, victim);
		}
		return rc;
	}
	return RC_BUSY;
}

/*
 * --sabotage=overcommit: between its terms, on N + 1 connections (its own
 * and N more), acquire N + 1 permits of s0 with permits => N + 1 (a client
 * that asks for more permits than the key's N: dlock grants it the N + 1st
 * at once), for 5 s each, then write a row under each of them at once: N
 * + 1 transactions, each INSERT ... WHERE dlock.fenced(key, its token),
 * all open before the first COMMIT.  The check must report more than N
 * permits granted, and written under, at one moment.
 */
static int
sabotage_overcommit(PGconn *conn, bool *done)
{
	int			n = npermits + 1;
	PGconn	   *conns[MAX_OVERCOMMIT + 1];
	Lease		ls[MAX_OVERCOMMIT + 1];
	ChaosOp		rs[MAX_OVERCOMMIT + 1];
	int			rcs[MAX_OVERCOMMIT + 1];
	char		states[MAX_OVERCOMMIT + 1][8];
	char		appname[32];
	int			ngranted = 0,
				ncommitted = 0,
				j;

	snprintf(appname, sizeof(appname), "dlock-chaos-w%d", my_worker);
	conns[0] = conn;
	for (j = 1; j < n; j++)
		if ((conns[j] = connect_db(appname, false)) == NULL)
			break;
	if (j == n)
		for (ngranted = 0; ngranted < n && !stop_requested; ngranted++)
			if (do_sem_grant(conns[ngranted], &ls[ngranted], 0, F_PERMITS, n,
							 5000, 3000) != RC_OK)
				break;
	if (ngranted == n)
	{
		/* every INSERT first, each in its own open transaction ... */
		for (j = 0; j < n; j++)
		{
			char		ebuf[32],
						keybuf[64],
						fbuf[32],
						wbuf[16],
						obuf[16],
						sbuf[16];
			const char *params[6] = {ebuf, fbuf, wbuf, obuf, sbuf, keybuf};
			PGresult   *res = NULL;

			op_begin(&rs[j], OP_WRITE, &ls[j]);
			rs[j].flags |= F_TXN | F_SABOTAGED;
			rs[j].value = ++ls[j].nwrites;
			strlcpy(ebuf, kname(0), sizeof(ebuf));
			key_name(keybuf, sizeof(keybuf), 0);
			snprintf(fbuf, sizeof(fbuf), INT64_FORMAT, ls[j].fence);
			snprintf(wbuf, sizeof(wbuf), "%d", my_worker);
			snprintf(obuf, sizeof(obuf), "%d", rs[j].op);
			snprintf(sbuf, sizeof(sbuf), INT64_FORMAT, rs[j].value);
			rcs[j] = run(conns[j], "BEGIN", 0, NULL, &res, states[j], my_worker);
			PQclear(res);
			if (rcs[j] != RC_OK)
				continue;
			rs[j].t_fence1 = rs[j].t_ins = now_us();
			rcs[j] = run(conns[j], SEM_INSERT_FENCED, 6, params, &res, states[j], my_worker);
			if (rcs[j] == RC_OK && strcmp(PQcmdTuples(res), "1") != 0)
				rcs[j] = RC_BUSY;
			PQclear(res);
			if (rcs[j] != RC_OK && rcs[j] != RC_LOST)
				rollback(conns[j]);
		}
		/* ... then each done_at and COMMIT, the records in their order */
		for (j = 0; j < n; j++)
		{
			char		wbuf[16],
						obuf[16];
			const char *params[2] = {wbuf, obuf};
			PGresult   *res = NULL;
			int			rc = rcs[j];

			if (rc != RC_OK)
			{
				op_end(&rs[j], rc == RC_LOST ? OUT_FAILED : rc == RC_LF001 ? OUT_REFUSED :
					   rc == RC_BUSY ? OUT_NONE : OUT_UNEXPECTED, states[j]);
				continue;
			}
			snprintf(wbuf, sizeof(wbuf), "%d", my_worker);
			snprintf(obuf, sizeof(obuf), "%d", rs[j].op);
			rc = run(conns[j], SEM_DONE, 2, params, &res, states[j], my_worker);
			PQclear(res);
			if (rc != RC_OK)
			{
				if (rc != RC_LOST)
					rollback(conns[j]);
				op_end(&rs[j], rc == RC_LOST ? OUT_FAILED : OUT_UNEXPECTED, states[j]);
				continue;
			}
			rs[j].t_commit = now_us();
			rc = run(conns[j], "COMMIT", 0, NULL, &res, states[j], my_worker);
			PQclear(res);
			if (rc == RC_OK)
			{
				op_end(&rs[j], OUT_OK, states[j]);
				__sync_fetch_and_add(acked_writes, 1);
				ncommitted++;
			}
			else
				op_end(&rs[j], rc == RC_LOST ? OUT_INDET : OUT_UNEXPECTED, states[j]);
		}
		if (ncommitted == n)
		{
			*done = true;
			printf("dlock-chaos: sabotage: worker %d was granted %d permits of s0 (permits => %d) and wrote under all of them at once\n",
				   my_worker, n, n);
		}
	}
	for (j = 0; j < ngranted; j++)
		if (PQstatus(conns[j]) == CONNECTION_OK)
			(void) do_release(conns[j], &ls[j]);
	for (j = 1; j < n && conns[j] != NULL; j++)
		PQfinish(conns[j]);
	return PQstatus(conn) == CONNECTION_OK ? RC_OK : RC_LOST;
}

/*
 * --sabotage=lost-renewal: with a permit just granted, do no work until
 * 30 ms past the lease's client-side bound, renew (dlock.renew says NULL:
 * the lease is lost), and write under it all the same without
 * dlock.fenced, as a client that ignores its lost renewal would.  The
 * check must report a write accepted after its lease expired, by both
 * clocks.
 */
static int
sabotage_lost_renewal(PGconn *conn, Lease *l, bool *done)
{
	int			rc;

	sleep_until(l->deadline + 30000);
	if (stop_requested)
		return RC_BUSY;
	rc = do_renew(conn, l);
	if (rc != RC_BUSY)
		return rc;
	rc = do_el_write(conn, l, EW_NOFENCE, F_SABOTAGED, NULL);
	if (rc == RC_OK)
	{
		*done = true;
		printf("dlock-chaos: sabotage: worker %d wrote s%d under fence " INT64_FORMAT " without dlock.fenced after its renewal said NULL\n",
			   my_worker, l->key, l->fence);
	}
	return rc;
}

/*
 * --sabotage=stale-reader: with a shared lease just granted, let it run
 * out (30 ms past its client-side bound), wait (dlock.lease_status, every
 * 10 ms for up to 3 s) for an exclusive lease of the key granted after it
 * to another client, then write under the shared token without
 * dlock.fenced, in a transaction held open until the exclusive holder
 * wrote a row too (for up to 2 s).  The check must report a shared
 * lease's write after a later exclusive grant (by both clocks), and
 * overlapping the exclusive holder's.  Sets *done only if the exclusive
 * holder wrote meanwhile (until then, the reader tries again).
 */
static int
sabotage_stale_reader(PGconn *conn, Lease *l, bool *done)
{
	int64		give_up;
	char		keybuf[64],
				fbuf[32];
	const char *params[2] = {keybuf, fbuf};

	sleep_until(l->deadline + 30000);
	key_name(keybuf, sizeof(keybuf), l->key);
	snprintf(fbuf, sizeof(fbuf), INT64_FORMAT, l->fence);
	give_up = now_us() + 3000000;
	while (!stop_requested && now_us() < give_up)
	{
		PGresult   *res;
		char		state[8];
		int			rc;
		bool		overlapped = false;

		sleep_until(now_us() + 10000);
		rc = run(conn, "SELECT fence FROM dlock.lease_status WHERE key = $1 AND permit IS NULL AND state = 'held' AND fence > $2::bigint",
				 2, params, &res, state, my_worker);
		if (rc != RC_OK)
		{
			PQclear(res);
			return rc;
		}
		if (PQntuples(res) != 1)
		{
			PQclear(res);
			continue;
		}
		l->other_fence = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
		PQclear(res);
		rc = do_el_write(conn, l, EW_STALE_HOLD, F_SABOTAGED, &overlapped);
		if (rc == RC_OK)
		{
			*done = overlapped;
			printf("dlock-chaos: sabotage: worker %d wrote %s under its ended shared lease (fence " INT64_FORMAT ") without dlock.fenced after the exclusive grant of fence " INT64_FORMAT ", %s\n",
				   my_worker, kname(l->key), l->fence, l->other_fence,
				   overlapped ? "whose holder wrote meanwhile" : "whose holder did not write meanwhile: again later");
		}
		return rc;
	}
	return RC_BUSY;
}

/*
 * --sabotage=steal (semaphore workload): right after a permit's grant was
 * acknowledged, drop the key with dlock.forget() (every permit of it, as
 * an administrator would), renew the permit (NULL, while it is certainly
 * live), and grant N permits of the key on this connection at once, then
 * release them.  The check must report more than N permits live at one
 * moment, and the holder refused while its lease was certainly live.
 * "Certainly live" is judged from the grant's invocation (+ TTL): after a
 * grant that waited, there may be no time left for it (then, not now).
 */
static int
sabotage_sem_steal(PGconn *conn, Lease *l, bool *done)
{
	char		keybuf[64];
	const char *params[1] = {keybuf};
	PGresult   *res;
	char		state[8];
	Lease	   *ls;
	int			rc,
				ng = 0,
				j;
	bool		forgotten;

	if (now_us() > l->grant_inv + (int64) l->ttl_ms * 1000 - 60000)
		return RC_BUSY;
	key_name(keybuf, sizeof(keybuf), l->key);
	rc = run(conn, "SELECT dlock.forget($1)", 1, params, &res, state, my_worker);
	forgotten = rc == RC_OK && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	if (rc != RC_OK)
		return rc;
	/* the lease is certainly still live, as the checker judges it */
	if (!forgotten || now_us() > l->grant_inv + (int64) l->ttl_ms * 1000 - 20000)
		return RC_BUSY;
	rc = do_renew(conn, l);
	if (rc == RC_LOST || rc == RC_OTHER)
		return rc;
	ls = pg_malloc(sizeof(Lease) * npermits);
	for (ng = 0; ng < npermits; ng++)
		if ((rc = do_sem_grant(conn, &ls[ng], l->key, F_PERMITS, npermits, 0, -1)) != RC_OK)
			break;
	if (ng > 0)
	{
		*done = true;
		printf("dlock-chaos: sabotage: worker %d dropped %s with dlock.forget while its permit (fence " INT64_FORMAT ") was live and was granted %d permits of it again\n",
			   my_worker, kname(l->key), l->fence, ng);
	}
	for (j = 0; j < ng && rc != RC_LOST; j++)
		if (do_release(conn, &ls[j]) == RC_LOST)
			rc = RC_LOST;
	pg_free(ls);
	return rc == RC_LOST ? rc : RC_OK;
}

/*
 * One term of a semaphore client under the lease *l just granted: one to
 * four rounds of some work, a renewal now and then, and a fenced write
 * (eight rounds in ten; see do_el_write: pauses past the lease's end
 * before and inside, transactions held open); the term ends at the first
 * call that finds the lease lost; then the holder releases it half of the
 * time, or lets it run out.  Returns RC_LOST when the connection was lost.
 */
static int
sem_term(PGconn *conn, Lease *l)
{
	int			rounds = (int) rnd_range(1, 4);
	int			rc = RC_OK;
	bool		alive = true;
	int			i;

	for (i = 0; i < rounds && alive && !stop_requested; i++)
	{
		if (i > 0 && chance(0.4) && now_us() < l->deadline)
		{
			rc = do_renew(conn, l);
			if (rc != RC_OK)
				break;
		}
		/* some work */
		sleep_until(now_us() + rnd_range(0, l->ttl_ms * 100));
		if (chance(0.8))
		{
			rc = do_el_write(conn, l, EW_NORMAL, 0, NULL);
			if (rc != RC_OK)
				alive = false;
		}
	}
	if (rc == RC_LOST)
		return rc;
	if (alive && rc == RC_OK && !stop_requested && chance(0.5))
		return do_release(conn, l);
	return RC_OK;
}

/*
 * One turn of worker w (semaphore workload).  A reader (the last
 * nreaders workers) takes a shared lease of a shared/exclusive key; the
 * others take one of the N permits of a semaphore key (three turns in
 * four) or the exclusive lease of a shared/exclusive key, waiting for it
 * up to 20-600 ms (a permit or a shared lease: half of the time, the
 * others try once).  Then a term (sem_term); a reader then pauses 0-300 ms,
 * so that the exclusive leases get their turn without preloading too.
 * Returns the class of the last call (RC_LOST: reconnect).
 */
static int
sem_turn(PGconn *conn, int w)
{
	bool		reader = w >= nworkers - nreaders;
	bool		early = now_us() > start_us + 500000;
	Lease		l;
	int			key,
				kind,
				rc;

	/* between terms: --sabotage=borrow and overcommit, by worker 0 */
	if (w == 0 && (sabotage & S_BORROW) && !sem_borrowed && early)
	{
		rc = sabotage_borrow(conn, &sem_borrowed);
		if (rc == RC_LOST)
			return rc;
	}
	if (w == 0 && (sabotage & S_OVERCOMMIT) && !sem_overcommitted && early)
	{
		rc = sabotage_overcommit(conn, &sem_overcommitted);
		if (rc == RC_LOST)
			return rc;
	}

	if (reader)
	{
		key = nkeys + (int) rnd_range(0, nrw - 1);
		kind = F_SHARED;
	}
	else if (nrw > 0 && chance(0.25))
	{
		key = nkeys + (int) rnd_range(0, nrw - 1);
		kind = 0;
	}
	else
	{
		key = (int) rnd_range(0, nkeys - 1);
		kind = F_PERMITS;
	}
	rc = do_sem_grant(conn, &l, key, kind, npermits, 0,
					  kind == 0 || chance(0.5) ? (int) rnd_range(20, 600) : -1);
	if (rc != RC_OK)
	{
		if (rc != RC_LOST)
			sleep_until(now_us() + rnd_range(0, 10000));
		return rc;
	}

	/* right after a grant: steal, lost-renewal (worker 0), stale-reader */
	if (w == 0 && kind == F_PERMITS && (sabotage & S_STEAL) && !sem_stolen && early)
		return sabotage_sem_steal(conn, &l, &sem_stolen);
	if (w == 0 && kind == F_PERMITS && (sabotage & S_LOST_RENEWAL) &&
		!sem_lost_renewed && early)
		return sabotage_lost_renewal(conn, &l, &sem_lost_renewed);
	if (w == nworkers - nreaders && kind == F_SHARED &&
		(sabotage & S_STALE_READER) && !sem_stale_read && early)
		return sabotage_stale_reader(conn, &l, &sem_stale_read);

	rc = sem_term(conn, &l);
	if (reader && rc != RC_LOST)
		sleep_until(now_us() + rnd_range(0, 300000));
	return rc;
}

/*
 * A worker process: loop on leases until told to stop.  With --workload
 * election, workers 0 .. ncampaigners - 1 are campaigners, the others
 * observers; with --workload semaphore, each turn is sem_turn's.
 */
static int
worker_main(int w)
{
	char		path[MAXPGPATH];
	char		appname[32];
	PGconn	   *conn = NULL;
	int64		hard_end = end_us + 120 * INT64CONST(1000000);
	int64		down_since = 0;
	bool		sabotaged = false;
	bool		stolen = false;
	bool		usurped = false;
	bool		proclaimed_back = false;
	bool		stale_proclaimed = false;
	static Watch watch[MAX_KEYS];
	int			watched = w;

	my_worker = w;
	rng_state = seed * 1000003 + (uint64) w + 1;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	pqsignal(SIGINT, SIG_IGN);
	pqsignal(SIGTERM, handle_stop);
	snprintf(path, sizeof(path), "%s/worker-%d.log", logdir, w);
	oplog = fopen(path, "w");
	if (oplog == NULL)
	{
		fprintf(stderr, "dlock-chaos: cannot create %s: %m\n", path);
		return 3;
	}
	snprintf(appname, sizeof(appname), "dlock-chaos-w%d", w);

	while (!stop_requested && now_us() < hard_end)
	{
		Lease		l;
		int			rc,
					nwrites,
					i;
		bool		alive = true;

		if (conn == NULL)
		{
			conn = connect_db(appname, false);
			if (conn == NULL)
			{
				if (down_since == 0)
					down_since = now_us();
				else if (now_us() - down_since > RECONNECT_GIVEUP_S * INT64CONST(1000000))
				{
					fprintf(stderr, "dlock-chaos: worker %d: cannot connect for %d s, giving up\n",
							w, RECONNECT_GIVEUP_S);
					fclose(oplog);
					return 3;
				}
				sleep_until(now_us() + 100000);
				continue;
			}
			down_since = 0;
		}

		if (semaphore)
		{
			rc = sem_turn(conn, w);
			if (rc == RC_LOST)
			{
				PQfinish(conn);
				conn = NULL;
			}
			continue;
		}

		/* an observer: one call per turn, the elections in turn */
		if (election && w >= ncampaigners)
		{
			watched = (watched + 1) % nkeys;
			if (chance(0.25))
				rc = do_leader(conn, watched);
			else
				rc = do_observe(conn, watched, &watch[watched]);
			if (rc == RC_LOST)
			{
				PQfinish(conn);
				conn = NULL;
			}
			continue;
		}

		/* --sabotage=usurp: once, by worker 0, after 0.5 s, between terms */
		if (w == 0 && (sabotage & S_USURP) && !usurped &&
			now_us() > start_us + 500000)
		{
			rc = sabotage_usurp(conn, &usurped);
			if (rc == RC_LOST)
			{
				PQfinish(conn);
				conn = NULL;
				continue;
			}
		}

		rc = do_grant(conn, &l, -1);
		if (rc != RC_OK)
		{
			if (rc == RC_LOST)
			{
				PQfinish(conn);
				conn = NULL;
			}
			else
				sleep_until(now_us() + rnd_range(0, 10000));
			continue;
		}

		/* --sabotage=steal: once, by worker 0, after 0.5 s */
		if (w == 0 && (sabotage & S_STEAL) && !stolen &&
			now_us() > start_us + 500000)
		{
			rc = sabotage_steal(conn, &l, &stolen);
			if (rc == RC_LOST)
			{
				PQfinish(conn);
				conn = NULL;
			}
			continue;
		}

		/* --sabotage=expired, superseded: once, by worker 0, after 0.5 s */
		if (w == 0 && (sabotage & (S_EXPIRED | S_SUPERSEDED)) && !sabotaged &&
			now_us() > start_us + 500000)
		{
			rc = sabotage_write(conn, &l, &sabotaged);
			if (rc == RC_LOST)
			{
				PQfinish(conn);
				conn = NULL;
			}
			continue;
		}

		if (election)
		{
			/* --sabotage=proclaim-back: once, by worker 0, after 0.5 s */
			if (w == 0 && (sabotage & S_PROCLAIM_BACK) && !proclaimed_back &&
				now_us() > start_us + 500000)
				rc = sabotage_proclaim_back(conn, &l, &proclaimed_back);
			/* --sabotage=stale-proclaim: the same */
			else if (w == 0 && (sabotage & S_STALE_PROCLAIM) && !stale_proclaimed &&
					 now_us() > start_us + 500000)
				rc = sabotage_stale_proclaim(conn, &l, &stale_proclaimed);
			else
				rc = el_term(conn, &l);
			if (rc == RC_LOST)
			{
				PQfinish(conn);
				conn = NULL;
			}
			continue;
		}

		nwrites = (int) rnd_range(1, 3);
		for (i = 0; i < nwrites && alive && !stop_requested; i++)
		{
			if (i > 0 && chance(0.4) && now_us() < l.deadline)
			{
				rc = do_renew(conn, &l);
				if (rc != RC_OK)
				{
					alive = false;
					break;
				}
			}
			/* some work outside the transaction */
			sleep_until(now_us() + rnd_range(0, l.ttl_ms * 100));
			rc = do_write(conn, &l, false);
			if (rc != RC_OK)
				alive = false;
		}
		if (rc == RC_LOST)
		{
			PQfinish(conn);
			conn = NULL;
			continue;
		}
		if (alive && chance(0.6))
		{
			rc = do_release(conn, &l);
			if (rc == RC_LOST)
			{
				PQfinish(conn);
				conn = NULL;
			}
		}
	}
	if (conn)
		PQfinish(conn);
	if (w == 0 && (sabotage & (S_EXPIRED | S_SUPERSEDED)) && !sabotaged)
		printf("dlock-chaos: sabotage: worker 0 found no chance to write after its lease's expiry\n");
	if (w == 0 && !semaphore && (sabotage & S_STEAL) && !stolen)
		printf("dlock-chaos: sabotage: worker 0 found no chance to steal a live lease\n");
	if (w == 0 && (sabotage & S_USURP) && !usurped)
		printf("dlock-chaos: sabotage: worker 0 found no chance to write under another client's epoch\n");
	if (w == 0 && (sabotage & S_PROCLAIM_BACK) && !proclaimed_back)
		printf("dlock-chaos: sabotage: worker 0 found no chance to proclaim a lower value\n");
	if (w == 0 && (sabotage & S_STALE_PROCLAIM) && !stale_proclaimed)
		printf("dlock-chaos: sabotage: worker 0 found no chance to proclaim under a newer epoch\n");
	if (w == 0 && (sabotage & S_BORROW) && !sem_borrowed)
		printf("dlock-chaos: sabotage: worker 0 found no chance to write under another client's permit\n");
	if (w == 0 && (sabotage & S_OVERCOMMIT) && !sem_overcommitted)
		printf("dlock-chaos: sabotage: worker 0 found no chance to write under N + 1 permits at once\n");
	if (w == 0 && (sabotage & S_LOST_RENEWAL) && !sem_lost_renewed)
		printf("dlock-chaos: sabotage: worker 0 found no chance to write on after a lost renewal\n");
	if (w == 0 && semaphore && (sabotage & S_STEAL) && !sem_stolen)
		printf("dlock-chaos: sabotage: worker 0 found no chance to drop a key with a live permit\n");
	if (w == nworkers - nreaders && (sabotage & S_STALE_READER) && !sem_stale_read)
		printf("dlock-chaos: sabotage: worker %d found no chance to write under a shared lease after an exclusive grant\n", w);
	if (fclose(oplog) != 0)
	{
		fprintf(stderr, "dlock-chaos: worker %d: cannot write its log: %m\n", w);
		return 3;
	}
	return 0;
}

/*
 * The forger's probe: can a fresh key be granted now?  A grant of a key
 * nobody uses is refused only while the horizon holds every key (after a
 * restart in memory mode, or in table mode after memory mode).  Returns
 * RC_OK (granted), RC_BUSY (refused) or the error's class.
 */
static int
forger_probe(PGconn *conn)
{
	PGresult   *res;
	char		state[8];
	int			rc;

	rc = run(conn, "SELECT count(*) FROM dlock.try_acquire('dlock-chaos:forger-probe', '1 ms')",
			 0, NULL, &res, state, my_worker);
	if (rc == RC_OK && strcmp(PQgetvalue(res, 0, 0), "0") == 0)
		rc = RC_BUSY;
	PQclear(res);
	return rc;
}

/*
 * One forged attempt: present a token that no lease of the key can have
 * (0, -1, one never issued, or, after a crash-restart in memory mode, the
 * key's last token acknowledged before the crash, whose lease the crash
 * dropped) for a write into dlock_chaos_forged (or its 'monotonic' twin),
 * or to check_fence.  Every acceptance is a violation, judged in the check
 * from this record (and the row, which carries the record's number).
 * With bypass (--sabotage=forge), the write sets dlock.fence_bypass: it is
 * accepted, and the check must say so.
 */
static int
forge_one(PGconn *conn, bool in_memory, bool in_horizon, int gen,
		  bool bypass)
{
	ChaosOp		r;
	Lease		l;
	char		kbuf[32],
				keybuf[64],
				fbuf[32],
				obuf[16],
				sql[256];
	const char *params[4];
	const char *kparams[2];
	const char *table;
	PGresult   *res = NULL;
	char		state[8];
	int			rc;
	int			key = chance(0.2) ? nkeys : (int) rnd_range(0, nkeys - 1);
	int			tok = (int) rnd_range(0, 99);
	int			via = (int) rnd_range(0, 9);
	int64		token;
	int			flags;

	memset(&l, 0, sizeof(l));
	l.key = key;
	/* the key's last token before the crash, when its lease was in memory */
	if (tok < 40 && key < nkeys && gen > 0 && shared->pre_memory &&
		shared->last_token[key] > 0)
	{
		token = shared->last_token[key];
		flags = F_TOK_LAST;
	}
	else if (tok < 70)
	{
		token = 0;
		flags = F_TOK_ZERO;
	}
	else if (tok < 85)
	{
		token = -1;
		flags = F_TOK_NEG;
	}
	else
	{
		/* far above anything a run can draw: never issued */
		token = INT64CONST(1000000000000) + op_seq;
		flags = F_TOK_NEVER;
	}
	if (bypass)
	{
		token = 0;
		flags = F_TOK_ZERO;
		via = 0;
	}
	flags |= via < 3 ? F_VIA_COLUMN : via < 6 ? F_VIA_USE_FENCE : via < 8 ? F_VIA_FENCED : F_VIA_CHECK;
	if (!(flags & F_VIA_CHECK) && chance(0.3))
		flags |= F_MONO;
	if (in_memory)
		flags |= F_MEMORY;
	if (in_horizon)
		flags |= F_HORIZON;
	table = (flags & F_MONO) ? "dlock_chaos_forged_mono" : "dlock_chaos_forged";

	if (key < nkeys)
		snprintf(kbuf, sizeof(kbuf), "k%d", key);
	else
		strlcpy(kbuf, "never", sizeof(kbuf));
	snprintf(keybuf, sizeof(keybuf), "dlock-chaos:%s", kbuf);
	snprintf(fbuf, sizeof(fbuf), INT64_FORMAT, token);
	l.fence = token;
	op_begin(&r, OP_FORGE, &l);
	r.flags = flags;
	r.value = gen;
	snprintf(obuf, sizeof(obuf), "%d", r.op);
	params[0] = kbuf;
	params[1] = fbuf;
	params[2] = obuf;
	params[3] = keybuf;
	kparams[0] = keybuf;
	kparams[1] = fbuf;

	if (flags & F_VIA_CHECK)
	{
		r.t_fence1 = now_us();
		rc = run(conn, "SELECT dlock.check_fence($1, $2::bigint)", 2, kparams,
				 &res, state, my_worker);
		if (rc == RC_OK)
			op_end(&r, strcmp(PQgetvalue(res, 0, 0), "t") == 0 ? OUT_OK : OUT_REFUSED, state);
		else if (rc == RC_LOST)
			op_end(&r, OUT_FAILED, state);
		else
			op_end(&r, rc == RC_LF001 ? OUT_REFUSED : OUT_UNEXPECTED, state);
		PQclear(res);
		return rc;
	}
	if (flags & F_VIA_FENCED)
	{
		snprintf(sql, sizeof(sql), "INSERT INTO %s (k, fence, op) SELECT $1, $2::bigint, $3::int WHERE dlock.fenced($4, $2::bigint)", table);
		r.t_fence1 = r.t_ins = now_us();
		rc = run(conn, sql, 4, params, &res, state, my_worker);
		if (rc != RC_OK)
			goto failed;
		op_end(&r, strcmp(PQcmdTuples(res), "1") == 0 ? OUT_OK : OUT_NONE, state);
		PQclear(res);
		return rc;
	}

	/*
	 * The token in the column (one statement, autocommit; in a transaction
	 * with fence_bypass for the sabotage), or presented with use_fence first.
	 */
	if (bypass || (flags & F_VIA_USE_FENCE))
	{
		rc = run(conn, "BEGIN", 0, NULL, &res, state, my_worker);
		if (rc != RC_OK)
			goto failed;
		PQclear(res);
		res = NULL;
	}
	if (bypass)
	{
		rc = run(conn, "SET LOCAL dlock.fence_bypass = on", 0, NULL, &res, state, my_worker);
		if (rc != RC_OK)
			goto failed;
		PQclear(res);
		res = NULL;
	}
	if (flags & F_VIA_USE_FENCE)
	{
		r.t_fence1 = now_us();
		rc = run(conn, "SELECT dlock.use_fence($1, $2::bigint)", 2, kparams, &res,
				 state, my_worker);
		if (rc != RC_OK)
			goto failed;
		PQclear(res);
		res = NULL;
	}
	snprintf(sql, sizeof(sql), "INSERT INTO %s (k, fence, op) VALUES ($1, $2, $3)", table);
	r.t_ins = now_us();
	rc = run(conn, sql, 3, params, &res, state, my_worker);
	if (rc != RC_OK)
		goto failed;
	PQclear(res);
	res = NULL;
	if (!bypass && !(flags & F_VIA_USE_FENCE))
	{
		op_end(&r, OUT_OK, state);
		return rc;
	}
	r.t_commit = now_us();
	rc = run(conn, "COMMIT", 0, NULL, &res, state, my_worker);
	PQclear(res);
	op_end(&r, rc == RC_OK ? OUT_OK : rc == RC_LOST ? OUT_INDET : OUT_UNEXPECTED, state);
	return rc;

failed:
	PQclear(res);
	return write_failed(conn, &r, rc, state);
}

/*
 * The forger (--forge), a process of its own that the nemesis leaves
 * alone: all through the run, and above all in the moments right after
 * each crash-restart, while the horizon holds every key in memory mode,
 * it presents forged tokens (forge_one).  After a restart it reconnects
 * every 20 ms, and until a grant of a fresh key succeeds (the horizon has
 * passed) it forges every 2-10 ms; otherwise every 10-40 ms.  (Before each
 * crash the nemesis takes a lease that outlives the restart, so that in
 * memory mode the horizon is still there when the server is back.)
 */
static int
forger_main(void)
{
	char		path[MAXPGPATH];
	PGconn	   *conn = NULL;
	int64		hard_end = end_us + 120 * INT64CONST(1000000);
	int			gen = 0;
	bool		in_memory = false;
	bool		in_horizon = false;
	bool		bypassed = false;
	int64		hold_until = 0;

	my_worker = nworkers;
	rng_state = seed * 1000003 + 999983;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	pqsignal(SIGINT, SIG_IGN);
	pqsignal(SIGTERM, handle_stop);
	snprintf(path, sizeof(path), "%s/forger.log", logdir);
	oplog = fopen(path, "w");
	if (oplog == NULL)
	{
		fprintf(stderr, "dlock-chaos: cannot create %s: %m\n", path);
		return 3;
	}

	while (!stop_requested && now_us() < hard_end)
	{
		int			rc;
		bool		bypass = false;

		if (conn == NULL)
		{
			PGresult   *res;

			/* the generation before connecting: the server is that one's or later */
			gen = shared->generation;
			__sync_synchronize();
			conn = connect_db("dlock-chaos-forger", false);
			if (conn == NULL)
			{
				sleep_until(now_us() + 20000);
				continue;
			}
			res = PQexec(conn, "SHOW dlock.storage");
			in_memory = PQresultStatus(res) == PGRES_TUPLES_OK &&
				strcmp(PQgetvalue(res, 0, 0), "memory") == 0;
			PQclear(res);
			in_horizon = true;
		}
		if (in_horizon)
		{
			rc = forger_probe(conn);
			if (rc == RC_OK)
				in_horizon = false;
			else if (rc != RC_BUSY)
			{
				PQfinish(conn);
				conn = NULL;
				continue;
			}
		}
		/*
		 * Also keep a lease of our own in use that outlives a restart (1.5 s
		 * longer than the longest one so far, 5-10 s), whatever the mode:
		 * a second way to have the horizon there when the server is back.
		 */
		if (!in_horizon && now_us() > hold_until)
		{
			PGresult   *res;
			char		state[8];
			char		ttl[32];
			const char *p1[1] = {ttl};
			int64		hold_ms = Min(10000, Max(5000, 1500 + shared->restart_us / 1000));

			hold_until = now_us() + hold_ms * 500;
			snprintf(ttl, sizeof(ttl), INT64_FORMAT " ms", hold_ms);
			rc = run(conn, "SELECT count(*) FROM dlock.try_acquire('dlock-chaos:forger-hold', $1::interval)",
					 1, p1, &res, state, my_worker);
			PQclear(res);
			if (rc == RC_LOST)
			{
				PQfinish(conn);
				conn = NULL;
				continue;
			}
		}
		if ((sabotage & S_FORGE_BYPASS) && !bypassed &&
			now_us() > start_us + 500000)
			bypass = bypassed = true;
		rc = forge_one(conn, in_memory, in_horizon, gen, bypass);
		if (bypass && rc == RC_OK)
			printf("dlock-chaos: sabotage: the forger wrote under token 0 with dlock.fence_bypass\n");
		else if (bypass)
			bypassed = false;
		if (rc == RC_LOST || shared->generation != gen)
		{
			PQfinish(conn);
			conn = NULL;
			continue;
		}
		sleep_until(now_us() + (in_horizon ? rnd_range(2, 10) : rnd_range(10, 40)) * 1000);
	}
	if (conn)
		PQfinish(conn);
	if (fclose(oplog) != 0)
	{
		fprintf(stderr, "dlock-chaos: the forger cannot write its log: %m\n");
		return 3;
	}
	return 0;
}

/*
 * Run pg_ctl with the given arguments, its output to a file in the log
 * directory (never our stdout: the postmaster it starts would inherit it
 * and keep a pipe of whoever runs us open).  Returns its exit status.
 */
static int
run_pg_ctl(const char *a1, const char *a2, const char *a3, const char *a4,
		   const char *a5, const char *a6)
{
	pid_t		pid;
	int			status;
	char		path[MAXPGPATH];
	char		opts[64];
	const char *argv[12];
	int			n = 0;

	argv[n++] = pg_ctl;
	argv[n++] = "-D";
	argv[n++] = pgdata;
	argv[n++] = a1;
	argv[n++] = a2;
	argv[n++] = a3;
	argv[n++] = a4;
	argv[n++] = a5;
	argv[n++] = a6;
	/* --switch-modes: every start says which storage mode */
	if (switch_modes && strcmp(a6, "start") == 0)
	{
		snprintf(opts, sizeof(opts), "-c dlock.storage=%s",
				 memory_mode ? "memory" : "table");
		argv[n++] = "-o";
		argv[n++] = opts;
	}
	argv[n] = NULL;

	snprintf(path, sizeof(path), "%s/pg_ctl.out", logdir);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0)
	{
		int			in = open("/dev/null", O_RDONLY);
		int			out = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);

		dup2(in, 0);
		dup2(out, 1);
		dup2(out, 2);
		pqsignal(SIGINT, SIG_IGN);
		execv(pg_ctl, (char *const *) argv);
		_exit(127);
	}
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The postmaster's PID from postmaster.pid, or 0. */
static pid_t
postmaster_pid(void)
{
	char		path[MAXPGPATH];
	FILE	   *f;
	long		pid = 0;

	snprintf(path, sizeof(path), "%s/postmaster.pid", pgdata);
	f = fopen(path, "r");
	if (f == NULL)
		return 0;
	if (fscanf(f, "%ld", &pid) != 1)
		pid = 0;
	fclose(f);
	return (pid_t) pid;
}

/* The parent PID of process pid, from /proc, or 0. */
static pid_t
parent_of(pid_t pid)
{
	char		path[64],
				buf[512];
	FILE	   *f;
	char	   *p;
	long		ppid = 0;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
	f = fopen(path, "r");
	if (f == NULL)
		return 0;
	if (fgets(buf, sizeof(buf), f) != NULL && (p = strrchr(buf, ')')) != NULL)
		sscanf(p + 1, " %*c %ld", &ppid);
	fclose(f);
	return (pid_t) ppid;
}

/*
 * Start the server, retrying while the old one's processes linger; say so
 * and return false if it does not come up within two minutes.
 */
static bool
start_server(void)
{
	int64		give_up = now_us() + 120 * INT64CONST(1000000);

	for (;;)
	{
		if (run_pg_ctl("-l", server_log, "-w", "-t", "60", "start") == 0)
			return true;
		if (now_us() > give_up)
		{
			fprintf(stderr, "dlock-chaos: the server did not start again (see %s/pg_ctl.out and %s)\n",
					logdir, server_log);
			return false;
		}
		sleep_until(now_us() + 500000);
	}
}

/* SIGCONT every worker the nemesis stopped. */
static void
continue_all(void)
{
	int			i;

	for (i = 0; i < nworkers; i++)
	{
		if (worker_pids[i] > 0)
			kill(worker_pids[i], SIGCONT);
		stopped_until[i] = 0;
	}
}

/* A random worker backend's PID, or 0; conn is the nemesis's connection. */
static int
random_backend(PGconn *conn)
{
	PGresult   *res;
	int			pid = 0;

	res = PQexec(conn, "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'dlock-chaos-w%' ORDER BY random() LIMIT 1");
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
		pid = atoi(PQgetvalue(res, 0, 0));
	PQclear(res);
	return pid;
}

/*
 * After a backend's SIGKILL: wait until the postmaster has reaped it (it
 * then stops every other process and refuses connections until the reset
 * is over) and until a connection succeeds again, so that the time we
 * record as "the server is back" comes after the reset.
 */
static void
wait_reset(pid_t pid)
{
	int64		give_up = now_us() + 60 * INT64CONST(1000000);
	char		path[64];
	PGconn	   *conn;

	snprintf(path, sizeof(path), "/proc/%d", (int) pid);
	while (access(path, F_OK) == 0 && now_us() < give_up)
		sleep_until(now_us() + 2000);
	sleep_until(now_us() + 20000);
	while ((conn = connect_db("dlock-chaos-nemesis", false)) == NULL &&
		   now_us() < give_up)
		sleep_until(now_us() + 10000);
	if (conn)
		PQfinish(conn);
}

/*
 * Crash the server one of three ways (with --switch-modes, four: a clean
 * restart too) and bring it back.  Returns false if
 * it cannot be brought back.
 */
static bool
crash_restart(PGconn **nconn)
{
	int			kind = (int) rnd_range(0, switch_modes ? 3 : 2);
	pid_t		pm = postmaster_pid();

	continue_all();
	if (pm == 0)
	{
		/* down already (a reset with restart_after_crash off): start it */
		return start_server();
	}
	if (kind == 2 && *nconn != NULL)
	{
		/* SIGKILL a worker's backend: the postmaster resets the cluster */
		int			pid = random_backend(*nconn);

		if (pid > 0 && pm > 0 && parent_of(pid) == pm && nkilled < MAX_KILLED)
		{
			killed_pids[nkilled++] = pid;
			if (kill(pid, SIGKILL) == 0)
			{
				n_crash_backendkill++;
				wait_reset(pid);
				return true;
			}
		}
		kind = 0;
	}

	/*
	 * --switch-modes: half of the restarts (never a reset, which keeps the
	 * postmaster's settings) come back in the other storage mode.
	 */
	if (switch_modes && chance(0.5))
	{
		memory_mode = !memory_mode;
		n_switches++;
		if (ncrashes < MAX_CRASHES)
			crash_switch[ncrashes] = true;
	}
	if (kind == 3)
	{
		/* a clean restart, as for a planned switch */
		if (run_pg_ctl("-m", "fast", "-w", "-t", "60", "stop") != 0)
		{
			fprintf(stderr, "dlock-chaos: pg_ctl stop -m fast failed (see %s/pg_ctl.out)\n", logdir);
			return false;
		}
		n_clean_restarts++;
	}
	if (kind == 1 && pm > 0)
	{
		int64		wait_end = now_us() + 30 * INT64CONST(1000000);

		if (kill(pm, SIGKILL) != 0)
			kind = 0;
		else
		{
			n_crash_pmkill++;
			while (kill(pm, 0) == 0 && now_us() < wait_end)
				sleep_until(now_us() + 20000);
		}
	}
	if (kind == 0 || kind == 2)
	{
		if (run_pg_ctl("-m", "immediate", "-w", "-t", "60", "stop") != 0)
		{
			fprintf(stderr, "dlock-chaos: pg_ctl stop -m immediate failed (see %s/pg_ctl.out)\n", logdir);
			return false;
		}
		n_crash_immediate++;
	}
	if (*nconn)
	{
		PQfinish(*nconn);
		*nconn = NULL;
	}
	sleep_until(now_us() + rnd_range(0, 1000000));
	return start_server();
}

/*
 * --sabotage=async-commit: wait (at most 3 s) until a worker's COMMIT has
 * returned (the workers count them in shared memory), then stop the server
 * at once (SIGQUIT to the postmaster, what pg_ctl stop -m immediate sends),
 * before the WAL writer flushes that asynchronous commit, and start it
 * again.  Returns false if it cannot be brought back.
 */
static bool
crash_after_ack(PGconn **nconn)
{
	int64		base = *acked_writes;
	int64		give_up = now_us() + 3 * INT64CONST(1000000);
	pid_t		pm;

	continue_all();
	while (*acked_writes == base && now_us() < give_up && !stop_requested)
		sleep_until(now_us() + 200);
	pm = postmaster_pid();
	if (pm == 0)
		return start_server();
	if (kill(pm, SIGQUIT) == 0)
	{
		int64		wait_end = now_us() + 30 * INT64CONST(1000000);

		n_crash_immediate++;
		while (kill(pm, 0) == 0 && now_us() < wait_end)
			sleep_until(now_us() + 20000);
	}
	if (*nconn)
	{
		PQfinish(*nconn);
		*nconn = NULL;
	}
	return start_server();
}

/*
 * The nemesis, in the main process, until the duration is over or we are
 * interrupted.  Returns false if the server could not be restarted.
 */
static bool
nemesis(void)
{
	PGconn	   *nconn = NULL;
	int64		next_action = now_us() + 500000;
	int64		next_crash = pgdata ? now_us() + rnd_range(crash_every_s / 2 * 1000000, crash_every_s * 1500000) : 0;
	bool		ok = true;
	bool		setval_done = false;

	if (sabotage & S_ASYNC)
		next_crash = now_us() + 1000000;

	while (!stop_requested && now_us() < end_us)
	{
		int64		t = now_us();
		int			i;

		/*
		 * --sabotage=setval: half-way, set the token sequence back to where
		 * it was when the run began, so that the next grants draw the tokens
		 * of the first half's grants again.
		 */
		if ((sabotage & S_SETVAL) && !setval_done && nconn != NULL &&
			t >= start_us + (end_us - start_us) / 2)
		{
			const char *params[1] = {seq_at_start};
			PGresult   *res = PQexecParams(nconn, "SELECT last_value, setval('dlock.fence_seq', $1::bigint) FROM dlock.fence_seq",
										   1, NULL, params, NULL, NULL, 0);

			if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
			{
				printf("dlock-chaos: sabotage: dlock.fence_seq set back from %s to %s at %.3f s\n",
					   PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1), (t - start_us) / 1e6);
				setval_done = true;
			}
			PQclear(res);
		}

		for (i = 0; i < nworkers; i++)
			if (stopped_until[i] != 0 && t >= stopped_until[i])
			{
				kill(worker_pids[i], SIGCONT);
				stopped_until[i] = 0;
			}
		if (nconn == NULL)
			nconn = connect_db("dlock-chaos-nemesis", false);

		/*
		 * With restart_after_crash off, a backend's SIGKILL shuts the server
		 * down: bring it back.
		 */
		if (pgdata && nconn == NULL && postmaster_pid() == 0)
		{
			sleep_until(now_us() + 200000);
			if (postmaster_pid() == 0 && !start_server())
			{
				ok = false;
				break;
			}
			continue;
		}

		if (pgdata && t >= next_crash)
		{
			int64		c0 = now_us();
			int64		before[MAX_KEYS];
			bool		was_memory = memory_mode;

			/* the keys' tokens acknowledged before this crash, for the forger */
			memcpy(before, shared->key_token, sizeof(int64) * nkeys);

			/*
			 * --forge: take a lease that outlives the restart (2 s longer than
			 * the longest one so far, 5 s at least, 15 s at most), so that in
			 * memory mode (or after a switch from table mode, which waits out
			 * the table's live leases) the horizon still holds every key when
			 * the server is back and the forger can try its tokens then.
			 */
			if (forge && nconn != NULL && (sabotage & S_ASYNC) == 0)
			{
				char		key[64],
							ttl[32];
				const char *p2[2] = {key, ttl};

				snprintf(key, sizeof(key), "dlock-chaos:nemesis-hold-%d", ncrashes);
				snprintf(ttl, sizeof(ttl), INT64_FORMAT " ms",
						 Min(15000, Max(5000, 2000 + shared->restart_us / 1000)));
				PQclear(PQexecParams(nconn, "SELECT count(*) FROM dlock.try_acquire($1, $2::interval)",
									 2, NULL, p2, NULL, NULL, 0));
			}
			if (!((sabotage & S_ASYNC) ? crash_after_ack(&nconn) : crash_restart(&nconn)))
			{
				ok = false;
				break;
			}
			if (ncrashes < MAX_CRASHES)
			{
				crash_at[ncrashes][0] = c0;
				crash_at[ncrashes][1] = now_us();
				crash_pre_memory[ncrashes] = was_memory;
				ncrashes++;
			}
			memcpy(shared->last_token, before, sizeof(int64) * nkeys);
			shared->pre_memory = was_memory;
			shared->back_at = now_us();
			shared->restart_us = Max(shared->restart_us, shared->back_at - c0);
			__sync_synchronize();
			shared->generation++;
			next_crash = now_us() + rnd_range(crash_every_s / 2 * 1000000, crash_every_s * 1500000);
			/* async-commit: crash again as soon as the workers are back */
			if (sabotage & S_ASYNC)
				next_crash = now_us() + rnd_range(300000, 800000);
			next_action = now_us() + 200000;
		}
		else if (t >= next_action)
		{
			if (chance(0.5))
			{
				i = (int) rnd_range(0, nworkers - 1);
				if (stopped_until[i] == 0)
				{
					kill(worker_pids[i], SIGSTOP);
					stopped_until[i] = t + rnd_range(600, 1500) * 1000;
					n_sigstops++;
				}
			}
			else if (nconn != NULL)
			{
				PGresult   *res = PQexec(nconn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'dlock-chaos-w%' ORDER BY random() LIMIT 1");

				if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
					strcmp(PQgetvalue(res, 0, 0), "t") == 0)
					n_terminates++;
				else if (PQstatus(nconn) != CONNECTION_OK)
				{
					PQfinish(nconn);
					nconn = NULL;
				}
				PQclear(res);
			}
			next_action = t + rnd_range(nemesis_ms / 2, nemesis_ms * 3 / 2) * 1000;
		}
		sleep_until(Min(now_us() + 20000, end_us));
	}
	continue_all();
	if (nconn)
		PQfinish(nconn);
	return ok;
}

/* Run a setup statement; die if it fails. */
static void
setup_exec(PGconn *conn, const char *sql)
{
	PGresult   *res = PQexec(conn, sql);

	if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "dlock-chaos: setup failed: %s", PQerrorMessage(conn));
		exit(2);
	}
	PQclear(res);
}

/* Create the extension (if missing) and the two fenced tables, afresh. */
static void
setup(void)
{
	PGconn	   *conn = connect_db("dlock-chaos-setup", true);
	char		sql[256];

	if (conn == NULL)
		exit(2);
	setup_exec(conn, "SET client_min_messages = warning");
	setup_exec(conn, "CREATE EXTENSION IF NOT EXISTS dlock");
	setup_exec(conn, "DROP TABLE IF EXISTS dlock_chaos_history, dlock_chaos_counter, dlock_chaos_forged, dlock_chaos_forged_mono, dlock_chaos_election, dlock_chaos_semaphore");

	/*
	 * The semaphore workload's history, as the election's: no fencing
	 * trigger, the writers' own dlock.fenced(key, token) guards it.
	 */
	if (semaphore)
		setup_exec(conn, "CREATE TABLE dlock_chaos_semaphore (id bigserial PRIMARY KEY, k text NOT NULL, fence bigint NOT NULL, worker int NOT NULL, op int NOT NULL, seq int NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp(), done_at timestamptz, UNIQUE (worker, op))");

	/*
	 * The election workload's history: no fencing trigger, the writers'
	 * own dlock.fenced(election, epoch) guards it.
	 */
	if (election)
	{
		int64		give_up = now_us() + 120 * INT64CONST(1000000);

		setup_exec(conn, "CREATE TABLE dlock_chaos_election (id bigserial PRIMARY KEY, election text NOT NULL, epoch bigint NOT NULL, worker int NOT NULL, op int NOT NULL, seq int NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp(), done_at timestamptz, UNIQUE (worker, op))");

		/*
		 * The token of a grant now is larger than that of every lease from
		 * before the run, which the observers may still see (a previous
		 * run's values mean nothing to this one's logs).  In memory mode
		 * after a restart, no grant until the horizon: wait for it.
		 */
		for (;;)
		{
			PGresult   *res = PQexec(conn, "SELECT fence FROM dlock.try_acquire('dlock-chaos:floor', '1 ms')");

			if (PQresultStatus(res) != PGRES_TUPLES_OK)
			{
				fprintf(stderr, "dlock-chaos: setup failed: %s", PQerrorMessage(conn));
				exit(2);
			}
			if (PQntuples(res) == 1)
			{
				el_floor = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
				PQclear(res);
				break;
			}
			PQclear(res);
			if (now_us() > give_up)
			{
				fprintf(stderr, "dlock-chaos: setup failed: no grant for 2 minutes\n");
				exit(2);
			}
			sleep_until(now_us() + 200000);
		}
	}
	setup_exec(conn, "CREATE TABLE dlock_chaos_counter (k text PRIMARY KEY, value bigint NOT NULL, fence bigint NOT NULL DEFAULT 0)");
	setup_exec(conn, "CREATE TABLE dlock_chaos_history (id bigserial PRIMARY KEY, k text NOT NULL, value bigint NOT NULL, fence bigint NOT NULL, worker int NOT NULL, op int NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp())");
	snprintf(sql, sizeof(sql),
			 "INSERT INTO dlock_chaos_counter (k, value) SELECT 'k' || i, 0 FROM generate_series(0, %d) i",
			 nkeys - 1);
	setup_exec(conn, sql);
	if (sabotage & S_SETVAL)
	{
		PGresult   *res = PQexec(conn, "SELECT last_value FROM dlock.fence_seq");

		if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
			strlcpy(seq_at_start, PQgetvalue(res, 0, 0), sizeof(seq_at_start));
		PQclear(res);
	}
	{
		PGresult   *res = PQexec(conn, "SHOW dlock.storage");

		memory_mode = PQresultStatus(res) == PGRES_TUPLES_OK &&
			strcmp(PQgetvalue(res, 0, 0), "memory") == 0;
		PQclear(res);
	}
	if (forge)
	{
		/* the forger's tables: every row in them is a forged write accepted */
		setup_exec(conn, "CREATE TABLE dlock_chaos_forged (id bigserial PRIMARY KEY, k text NOT NULL, fence bigint NOT NULL, op int NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp())");
		setup_exec(conn, "CREATE TABLE dlock_chaos_forged_mono (LIKE dlock_chaos_forged INCLUDING ALL)");
		setup_exec(conn, "CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON dlock_chaos_forged FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('dlock-chaos:{k}', 'fence')");
		setup_exec(conn, "CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON dlock_chaos_forged_mono FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('dlock-chaos:{k}', 'fence', 'monotonic')");
	}
	if (!no_fence)
	{
		setup_exec(conn, "CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON dlock_chaos_counter FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('dlock-chaos:{k}', 'fence')");
		setup_exec(conn, "CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON dlock_chaos_history FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('dlock-chaos:{k}', 'fence')");
	}
	PQfinish(conn);
}

/* ---------------------------------------------------------------- checker */

static ChaosOp *wlog[MAX_WORKERS];
static int	wlog_n[MAX_WORKERS];
static bool *in_db[MAX_WORKERS];	/* per record: its history row exists */
static int64 *written_at[MAX_WORKERS];	/* per record: the row's written_at
										 * (us since the epoch), or 0 */

/* violation counts by kind, and how many were printed */
static long violations = 0;
static long vio_kind[32];
static ChaosOp *flog;			/* the forger's records */
static int	flog_n = 0;
static bool *flog_in_db;		/* per record: its row exists */

#define V_GAP		0
#define V_DUP		1
#define V_FENCE_ORDER 2
#define V_STALE		3
#define V_NEWER		4
#define V_REISSUE	5
#define V_TOKEN_ORDER 6
#define V_LOST		7
#define V_PHANTOM	8
#define V_ERROR		9
#define V_SERVERLOG 10
#define V_COUNTER	11
#define V_STALE_SRV 12
#define V_EXCLUSION 13
#define V_FORGED	14
#define V_EL_FOREIGN 15
#define V_EL_ORDER	16
#define V_EL_OVERLAP 17
#define V_PROCLAIM	18
#define V_LEASE_LOST 19
#define V_OBS_BACK	20
#define V_OBS_STALE 21
#define V_OBS_PHANTOM 22
#define V_OBS_DEAD	23
#define V_EL_LOST	24
#define V_SEM_FOREIGN 25
#define V_SEM_WRITERS 26
#define V_SEM_GRANTS 27
#define V_RW_OVERLAP 28
#define V_RW_AFTER	29

static const char *const vio_name[] = {
	"history gap", "lost update (duplicate value)", "fences out of order",
	"write accepted after its lease expired", "write accepted under a superseded lease",
	"token reissued", "token not larger than an earlier acknowledged grant's",
	"acknowledged write lost", "write in the database that was not accepted",
	"unexpected error", "server log", "counter row wrong",
	"write accepted after its lease expired (server clock)",
	"key granted while an acknowledged lease of it was live (server clock)",
	"forged token accepted",
	"write accepted under an epoch its client was not granted",
	"epochs of accepted writes out of order (server clock)",
	"two clients' writes accepted at overlapping moments (server clock)",
	"proclaim accepted outside its lease",
	"acknowledged lease lost (its holder refused while it was certainly live)",
	"observer saw the election go backwards",
	"observer saw less than was acknowledged",
	"observer saw a value not proclaimed in that epoch",
	"ended lease reported as the leader",
	"acknowledged grant or proclaim lost (final state)",
	"write accepted under a token its client was not granted",
	"writes under more than N permits accepted at one moment (server clock)",
	"more than N permits of a key live at one moment (server clock)",
	"an exclusive lease's write and another lease's accepted at overlapping moments (server clock)",
	"write accepted after a later grant that excludes its lease (server clock)"
};

/* Report one violation (printed for the first SHOW_MAX of its kind). */
static void
violation(int kind, const char *fmt,...)
{
	va_list		ap;

	violations++;
	if (vio_kind[kind]++ >= SHOW_MAX)
		return;
	fprintf(stderr, "dlock-chaos: VIOLATION (%s): ", vio_name[kind]);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* Read every worker's log into wlog. */
static bool
read_logs(void)
{
	int			w;

	for (w = 0; w < nworkers; w++)
	{
		char		path[MAXPGPATH];
		struct stat st;
		FILE	   *f;

		snprintf(path, sizeof(path), "%s/worker-%d.log", logdir, w);
		if (stat(path, &st) != 0 || (f = fopen(path, "r")) == NULL)
		{
			fprintf(stderr, "dlock-chaos: cannot read %s: %m\n", path);
			return false;
		}
		wlog_n[w] = (int) (st.st_size / sizeof(ChaosOp));
		wlog[w] = pg_malloc0(sizeof(ChaosOp) * (wlog_n[w] + 1));
		in_db[w] = pg_malloc0(sizeof(bool) * (wlog_n[w] + 1));
		written_at[w] = pg_malloc0(sizeof(int64) * (wlog_n[w] + 1));
		if (wlog_n[w] > 0 && fread(wlog[w], sizeof(ChaosOp), wlog_n[w], f) != (size_t) wlog_n[w])
		{
			fprintf(stderr, "dlock-chaos: cannot read %s\n", path);
			fclose(f);
			return false;
		}
		fclose(f);
	}
	if (forge)
	{
		char		path[MAXPGPATH];
		struct stat st;
		FILE	   *f;

		snprintf(path, sizeof(path), "%s/forger.log", logdir);
		if (stat(path, &st) != 0 || (f = fopen(path, "r")) == NULL)
		{
			fprintf(stderr, "dlock-chaos: cannot read %s: %m\n", path);
			return false;
		}
		flog_n = (int) (st.st_size / sizeof(ChaosOp));
		flog = pg_malloc0(sizeof(ChaosOp) * (flog_n + 1));
		flog_in_db = pg_malloc0(sizeof(bool) * (flog_n + 1));
		if (flog_n > 0 && fread(flog, sizeof(ChaosOp), flog_n, f) != (size_t) flog_n)
		{
			fprintf(stderr, "dlock-chaos: cannot read %s\n", path);
			fclose(f);
			return false;
		}
		fclose(f);
	}
	return true;
}

static int
cmp_fence(const void *a, const void *b)
{
	const ChaosOp *x = *(ChaosOp *const *) a;
	const ChaosOp *y = *(ChaosOp *const *) b;

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	return x->fence < y->fence ? -1 : x->fence > y->fence ? 1 : 0;
}

static int
cmp_inv(const void *a, const void *b)
{
	const ChaosOp *x = *(ChaosOp *const *) a;
	const ChaosOp *y = *(ChaosOp *const *) b;

	return x->t_inv < y->t_inv ? -1 : x->t_inv > y->t_inv ? 1 : 0;
}

static int
cmp_done(const void *a, const void *b)
{
	const ChaosOp *x = *(ChaosOp *const *) a;
	const ChaosOp *y = *(ChaosOp *const *) b;

	return x->t_done < y->t_done ? -1 : x->t_done > y->t_done ? 1 : 0;
}

static int
cmp_int64(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return x < y ? -1 : x > y ? 1 : 0;
}

/* Seconds since the start, for messages. */
static double
rel(int64 t)
{
	return (t - start_us) / 1e6;
}

/* Scan the server log written since we started for what must not be there. */
static void
check_server_log(void)
{
	FILE	   *f;
	char		line[4096];

	if (server_log == NULL)
		return;
	f = fopen(server_log, "r");
	if (f == NULL)
	{
		fprintf(stderr, "dlock-chaos: cannot read %s: %m\n", server_log);
		violation(V_SERVERLOG, "server log %s unreadable", server_log);
		return;
	}
	fseek(f, server_log_start, SEEK_SET);
	while (fgets(line, sizeof(line), f) != NULL)
	{
		char	   *p;

		line[strcspn(line, "\n")] = '\0';
		if (strstr(line, "PANIC:") || strstr(line, "TRAP:"))
			violation(V_SERVERLOG, "%s", line);
		else if ((p = strstr(line, "terminated by signal")) != NULL)
		{
			char	   *q = strstr(line, "(PID ");
			int			pid = q ? atoi(q + 5) : 0;
			bool		ours = false;
			int			i;

			for (i = 0; i < nkilled; i++)
				if (killed_pids[i] == pid)
					ours = true;
			if (!ours || strncmp(p, "terminated by signal 9", 22) != 0)
				violation(V_SERVERLOG, "%s", line);
		}
	}
	fclose(f);
}

/*
 * --sabotage=delete-history, forge-history, server-log, after the run and
 * before the check: delete the history row of the last acknowledged write,
 * insert a row no worker wrote (both as a superuser, with
 * dlock.fence_bypass), append a backend's segmentation fault to the server
 * log.  Returns false if a sabotage could not be done.
 */
static bool
sabotage_after_run(PGconn *conn)
{
	PGresult   *res;

	if (sabotage & S_DELETE)
	{
		const ChaosOp *last = NULL;
		char		wbuf[16],
					obuf[16];
		const char *params[2];
		int			w,
					i;

		for (w = 0; w < nworkers; w++)
			for (i = 0; i < wlog_n[w]; i++)
				if (wlog[w][i].type == OP_WRITE && wlog[w][i].outcome == OUT_OK &&
					(last == NULL || wlog[w][i].t_done > last->t_done))
					last = &wlog[w][i];
		if (last == NULL)
		{
			fprintf(stderr, "dlock-chaos: sabotage delete-history: no acknowledged write\n");
			return false;
		}
		snprintf(wbuf, sizeof(wbuf), "%d", last->worker);
		snprintf(obuf, sizeof(obuf), "%d", last->op);
		params[0] = wbuf;
		params[1] = obuf;
		PQclear(PQexec(conn, "SET dlock.fence_bypass = on"));
		res = PQexecParams(conn, election ?
						   "DELETE FROM dlock_chaos_election WHERE worker = $1 AND op = $2" :
						   semaphore ?
						   "DELETE FROM dlock_chaos_semaphore WHERE worker = $1 AND op = $2" :
						   "DELETE FROM dlock_chaos_history WHERE worker = $1 AND op = $2",
						   2, NULL, params, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_COMMAND_OK || strcmp(PQcmdTuples(res), "1") != 0)
		{
			fprintf(stderr, "dlock-chaos: sabotage delete-history failed: %s", PQerrorMessage(conn));
			PQclear(res);
			return false;
		}
		PQclear(res);
		printf("dlock-chaos: sabotage: deleted the history row of %s value " INT64_FORMAT " (worker %d op %d, acknowledged)\n",
			   kname(last->key), last->value, last->worker, last->op);
	}
	if (sabotage & S_FORGE)
	{
		PQclear(PQexec(conn, "SET dlock.fence_bypass = on"));
		res = PQexec(conn, election ?
					 "INSERT INTO dlock_chaos_election (election, epoch, worker, op, seq) SELECT 'e0', coalesce(max(epoch), 0), 0, 1000000000, 1 FROM dlock_chaos_election WHERE election = 'e0'" :
					 semaphore ?
					 "INSERT INTO dlock_chaos_semaphore (k, fence, worker, op, seq) SELECT 's0', coalesce(max(fence), 0), 0, 1000000000, 1 FROM dlock_chaos_semaphore WHERE k = 's0'" :
					 "INSERT INTO dlock_chaos_history (k, value, fence, worker, op) SELECT 'k0', coalesce(max(value), 0) + 1, coalesce(max(fence), 0), 0, 1000000000 FROM dlock_chaos_history WHERE k = 'k0'");
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
		{
			fprintf(stderr, "dlock-chaos: sabotage forge-history failed: %s", PQerrorMessage(conn));
			PQclear(res);
			return false;
		}
		PQclear(res);
		printf("dlock-chaos: sabotage: inserted a history row of %s0 that no worker wrote (worker 0 op 1000000000)\n",
			   election ? "e" : semaphore ? "s" : "k");
	}
	if (sabotage & S_SERVERLOG)
	{
		FILE	   *f = server_log ? fopen(server_log, "a") : NULL;

		if (f == NULL)
		{
			fprintf(stderr, "dlock-chaos: sabotage server-log needs a writable --server-log\n");
			return false;
		}
		fprintf(f, "LOG:  server process (PID 1) was terminated by signal 11: Segmentation fault\n");
		if (fclose(f) != 0)
			return false;
		printf("dlock-chaos: sabotage: appended a segmentation fault to %s\n", server_log);
	}
	return true;
}

/* Connect for the final check, waiting out a recovery in progress. */
static PGconn *
connect_for_check(void)
{
	int64		give_up = now_us() + 180 * INT64CONST(1000000);
	PGconn	   *conn;

	while ((conn = connect_db("dlock-chaos-check", now_us() > give_up)) == NULL)
	{
		if (now_us() > give_up)
			return NULL;
		if (pgdata && postmaster_pid() == 0)
			start_server();
		sleep_until(now_us() + 500000);
	}
	return conn;
}

/* exclusion check's figures */
static long x_checked = 0;		/* pairs of consecutive grants checked */
static long x_released = 0;		/* of which the first was released */
static long x_crash = 0;		/* of which a crash-restart came between, the
								 * first lease certainly live at the crash */
static long x_unknown = 0;		/* skipped: a release's outcome unknown */
static long x_switch = 0;		/* of which a restart into the other storage
								 * mode came between, the first live at it */
static int64 x_margin = PG_INT64_MAX;	/* smallest (grant - end), us, of
										 * the pairs without a release */

/*
 * Exclusion, by the server's clock, of two acknowledged grants A and B of
 * one key, A's token the smaller (check_exclusion: each key's consecutive
 * grants): B must have been granted at or after the end of A's lease as it
 * stood when B was granted:
 *
 * - B's grant: srv_at, clock_timestamp() in the grant's statement, after
 *   the grant was made (so at or after its moment: an upper bound).
 * - A's end: the expires_at returned by A's grant, or by its last renewal
 *   acknowledged before B's grant was invoked.  Renewals whose outcome is
 *   unknown, or that overlap B's grant, are left out: the workers renew
 *   with the lease's own TTL, so a renewal can only have moved the end
 *   later.
 * - A released: an acknowledged release makes the limit the server's clock
 *   before that release (srv_at: the release is seen by others only when
 *   it commits, after that); a release whose outcome is unknown, invoked
 *   before B's grant returned, may have ended A at any moment: the pair is
 *   skipped.  (A release lost in a crash, dlock.async_release, only keeps A
 *   longer.)
 *
 * The grant order of a key is its token order: a grant draws its token
 * under the key's grant lock, held until its transaction ends.  Only
 * acknowledged grants count; an indeterminate grant between A and B, if
 * it happened, had to wait for A's end too, and B for its end.  After a
 * crash in memory mode every lease is lost: B must still wait for A's end
 * (the horizon), which is what this check sees and the write checks do
 * not.
 */
static void
exclusion_pair(const ChaosOp *a, const ChaosOp *b)
{
	const ChaosOp *wl = wlog[a->worker];
	int64		end = a->expires_srv;
	int64		limit;
	int64		released_at = PG_INT64_MAX;
	int64		release_inv = PG_INT64_MAX;
	bool		unknown = false;
	int			k,
				c;

	if (a->key != b->key || a->fence == b->fence)
		return;
	/* A's renewals and releases: its worker's records up to its next grant */
	for (k = a->op + 1; k < wlog_n[a->worker] && wl[k].type != OP_GRANT; k++)
	{
		const ChaosOp *p = &wl[k];

		if (p->key != a->key || p->fence != a->fence)
			continue;
		if (p->type == OP_RENEW && p->outcome == OUT_OK && p->t_done < b->t_inv)
			end = p->expires_srv;
		else if (p->type == OP_RELEASE && p->outcome == OUT_OK)
		{
			released_at = Min(released_at, p->srv_at);
			release_inv = Min(release_inv, p->t_inv);
		}
		else if (p->type == OP_RELEASE && p->outcome != OUT_NONE)
		{
			release_inv = Min(release_inv, p->t_inv);
			if (p->t_inv < b->t_done)
				unknown = true;
		}
	}
	if (unknown)
	{
		x_unknown++;
		return;
	}
	limit = Min(end, released_at);
	x_checked++;
	if (released_at != PG_INT64_MAX)
		x_released++;
	else
		x_margin = Min(x_margin, b->srv_at - limit);
	/* a crash-restart between them, A certainly live and unreleased */
	for (c = 0; c < ncrashes; c++)
		if (crash_at[c][0] > a->t_done && crash_at[c][1] < b->t_inv &&
			crash_at[c][0] < a->t_inv + (int64) a->ttl_ms * 1000 &&
			crash_at[c][0] < release_inv)
		{
			x_crash++;
			break;
		}
	for (c = 0; c < ncrashes; c++)
		if (crash_switch[c] && crash_at[c][0] > a->t_done && crash_at[c][1] < b->t_inv &&
			crash_at[c][0] < a->t_inv + (int64) a->ttl_ms * 1000 &&
			crash_at[c][0] < release_inv)
		{
			x_switch++;
			break;
		}
	if (b->srv_at < limit)
		violation(V_EXCLUSION, "%s granted with fence " INT64_FORMAT " (worker %d op %d, invoked at %.6f s) %.3f ms before the end of the lease with fence " INT64_FORMAT " (worker %d op %d, acknowledged at %.6f s, %s)",
				  kname(b->key), b->fence, b->worker, b->op, rel(b->t_inv),
				  (limit - b->srv_at) / 1000.0, a->fence, a->worker, a->op,
				  rel(a->t_done),
				  released_at < end ? "its release" : "its expires_at");
}

/* Each key's consecutive grants by token, judged by exclusion_pair. */
static void
check_exclusion(ChaosOp **grants, int ngrants)
{
	int			i;

	for (i = 1; i < ngrants; i++)
		exclusion_pair(grants[i - 1], grants[i]);
}

/* the forger's figures */
static long f_attempts = 0;
static long f_horizon = 0;		/* with a fresh key's grant refused just before */
static long f_memory = 0;		/* in memory mode */
static long f_accepted = 0;
static long f_by_tok[4];
static long f_by_via[4];
static long f_mono = 0;


/*
 * The index of the first of grants[0 .. ngrants - 1] (sorted by key, then
 * fence) whose (key, fence) is at least r's; ngrants if none.
 */
static int
first_grant_at(ChaosOp **grants, int ngrants, const ChaosOp *r)
{
	int			lo = 0;
	int			hi = ngrants - 1;

	while (lo <= hi)
	{
		int			mid = (lo + hi) / 2;
		const ChaosOp *g = grants[mid];

		if (g->key < r->key || (g->key == r->key && g->fence < r->fence))
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return lo;
}
/*
 * The forger's attempts.  A forged token is 0, -1 or never issued: any
 * acceptance (a row in a forged table, or check_fence saying true) is a
 * violation.  The last token acknowledged for a key before a crash-restart
 * that began in memory mode: an acceptance is a violation if the grant of
 * that token was acknowledged before such a crash began and the attempt
 * was made after the server was back (the crash dropped the lease, in
 * whatever mode the server came back).  grants: the acknowledged grants
 * sorted by key and token.
 */
static void
check_forged(PGconn *conn, ChaosOp **grants, int ngrants)
{
	PGresult   *res;
	int			i;

	res = PQexec(conn, "SELECT op, k, fence FROM dlock_chaos_forged UNION ALL SELECT op, k, fence FROM dlock_chaos_forged_mono");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "dlock-chaos: cannot read the forged tables: %s", PQerrorMessage(conn));
		violation(V_FORGED, "the forged tables are unreadable");
		PQclear(res);
		return;
	}
	for (i = 0; i < PQntuples(res); i++)
	{
		int			op = atoi(PQgetvalue(res, i, 0));

		if (op >= 0 && op < flog_n && flog[op].type == OP_FORGE)
			flog_in_db[op] = true;
		else
			violation(V_FORGED, "a row of %s with token %s, op %d, matches no attempt of the forger",
					  PQgetvalue(res, i, 1), PQgetvalue(res, i, 2), op);
	}
	PQclear(res);

	for (i = 0; i < flog_n; i++)
	{
		const ChaosOp *r = &flog[i];
		int			tk = (r->flags & F_TOK_MASK) >> 8;
		int			via = (r->flags & F_VIA_MASK) >> 12;
		bool		accepted;
		const char *why = NULL;

		if (r->type != OP_FORGE)
			continue;
		f_attempts++;
		if (r->flags & F_HORIZON)
			f_horizon++;
		if (r->flags & F_MEMORY)
			f_memory++;
		if (r->flags & F_MONO)
			f_mono++;
		f_by_tok[tk == 1 ? 0 : tk == 2 ? 1 : tk == 4 ? 2 : 3]++;
		f_by_via[via == 1 ? 0 : via == 2 ? 1 : via == 4 ? 2 : 3]++;
		if (r->outcome == OUT_UNEXPECTED)
			violation(V_ERROR, "forger op %d: SQLSTATE %s at %.3f s", i, r->sqlstate, rel(r->t_done));
		accepted = flog_in_db[i] ||
			((r->flags & F_VIA_CHECK) && r->outcome == OUT_OK);
		if (!accepted)
			continue;
		f_accepted++;
		if (r->flags & (F_TOK_ZERO | F_TOK_NEG))
			why = "a token below 1";
		else if (r->flags & F_TOK_NEVER)
			why = "a token never issued";
		else
		{
			/* the last token before a crash: find its grant */
			int			lo = first_grant_at(grants, ngrants, r),
						c;

			if (lo < ngrants && grants[lo]->key == r->key && grants[lo]->fence == r->fence)
				for (c = 0; c < ncrashes; c++)
					if (crash_pre_memory[c] && crash_at[c][0] > grants[lo]->t_done &&
						crash_at[c][1] < r->t_inv)
					{
						why = "the token of a lease dropped by a crash-restart in memory mode";
						break;
					}
		}
		if (why)
			violation(V_FORGED, "k%s token " INT64_FORMAT " (%s) accepted %s at %.3f s (forger op %d, %s, %s mode%s)",
					  r->key < nkeys ? psprintf("%d", r->key) : "never", r->fence, why,
					  (r->flags & F_VIA_CHECK) ? "by check_fence" :
					  (r->flags & F_VIA_USE_FENCE) ? "by use_fence and the trigger" :
					  (r->flags & F_VIA_FENCED) ? "by fenced and the trigger" : "by the trigger (token column)",
					  rel(r->t_inv), i,
					  (r->flags & F_MONO) ? "monotonic table" : "lease table",
					  (r->flags & F_MEMORY) ? "memory" : "table",
					  (r->flags & F_HORIZON) ? ", while the horizon held every key" : "");
	}
}

/*
 * The server's expiry of the lease of record i of worker w, as it stood
 * before that record: the expires_at returned by the lease's last grant or
 * renewal before it (the worker's log is in order; a renewal after the
 * record cannot make it legal, and a renewal may move the expiry earlier,
 * so the last one counts); 0 if none.  *unknown is set when a renewal of
 * the lease before it had an unknown outcome.
 */
static int64
expiry_before(int w, int i, bool *unknown)
{
	const ChaosOp *r = &wlog[w][i];
	int64		limit = 0;
	int			k;

	for (k = i - 1; k >= 0; k--)
	{
		const ChaosOp *p = &wlog[w][k];

		if (p->key != r->key || p->fence != r->fence)
			continue;
		if (p->type == OP_RENEW && p->outcome == OUT_OK)
		{
			if (limit == 0)
				limit = p->expires_srv;
		}
		else if (p->type == OP_RENEW &&
				 (p->outcome == OUT_INDET || p->outcome == OUT_UNEXPECTED))
			*unknown = true;
		else if (p->type == OP_GRANT && p->outcome == OUT_OK)
		{
			if (limit == 0)
				limit = p->expires_srv;
			break;
		}
	}
	return limit;
}

/*
 * The election workload's checks (--workload election).
 */

/* a row of the election's history */
typedef struct ElRow
{
	int			e;
	int			worker;
	int			op;
	int64		epoch;
	int64		seq;
	int64		at;				/* written_at, us since the epoch */
	int64		end;			/* done_at, or written_at */
	bool		matched;		/* it is a write of the logs */
} ElRow;

static ElRow *el_rows;			/* by election, written_at, epoch desc */
static int	el_nrows = 0;

/* per election: its acknowledged grants by completion, and the running max */
static ChaosOp **el_bydone[MAX_KEYS];
static ChaosOp **el_top[MAX_KEYS];	/* [j]: the largest token of [0..j] */
static int	el_ngrants[MAX_KEYS];

/* the election's figures */
static long e_epochs_written = 0;	/* epochs with an accepted write */
static long e_leader_changes = 0;	/* consecutive grants, other client */
static long e_proclaims = 0;	/* proclaims acknowledged true */
static long e_proclaims_refused = 0;	/* said false */
static long e_stale_proclaims = 0;	/* paused past the lease's end */
static long e_stale_proclaims_refused = 0;
static long e_proclaims_srv = 0;	/* accepted ones checked by the
									 * server's clock */
static long e_refusals_checked = 0; /* holders' refusals checked against a
									 * certainly live lease */
static long e_observations = 0; /* calls that returned a row */
static long e_obs_timeouts = 0; /* observe: wait ran out */
static long e_leader_rows = 0;	/* dlock.leader: a row */
static long e_leader_none = 0;	/* dlock.leader: no row */
static long e_obs_changes = 0;	/* rows with a newer epoch or value than
								 * the observer had seen */
static long e_obs_vs_acked = 0; /* rows checked against acknowledged
								 * grants and proclaims */
static long e_obs_vs_live = 0;	/* observations made while an acknowledged
								 * lease was certainly live */
static long e_overlap_pairs = 0;	/* rows after another client's, checked */
static long e_txn_writes = 0;	/* accepted writes of two statements */
static long e_horizon_pairs = 0;	/* consecutive grants across a crash in
									 * memory mode, the first lease live */

/*
 * Read the election's history; match each row with its write in the logs
 * (in_db, written_at), a row that matches none, or a write that was
 * refused or failed, being a violation.  Returns false if the table cannot
 * be read.
 */
static bool
check_election_history(PGconn *conn)
{
	PGresult   *res;
	int			i;

	res = PQexec(conn, "SELECT substr(election, 2)::int, epoch, worker, op, seq, (extract(epoch FROM written_at) * 1000000)::bigint, (extract(epoch FROM coalesce(done_at, written_at)) * 1000000)::bigint FROM dlock_chaos_election ORDER BY 1, 6, 2 DESC, id");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "dlock-chaos: cannot read the election's history: %s", PQerrorMessage(conn));
		return false;
	}
	el_nrows = PQntuples(res);
	el_rows = pg_malloc0(sizeof(ElRow) * (el_nrows + 1));
	for (i = 0; i < el_nrows; i++)
	{
		ElRow	   *row = &el_rows[i];
		const ChaosOp *r = NULL;

		row->e = atoi(PQgetvalue(res, i, 0));
		row->epoch = strtoll(PQgetvalue(res, i, 1), NULL, 10);
		row->worker = atoi(PQgetvalue(res, i, 2));
		row->op = atoi(PQgetvalue(res, i, 3));
		row->seq = strtoll(PQgetvalue(res, i, 4), NULL, 10);
		row->at = strtoll(PQgetvalue(res, i, 5), NULL, 10);
		row->end = strtoll(PQgetvalue(res, i, 6), NULL, 10);
		if (row->worker >= 0 && row->worker < nworkers &&
			row->op >= 0 && row->op < wlog_n[row->worker])
			r = &wlog[row->worker][row->op];
		if (r == NULL || r->type != OP_WRITE || r->key != row->e ||
			r->value != row->seq || r->fence != row->epoch)
		{
			violation(V_PHANTOM, "e%d epoch " INT64_FORMAT " seq " INT64_FORMAT " by worker %d op %d matches no write in the logs",
					  row->e, row->epoch, row->seq, row->worker, row->op);
			continue;
		}
		row->matched = true;
		in_db[row->worker][row->op] = true;
		written_at[row->worker][row->op] = row->at;
		if (r->outcome != OUT_OK && r->outcome != OUT_INDET)
			violation(V_PHANTOM, "e%d epoch " INT64_FORMAT " seq " INT64_FORMAT " by worker %d op %d was reported failed (%s) but is in the database",
					  row->e, row->epoch, row->seq, row->worker, row->op, r->sqlstate);
	}
	PQclear(res);
	return true;
}

/*
 * Per election, its acknowledged grants in order of completion (bydone:
 * every acknowledged grant, by completion), and for each prefix the one
 * with the largest token: the latest epoch acknowledged by then.
 */
static void
el_prepare(ChaosOp **bydone, int ngrants)
{
	int			i,
				e;

	for (e = 0; e < nkeys; e++)
	{
		el_bydone[e] = pg_malloc(sizeof(ChaosOp *) * (ngrants + 1));
		el_top[e] = pg_malloc(sizeof(ChaosOp *) * (ngrants + 1));
		el_ngrants[e] = 0;
	}
	for (i = 0; i < ngrants; i++)
	{
		ChaosOp    *g = bydone[i];
		int			n;

		if (g->key < 0 || g->key >= nkeys)
			continue;
		n = el_ngrants[g->key]++;
		el_bydone[g->key][n] = g;
		el_top[g->key][n] = (n > 0 && el_top[g->key][n - 1]->fence > g->fence) ?
			el_top[g->key][n - 1] : g;
	}
}

/*
 * The acknowledged grant of election e with the largest token among those
 * acknowledged before monotonic time t, or NULL.
 */
static const ChaosOp *
latest_grant(int e, int64 t)
{
	int			lo = 0,
				hi = el_ngrants[e] - 1;

	/* the last j with t_done < t */
	while (lo <= hi)
	{
		int			mid = (lo + hi) / 2;

		if (el_bydone[e][mid]->t_done < t)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return hi >= 0 ? el_top[e][hi] : NULL;
}

/*
 * The acknowledged grant of the lease of record i of worker w (the same
 * election and token, earlier in its log), or NULL: a write under another
 * client's epoch (--sabotage=usurp) has none.
 */
static const ChaosOp *
lease_grant_of(int w, int i)
{
	const ChaosOp *r = &wlog[w][i];
	int			k;

	for (k = i - 1; k >= 0; k--)
	{
		const ChaosOp *p = &wlog[w][k];

		if (p->type == OP_GRANT && p->outcome == OUT_OK &&
			p->key == r->key && p->fence == r->fence)
			return p;
	}
	return NULL;
}

/*
 * Until when (monotonic) the lease granted by g is certainly live, judged
 * for a call made from t_from to t_to: (the invocation of its grant, or of
 * its last renewal acknowledged before t_from) + TTL - slack.  The server
 * computed the expiry from its clock at a moment after that invocation,
 * and the workers renew with the lease's own TTL.  0 if it may have ended
 * otherwise before t_to: a release (resignation) tried before t_to, or a
 * crash-restart begun in memory mode (which drops every lease) or into
 * the other storage mode since the grant was invoked.  (A forget, which
 * only --sabotage=steal does, is not allowed for: the checks must see it.)
 */
static int64
certain_end(const ChaosOp *g, int64 t_from, int64 t_to)
{
	const ChaosOp *wl = wlog[g->worker];
	int64		base = g->t_inv;
	int			k,
				c;

	for (c = 0; c < ncrashes; c++)
		if ((crash_pre_memory[c] || crash_switch[c]) &&
			crash_at[c][0] > g->t_inv && crash_at[c][0] < t_to)
			return 0;
	for (k = g->op + 1; k < wlog_n[g->worker]; k++)
	{
		const ChaosOp *p = &wl[k];

		if (p->t_inv >= t_to)
			break;
		if (p->key != g->key || p->fence != g->fence)
			continue;
		if (p->type == OP_RELEASE && p->outcome != OUT_NONE)
			return 0;
		if (p->type == OP_RENEW && p->outcome == OUT_OK && p->t_done < t_from)
			base = Max(base, p->t_inv);
	}
	return base + (int64) g->ttl_ms * 1000 - SLACK_US;
}

/*
 * The record that set an election value: the grant (n = 0) of record vop
 * of campaigner vw, or that campaigner's proclaim of n under the same
 * grant.  Returns it, or NULL with *why set when there is none, or when it
 * was refused or belongs to another election or epoch (fence: the epoch the
 * value was seen under, or -1 if none).
 */
static const ChaosOp *
value_source(int e, int64 fence, int32 vw, int32 vop, int64 n, const char **why)
{
	const ChaosOp *g;
	int			k;

	if (vw < 0 || vw >= ncampaigners || vop < 0 || vop >= wlog_n[vw])
	{
		*why = vw == -2 ? "a value that is not one of ours" : "the campaign it names was never made";
		return NULL;
	}
	g = &wlog[vw][vop];
	if (g->type != OP_GRANT || g->key != e)
	{
		*why = "the campaign it names was never made";
		return NULL;
	}
	if (g->outcome != OUT_OK && g->outcome != OUT_INDET)
	{
		*why = "the campaign it names was not granted";
		return NULL;
	}
	/* an indeterminate grant's token is unknown: any epoch may be its */
	if (fence >= 0 && g->outcome == OUT_OK && g->fence != fence)
	{
		*why = "it was proclaimed in another epoch";
		return NULL;
	}
	if (n == 0)
		return g;
	for (k = vop + 1; k < wlog_n[vw]; k++)
	{
		const ChaosOp *p = &wlog[vw][k];

		if (p->type == OP_GRANT && p->outcome != OUT_NONE)
			break;
		if (p->type != OP_PROCLAIM || p->vop != vop || p->value != n)
			continue;
		if (p->outcome != OUT_OK && p->outcome != OUT_INDET)
		{
			*why = "its proclaim was refused";
			return NULL;
		}
		return p;
	}
	*why = "no proclaim of it was made";
	return NULL;
}

/*
 * The last proclaim acknowledged true under grant g before monotonic time
 * t (PG_INT64_MAX: at all), or g itself (its value) if none.
 */
static const ChaosOp *
last_acked_value(const ChaosOp *g, int64 t)
{
	const ChaosOp *last = g;
	int			k;

	for (k = g->op + 1; k < wlog_n[g->worker]; k++)
	{
		const ChaosOp *p = &wlog[g->worker][k];

		if (p->type == OP_GRANT && p->outcome != OUT_NONE)
			break;
		if (p->type == OP_PROCLAIM && p->vop == g->op && p->outcome == OUT_OK &&
			p->t_done < t && p->op > last->op)
			last = p;
	}
	return last;
}

/* A record's name for messages: "worker W op I". */
static const char *
who(const ChaosOp *r)
{
	return psprintf("worker %d op %d", r->worker, r->op);
}

/*
 * The election's history: every accepted write of an epoch comes from the
 * client granted that epoch; by the server's clock, no accepted write of
 * an epoch comes after one of a larger epoch (written_at: after the token
 * was checked; a write of a newer epoch is checked after its grant, which
 * comes after the COMMIT of every write of older ones, whose key lock it
 * must wait for); and no two clients' writes overlap ([written_at,
 * done_at], both inside the fence).  grants: the acknowledged grants by
 * election and token.
 */
static void
el_check_rows(ChaosOp **grants, int ngrants)
{
	int			i;
	int			cur_e = -1;
	int64		max_epoch = 0;
	const ElRow *max_row = NULL;
	const ElRow *best1 = NULL;	/* the latest-ending row so far */
	const ElRow *best2 = NULL;	/* the same, of another client than best1 */
	int64	   *epochs = pg_malloc(sizeof(int64) * (el_nrows + 1));

	for (i = 0; i < el_nrows; i++)
	{
		const ElRow *row = &el_rows[i];
		const ElRow *other;

		if (row->e != cur_e)
		{
			cur_e = row->e;
			max_epoch = 0;
			max_row = NULL;
			best1 = best2 = NULL;
		}
		epochs[i] = row->epoch;
		if (row->matched)
		{
			ChaosOp		probe;
			int			lo;

			memset(&probe, 0, sizeof(probe));
			probe.key = row->e;
			probe.fence = row->epoch;
			lo = first_grant_at(grants, ngrants, &probe);
			if (lo >= ngrants || grants[lo]->key != row->e || grants[lo]->fence != row->epoch)
				violation(V_EL_FOREIGN, "e%d epoch " INT64_FORMAT ": a write by worker %d (op %d) was accepted, but no client was acknowledged that epoch",
						  row->e, row->epoch, row->worker, row->op);
			else if (grants[lo]->worker != row->worker || grants[lo]->op > row->op)
				violation(V_EL_FOREIGN, "e%d epoch " INT64_FORMAT ": a write by worker %d (op %d) was accepted, but the epoch was granted to worker %d (op %d)",
						  row->e, row->epoch, row->worker, row->op,
						  grants[lo]->worker, grants[lo]->op);
			if (wlog[row->worker][row->op].flags & F_TXN)
				e_txn_writes++;
		}

		/* epochs never go back along the server's clock */
		if (max_row != NULL && row->epoch < max_epoch)
			violation(V_EL_ORDER, "e%d: a write of epoch " INT64_FORMAT " (worker %d op %d) has written_at %.3f ms after that of a write of epoch " INT64_FORMAT " (worker %d op %d)",
					  row->e, row->epoch, row->worker, row->op,
					  (row->at - max_row->at) / 1000.0, max_epoch,
					  max_row->worker, max_row->op);
		if (max_row == NULL || row->epoch > max_epoch)
		{
			max_epoch = row->epoch;
			max_row = row;
		}

		/* no overlap with an earlier-starting row of another client */
		other = (best1 != NULL && best1->worker != row->worker) ? best1 : best2;
		if (other != NULL)
		{
			e_overlap_pairs++;
			if (other->end >= row->at)
				violation(V_EL_OVERLAP, "e%d: worker %d's write (epoch " INT64_FORMAT ", op %d) was written %.3f ms before worker %d's (epoch " INT64_FORMAT ", op %d) ended (its done_at)",
						  row->e, row->worker, row->epoch, row->op,
						  (other->end - row->at) / 1000.0, other->worker,
						  other->epoch, other->op);
		}
		if (best1 == NULL || row->end > best1->end)
		{
			if (best1 != NULL && best1->worker != row->worker)
				best2 = best1;
			best1 = row;
		}
		else if (row->worker != best1->worker && (best2 == NULL || row->end > best2->end))
			best2 = row;
	}

	/* distinct epochs with an accepted write (tokens are unique) */
	qsort(epochs, el_nrows, sizeof(int64), cmp_int64);
	for (i = 0; i < el_nrows; i++)
		if (i == 0 || epochs[i] != epochs[i - 1])
			e_epochs_written++;
	pg_free(epochs);
}

/*
 * The campaigners' proclaims and refusals.  A proclaim acknowledged true
 * must have been made inside its lease: sent before the lease's client-side
 * expiry bound, read by the server's clock before the expires_at of the
 * lease's last grant or renewal, and sent before any grant of a larger
 * epoch of the election was acknowledged.  A refusal of the holder (a
 * renewal that says NULL, a proclaim that says false, a fenced write
 * refused with LF001, a resignation that says false) must not come while
 * its lease was certainly live:
 * that would be an acknowledged grant lost.  grants and minlater as in
 * check().
 */
static void
el_check_campaigners(ChaosOp **grants, int ngrants, const int64 *minlater)
{
	int			w,
				i;

	for (w = 0; w < ncampaigners; w++)
		for (i = 0; i < wlog_n[w]; i++)
		{
			const ChaosOp *r = &wlog[w][i];
			bool		refusal;

			if (r->type == OP_PROCLAIM)
			{
				if (r->flags & F_PAUSE_BEFORE)
				{
					e_stale_proclaims++;
					if (r->outcome == OUT_NONE)
						e_stale_proclaims_refused++;
				}
				if (r->outcome == OUT_NONE)
					e_proclaims_refused++;
			}
			if (r->type == OP_PROCLAIM && r->outcome == OUT_OK)
			{
				bool		unknown = false;
				int64		limit = expiry_before(w, i, &unknown);
				int			lo = first_grant_at(grants, ngrants, r);
				int64		first_later = PG_INT64_MAX;

				e_proclaims++;
				if ((r->flags & F_PAUSE_BEFORE) || r->t_inv > r->deadline + SLACK_US)
					violation(V_PROCLAIM, "e%d epoch " INT64_FORMAT " value " INT64_FORMAT " (%s%s): sent %.1f ms after the lease had expired, at the latest",
							  r->key, r->fence, r->value, who(r),
							  (r->flags & F_PAUSE_BEFORE) ? ", paused before" : "",
							  (r->t_inv - r->deadline) / 1000.0);
				if (!unknown && limit != 0)
				{
					e_proclaims_srv++;
					if (r->srv_lo >= limit)
						violation(V_PROCLAIM, "e%d epoch " INT64_FORMAT " value " INT64_FORMAT " (%s): the server's clock before it was %.3f ms after the lease's expires_at",
								  r->key, r->fence, r->value, who(r),
								  (r->srv_lo - limit) / 1000.0);
				}
				if (lo < ngrants && grants[lo]->key == r->key && grants[lo]->fence == r->fence)
					first_later = minlater[lo];
				else if (lo < ngrants && grants[lo]->key == r->key)
					first_later = Min(grants[lo]->t_done, minlater[lo]);
				if (first_later < r->t_inv)
					violation(V_PROCLAIM, "e%d epoch " INT64_FORMAT " value " INT64_FORMAT " (%s): sent at %.6f s, after a grant of a larger epoch was acknowledged at %.6f s",
							  r->key, r->fence, r->value, who(r), rel(r->t_inv), rel(first_later));
			}

			refusal = (r->type == OP_RENEW && r->outcome == OUT_NONE) ||
				(r->type == OP_RELEASE && r->outcome == OUT_NONE) ||
				(r->type == OP_PROCLAIM && r->outcome == OUT_NONE) ||
				(r->type == OP_WRITE && r->outcome == OUT_REFUSED);
			if (refusal)
			{
				const ChaosOp *g = lease_grant_of(w, i);
				int64		until;

				if (g == NULL)
					continue;
				until = certain_end(g, r->t_inv, r->t_done);
				if (until == 0)
					continue;
				e_refusals_checked++;
				if (r->t_done < until)
					violation(V_LEASE_LOST, "%s %s " INT64_FORMAT " (%s): %s at %.6f s, while the lease was certainly live until %.6f s",
							  kname(r->key), semaphore ? "fence" : "epoch", r->fence, who(r),
							  r->type == OP_RENEW ? "renew said NULL" :
							  r->type == OP_RELEASE ? (semaphore ? "release said false" : "resign said false") :
							  r->type == OP_PROCLAIM ? "proclaim said false" :
							  "the fenced write was refused",
							  rel(r->t_done), rel(until));
			}
		}
}

/*
 * What the observers saw, each election on its own, in each observer's
 * order (one call at a time, so the order of its calls is real time):
 *
 * - never backwards: no epoch smaller than one it saw before, no value of
 *   an epoch with a smaller n than one it saw before in that epoch;
 * - only what was proclaimed: a value "w<c>:<op>:<n>" is the value of
 *   campaign op of campaigner c (n = 0) or of its proclaim of n, granted
 *   or acknowledged (or of unknown outcome), not refused, seen under that
 *   campaign's epoch;
 * - never less than was acknowledged before the call began: no epoch
 *   smaller than the latest acknowledged one, no older value of that
 *   epoch than its last acknowledged proclaim; and while that lease was
 *   certainly live for the whole call, a live leader with that epoch (in
 *   table mode, where lease rows are kept, some lease at all);
 * - a lease reported live (observe's 'held', every row of dlock.leader)
 *   has an expires_at after the statement began.
 */
static void
el_check_observers(void)
{
	int			w,
				i;
	bool		table_only = !memory_mode && !switch_modes;
	int64	   *prev_fence = pg_malloc(sizeof(int64) * nkeys);
	int64	   *prev_n = pg_malloc(sizeof(int64) * nkeys);
	const ChaosOp **prev_rec = pg_malloc(sizeof(ChaosOp *) * nkeys);

	for (w = ncampaigners; w < nworkers; w++)
	{
		int			e;

		for (e = 0; e < nkeys; e++)
		{
			prev_fence[e] = 0;
			prev_n[e] = -1;
			prev_rec[e] = NULL;
		}
		for (i = 0; i < wlog_n[w]; i++)
		{
			const ChaosOp *r = &wlog[w][i];
			const ChaosOp *g,
					   *src = NULL;
			bool		has_fence = !(r->flags & F_NOFENCE);
			bool		held = (r->flags & F_ST_HELD) != 0;
			const char *what = r->type == OP_LEADER ? "leader()" : "observe()";
			const char *why = NULL;
			int64		live_until = 0;

			if ((r->type != OP_OBSERVE && r->type != OP_LEADER) || r->outcome != OUT_OK)
				continue;
			e = r->key;
			g = latest_grant(e, r->t_inv);
			if (g != NULL)
				live_until = certain_end(g, r->t_inv, r->t_done);
			if (g != NULL && r->t_done < live_until)
				e_obs_vs_live++;
			else
				live_until = 0;
			if (r->flags & F_NOROW)
			{
				if (r->type == OP_OBSERVE)
				{
					e_obs_timeouts++;
					continue;
				}
				e_leader_none++;
				if (live_until != 0)
					violation(V_OBS_STALE, "e%d: worker %d op %d, leader() at %.6f s: no leader, while epoch " INT64_FORMAT " (%s) was certainly live",
							  e, w, i, rel(r->t_inv), g->fence, who(g));
				continue;
			}
			e_observations++;
			if (r->type == OP_LEADER)
				e_leader_rows++;

			/* a live lease that had ended before the statement began */
			if (held && r->expires_srv != 0 && r->expires_srv <= r->srv_lo)
				violation(V_OBS_DEAD, "e%d: worker %d op %d, %s: epoch " INT64_FORMAT " reported live, its expires_at %.3f ms before the statement began",
						  e, w, i, what, r->fence, (r->srv_lo - r->expires_srv) / 1000.0);

			/*
			 * The value: whose, and proclaimed in this epoch (a lease from
			 * before the run has a value that the logs cannot tell).
			 */
			if (!(r->flags & F_NOVALUE) && !(has_fence && r->fence <= el_floor))
			{
				src = value_source(e, has_fence ? r->fence : -1, r->vworker, r->vop, r->value, &why);
				if (src == NULL)
					violation(V_OBS_PHANTOM, "e%d: worker %d op %d, %s at %.6f s: epoch " INT64_FORMAT " value w%d:%d:" INT64_FORMAT ": %s",
							  e, w, i, what, rel(r->t_inv), r->fence,
							  r->vworker, r->vop, r->value, why);
			}

			/* never backwards, for this observer */
			if (has_fence)
			{
				if (r->fence < prev_fence[e])
					violation(V_OBS_BACK, "e%d: worker %d op %d, %s at %.6f s: epoch " INT64_FORMAT " after epoch " INT64_FORMAT " (op %d)",
							  e, w, i, what, rel(r->t_inv), r->fence, prev_fence[e],
							  prev_rec[e] ? prev_rec[e]->op : -1);
				else if (r->fence == prev_fence[e] && src != NULL &&
						 r->value < prev_n[e])
					violation(V_OBS_BACK, "e%d: worker %d op %d, %s at %.6f s: epoch " INT64_FORMAT " value " INT64_FORMAT " after value " INT64_FORMAT " (op %d)",
							  e, w, i, what, rel(r->t_inv), r->fence, r->value,
							  prev_n[e], prev_rec[e] ? prev_rec[e]->op : -1);
				if (r->fence > prev_fence[e] ||
					(src != NULL && r->fence == prev_fence[e] && r->value > prev_n[e]))
					e_obs_changes++;
				if (r->fence > prev_fence[e])
				{
					prev_fence[e] = r->fence;
					prev_n[e] = -1;
				}
				if (r->fence == prev_fence[e] && src != NULL)
					prev_n[e] = Max(prev_n[e], r->value);
				prev_rec[e] = r;
			}

			/* never less than was acknowledged before the call */
			if (g == NULL)
				continue;
			e_obs_vs_acked++;
			if (has_fence && r->fence < g->fence)
				violation(V_OBS_STALE, "e%d: worker %d op %d, %s at %.6f s: epoch " INT64_FORMAT ", but epoch " INT64_FORMAT " had been acknowledged (%s) at %.6f s",
						  e, w, i, what, rel(r->t_inv), r->fence, g->fence, who(g), rel(g->t_done));
			else if (has_fence && r->fence == g->fence && src != NULL)
			{
				const ChaosOp *p = last_acked_value(g, r->t_inv);

				if (src->op < p->op)
					violation(V_OBS_STALE, "e%d: worker %d op %d, %s at %.6f s: epoch " INT64_FORMAT " value " INT64_FORMAT ", but value " INT64_FORMAT " had been acknowledged (%s) at %.6f s",
							  e, w, i, what, rel(r->t_inv), r->fence, r->value,
							  p->value, who(p), rel(p->t_done));
			}
			if (live_until != 0 && has_fence && r->fence > g->fence)
				violation(V_EXCLUSION, "e%d: worker %d op %d, %s at %.6f s: epoch " INT64_FORMAT ", while epoch " INT64_FORMAT " (%s) was certainly live",
						  e, w, i, what, rel(r->t_inv), r->fence, g->fence, who(g));
			else if (live_until != 0 && !held)
				violation(V_OBS_STALE, "e%d: worker %d op %d, %s at %.6f s: state %s, while epoch " INT64_FORMAT " (%s) was certainly live",
						  e, w, i, what, rel(r->t_inv),
						  (r->flags & F_ST_RELEASED) ? "released" :
						  (r->flags & F_ST_EXPIRED) ? "expired" : "none",
						  g->fence, who(g));
			else if (table_only && !has_fence)
				violation(V_OBS_STALE, "e%d: worker %d op %d, %s at %.6f s: no lease at all, but epoch " INT64_FORMAT " had been acknowledged (%s) and table mode keeps its row",
						  e, w, i, what, rel(r->t_inv), g->fence, who(g));
		}
	}
	pg_free(prev_fence);
	pg_free(prev_n);
	pg_free(prev_rec);
}

/*
 * After the run, each election's state (dlock.observe from token 0, which
 * answers at once): the latest acknowledged epoch and its last
 * acknowledged proclaim must still be there, or something newer (an
 * epoch granted with an unknown outcome).  In memory mode a crash drops
 * the leases, and the pool forgets ended ones: no lease at all is then
 * allowed.
 */
static void
el_check_final(PGconn *conn)
{
	bool		table_only = !memory_mode && !switch_modes;
	int			e;

	for (e = 0; e < nkeys; e++)
	{
		char		keybuf[64];
		const char *params[1] = {keybuf};
		PGresult   *res;
		const ChaosOp *g = latest_grant(e, PG_INT64_MAX);

		if (g == NULL)
			continue;
		key_name(keybuf, sizeof(keybuf), e);
		res = PQexecParams(conn, "SELECT fence, value FROM dlock.observe($1, 0, '1 s')",
						   1, NULL, params, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			fprintf(stderr, "dlock-chaos: cannot observe e%d at the end: %s", e, PQerrorMessage(conn));
			violation(V_EL_LOST, "e%d: its state cannot be read", e);
		}
		else if (PQntuples(res) == 0 || PQgetisnull(res, 0, 0))
		{
			if (table_only)
				violation(V_EL_LOST, "e%d: no lease at the end, but epoch " INT64_FORMAT " was acknowledged (%s)",
						  e, g->fence, who(g));
		}
		else
		{
			int64		fence = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
			int32		vw = -1,
						vop = -1;
			int64		n = -1;
			const char *why = NULL;
			const ChaosOp *src = NULL;

			if (!PQgetisnull(res, 0, 1) &&
				!parse_value(PQgetvalue(res, 0, 1), &vw, &vop, &n))
				vw = -2;
			if (vw != -1)
				src = value_source(e, fence, vw, vop, n, &why);
			if (fence < g->fence)
				violation(V_EL_LOST, "e%d: epoch " INT64_FORMAT " at the end, but epoch " INT64_FORMAT " was acknowledged (%s)",
						  e, fence, g->fence, who(g));
			else if (fence == g->fence)
			{
				const ChaosOp *p = last_acked_value(g, PG_INT64_MAX);

				if (src == NULL)
					violation(V_OBS_PHANTOM, "e%d: epoch " INT64_FORMAT " at the end with value %s: %s",
							  e, fence, PQgetisnull(res, 0, 1) ? "NULL" : PQgetvalue(res, 0, 1),
							  why ? why : "none");
				else if (src->op < p->op)
					violation(V_EL_LOST, "e%d: epoch " INT64_FORMAT " at the end with value " INT64_FORMAT ", but value " INT64_FORMAT " was acknowledged (%s)",
							  e, fence, n, p->value, who(p));
			}
		}
		PQclear(res);
	}
}

/*
 * Leader changes: consecutive acknowledged grants of an election (by token)
 * to another client.  And the horizon's case: consecutive grants A and B
 * with a crash-restart in memory mode between them that began while A was
 * certainly live (certain_end) and before B was invoked, B acknowledged
 * after the server was back: the
 * exclusion check then judged a grant made after the crash had dropped
 * the lease it had to wait for.  (The line of the exclusion check counts
 * only pairs whose B was invoked after the server was back; a campaign
 * waits, so B is often invoked before the nemesis sees the server back.)
 */
static void
el_count_changes(ChaosOp **grants, int ngrants)
{
	int			i;

	for (i = 1; i < ngrants; i++)
	{
		const ChaosOp *a = grants[i - 1];
		const ChaosOp *b = grants[i];
		int			c;

		if (b->key != a->key)
			continue;
		if (b->worker != a->worker)
			e_leader_changes++;
		for (c = 0; c < ncrashes; c++)
			if (crash_pre_memory[c] && crash_at[c][0] > a->t_done &&
				crash_at[c][0] < b->t_inv && crash_at[c][1] < b->t_done &&
				certain_end(a, crash_at[c][0], crash_at[c][0]) > crash_at[c][0])
			{
				e_horizon_pairs++;
				break;
			}
	}
}

/*
 * The semaphore workload's checks (--workload semaphore).
 */

/* a row of the semaphore workload's history */
typedef struct SemRow
{
	int			key;			/* key number: s<n> is n, r<n> nkeys + n */
	int			worker;
	int			op;
	int64		fence;
	int64		seq;
	int64		at;				/* written_at, us since the epoch */
	int64		end;			/* done_at, or written_at */
	int32		kind;			/* its write's F_PERMITS, F_SHARED or 0 */
	bool		matched;		/* it is a write of the logs */
} SemRow;

static SemRow *sem_rows;		/* by key, written_at, fence */
static int	sem_nrows = 0;

/* the semaphore workload's figures */
static long s_grants[3];		/* acknowledged: permits, shared, exclusive */
static long s_txn_writes = 0;	/* accepted writes of two statements */
static long s_writes_checked = 0;	/* permit writes in the N-writers sweep */
static int	s_max_writers = 0;	/* most permits written under at one moment */
static long s_writers_at_n = 0; /* writes that began with N permits' writes
								 * open */
static long s_leases_checked = 0;	/* permits in the N-leases sweep */
static long s_leases_skipped = 0;	/* left out: a release's outcome unknown */
static int	s_max_live = 0;		/* most permits live at one moment */
static long s_live_at_n = 0;	/* grants made with N permits then live */
static long s_live_at_crash = 0;	/* permits certainly live when a
									 * crash-restart in memory mode began */
static long s_rw_checked = 0;	/* shared/exclusive writes checked for
								 * overlap */
static long s_shared_together = 0;	/* shared writes that began while
									 * another shared lease's was open */
static long s_after_checked = 0;	/* writes checked against the later
									 * grants that exclude them */
static long s_x_after_s = 0;	/* exclusive grants right after a shared
								 * one, by token */
static long s_s_after_x = 0;	/* shared grants right after an exclusive
								 * one */

/* A record's kind of lease: F_PERMITS, F_SHARED, or 0 (exclusive). */
static int32
lease_kind(const ChaosOp *r)
{
	return r->flags & F_KIND_MASK;
}

static const char *
kind_name(int32 kind)
{
	return kind == F_PERMITS ? "permit" : kind == F_SHARED ? "shared" : "exclusive";
}

static int
cmp_sem_row(const void *a, const void *b)
{
	const SemRow *x = (const SemRow *) a;
	const SemRow *y = (const SemRow *) b;

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	if (x->at != y->at)
		return x->at < y->at ? -1 : 1;
	return x->fence < y->fence ? -1 : x->fence > y->fence ? 1 : 0;
}

/*
 * Read the semaphore workload's history; match each row with its write in
 * the logs (in_db, written_at), a row that matches none, or a write that
 * was refused or failed, being a violation.  Returns false if the table
 * cannot be read.
 */
static bool
check_semaphore_history(PGconn *conn)
{
	PGresult   *res;
	int			i;

	res = PQexec(conn, "SELECT k, fence, worker, op, seq, (extract(epoch FROM written_at) * 1000000)::bigint, (extract(epoch FROM coalesce(done_at, written_at)) * 1000000)::bigint FROM dlock_chaos_semaphore ORDER BY id");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "dlock-chaos: cannot read the semaphore history: %s", PQerrorMessage(conn));
		return false;
	}
	sem_nrows = PQntuples(res);
	sem_rows = pg_malloc0(sizeof(SemRow) * (sem_nrows + 1));
	for (i = 0; i < sem_nrows; i++)
	{
		SemRow	   *row = &sem_rows[i];
		const char *k = PQgetvalue(res, i, 0);
		const ChaosOp *r = NULL;
		int			n;

		row->key = -1;
		if (sscanf(k, "s%d", &n) == 1 && n >= 0 && n < nkeys)
			row->key = n;
		else if (sscanf(k, "r%d", &n) == 1 && n >= 0 && n < nrw)
			row->key = nkeys + n;
		row->fence = strtoll(PQgetvalue(res, i, 1), NULL, 10);
		row->worker = atoi(PQgetvalue(res, i, 2));
		row->op = atoi(PQgetvalue(res, i, 3));
		row->seq = strtoll(PQgetvalue(res, i, 4), NULL, 10);
		row->at = strtoll(PQgetvalue(res, i, 5), NULL, 10);
		row->end = strtoll(PQgetvalue(res, i, 6), NULL, 10);
		if (row->worker >= 0 && row->worker < nworkers &&
			row->op >= 0 && row->op < wlog_n[row->worker])
			r = &wlog[row->worker][row->op];
		if (r == NULL || r->type != OP_WRITE || r->key != row->key ||
			r->value != row->seq || r->fence != row->fence)
		{
			violation(V_PHANTOM, "%s fence " INT64_FORMAT " seq " INT64_FORMAT " by worker %d op %d matches no write in the logs",
					  k, row->fence, row->seq, row->worker, row->op);
			continue;
		}
		row->matched = true;
		row->kind = lease_kind(r);
		in_db[row->worker][row->op] = true;
		written_at[row->worker][row->op] = row->at;
		if (r->outcome != OUT_OK && r->outcome != OUT_INDET)
			violation(V_PHANTOM, "%s fence " INT64_FORMAT " seq " INT64_FORMAT " by worker %d op %d was reported failed (%s) but is in the database",
					  k, row->fence, row->seq, row->worker, row->op, r->sqlstate);
	}
	PQclear(res);
	qsort(sem_rows, sem_nrows, sizeof(SemRow), cmp_sem_row);
	return true;
}

/*
 * The server's end of the lease granted by g, as its holder's log tells
 * it: the expires_at of its last acknowledged renewal (or of its grant),
 * or, if it was released, the server's clock before the release, whichever
 * is earlier.  Each acknowledged renewal found the lease live and set its
 * expiry, so the lease was live until then (unless released).  Returns
 * false when a release of it had an unknown outcome: it may have ended at
 * any moment after that release was sent.
 */
static bool
sem_lease_end(const ChaosOp *g, int64 *end)
{
	const ChaosOp *wl = wlog[g->worker];
	int64		e = g->expires_srv;
	int64		released = PG_INT64_MAX;
	int			k;

	for (k = g->op + 1; k < wlog_n[g->worker]; k++)
	{
		const ChaosOp *p = &wl[k];

		if (p->key != g->key || p->fence != g->fence)
			continue;
		if (p->type == OP_RENEW && p->outcome == OUT_OK)
			e = p->expires_srv;
		else if (p->type == OP_RELEASE && p->outcome == OUT_OK)
			released = Min(released, p->srv_at);
		else if (p->type == OP_RELEASE && p->outcome != OUT_NONE)
			return false;
	}
	*end = Min(e, released);
	return true;
}

/* a grant's start or end in the sweep of sem_check_permits */
typedef struct SemEvent
{
	int64		t;				/* the server's clock */
	int			delta;			/* +1 the grant, -1 the end */
	const ChaosOp *g;
} SemEvent;

static int
cmp_sem_event(const void *a, const void *b)
{
	const SemEvent *x = (const SemEvent *) a;
	const SemEvent *y = (const SemEvent *) b;

	if (x->t != y->t)
		return x->t < y->t ? -1 : 1;
	/* a lease's end before a grant at the same moment: [grant, end) */
	return x->delta - y->delta;
}

/*
 * No more than N permits of a semaphore key live at one moment, by the
 * server's clock: the acknowledged grants of the key (grants[from .. to -
 * 1]), each live from its grant's clock_timestamp() (after the grant, in
 * its statement: the permit was taken by then) until sem_lease_end (a
 * lower bound of its end).  Each permit has one lease at a time, and the
 * next grant of it waits for its end (and for the writers under it: a
 * grant locks the permit as a grant of an exclusive key does), so two
 * leases of one permit never overlap so counted; nor across a crash in
 * memory mode, where the horizon keeps every key until the end of the
 * leases the crash dropped.  Leases whose release had an unknown outcome
 * are left out (fewer counted: never a false violation).
 */
static void
sem_check_permits(ChaosOp **grants, int from, int to)
{
	SemEvent   *ev = pg_malloc(sizeof(SemEvent) * (2 * (to - from) + 1));
	const ChaosOp **live = pg_malloc(sizeof(ChaosOp *) * (to - from + 1));
	int			nev = 0,
				nlive = 0,
				i,
				c;

	for (i = from; i < to; i++)
	{
		const ChaosOp *g = grants[i];
		int64		end;

		if (!sem_lease_end(g, &end))
		{
			s_leases_skipped++;
			continue;
		}
		if (end <= g->srv_at)
			continue;
		ev[nev].t = g->srv_at;
		ev[nev].delta = 1;
		ev[nev++].g = g;
		ev[nev].t = end;
		ev[nev].delta = -1;
		ev[nev++].g = g;
		s_leases_checked++;
		for (c = 0; c < ncrashes; c++)
			if (crash_pre_memory[c] && crash_at[c][0] > g->t_done &&
				certain_end(g, crash_at[c][0], crash_at[c][0]) > crash_at[c][0])
			{
				s_live_at_crash++;
				break;
			}
	}
	qsort(ev, nev, sizeof(SemEvent), cmp_sem_event);
	for (i = 0; i < nev; i++)
	{
		const ChaosOp *g = ev[i].g;
		int			j;

		if (ev[i].delta < 0)
		{
			for (j = 0; j < nlive; j++)
				if (live[j] == g)
				{
					live[j] = live[--nlive];
					break;
				}
			continue;
		}
		live[nlive++] = g;
		s_max_live = Max(s_max_live, nlive);
		if (nlive == npermits)
			s_live_at_n++;
		if (nlive > npermits)
		{
			StringInfoData others;

			initStringInfo(&others);
			for (j = 0; j < nlive - 1; j++)
				appendStringInfo(&others, "%s" INT64_FORMAT " (worker %d op %d)",
								 j > 0 ? ", " : "", live[j]->fence, live[j]->worker, live[j]->op);
			violation(V_SEM_GRANTS, "%s: fence " INT64_FORMAT " (worker %d op %d, invoked at %.6f s) granted while %d leases of the key were live by the server's clock: %s",
					  kname(g->key), g->fence, g->worker, g->op, rel(g->t_inv),
					  nlive - 1, others.data);
			pfree(others.data);
		}
	}
	pg_free(ev);
	pg_free(live);
}

/*
 * The grants of a shared/exclusive key (grants[from .. to - 1], in token
 * order), judged by exclusion_pair: each exclusive grant against every
 * grant since the key's previous exclusive one (that one included), each
 * shared grant against the previous exclusive one.  (Earlier leases ended
 * before that exclusive one was granted, which ended before this grant.)
 * A grant's token is drawn under the key's lock, which a shared grant and
 * an exclusive grant take in conflicting modes: their token order is their
 * order.
 */
static void
sem_check_rw_grants(ChaosOp **grants, int from, int to)
{
	int			px = -1;
	int			i,
				a;

	for (i = from; i < to; i++)
	{
		const ChaosOp *b = grants[i];

		if (i > from && lease_kind(grants[i - 1]) == F_SHARED && lease_kind(b) == 0)
			s_x_after_s++;
		if (i > from && lease_kind(grants[i - 1]) == 0 && lease_kind(b) == F_SHARED)
			s_s_after_x++;
		if (lease_kind(b) == 0)
		{
			for (a = px < 0 ? from : px; a < i; a++)
				exclusion_pair(grants[a], b);
			px = i;
		}
		else if (px >= 0)
			exclusion_pair(grants[px], b);
	}
}

/*
 * The grants: per semaphore key, never more than N permits live at one
 * moment; per shared/exclusive key, an exclusive grant never while another
 * lease of the key was live, nor a shared grant while an exclusive one
 * was.  grants: the acknowledged grants by key and token.
 */
static void
sem_check_grants(ChaosOp **grants, int ngrants)
{
	int			i = 0;

	while (i < ngrants)
	{
		int			j = i;

		while (j < ngrants && grants[j]->key == grants[i]->key)
		{
			s_grants[lease_kind(grants[j]) == F_PERMITS ? 0 :
					 lease_kind(grants[j]) == F_SHARED ? 1 : 2]++;
			j++;
		}
		if (grants[i]->key < nkeys)
			sem_check_permits(grants, i, j);
		else
			sem_check_rw_grants(grants, i, j);
		i = j;
	}
}

/*
 * The history, by the server's clock.  A write under token t is inside
 * its fence from the check of t (by dlock.fenced, before written_at is
 * read) until its COMMIT (after done_at): all that time it holds the lock
 * of t's permit (or of the key, for an exclusive or shared lease) in share
 * mode, and the next grant of that permit (of the key) waits for it; a
 * write under t after that grant is refused.  So [written_at, done_at]
 * (written_at alone for one statement) of writes under two leases that
 * exclude each other never overlap, and for one permit the next lease's
 * writes begin after the previous one's COMMIT: done_at < written_at,
 * with a grant and a synchronous commit between them.  Hence:
 *
 * - every accepted write's token was granted (acknowledged) to its client,
 *   before the write;
 * - per semaphore key, the writes open at the moment any of them began
 *   (written_at) are under at most N distinct tokens (the most overlapping
 *   closed intervals meet at some interval's start);
 * - per shared/exclusive key, no write under an exclusive token overlaps a
 *   write under another token;
 * - per shared/exclusive key, a write ends (done_at) before the grant
 *   (its clock_timestamp(), after the grant) of every later lease that
 *   excludes it: every later one for an exclusive lease's write, every
 *   later exclusive one for a shared lease's.
 *
 * grants: the acknowledged grants by key and token.
 */
static void
sem_check_rows(ChaosOp **grants, int ngrants)
{
	int64	   *after_all = pg_malloc(sizeof(int64) * (ngrants + 1));
	int64	   *after_x = pg_malloc(sizeof(int64) * (ngrants + 1));
	const SemRow **active = pg_malloc(sizeof(SemRow *) * (sem_nrows + 1));
	int			nactive = 0;
	int			cur = -1;
	int			i,
				j,
				k;

	/* per key, the earliest grant (server clock) from each grant on */
	for (i = ngrants - 1; i >= 0; i--)
	{
		bool		same = i + 1 < ngrants && grants[i + 1]->key == grants[i]->key;
		int64		a = same ? after_all[i + 1] : PG_INT64_MAX;
		int64		x = same ? after_x[i + 1] : PG_INT64_MAX;

		after_all[i] = Min(a, grants[i]->srv_at);
		after_x[i] = lease_kind(grants[i]) == 0 ? Min(x, grants[i]->srv_at) : x;
	}

	for (i = 0; i < sem_nrows; i++)
	{
		const SemRow *row = &sem_rows[i];
		ChaosOp		probe;
		int			lo,
					next;

		if (!row->matched)
			continue;
		if (row->key != cur)
		{
			cur = row->key;
			nactive = 0;
		}

		/* the token is its client's */
		memset(&probe, 0, sizeof(probe));
		probe.key = row->key;
		probe.fence = row->fence;
		lo = first_grant_at(grants, ngrants, &probe);
		if (lo >= ngrants || grants[lo]->key != row->key || grants[lo]->fence != row->fence)
			violation(V_SEM_FOREIGN, "%s fence " INT64_FORMAT ": a write by worker %d (op %d) was accepted, but no client was acknowledged that token",
					  kname(row->key), row->fence, row->worker, row->op);
		else if (grants[lo]->worker != row->worker || grants[lo]->op > row->op)
			violation(V_SEM_FOREIGN, "%s fence " INT64_FORMAT ": a write by worker %d (op %d) was accepted, but the token was granted to worker %d (op %d)",
					  kname(row->key), row->fence, row->worker, row->op,
					  grants[lo]->worker, grants[lo]->op);
		if (wlog[row->worker][row->op].flags & F_TXN)
			s_txn_writes++;

		/* the writes still open when this one began, and this one */
		for (j = k = 0; j < nactive; j++)
			if (active[j]->end >= row->at)
				active[k++] = active[j];
		nactive = k;
		active[nactive++] = row;

		if (row->key < nkeys)
		{
			int			distinct = 0;

			for (j = 0; j < nactive; j++)
			{
				for (k = 0; k < j; k++)
					if (active[k]->fence == active[j]->fence)
						break;
				if (k == j)
					distinct++;
			}
			s_writes_checked++;
			s_max_writers = Max(s_max_writers, distinct);
			if (distinct == npermits)
				s_writers_at_n++;
			if (distinct > npermits)
			{
				StringInfoData open;

				initStringInfo(&open);
				for (j = 0; j < nactive - 1; j++)
					appendStringInfo(&open, "%sfence " INT64_FORMAT " (worker %d op %d, %.3f ms left)",
									 j > 0 ? ", " : "", active[j]->fence, active[j]->worker,
									 active[j]->op, (active[j]->end - row->at) / 1000.0);
				violation(V_SEM_WRITERS, "%s: the write of worker %d (op %d, fence " INT64_FORMAT ") began while writes under %d other tokens of the key were open (N = %d): %s",
						  kname(row->key), row->worker, row->op, row->fence,
						  distinct - 1, npermits, open.data);
				pfree(open.data);
			}
			continue;
		}

		/* a shared/exclusive key: an exclusive lease's writes overlap none */
		s_rw_checked++;
		for (j = 0; j < nactive - 1; j++)
			if (active[j]->fence != row->fence &&
				(active[j]->kind == 0 || row->kind == 0))
			{
				violation(V_RW_OVERLAP, "%s: the write of worker %d (op %d, %s fence " INT64_FORMAT ") began %.3f ms before the write of worker %d (op %d, %s fence " INT64_FORMAT ") ended (its done_at)",
						  kname(row->key), row->worker, row->op, kind_name(row->kind),
						  row->fence, (active[j]->end - row->at) / 1000.0,
						  active[j]->worker, active[j]->op, kind_name(active[j]->kind),
						  active[j]->fence);
				break;
			}
		if (row->kind == F_SHARED)
			for (j = 0; j < nactive - 1; j++)
				if (active[j]->kind == F_SHARED && active[j]->fence != row->fence)
				{
					s_shared_together++;
					break;
				}

		/* before every later grant that excludes it */
		next = (lo < ngrants && grants[lo]->key == row->key && grants[lo]->fence == row->fence) ?
			lo + 1 : lo;
		if (next < ngrants && grants[next]->key == row->key)
		{
			int64		limit = row->kind == 0 ? after_all[next] : after_x[next];

			s_after_checked++;
			if (row->end >= limit)
			{
				const ChaosOp *g = NULL;

				for (j = next; j < ngrants && grants[j]->key == row->key; j++)
					if (grants[j]->srv_at == limit &&
						(row->kind == 0 || lease_kind(grants[j]) == 0))
					{
						g = grants[j];
						break;
					}
				violation(V_RW_AFTER, "%s: the write of worker %d (op %d, %s fence " INT64_FORMAT ") ended (its done_at) %.3f ms after the grant of the %s lease with fence " INT64_FORMAT " (worker %d op %d) was made",
						  kname(row->key), row->worker, row->op, kind_name(row->kind),
						  row->fence, (row->end - limit) / 1000.0,
						  g ? kind_name(lease_kind(g)) : "?", g ? g->fence : 0,
						  g ? g->worker : -1, g ? g->op : -1);
			}
		}
	}
	pg_free(after_all);
	pg_free(after_x);
	pg_free(active);
}

/*
 * The counter workload's database side: per key, the history's values are
 * exactly 1..n with fences that never go down, each row is a write of the
 * logs that was not refused (in_db, written_at), and the counters agree.
 * Returns false if the tables cannot be read.
 */
static bool
check_counter_history(PGconn *conn)
{
	PGresult   *res;
	int			i;
	int			prev_key = -1;
	int64		expect = 0,
				prev_fence = 0;
	const ChaosOp *prev_rec = NULL;

	res = PQexec(conn, "SELECT substr(k, 2)::int, value, fence, worker, op, (extract(epoch FROM written_at) * 1000000)::bigint FROM dlock_chaos_history ORDER BY 1, 2, id");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "dlock-chaos: cannot read the history: %s", PQerrorMessage(conn));
		return false;
	}
	for (i = 0; i < PQntuples(res); i++)
	{
		int			key = atoi(PQgetvalue(res, i, 0));
		int64		value = strtoll(PQgetvalue(res, i, 1), NULL, 10);
		int64		fence = strtoll(PQgetvalue(res, i, 2), NULL, 10);
		int			hw = atoi(PQgetvalue(res, i, 3));
		int			hop = atoi(PQgetvalue(res, i, 4));
		const ChaosOp *r = NULL;

		if (key != prev_key)
		{
			prev_key = key;
			expect = 1;
			prev_fence = 0;
			prev_rec = NULL;
		}
		if (hw >= 0 && hw < nworkers && hop >= 0 && hop < wlog_n[hw])
			r = &wlog[hw][hop];
		if (r == NULL || r->type != OP_WRITE || r->key != key || r->value != value || r->fence != fence)
			violation(V_PHANTOM, "k%d value " INT64_FORMAT " fence " INT64_FORMAT " by worker %d op %d matches no write in the logs",
					  key, value, fence, hw, hop);
		else
		{
			in_db[hw][hop] = true;
			written_at[hw][hop] = strtoll(PQgetvalue(res, i, 5), NULL, 10);
			if (r->outcome != OUT_OK && r->outcome != OUT_INDET)
				violation(V_PHANTOM, "k%d value " INT64_FORMAT " fence " INT64_FORMAT " by worker %d op %d was reported failed (%s) but is in the database",
						  key, value, fence, hw, hop, r->sqlstate);
		}
		if (value < expect)
			violation(V_DUP, "k%d value " INT64_FORMAT " written twice: fence " INT64_FORMAT " (worker %d op %d), and fence " INT64_FORMAT " (worker %d op %d)",
					  key, value, fence, hw, hop,
					  prev_rec ? prev_rec->fence : 0, prev_rec ? prev_rec->worker : -1,
					  prev_rec ? prev_rec->op : -1);
		else if (value > expect)
			violation(V_GAP, "k%d: values " INT64_FORMAT ".." INT64_FORMAT " missing", key, expect, value - 1);
		if (fence < prev_fence)
			violation(V_FENCE_ORDER, "k%d value " INT64_FORMAT " has fence " INT64_FORMAT " after fence " INT64_FORMAT,
					  key, value, fence, prev_fence);
		prev_fence = Max(prev_fence, fence);
		expect = Max(expect, value + 1);
		prev_rec = r;
	}
	PQclear(res);
	res = PQexec(conn, "SELECT c.k, c.value, coalesce(max(h.value), 0) FROM dlock_chaos_counter c LEFT JOIN dlock_chaos_history h USING (k) GROUP BY c.k, c.value HAVING c.value <> coalesce(max(h.value), 0) OR count(h.*) <> coalesce(max(h.value), 0)");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "dlock-chaos: cannot read the counters: %s", PQerrorMessage(conn));
		return false;
	}
	for (i = 0; i < PQntuples(res); i++)
		violation(V_COUNTER, "counter %s is %s, the history's highest value %s (with a different number of rows)",
				  PQgetvalue(res, i, 0), PQgetvalue(res, i, 1), PQgetvalue(res, i, 2));
	PQclear(res);

	return true;
}

/*
 * Verify everything and print the counts.  Returns the number of
 * violations, or -1 if the check itself could not be done.
 */
static long
check(void)
{
	PGconn	   *conn;
	ChaosOp   **grants,
			  **byinv,
			  **bydone;
	int64	   *released;
	int64	   *minlater;
	int64	   *minlater_x;
	int			ngrants = 0,
				nreleased = 0,
				w,
				i,
				j;
	long		c_renewals = 0,
				c_releases = 0,
				c_accepted = 0,
				c_refused = 0,
				c_stale = 0,
				c_stale_refused = 0,
				c_stale_cut = 0,
				c_pauses = 0,
				c_indet = 0,
				c_takeovers = 0,
				c_attempts = 0,
				c_lostconn = 0,
				c_srv_checked = 0,
				c_srv_skipped = 0;
	int64		maxfence;

	/* the database's side: history and counters */
	conn = connect_for_check();
	if (conn == NULL)
	{
		fprintf(stderr, "dlock-chaos: cannot connect for the final check\n");
		return -1;
	}
	if (sabotage && !sabotage_after_run(conn))
		return -1;
	if (!(election ? check_election_history(conn) :
		  semaphore ? check_semaphore_history(conn) : check_counter_history(conn)))
		return -1;

	/* the logs' side */
	for (w = 0; w < nworkers; w++)
		for (i = 0; i < wlog_n[w]; i++)
		{
			ChaosOp    *r = &wlog[w][i];

			if (r->type == OP_GRANT && r->outcome == OUT_OK)
				ngrants++;
			if (r->type == OP_RELEASE && r->outcome == OUT_OK)
				nreleased++;
		}
	grants = pg_malloc(sizeof(ChaosOp *) * (ngrants + 1));
	byinv = pg_malloc(sizeof(ChaosOp *) * (ngrants + 1));
	bydone = pg_malloc(sizeof(ChaosOp *) * (ngrants + 1));
	released = pg_malloc(sizeof(int64) * (nreleased + 1));
	minlater = pg_malloc(sizeof(int64) * (ngrants + 1));
	minlater_x = pg_malloc(sizeof(int64) * (ngrants + 1));
	ngrants = nreleased = 0;
	for (w = 0; w < nworkers; w++)
		for (i = 0; i < wlog_n[w]; i++)
		{
			ChaosOp    *r = &wlog[w][i];

			if (r->type == OP_GRANT && r->outcome == OUT_OK)
			{
				grants[ngrants] = byinv[ngrants] = bydone[ngrants] = r;
				ngrants++;
			}
			if (r->type == OP_RELEASE && r->outcome == OUT_OK)
				released[nreleased++] = r->fence;
			if (r->outcome == OUT_INDET)
				c_indet++;
			if (r->outcome == OUT_UNEXPECTED)
				violation(V_ERROR, "worker %d op %d (%s): SQLSTATE %s at %.3f s",
						  w, i, r->type == OP_GRANT ? (election ? "campaign" : "grant") :
						  r->type == OP_RENEW ? "renew" :
						  r->type == OP_RELEASE ? (election ? "resign" : "release") :
						  r->type == OP_PROCLAIM ? "proclaim" :
						  r->type == OP_OBSERVE ? "observe" :
						  r->type == OP_LEADER ? "leader" : "write",
						  r->sqlstate, rel(r->t_done));
			if (r->outcome == OUT_FAILED || r->outcome == OUT_INDET)
				c_lostconn++;
			if (r->type == OP_RENEW && r->outcome == OUT_OK)
				c_renewals++;
			if (r->type == OP_RELEASE && r->outcome == OUT_OK)
				c_releases++;
		}
	qsort(released, nreleased, sizeof(int64), cmp_int64);

	/* tokens: unique, and larger than those of grants acknowledged earlier */
	qsort(grants, ngrants, sizeof(ChaosOp *), cmp_fence);
	{
		int64	   *fences = pg_malloc(sizeof(int64) * (ngrants + 1));

		for (i = 0; i < ngrants; i++)
			fences[i] = grants[i]->fence;
		qsort(fences, ngrants, sizeof(int64), cmp_int64);
		for (i = 1; i < ngrants; i++)
			if (fences[i] == fences[i - 1])
				violation(V_REISSUE, "fence " INT64_FORMAT " was granted twice", fences[i]);
		pg_free(fences);
	}
	qsort(byinv, ngrants, sizeof(ChaosOp *), cmp_inv);
	qsort(bydone, ngrants, sizeof(ChaosOp *), cmp_done);
	maxfence = 0;
	j = 0;
	{
		const ChaosOp *maxrec = NULL;

		for (i = 0; i < ngrants; i++)
		{
			while (j < ngrants && bydone[j]->t_done < byinv[i]->t_inv)
			{
				if (bydone[j]->fence > maxfence)
				{
					maxfence = bydone[j]->fence;
					maxrec = bydone[j];
				}
				j++;
			}
			if (maxrec != NULL && byinv[i]->fence <= maxfence)
				violation(V_TOKEN_ORDER, "grant of %s by worker %d invoked at %.6f s got fence " INT64_FORMAT ", but %s had been granted fence " INT64_FORMAT " (worker %d, acknowledged at %.6f s)",
						  kname(byinv[i]->key), byinv[i]->worker, rel(byinv[i]->t_inv), byinv[i]->fence,
						  kname(maxrec->key), maxfence, maxrec->worker, rel(maxrec->t_done));
		}
	}

	/*
	 * Per key, by fence: takeovers, and for each grant the earliest
	 * acknowledgement of any later grant of the key (suffix minimum); of
	 * any later exclusive grant, for the semaphore workload's shared leases.
	 */
	for (i = ngrants - 1; i >= 0; i--)
	{
		int64		m = PG_INT64_MAX;
		int64		mx = PG_INT64_MAX;

		if (i + 1 < ngrants && grants[i + 1]->key == grants[i]->key)
		{
			m = Min(minlater[i + 1], grants[i + 1]->t_done);
			mx = (grants[i + 1]->flags & F_KIND_MASK) == 0 ?
				Min(minlater_x[i + 1], grants[i + 1]->t_done) : minlater_x[i + 1];
		}
		minlater[i] = m;
		minlater_x[i] = mx;
		if (i > 0 && grants[i - 1]->key == grants[i]->key &&
			!bsearch(&grants[i - 1]->fence, released, nreleased, sizeof(int64), cmp_int64))
			c_takeovers++;
	}

	if (semaphore)
		sem_check_grants(grants, ngrants);
	else
		check_exclusion(grants, ngrants);
	if (forge)
		check_forged(conn, grants, ngrants);
	if (election)
	{
		el_prepare(bydone, ngrants);
		el_check_final(conn);
	}
	PQfinish(conn);

	/* writes */
	for (w = 0; w < nworkers; w++)
		for (i = 0; i < wlog_n[w]; i++)
		{
			ChaosOp    *r = &wlog[w][i];
			bool		accepted;
			bool		stale;
			int			lo;

			if (r->type != OP_WRITE)
				continue;
			c_attempts++;
			accepted = in_db[w][i];
			if (r->flags & (F_PAUSE_BEFORE | F_PAUSE_INSIDE))
				c_pauses++;
			/* stale: its first write (or use_fence) after the lease's end */
			stale = (r->flags & F_PAUSE_BEFORE) ||
				(r->t_fence1 != 0 && r->t_fence1 > r->deadline + SLACK_US) ||
				(r->t_upd != 0 && r->t_upd > r->deadline + SLACK_US);
			if (stale)
			{
				c_stale++;
				if (r->outcome == OUT_REFUSED)
					c_stale_refused++;
				else if (r->outcome == OUT_FAILED || r->outcome == OUT_INDET)
					c_stale_cut++;
			}
			if (r->outcome == OUT_REFUSED)
				c_refused++;
			if (r->outcome == OUT_OK && !accepted)
				violation(V_LOST, "%s value " INT64_FORMAT " fence " INT64_FORMAT " (worker %d op %d) was committed at %.3f s but is not in the database",
						  kname(r->key), r->value, r->fence, w, i, rel(r->t_done));
			if (!accepted)
				continue;
			c_accepted++;
			if (r->t_ins > r->deadline + SLACK_US || stale)
				violation(V_STALE, "%s value " INT64_FORMAT " fence " INT64_FORMAT " (worker %d op %d%s%s): written %.1f ms after the lease had expired, at the latest",
						  kname(r->key), r->value, r->fence, w, i,
						  (r->flags & F_PAUSE_BEFORE) ? ", paused before" : "",
						  (r->flags & F_PAUSE_INSIDE) ? ", paused inside" : "",
						  (Max(r->t_ins, r->t_upd) - r->deadline) / 1000.0);

			/*
			 * By the server's clock: the row's written_at must be before the
			 * expires_at returned by the last grant or renewal of its lease
			 * before the write (the worker's log is in order; a renewal after
			 * the write cannot make it legal).  Skipped if a renewal's
			 * outcome is unknown.
			 */
			{
				bool		unknown = false;
				int64		limit = expiry_before(w, i, &unknown);

				if (unknown || limit == 0 || written_at[w][i] == 0)
					c_srv_skipped++;
				else
				{
					c_srv_checked++;
					if (written_at[w][i] >= limit)
						violation(V_STALE_SRV, "%s value " INT64_FORMAT " fence " INT64_FORMAT " (worker %d op %d): written_at is %.3f ms after the lease's expires_at",
								  kname(r->key), r->value, r->fence, w, i,
								  (written_at[w][i] - limit) / 1000.0);
				}
			}
			/*
			 * Find this write's grant among the key's grants.  (Semaphore
			 * workload: the permits of a key coexist, so only a
			 * shared/exclusive key's later grants supersede a lease: every
			 * later one an exclusive lease, every later exclusive one a
			 * shared lease.)
			 */
			lo = first_grant_at(grants, ngrants, r);
			/* grants[lo] is the first with (key, fence) >= the write's */
			{
				int64		first_later = PG_INT64_MAX;
				bool		shared_w = semaphore && (r->flags & F_SHARED);
				const int64 *ml = shared_w ? minlater_x : minlater;

				if (semaphore && r->key < nkeys)
					first_later = PG_INT64_MAX; /* permits coexist */
				else if (lo < ngrants && grants[lo]->key == r->key && grants[lo]->fence == r->fence)
					first_later = ml[lo];
				else if (lo < ngrants && grants[lo]->key == r->key)
					first_later = (!shared_w || (grants[lo]->flags & F_KIND_MASK) == 0) ?
						Min(grants[lo]->t_done, ml[lo]) : ml[lo];
				if (first_later < r->t_commit)
					violation(V_NEWER, "%s value " INT64_FORMAT " fence " INT64_FORMAT " (worker %d op %d) committed (COMMIT sent at %.6f s) after a grant of a larger token was acknowledged at %.6f s",
							  kname(r->key), r->value, r->fence, w, i, rel(r->t_commit), rel(first_later));
			}
		}

	if (election)
	{
		el_count_changes(grants, ngrants);
		el_check_rows(grants, ngrants);
		el_check_campaigners(grants, ngrants, minlater);
		el_check_observers();
	}
	if (semaphore)
	{
		sem_check_rows(grants, ngrants);
		/* holders refused while their lease was certainly live */
		el_check_campaigners(grants, ngrants, minlater);
	}

	check_server_log();

	printf("dlock-chaos: ran %.1f s, %d workers, %d keys, seed " UINT64_FORMAT "%s\n",
		   rel(now_us()), nworkers, nkeys, seed,
		   no_fence ? (election || semaphore ? ", NO dlock.fenced IN THE WRITES" : ", NO FENCING TRIGGER") : "");
	printf("dlock-chaos: write attempts %ld, refused (LF001) %ld, cut off by the nemesis %ld; stale writes cut off %ld; crash kinds: immediate stop %ld, postmaster SIGKILL %ld, backend SIGKILL %ld\n",
		   c_attempts, c_refused, c_lostconn, c_stale_cut, n_crash_immediate, n_crash_pmkill, n_crash_backendkill);
	printf("dlock-chaos: accepted writes checked against the server's expires_at: %ld (skipped, a renewal's outcome unknown: %ld)\n",
		   c_srv_checked, c_srv_skipped);
	printf("dlock-chaos: consecutive grants of a key checked for exclusion by the server's clock: %ld (the first released: %ld; a crash-restart between, the first live at the crash: %ld; a restart into the other storage mode between, the first live at it: %ld; skipped, a release's outcome unknown: %ld; closest grant after an unreleased lease: %.3f ms after its end)\n",
		   x_checked, x_released, x_crash, x_switch, x_unknown,
		   x_margin != PG_INT64_MAX ? x_margin / 1000.0 : 0.0);
	if (switch_modes)
		printf("dlock-chaos: storage mode switches: %ld (clean restarts: %ld); the server ends in %s mode\n",
			   n_switches, n_clean_restarts, memory_mode ? "memory" : "table");
	if (forge)
		printf("dlock-chaos: forged tokens presented: %ld (0: %ld, -1: %ld, never issued: %ld, the last before a crash in memory mode: %ld; in the token column: %ld, with use_fence: %ld, with fenced: %ld, to check_fence: %ld; to the monotonic table: %ld; in memory mode: %ld; while the horizon held every key: %ld), accepted: %ld\n",
			   f_attempts, f_by_tok[0], f_by_tok[1], f_by_tok[2], f_by_tok[3],
			   f_by_via[0], f_by_via[1], f_by_via[2], f_by_via[3], f_mono,
			   f_memory, f_horizon, f_accepted);
	if (election)
		printf("dlock-chaos: election: %d elections, %d campaigners, %d observers; epochs granted %d (to another client than the epoch before: %ld; after a lease that ran out: %ld), epochs with accepted writes %ld, accepted writes of two statements %ld; proclaims acknowledged %ld, refused %ld (after a pause past the lease's end: %ld, of which refused %ld), checked by the server's clock %ld; holders' refusals checked against a certainly live lease %ld; observations with a row %ld (leader() rows %ld), observe() timeouts %ld, leader() without a row %ld; newer epoch or value seen %ld times; observations checked against acknowledged grants and proclaims %ld, made while an acknowledged lease was certainly live %ld; writes checked for overlap with another client's %ld; consecutive epochs with a crash-restart in memory mode between them, the first lease live at it: %ld\n",
			   nkeys, ncampaigners, nobservers, ngrants, e_leader_changes, c_takeovers,
			   e_epochs_written, e_txn_writes, e_proclaims, e_proclaims_refused,
			   e_stale_proclaims, e_stale_proclaims_refused, e_proclaims_srv,
			   e_refusals_checked, e_observations, e_leader_rows, e_obs_timeouts,
			   e_leader_none, e_obs_changes, e_obs_vs_acked, e_obs_vs_live,
			   e_overlap_pairs, e_horizon_pairs);
	if (semaphore)
		printf("dlock-chaos: semaphore: %d keys of %d permits, %d shared/exclusive keys, %d clients of which %d readers; grants acknowledged: permits %ld, shared %ld, exclusive %ld (an exclusive grant right after a shared one, by token: %ld; a shared one right after an exclusive one: %ld); accepted writes of two statements %ld; writes refused (LF001) %ld; permit writes checked for at most N permits' writes at one moment %ld, most permits written under at one moment %d (writes begun with N permits' writes open: %ld); permits checked for at most N live at one moment %ld (skipped, a release's outcome unknown: %ld), most permits live at one moment %d (grants with N then live: %ld), permits certainly live when a crash-restart in memory mode began: %ld; shared/exclusive writes checked for overlap %ld (shared writes begun while another shared lease's was open: %ld), checked against the later grants that exclude them %ld; holders' refusals checked against a certainly live lease %ld\n",
			   nkeys, npermits, nrw, nworkers, nreaders, s_grants[0], s_grants[1],
			   s_grants[2], s_x_after_s, s_s_after_x, s_txn_writes, c_refused,
			   s_writes_checked, s_max_writers, s_writers_at_n, s_leases_checked,
			   s_leases_skipped, s_max_live, s_live_at_n, s_live_at_crash,
			   s_rw_checked, s_shared_together, s_after_checked, e_refusals_checked);
	for (i = 0; i < (int) lengthof(vio_name); i++)
		if (vio_kind[i] > 0)
			printf("dlock-chaos: violations: %s: %ld\n", vio_name[i], vio_kind[i]);
	printf("dlock-chaos: counts: grants=%d takeovers=%ld accepted_writes=%ld stale_writes=%ld stale_writes_refused=%ld renewals=%ld releases=%ld pauses=%ld sigstops=%ld backend_kills=%ld crash_restarts=%ld indeterminate=%ld forged=%ld forged_in_horizon=%ld mode_switches=%ld",
		   ngrants, c_takeovers, c_accepted, c_stale, c_stale_refused, c_renewals, c_releases,
		   c_pauses, n_sigstops, n_terminates,
		   n_crash_immediate + n_crash_pmkill + n_crash_backendkill + n_clean_restarts,
		   c_indet, f_attempts, f_horizon, n_switches);
	if (election)
		printf(" epochs_written=%ld leader_changes=%ld proclaims=%ld proclaims_refused=%ld stale_proclaims=%ld stale_proclaims_refused=%ld writes_refused=%ld observations=%ld observed_changes=%ld",
			   e_epochs_written, e_leader_changes, e_proclaims, e_proclaims_refused,
			   e_stale_proclaims, e_stale_proclaims_refused, c_refused,
			   e_observations, e_obs_changes);
	if (semaphore)
		printf(" permit_grants=%ld shared_grants=%ld exclusive_grants=%ld writes_refused=%ld max_permit_writers=%d permit_writers_at_n=%ld max_permits_live=%d permits_live_at_n=%ld shared_together=%ld exclusive_after_shared=%ld shared_after_exclusive=%ld",
			   s_grants[0], s_grants[1], s_grants[2], c_refused, s_max_writers,
			   s_writers_at_n, s_max_live, s_live_at_n, s_shared_together,
			   s_x_after_s, s_s_after_x);
	printf(" violations=%ld\n", violations);
	fflush(stdout);
	return violations;
}

/* Remove the log directory and what is in it. */
static void
remove_logdir(void)
{
	DIR		   *d = opendir(logdir);
	struct dirent *de;
	char		path[MAXPGPATH];

	if (d == NULL)
		return;
	while ((de = readdir(d)) != NULL)
	{
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", logdir, de->d_name);
		unlink(path);
	}
	closedir(d);
	rmdir(logdir);
}

/*
 * Stop the workers: SIGTERM (they finish the operation they are in; their
 * statements time out), SIGCONT, and SIGKILL for any still there after a
 * minute.  Every child is reaped.  Returns false if one had to be killed
 * or failed.
 */
static bool
stop_workers(void)
{
	int64		give_up = now_us() + 60 * INT64CONST(1000000);
	int			left = 0;
	bool		ok = true;
	int			i;

	for (i = 0; i <= nworkers; i++)
		if (worker_pids[i] > 0)
		{
			kill(worker_pids[i], SIGTERM);
			kill(worker_pids[i], SIGCONT);
			left++;
		}
	while (left > 0)
	{
		int			status;
		pid_t		pid = waitpid(-1, &status, WNOHANG);

		if (pid > 0)
		{
			for (i = 0; i <= nworkers; i++)
				if (worker_pids[i] == pid)
				{
					worker_pids[i] = 0;
					left--;
					if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
					{
						fprintf(stderr, "dlock-chaos: worker %d ended with status %d\n", i, status);
						ok = false;
					}
				}
			continue;
		}
		if (pid < 0 && errno == ECHILD)
			break;
		if (now_us() > give_up)
		{
			for (i = 0; i <= nworkers; i++)
				if (worker_pids[i] > 0)
				{
					fprintf(stderr, "dlock-chaos: worker %d did not stop in time: killed\n", i);
					kill(worker_pids[i], SIGKILL);
				}
			ok = false;
			give_up = PG_INT64_MAX;
		}
		sleep_until(now_us() + 20000);
	}
	return ok;
}

/* Print the usage. */
static void
usage(void)
{
	printf("dlock-chaos: check dlock's leases and fencing under faults\n\n"
		   "Usage:\n"
		   "  dlock-chaos [OPTION]...\n\n"
		   "Options:\n"
		   "  --duration=S        run for S seconds (default 60)\n"
		   "  --workers=N         worker processes (default 8, at most %d)\n"
		   "  --keys=K            lease keys (default 4, at most %d)\n"
		   "  --seed=X            random seed (default: from the clock; printed)\n"
		   "  --pgdata=DIR        the server's data directory; with --pg-ctl and\n"
		   "                      --server-log, enables crash-restarts\n"
		   "  --pg-ctl=PATH       pg_ctl of the server\n"
		   "  --server-log=FILE   the server's log (checked for PANIC, TRAP and\n"
		   "                      processes killed by a signal we did not send)\n"
		   "  --crash-every=S     mean seconds between crash-restarts (default 10)\n"
		   "  --nemesis-every=MS  mean ms between SIGSTOPs and terminations (default 300)\n"
		   "  --logdir=DIR        keep the operation logs here (default: a temporary\n"
		   "                      directory, removed unless a violation is found)\n"
		   "  --forge             run the forger: present forged tokens (0, -1, never\n"
		   "                      issued, the last before a crash in memory mode),\n"
		   "                      above all right after each crash-restart\n"
		   "  --switch-modes      half of the crash-restarts (with --pgdata) come back\n"
		   "                      in the other dlock.storage mode (needs dlock preloaded)\n"
		   "  --workload=KIND     counter (default: leases, fenced read-modify-writes),\n"
		   "                      election (dlock.campaign, proclaim, fenced writes,\n"
		   "                      observe and leader; --keys is then the number of\n"
		   "                      elections) or semaphore (permits of --keys keys,\n"
		   "                      shared and exclusive leases of half as many more,\n"
		   "                      fenced writes)\n"
		   "  --observers=N       election: how many of the workers observe (default\n"
		   "                      a quarter, at least one); the others campaign\n"
		   "  --permits=N         semaphore: permits per key (default 3)\n"
		   "  --readers=N         semaphore: how many of the workers take shared leases\n"
		   "                      (default a fifth, at least one); the others permits\n"
		   "                      and exclusive leases\n"
		   "  --no-fence          debug: leave the tables unprotected by fence_guard\n"
		   "                      (election: dlock.fenced out of the writes; the\n"
		   "                      check must then report violations)\n"
		   "  --sabotage=KIND,... debug: break one property for real, so that the\n"
		   "                      check must report it (repeatable): setval,\n"
		   "                      delete-history, forge-history, server-log,\n"
		   "                      superseded, expired, async-commit, steal, forge;\n"
		   "                      election only: usurp, proclaim-back,\n"
		   "                      stale-proclaim; semaphore only: borrow, overcommit,\n"
		   "                      lost-renewal, stale-reader\n"
		   "  -d, --dbname=DB     database name or connection string\n"
		   "  -h, --host=HOST     server host or socket directory\n"
		   "  -p, --port=PORT     server port\n"
		   "  -U, --username=USER user name\n"
		   "  --help              show this help, then exit\n\n"
		   "Exit status: 0 no violation, 1 violations found, 2 the run or the check\n"
		   "could not be done.\n", MAX_WORKERS, MAX_KEYS);
}

/* Parse a non-negative integer option or exit 2. */
static long
int_arg(const char *name, const char *s, long lo, long hi)
{
	char	   *end;
	long		v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || *end != '\0' || end == s || v < lo || v > hi)
	{
		fprintf(stderr, "dlock-chaos: invalid value for --%s: \"%s\" (%ld..%ld)\n", name, s, lo, hi);
		exit(2);
	}
	return v;
}

int
main(int argc, char **argv)
{
	static struct option long_options[] = {
		{"duration", required_argument, NULL, 1},
		{"workers", required_argument, NULL, 2},
		{"keys", required_argument, NULL, 3},
		{"seed", required_argument, NULL, 4},
		{"pgdata", required_argument, NULL, 5},
		{"pg-ctl", required_argument, NULL, 6},
		{"server-log", required_argument, NULL, 7},
		{"logdir", required_argument, NULL, 8},
		{"no-fence", no_argument, NULL, 9},
		{"crash-every", required_argument, NULL, 10},
		{"nemesis-every", required_argument, NULL, 11},
		{"help", no_argument, NULL, 12},
		{"sabotage", required_argument, NULL, 13},
		{"forge", no_argument, NULL, 14},
		{"switch-modes", no_argument, NULL, 15},
		{"workload", required_argument, NULL, 16},
		{"observers", required_argument, NULL, 17},
		{"permits", required_argument, NULL, 18},
		{"readers", required_argument, NULL, 19},
		{"dbname", required_argument, NULL, 'd'},
		{"host", required_argument, NULL, 'h'},
		{"port", required_argument, NULL, 'p'},
		{"username", required_argument, NULL, 'U'},
		{NULL, 0, NULL, 0}
	};
	int			c,
				w;
	bool		ok = true;
	long		v;
	struct stat st;

	while ((c = getopt_long(argc, argv, "d:h:p:U:", long_options, NULL)) != -1)
	{
		switch (c)
		{
			case 1:
				duration_s = (int) int_arg("duration", optarg, 1, 100000000);
				break;
			case 2:
				nworkers = (int) int_arg("workers", optarg, 1, MAX_WORKERS);
				break;
			case 3:
				nkeys = (int) int_arg("keys", optarg, 1, MAX_KEYS);
				break;
			case 4:
				{
					char	   *end;

					errno = 0;
					seed = strtoull(optarg, &end, 10);
					if (errno != 0 || *end != '\0' || end == optarg)
					{
						fprintf(stderr, "dlock-chaos: invalid value for --seed: \"%s\"\n", optarg);
						exit(2);
					}
					seed_given = true;
				}
				break;
			case 5:
				pgdata = optarg;
				break;
			case 6:
				pg_ctl = optarg;
				break;
			case 7:
				server_log = optarg;
				break;
			case 8:
				logdir = optarg;
				keep_logs = true;
				break;
			case 9:
				no_fence = true;
				break;
			case 10:
				crash_every_s = (int) int_arg("crash-every", optarg, 2, 1000000);
				break;
			case 11:
				nemesis_ms = (int) int_arg("nemesis-every", optarg, 10, 1000000);
				break;
			case 12:
				usage();
				exit(0);
			case 13:
				{
					char	   *list = pg_strdup(optarg);
					char	   *tok;
					char	   *save = NULL;

					for (tok = strtok_r(list, ",", &save); tok != NULL;
						 tok = strtok_r(NULL, ",", &save))
					{
						int			k;

						for (k = 0; k < (int) lengthof(sabotage_kinds); k++)
							if (strcmp(tok, sabotage_kinds[k].name) == 0)
								break;
						if (k == (int) lengthof(sabotage_kinds))
						{
							fprintf(stderr, "dlock-chaos: unknown --sabotage kind \"%s\"\n", tok);
							exit(2);
						}
						sabotage |= sabotage_kinds[k].flag;
					}
					pg_free(list);
				}
				break;
			case 14:
				forge = true;
				break;
			case 15:
				switch_modes = true;
				break;
			case 16:
				election = semaphore = false;
				if (strcmp(optarg, "election") == 0)
					election = true;
				else if (strcmp(optarg, "semaphore") == 0)
					semaphore = true;
				else if (strcmp(optarg, "counter") != 0)
				{
					fprintf(stderr, "dlock-chaos: unknown --workload \"%s\" (counter, election, semaphore)\n", optarg);
					exit(2);
				}
				break;
			case 17:
				nobservers = (int) int_arg("observers", optarg, 0, MAX_WORKERS);
				break;
			case 18:
				npermits = (int) int_arg("permits", optarg, 1, 1000);
				permits_given = true;
				break;
			case 19:
				nreaders = (int) int_arg("readers", optarg, 0, MAX_WORKERS);
				break;
			case 'd':
				dbname = optarg;
				break;
			case 'h':
				host = optarg;
				break;
			case 'p':
				port = optarg;
				break;
			case 'U':
				user = optarg;
				break;
			default:
				fprintf(stderr, "Try \"dlock-chaos --help\" for more information.\n");
				exit(2);
		}
	}
	if (optind < argc)
	{
		fprintf(stderr, "dlock-chaos: unexpected argument \"%s\"\n", argv[optind]);
		exit(2);
	}
	if ((pgdata != NULL || pg_ctl != NULL) && (pgdata == NULL || pg_ctl == NULL || server_log == NULL))
	{
		fprintf(stderr, "dlock-chaos: crash-restarts need all of --pgdata, --pg-ctl and --server-log\n");
		exit(2);
	}
	if (((sabotage & S_SERVERLOG) && server_log == NULL) ||
		((sabotage & S_ASYNC) && pgdata == NULL))
	{
		fprintf(stderr, "dlock-chaos: --sabotage=server-log needs --server-log; async-commit needs crash-restarts\n");
		exit(2);
	}
	if ((switch_modes && pgdata == NULL) || ((sabotage & S_FORGE_BYPASS) && !forge))
	{
		fprintf(stderr, "dlock-chaos: --switch-modes needs crash-restarts; --sabotage=forge needs --forge\n");
		exit(2);
	}
	if (election && (forge || (sabotage & (S_SETVAL | S_FORGE_BYPASS))))
	{
		fprintf(stderr, "dlock-chaos: --workload election does not run the forger (--forge) nor --sabotage=setval, forge\n");
		exit(2);
	}
	if (!election && (nobservers >= 0 ||
					  (sabotage & (S_USURP | S_PROCLAIM_BACK | S_STALE_PROCLAIM))))
	{
		fprintf(stderr, "dlock-chaos: --observers and --sabotage=usurp, proclaim-back, stale-proclaim need --workload election\n");
		exit(2);
	}
	if (semaphore && (forge || (sabotage & (S_SETVAL | S_FORGE_BYPASS | S_SUPERSEDED | S_EXPIRED))))
	{
		fprintf(stderr, "dlock-chaos: --workload semaphore does not run the forger (--forge) nor --sabotage=setval, forge, superseded, expired (see lost-renewal, stale-reader)\n");
		exit(2);
	}
	if (!semaphore && (permits_given || nreaders >= 0 ||
					   (sabotage & (S_BORROW | S_OVERCOMMIT | S_LOST_RENEWAL | S_STALE_READER))))
	{
		fprintf(stderr, "dlock-chaos: --permits, --readers and --sabotage=borrow, overcommit, lost-renewal, stale-reader need --workload semaphore\n");
		exit(2);
	}
	if (semaphore)
	{
		nrw = Max(1, nkeys / 2);
		if (nkeys + nrw > MAX_KEYS)
		{
			fprintf(stderr, "dlock-chaos: --workload semaphore takes at most %d keys\n", MAX_KEYS * 2 / 3);
			exit(2);
		}
		if (nreaders < 0)
			nreaders = nworkers >= 2 ? Max(1, (nworkers + 2) / 5) : 0;
		if (nreaders >= nworkers)
		{
			fprintf(stderr, "dlock-chaos: --readers must leave a permit client among the %d workers\n", nworkers);
			exit(2);
		}
		if ((sabotage & S_STALE_READER) && nreaders == 0)
		{
			fprintf(stderr, "dlock-chaos: --sabotage=stale-reader needs a reader\n");
			exit(2);
		}
		if ((sabotage & S_OVERCOMMIT) && npermits >= MAX_OVERCOMMIT)
		{
			fprintf(stderr, "dlock-chaos: --sabotage=overcommit needs --permits below %d\n", MAX_OVERCOMMIT);
			exit(2);
		}
	}
	if (election)
	{
		if (nobservers < 0)
			nobservers = nworkers >= 2 ? Max(1, nworkers / 4) : 0;
		if (nobservers >= nworkers)
		{
			fprintf(stderr, "dlock-chaos: --observers must leave a campaigner among the %d workers\n", nworkers);
			exit(2);
		}
		ncampaigners = nworkers - nobservers;
		kp = "e";
	}
	else
	{
		/* semaphore: every client's refusals are checked as campaigners' */
		nobservers = 0;
		ncampaigners = nworkers;
	}
	if (!seed_given)
		seed = (uint64) time(NULL) ^ ((uint64) getpid() << 16);
	rng_state = seed;
	setvbuf(stdout, NULL, _IOLBF, 0);

	if (logdir == NULL)
	{
		strlcpy(logdir_buf, "/tmp/dlock-chaos.XXXXXX", sizeof(logdir_buf));
		if (mkdtemp(logdir_buf) == NULL)
		{
			fprintf(stderr, "dlock-chaos: cannot create a temporary directory: %m\n");
			exit(2);
		}
		logdir = logdir_buf;
	}
	else if (mkdir(logdir, 0700) != 0 && errno != EEXIST)
	{
		fprintf(stderr, "dlock-chaos: cannot create %s: %m\n", logdir);
		exit(2);
	}
	if (server_log != NULL && stat(server_log, &st) == 0)
		server_log_start = (long) st.st_size;

	if (election)
		printf("dlock-chaos: %d s, election workload: %d campaigners, %d observers, %d elections, seed " UINT64_FORMAT "%s%s\n",
			   duration_s, ncampaigners, nobservers, nkeys, seed,
			   no_fence ? ", NO dlock.fenced IN THE WRITES (debug)" : "",
			   sabotage ? ", SABOTAGED (debug)" : "");
	else if (semaphore)
		printf("dlock-chaos: %d s, semaphore workload: %d clients of which %d readers, %d keys of %d permits, %d shared/exclusive keys, seed " UINT64_FORMAT "%s%s\n",
			   duration_s, nworkers, nreaders, nkeys, npermits, nrw, seed,
			   no_fence ? ", NO dlock.fenced IN THE WRITES (debug)" : "",
			   sabotage ? ", SABOTAGED (debug)" : "");
	else
		printf("dlock-chaos: %d s, %d workers, %d keys, seed " UINT64_FORMAT "%s%s\n",
			   duration_s, nworkers, nkeys, seed, no_fence ? ", NO FENCING TRIGGER (debug)" : "",
			   sabotage ? ", SABOTAGED (debug)" : "");
	if (pgdata == NULL)
		printf("dlock-chaos: crash-restarts are off (they need --pgdata, --pg-ctl and --server-log)\n");
	setup();

	pqsignal(SIGINT, handle_stop);
	pqsignal(SIGTERM, handle_stop);
	pqsignal(SIGHUP, handle_stop);
	shared = mmap(NULL, sizeof(ChaosShared), PROT_READ | PROT_WRITE,
				  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED)
	{
		fprintf(stderr, "dlock-chaos: mmap failed: %m\n");
		exit(2);
	}
	memset(shared, 0, sizeof(ChaosShared));
	acked_writes = &shared->acked_writes;
	start_us = now_us();
	end_us = start_us + (int64) duration_s * 1000000;
	fflush(stdout);
	fflush(stderr);
	for (w = 0; w < nworkers; w++)
	{
		pid_t		pid = fork();

		if (pid < 0)
		{
			fprintf(stderr, "dlock-chaos: fork failed: %m\n");
			stop_requested = 1;
			break;
		}
		if (pid == 0)
			_exit(worker_main(w));
		worker_pids[w] = pid;
	}
	if (forge && !stop_requested)
	{
		pid_t		pid = fork();

		if (pid < 0)
		{
			fprintf(stderr, "dlock-chaos: fork failed: %m\n");
			stop_requested = 1;
		}
		else if (pid == 0)
			_exit(forger_main());
		else
			worker_pids[nworkers] = pid;
	}

	if (!stop_requested)
		ok = nemesis();
	if (stop_requested)
		printf("dlock-chaos: interrupted after %.1f s; checking what ran\n", (now_us() - start_us) / 1e6);
	/* a second ^C ends us at once; the workers die with us (PDEATHSIG) */
	pqsignal(SIGINT, SIG_DFL);
	pqsignal(SIGTERM, SIG_DFL);
	pqsignal(SIGHUP, SIG_DFL);
	if (!stop_workers())
		ok = false;

	if (!read_logs())
		exit(2);
	v = check();
	if (v < 0)
		ok = false;
	if (!ok || v != 0 || keep_logs)
		printf("dlock-chaos: operation logs kept in %s\n", logdir);
	else
		remove_logdir();
	if (v > 0)
		return 1;
	return ok ? 0 : 2;
}
