/*-------------------------------------------------------------------------
 *
 * dlock-fuzz.c
 *	  Hostile input for the dlock extension (issue 9, section 5).
 *
 * dlock-fuzz --calls N --seed X [connection options]
 *
 * Makes N calls, chosen by a seeded generator, of every SQL function of
 * dlock (try_acquire, acquire with short waits, renew, release, use_fence,
 * check_fence, prune, stats_reset, the views) and of writes through the
 * fence_guard trigger, with hostile arguments (NULLs, empty and 10 MB
 * strings, keys on both sides of the 512-byte limit and multibyte
 * characters straddling it, odd unicode, extreme and mixed-sign intervals,
 * extreme tokens, hostile templates, columns of odd types, partitions,
 * inheritance, views, COPY, ON CONFLICT, MERGE, savepoints, cursors,
 * plpgsql exception blocks, PREPARE TRANSACTION, parallel mode), and, as an
 * ordinary role, every attempt we know to forge or destroy a lease.
 *
 * Three connections: "digest" (superuser, search_path pg_catalog) only
 * reads the state; "su" (superuser) makes the calls that need one; "usr"
 * (an ordinary role with CREATE on the database and on schema public, made
 * by us) makes all the rest.  After every call the digest connection reads
 * a digest of the state: dlock.leases (every column, owners included), the
 * token sequence, dlock's catalog entries (schema, tables, columns,
 * functions, types, triggers, rules, policies, ACLs, owners, the
 * extension's membership, role settings, parameter ACLs, the fuzz role's
 * attributes) and the rows of the protected tables.  A violation is:
 *   - a lost connection or a restarted server (a crash), or a PANIC, TRAP
 *     or signal death in the server log (--server-log);
 *   - SQLSTATE XX000 (or any class XX), or one outside the allowlist;
 *   - a refused call after which the digest differs (the token sequence
 *     may only move forward, and only for calls of dlock's API: a grant
 *     rolled back still consumed its token);
 *   - a forgery that succeeds: an attack that must be refused and was not,
 *     a write under a token that is not the key's current one that changed
 *     rows, a held key granted to somebody else, a renew or release with a
 *     wrong owner that did not return NULL / false, a stranger's
 *     check_fence that said true;
 *   - a write under the current token of a live lease that was refused.
 * Each violation is printed with the SQL that caused it (truncated); the
 * exit status is 1 if there was any, 2 for bad usage or a failed setup.
 *
 * fuzz/dlock-fuzz.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres_fe.h"

#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "getopt_long.h"
#include "libpq-fe.h"
#include "pqexpbuffer.h"

#define MAX_STMTS	8
#define MAX_STATES	128
#define MAX_SHOWN	40
#define SQL_SHOWN	400
#define NPOOL		6
#define NGUARD		3

/* What a call must do for the run to pass. */
typedef enum Expect
{
	EXP_ANY,					/* anything allowed; a refusal changes nothing */
	EXP_REFUSE,					/* an attack: must fail, changing nothing */
	EXP_NOCHANGE,				/* may succeed, but must change nothing */
	EXP_VALUE,					/* must return expect_value (or fail), change nothing */
	EXP_NOROWS,					/* must return no row (or fail), change nothing */
	EXP_STALE,					/* a write under a wrong token: must change nothing */
	EXP_ACCEPT					/* a write under the live current token: must succeed */
} Expect;

/* Which connection makes the call. */
typedef enum Who
{
	AS_USR,
	AS_SU
} Who;

/* One call: up to MAX_STMTS statements run in order until one fails. */
typedef struct Call
{
	const char *cat;			/* category, for the histogram */
	Who			who;
	Expect		expect;
	const char *expect_value;	/* EXP_VALUE: first column of first row,
								 * NULL for SQL NULL */
	const char *expect_state;	/* a refusal must end with this SQLSTATE
								 * (NULL: any allowed one) */
	const char *refuse_what;	/* EXP_REFUSE: what succeeded, for the
								 * report (NULL: an attack) */
	bool		api;			/* a call of dlock's API: may draw tokens */
	bool		strict_seq;		/* refused for its arguments (22xxx, 42883):
								 * must not draw a token either */
	bool		invariants;		/* check the invariants of permits and
								 * shared leases afterwards */
	bool		async_sent;		/* the first statement was sent already
								 * (PQsendQuery): collect its result */
	int64		t_done;			/* now_ms() when its statements ended */
	bool		uses_dlock;		/* PREPARE TRANSACTION must fail */
	char	   *stmt[MAX_STMTS];
	int			nstmt;
	char	   *copydata;		/* rows for a COPY ... FROM STDIN statement */
	/* one statement sent with binary parameters instead */
	int			nparams;
	Oid			ptypes[3];
	char	   *pvalues[3];
	int			plengths[3];
	int			pformats[3];
	/* EXP_ACCEPT: the key and token, to see whether the lease still holds */
	char	   *accept_key;
	long long	accept_token;
	/* what the call returned */
	char	   *sqlstate;		/* NULL on success */
	char	   *errmsg;
	bool		lost;			/* the connection was lost */
	char	   *value;			/* first column of first row, or NULL */
	char	   *value2;			/* second column of first row, or NULL */
	bool		value_null;
	int			ntuples;
	long long	changed;		/* rows written by INSERT/UPDATE/DELETE/MERGE/COPY */
	bool		prepared;		/* a PREPARE TRANSACTION succeeded */
} Call;

/* The state the digest connection reads. */
typedef struct Digest
{
	char	   *leases;
	long long	seq;
	char	   *seq_called;
	char	   *catalog;
	char	   *tables;
	char	   *started;
	long long	tokens;			/* the token counter's last value */
} Digest;

/* A lease granted to one of our connections, by key. */
typedef struct Held
{
	char	   *key;			/* SQL literal of the key */
	char	   *owner;
	long long	fence;
} Held;

/* One entry of the histogram. */
typedef struct Count
{
	char		name[64];
	long		n;
} Count;

static const char *progname = "dlock-fuzz";

/* connections and options */
static PGconn *dig;
static PGconn *su;
static PGconn *usr;
static const char *keywords[8];
static const char *values[8];
static int	nconnopts = 0;
static const char *role = "dlock_fuzz";
static const char *server_log = NULL;
static const char *inject = NULL;
static bool verbose = false;
static bool sweep = false;		/* --sweep: every key shape, token, surface */
static bool horizon = false;	/* --horizon: just restarted in memory mode */
static bool has_kinds = false;	/* dlock 0.7: permits, shared leases,
								 * elections, observe (issue 20) */

/* run state */
static uint64 rng_state;
static Digest cur;
static bool evil_path = false;
static bool usr_loaded = false;	/* dlock is loaded in usr's session */
static char *pool_keys[NPOOL];
static char *guard_keys[NGUARD];
static long long guard_fence[NGUARD];
static Held held[NPOOL];
static char *tables_sql;			/* digest of the main protected tables */
static char *odd_tables_sql;	/* and of the tables of odd types */
static char *digest_pid;
static char *superuser_name;
static char *dbname_q;
static long log_offset = 0;
static uint64 run_seed;
static char *token_sql;			/* the token counter's last value */
static bool memory_mode = false;	/* dlock.storage = memory */
static char *horizon_sql;		/* ms until the horizon passes */

/*
 * The keys permits, shared leases and elections are asked of (issue 20),
 * as far as the invariants go: the largest permits => N asked of each and
 * whether mode => 'shared' may have been; and leases granted on it whose
 * owner we know (a ring), for owner calls and writes under their tokens.
 */
#define NKIND		6
#define NREMEMBER	8

typedef struct KindKey
{
	const char *key;			/* SQL expression */
	int			max_permits;	/* 1 until permits => N > 1 is asked */
	bool		shared;
	int			nleases;		/* leases remembered, ever */
	char	   *owner[NREMEMBER];	/* SQL literal */
	long long	fence[NREMEMBER];
} KindKey;

static KindKey kinds[NKIND + NPOOL];	/* the kind keys, then the pool keys */

/* results */
static Count states[MAX_STATES];
static int	nstates = 0;
static Count cats[MAX_STATES];
static Count times[MAX_STATES];
static int	ntimes = 0;
static int	ncats = 0;
static long calls_made = 0;
static long violations = 0;
static long crashes = 0;
static long forgeries_refused = 0;
static long stale_refused = 0;
static long accepted_writes = 0;
static long tokens_refused = 0; /* never-issued or horizon tokens refused */
static long wrapped_cases = 0;	/* wrapped calls compared with direct ones */
static long horizon_calls = 0;	/* calls made before the horizon */
static long invariant_checks = 0;	/* checks of the invariants of permits */
static long kinds_calls = 0;	/* calls of the 0.7 API (issue 20) */
static long kinds_leases = 0;	/* leases granted to owners we know */
static long observe_races = 0;	/* observes with a change checked */
static long notifications = 0;	/* NOTIFYs of dlock received by usr */
static int64 digest_ms = 0;
static int64 invariants_ms = 0;
static bool stop = false;		/* a crash ends the run */

/*
 * SQLSTATEs a call may end with, and why.  Anything else is a violation.
 */
static const char *const allowed[] = {
	"22004",					/* dlock: NULL argument, NULL key column */
	"22023",					/* dlock: bad key, ttl, wait, holder, template
								 * giving a bad key */
	"LF001",					/* dlock: fenced write refused */
	"39P01",					/* dlock: fence_guard misused (templates,
								 * types, AFTER, STATEMENT, TRUNCATE) */
	"55P03",					/* dlock: acquire timed out */
	"55000",					/* stats_reset not preloaded; prepared
								 * transactions disabled; config_dump
								 * outside a script */
	"0A000",					/* PREPARE after using dlock; trigger function
								 * called directly */
	"25000",					/* dlock function in parallel mode */
	"25006",					/* grant in a READ ONLY transaction */
	"57014",					/* statement_timeout around unlimited waits */
	"42501",					/* every attack of the ordinary role */
	"55P02",					/* SET of a postmaster-only setting */
	"42602",					/* SET of an unknown dlock.* setting: the
								 * prefix is reserved */
	"22007",					/* 'infinity'::interval and bad input syntax */
	"22008",					/* interval out of range */
	"22015",					/* interval field overflow */
	"22003",					/* bigint out of range */
	"22P02",					/* bad uuid, bad number input */
	"22P03",					/* bad binary parameter (wrong length) */
	"22021",					/* invalid UTF-8 from convert_from */
	"22P05",					/* \u0000 in a string */
	"54000",					/* chr(0), chr() of an invalid code point */
	"22001",					/* value too long for varchar(n)/char(n) */
	"23505",					/* duplicate key in a protected table */
	"23514",					/* CHECK of a domain or view */
	"44000",					/* WITH CHECK OPTION of a view */
	"21000",					/* MERGE/ON CONFLICT touching a row twice */
	"24000",					/* WHERE CURRENT OF without a current row */
	"42P06",					/* CREATE SCHEMA of an existing name */
	"42P07",					/* CREATE of an existing relation */
	"42710",					/* CREATE of an existing object */
	"42723",					/* CREATE of an existing function */
	"42883",					/* a call with wrong argument types */
	"42809",					/* statement on the wrong kind of object */
	"42704",					/* object that does not exist (after refusal) */
	"42P01",					/* relation that does not exist */
	NULL
};

/* Uniform random number below n, from a seeded splitmix64. */
static uint64
rnd(uint64 n)
{
	uint64		z;

	rng_state += UINT64CONST(0x9E3779B97F4A7C15);
	z = rng_state;
	z = (z ^ (z >> 30)) * UINT64CONST(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64CONST(0x94D049BB133111EB);
	z = z ^ (z >> 31);
	return n ? z % n : z;
}

/* True with probability pct percent. */
static bool
chance(int pct)
{
	return (int) rnd(100) < pct;
}

#define PICK(arr) ((arr)[rnd(lengthof(arr))])

/* Milliseconds on the monotonic clock. */
static int64
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Count one more of name in table t. */
static void
count(Count *t, int *n, const char *name)
{
	int			i;

	for (i = 0; i < *n; i++)
		if (strcmp(t[i].name, name) == 0)
		{
			t[i].n++;
			return;
		}
	if (*n < MAX_STATES)
	{
		strlcpy(t[*n].name, name, sizeof(t[*n].name));
		t[*n].n = 1;
		(*n)++;
	}
}

/* The call's statements joined, cut at SQL_SHOWN bytes, for a report. */
static char *
call_text(const Call *c)
{
	PQExpBufferData buf;
	int			i;

	initPQExpBuffer(&buf);
	for (i = 0; i < c->nstmt; i++)
		appendPQExpBuffer(&buf, "%s%s", i ? "; " : "", c->stmt[i]);
	if (buf.len > SQL_SHOWN)
	{
		buf.data[SQL_SHOWN] = '\0';
		buf.len = SQL_SHOWN;
		appendPQExpBufferStr(&buf, "...");
	}
	return buf.data;
}

/* Report a violation caused by call c (NULL: none in particular). */
static void violation(const Call *c, const char *fmt,...) pg_attribute_printf(2, 3);

static void
violation(const Call *c, const char *fmt,...)
{
	va_list		ap;
	char		msg[1024];

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	violations++;
	/* an injected call is always shown: t/hostile_input.pl looks for it */
	if (violations > MAX_SHOWN &&
		!(c && strcmp(c->cat, "injected") == 0))
		return;
	fprintf(stderr, "VIOLATION: %s\n", msg);
	if (c)
	{
		char	   *t = call_text(c);

		fprintf(stderr, "  call %ld [%s, as %s]: %s\n", calls_made, c->cat,
				c->who == AS_SU ? "superuser" : role, t);
		if (c->sqlstate)
			fprintf(stderr, "  ended with %s: %.300s\n", c->sqlstate,
					c->errmsg ? c->errmsg : "");
		free(t);
	}
}

/* Notices and warnings are expected by the hundred; keep them quiet. */
static void
quiet(void *arg, const PGresult *res)
{
	if (verbose)
		fprintf(stderr, "%s", PQresultErrorMessage(res));
}

/* Connect with the common options, as user (NULL: as given), or exit. */
static PGconn *
connect_as(const char *user, const char *appname, const char *options)
{
	const char *kw[12];
	const char *val[12];
	int			n = 0;
	int			i;
	PGconn	   *conn;

	for (i = 0; i < nconnopts; i++)
	{
		kw[n] = keywords[i];
		val[n++] = values[i];
	}
	if (user)
	{
		kw[n] = "user";
		val[n++] = user;
	}
	kw[n] = "application_name";
	val[n++] = appname;
	kw[n] = "options";
	val[n++] = options;
	kw[n] = NULL;
	val[n] = NULL;
	conn = PQconnectdbParams(kw, val, true);
	if (PQstatus(conn) != CONNECTION_OK)
	{
		fprintf(stderr, "%s: could not connect: %s", progname,
				PQerrorMessage(conn));
		return conn;
	}
	PQsetNoticeProcessor(conn, NULL, NULL);
	PQsetNoticeReceiver(conn, quiet, NULL);
	return conn;
}

/* Run sql on conn; exit on failure (for setup). */
static void
must(PGconn *conn, const char *sql)
{
	PGresult   *res = PQexec(conn, sql);

	if (PQresultStatus(res) != PGRES_COMMAND_OK &&
		PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "%s: setup failed: %s\n  in: %.500s\n", progname,
				PQerrorMessage(conn), sql);
		exit(2);
	}
	PQclear(res);
}

/* Run a query returning one value on conn; the value, or exit. */
static char *
must_value(PGconn *conn, const char *sql)
{
	PGresult   *res = PQexec(conn, sql);
	char	   *v;

	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		fprintf(stderr, "%s: setup query failed: %s\n  in: %.500s\n",
				progname, PQerrorMessage(conn), sql);
		exit(2);
	}
	v = pg_strdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	return v;
}

static int64 now_ms(void);

/* Free what a digest holds. */
static void
free_digest(Digest *d)
{
	free(d->leases);
	free(d->seq_called);
	free(d->catalog);
	free(d->tables);
	free(d->started);
	memset(d, 0, sizeof(*d));
}

/*
 * Read the digest of the state over the digest connection.  False if it
 * cannot be read (the server is gone, or an attack renamed something).
 */
static bool
read_digest(Digest *d, bool full, char **err)
{
	PGresult   *res;
	int64		t0 = now_ms();

	res = PQexecPrepared(dig, full ? "digest_full" : "digest", 0, NULL, NULL, NULL, 0);
	digest_ms += now_ms() - t0;
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		*err = pg_strdup(PQerrorMessage(dig));
		PQclear(res);
		return false;
	}
	d->leases = pg_strdup(PQgetvalue(res, 0, 0));
	d->seq = atoll(PQgetvalue(res, 0, 1));
	d->seq_called = pg_strdup(PQgetvalue(res, 0, 2));
	d->catalog = pg_strdup(full ? PQgetvalue(res, 0, 3) : cur.catalog);
	d->tables = pg_strdup(PQgetvalue(res, 0, 4));
	d->started = pg_strdup(PQgetvalue(res, 0, 5));
	d->tokens = atoll(PQgetvalue(res, 0, 6));
	PQclear(res);
	return true;
}

/*
 * The digest of the leases: every column of dlock.leases (owners, values
 * and slot counts included); in memory mode, where dlock.leases is empty,
 * what dlock.lease_status shows of each lease that does not change with
 * the clock, with the value observe() reports for a key's own lease.
 */
static const char *
leases_sql(void)
{
	if (memory_mode && has_kinds)
		return " (SELECT md5(coalesce(string_agg(concat_ws(' ', quote_literal(s.key), s.permit, s.fence, "
			"quote_nullable(s.holder), s.granted_at, s.expires_at, s.session_bound, s.pid, "
			"(SELECT quote_nullable(o.value) FROM dlock.observe(s.key, 0, '0') o WHERE s.permit IS NULL)), "
			"E'\\n' ORDER BY s.key COLLATE \"C\", s.permit NULLS FIRST), '')) FROM dlock.lease_status s),\n";
	return " (SELECT md5(coalesce(string_agg(l::text, E'\\n' ORDER BY l.key COLLATE \"C\"), '')) FROM dlock.leases l),\n";
}

static void prepare_invariants(void);

/* Prepare the digest query on the digest connection. */
static void
prepare_digest(void)
{
	PQExpBufferData q;
	PGresult   *res;

	initPQExpBuffer(&q);
	appendPQExpBufferStr(&q,
						 "WITH e AS (SELECT oid, extnamespace FROM pg_extension WHERE extname = 'dlock'),\n"
						 " r AS (SELECT c.oid FROM pg_class c, e WHERE c.relnamespace = e.extnamespace)\n"
						 "SELECT\n");
	appendPQExpBufferStr(&q, leases_sql());
	appendPQExpBufferStr(&q,
						 " (SELECT last_value FROM dlock.fence_seq),\n"
						 " (SELECT is_called::text FROM dlock.fence_seq),\n"
						 " md5((SELECT string_agg(x, E'\\n' ORDER BY x COLLATE \"C\") FROM (\n"
						 "  SELECT concat_ws(' ', 'ext', x.oid, x.extowner, x.extnamespace, x.extversion, x.extrelocatable, x.extconfig, x.extcondition) AS x FROM pg_extension x WHERE x.extname = 'dlock'\n"
						 "  UNION ALL SELECT concat_ws(' ', 'ns', n.oid, n.nspname, n.nspowner, coalesce(n.nspacl, acldefault('n', n.nspowner))) FROM pg_namespace n, e WHERE n.oid = e.extnamespace OR n.nspname IN ('dlock', 'fz')\n"
						 "  UNION ALL SELECT concat_ws(' ', 'rel', c.oid, c.relname, c.relnamespace, c.relowner, coalesce(c.relacl, acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::\"char\", c.relowner)), c.relkind, c.relpersistence, c.relfilenode, c.reltype, c.relhastriggers, c.relhasrules, c.relrowsecurity, c.relforcerowsecurity, c.relhasindex, c.relreplident, c.reloptions) FROM pg_class c WHERE c.relnamespace IN (SELECT extnamespace FROM e) OR c.relnamespace = 'fz'::regnamespace\n"
						 "  UNION ALL SELECT concat_ws(' ', 'att', a.attrelid, a.attnum, a.attname, a.atttypid, a.attnotnull, a.attisdropped, a.atthasdef, a.attgenerated, a.attacl) FROM pg_attribute a WHERE a.attrelid IN (SELECT oid FROM r) AND a.attnum > 0\n"
						 "  UNION ALL SELECT concat_ws(' ', 'def', d.adrelid, d.adnum, pg_get_expr(d.adbin, d.adrelid)) FROM pg_attrdef d WHERE d.adrelid IN (SELECT oid FROM r)\n"
						 "  UNION ALL SELECT concat_ws(' ', 'con', o.conrelid, o.conname, o.contype, o.convalidated) FROM pg_constraint o WHERE o.conrelid IN (SELECT oid FROM r)\n"
						 "  UNION ALL SELECT concat_ws(' ', 'proc', p.oid, p.proname, p.pronamespace, p.proowner, coalesce(p.proacl, acldefault('f', p.proowner)), p.prosecdef, p.provolatile, p.proparallel, p.proisstrict, p.proconfig, p.prolang, p.prosrc, p.probin, p.proargtypes) FROM pg_proc p, e WHERE p.pronamespace = e.extnamespace\n"
						 "  UNION ALL SELECT concat_ws(' ', 'type', t.oid, t.typname, t.typowner, coalesce(t.typacl, acldefault('T', t.typowner)), t.typrelid) FROM pg_type t, e WHERE t.typnamespace = e.extnamespace\n"
						 "  UNION ALL SELECT concat_ws(' ', 'op', o.oid, o.oprname) FROM pg_operator o, e WHERE o.oprnamespace = e.extnamespace\n"
						 "  UNION ALL SELECT concat_ws(' ', 'trg', t.tgrelid, t.tgname, t.tgfoid, t.tgtype, t.tgenabled, encode(t.tgargs, 'hex')) FROM pg_trigger t WHERE t.tgrelid IN (SELECT oid FROM r) OR t.tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'fz'::regnamespace)\n"
						 "  UNION ALL SELECT concat_ws(' ', 'rule', w.ev_class, w.rulename, w.ev_enabled) FROM pg_rewrite w WHERE w.ev_class IN (SELECT oid FROM r) OR w.ev_class IN (SELECT oid FROM pg_class WHERE relnamespace = 'fz'::regnamespace)\n"
						 "  UNION ALL SELECT concat_ws(' ', 'pol', p.polrelid, p.polname) FROM pg_policy p WHERE p.polrelid IN (SELECT oid FROM r)\n"
						 "  UNION ALL SELECT concat_ws(' ', 'seq', s.seqrelid, s.seqtypid, s.seqstart, s.seqincrement, s.seqmax, s.seqmin, s.seqcache, s.seqcycle) FROM pg_sequence s WHERE s.seqrelid IN (SELECT oid FROM r)\n"
						 "  UNION ALL SELECT concat_ws(' ', 'member', count(*)) FROM pg_depend d, e WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid AND d.deptype = 'e'\n"
						 "  UNION ALL SELECT concat_ws(' ', 'pub', p.prrelid) FROM pg_publication_rel p WHERE p.prrelid IN (SELECT oid FROM r)\n"
						 "  UNION ALL SELECT concat_ws(' ', 'setting', s.setdatabase, s.setrole, s.setconfig) FROM pg_db_role_setting s\n"
						 "  UNION ALL SELECT concat_ws(' ', 'paramacl', p.parname, p.paracl) FROM pg_parameter_acl p\n"
						 "  UNION ALL SELECT concat_ws(' ', 'evt', v.evtname) FROM pg_event_trigger v\n"
						 "  UNION ALL SELECT concat_ws(' ', 'role', a.rolname, a.rolsuper, a.rolinherit, a.rolcreaterole, a.rolcreatedb, a.rolreplication, a.rolbypassrls) FROM pg_roles a WHERE a.rolname = current_setting('dlock_fuzz.role')\n"
						 "  UNION ALL SELECT concat_ws(' ', 'member-of', m.roleid, m.member) FROM pg_auth_members m\n"
						 "  UNION ALL SELECT concat_ws(' ', 'db', d.datname, d.datdba, coalesce(d.datacl, acldefault('d', d.datdba))) FROM pg_database d WHERE d.datname = current_database()\n"
						 " ) s) || ");
	appendPQExpBufferStr(&q, odd_tables_sql);
	appendPQExpBufferStr(&q, "),\n ");
	appendPQExpBufferStr(&q, tables_sql);
	appendPQExpBuffer(&q, ",\n pg_postmaster_start_time()::text,\n (%s)", token_sql);
	res = PQprepare(dig, "digest_full", q.data, 0, NULL);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		fprintf(stderr, "%s: cannot prepare the digest: %s", progname,
				PQerrorMessage(dig));
		exit(2);
	}
	PQclear(res);
	termPQExpBuffer(&q);

	/* the same without the catalog, for calls that make no DDL */
	initPQExpBuffer(&q);
	appendPQExpBuffer(&q,
					  "SELECT\n%s"
					  " (SELECT last_value FROM dlock.fence_seq),\n"
					  " (SELECT is_called::text FROM dlock.fence_seq),\n"
					  " NULL::text,\n %s,\n pg_postmaster_start_time()::text,\n (%s)",
					  leases_sql(), tables_sql, token_sql);
	res = PQprepare(dig, "digest", q.data, 0, NULL);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		fprintf(stderr, "%s: cannot prepare the digest: %s", progname,
				PQerrorMessage(dig));
		exit(2);
	}
	PQclear(res);
	termPQExpBuffer(&q);
	if (has_kinds && !horizon)
		prepare_invariants();
}

/*
 * Read the digest as the new baseline after a step that is not a call (a
 * reconnection, maintenance).  A failure is a crash: it ends the run.
 */
static void
refresh_digest(void)
{
	Digest		after;
	char	   *err;

	if (!read_digest(&after, true, &err))
	{
		crashes++;
		stop = true;
		violation(NULL, "cannot read the state (crash?): %s", err);
		free(err);
		return;
	}
	free_digest(&cur);
	cur = after;
}

/* Add a statement (printf-style) to call c. */
static void add(Call *c, const char *fmt,...) pg_attribute_printf(2, 3);

static void
add(Call *c, const char *fmt,...)
{
	va_list		ap;
	size_t		len = 256;
	char	   *buf;

	if (c->nstmt >= MAX_STMTS)
	{
		fprintf(stderr, "%s: too many statements in a call\n", progname);
		exit(2);
	}
	for (;;)
	{
		int			n;

		buf = pg_malloc(len);
		va_start(ap, fmt);
		n = vsnprintf(buf, len, fmt, ap);
		va_end(ap);
		if (n >= 0 && (size_t) n < len)
			break;
		free(buf);
		len = n >= 0 ? (size_t) n + 1 : len * 2;
	}
	c->stmt[c->nstmt++] = buf;
}

/* A fresh call of category cat. */
static Call *
new_call(const char *cat, Who who, Expect expect)
{
	Call	   *c = pg_malloc0(sizeof(Call));

	c->cat = cat;
	c->who = who;
	c->expect = expect;
	return c;
}

/* Free a call. */
static void
free_call(Call *c)
{
	int			i;

	for (i = 0; i < c->nstmt; i++)
		free(c->stmt[i]);
	for (i = 0; i < c->nparams; i++)
		free(c->pvalues[i]);
	free(c->copydata);
	free(c->accept_key);
	free(c->sqlstate);
	free(c->errmsg);
	free(c->value);
	free(c->value2);
	free(c);
}

/* Is SQLSTATE s in the allowlist? */
static bool
is_allowed(const char *s)
{
	int			i;

	for (i = 0; allowed[i]; i++)
		if (strcmp(allowed[i], s) == 0)
			return true;
	return false;
}

/*
 * Query the live lease of key (an SQL expression) over the digest
 * connection: its current token (-1 when the key has no row) and whether
 * it is held with more than a second to go.
 */
static long long
key_state(const char *key, bool *live, bool *ended)
{
	char	   *sql;
	PGresult   *res;
	long long	fence = -1;

	*live = false;
	*ended = true;
	/* the key's own lease (since 0.7 its permits have rows too) */
	sql = psprintf("SELECT fence, state = 'held' AND remaining > '1 s', state <> 'held' "
				   "FROM dlock.lease_status WHERE key = %s%s", key,
				   has_kinds ? " AND permit IS NULL" : "");
	res = PQexec(dig, sql);
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
	{
		fence = atoll(PQgetvalue(res, 0, 0));
		*live = PQgetvalue(res, 0, 1)[0] == 't';
		*ended = PQgetvalue(res, 0, 2)[0] == 't';
	}
	PQclear(res);
	free(sql);
	return fence;
}

/*
 * Is token a lease of key (an SQL expression) in state 'held' now, with
 * more than a second to go when long is set?  The key's own lease or one
 * of its permits or shared leases.
 */
static bool
token_held(const char *key, long long token, bool long_enough)
{
	char	   *sql;
	PGresult   *res;
	bool		held = false;

	sql = psprintf("SELECT count(*) FROM dlock.lease_status WHERE key = %s AND fence = %lld "
				   "AND state = 'held'%s", key, token,
				   long_enough ? " AND remaining > '1 s'" : "");
	res = PQexec(dig, sql);
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
		held = strcmp(PQgetvalue(res, 0, 0), "0") != 0;
	PQclear(res);
	free(sql);
	return held;
}

/* The KindKey of key (a pointer from kinds[].key or pool_keys), or NULL. */
static KindKey *
kind_of(const char *key)
{
	int			i;

	for (i = 0; i < NKIND + NPOOL; i++)
		if (kinds[i].key == key)
			return &kinds[i];
	return NULL;
}

/*
 * Prepare the query of check_invariants on the digest connection (since
 * 0.7): planning it takes longer than running it.
 */
static void
prepare_invariants(void)
{
	PQExpBufferData q;
	PGresult   *res;
	int			i;

	initPQExpBuffer(&q);
	appendPQExpBuffer(&q,
					  "WITH s AS MATERIALIZED (SELECT key, fence, state, permit, granted_at, expires_at, session_bound "
					  "FROM dlock.lease_status WHERE fence IS NOT NULL),\n"
					  " b(k, n) AS (");
	/* $i: the largest permits => N asked of kinds[i - 1], NULL if shared */
	appendPQExpBufferStr(&q, "VALUES ");
	for (i = 0; i < NKIND + NPOOL; i++)
		appendPQExpBuffer(&q, "%s(%s, $%d::int)", i ? ", " : "", kinds[i].key, i + 1);
	/* the keys whose leader() is compared with their exclusive lease */
	appendPQExpBufferStr(&q, "),\n t(k) AS (VALUES ");
	for (i = 0; i < NKIND + NPOOL; i++)
		appendPQExpBuffer(&q, "%s(%s)", i ? ", " : "", kinds[i].key);
	appendPQExpBuffer(&q,
					  ")\nSELECT\n"
					  " (SELECT string_agg(fence || ' (' || n || ' leases)', ', ') FROM (SELECT fence, count(*) AS n FROM s GROUP BY fence HAVING count(*) > 1 LIMIT 5) d),\n"
					  " (SELECT string_agg(quote_literal(left(key, 60)), ', ') FROM (SELECT key FROM s GROUP BY key "
					  "HAVING bool_or(permit IS NULL AND state = 'held') AND bool_or(permit IS NOT NULL AND state = 'held') LIMIT 5) d),\n"
					  " (SELECT string_agg(format('%%L: exclusive %%s [%%s, %%s), permit %%s %%s [%%s, %%s)', left(k, 60), af, ag, ae, bp, bf, bg, be), '; ') "
					  "FROM (SELECT a.key, a.fence, a.granted_at, a.expires_at, b.permit, b.fence, b.granted_at, b.expires_at "
					  "FROM s a JOIN s b ON a.key = b.key AND a.permit IS NULL AND b.permit IS NOT NULL "
					  "WHERE NOT a.session_bound AND NOT b.session_bound AND a.granted_at < b.expires_at AND b.granted_at < a.expires_at LIMIT 3) "
					  "d(k, af, ag, ae, bp, bf, bg, be)),\n"
					  " (SELECT string_agg(format('%%L: %%s live, up to permit %%s, permits asked at most %%s', left(b.k, 60), c.n, c.m, b.n), '; ') "
					  "FROM b, LATERAL (SELECT count(*) AS n, max(permit) AS m FROM s WHERE s.key = b.k AND s.permit IS NOT NULL AND s.state = 'held') c "
					  "WHERE b.n IS NOT NULL AND (c.n > b.n OR c.m > b.n)),\n"
					  " (SELECT string_agg(quote_literal(left(key, 60)) || ' (' || octet_length(key) || ' bytes) permit ' || coalesce(permit::text, 'NULL'), ', ') "
					  "FROM s WHERE octet_length(key) NOT BETWEEN 1 AND 512 OR strpos(key, chr(31)) > 0 OR permit NOT BETWEEN 1 AND 1000),\n"
					  " (SELECT string_agg(fence::text, ', ') FROM s WHERE fence > (%s)),\n"
					  " (SELECT string_agg(format('%%L: leader %%s, exclusive lease %%s', left(k.k, 60), l.fence, e.fence), '; ') "
					  "FROM t k CROSS JOIN LATERAL dlock.leader(k.k) l "
					  "LEFT JOIN s e ON e.key = k.k AND e.permit IS NULL WHERE l.fence IS DISTINCT FROM e.fence),\n",
					  token_sql);
	if (memory_mode)
		appendPQExpBufferStr(&q, " NULL::text");
	else
		appendPQExpBufferStr(&q,
							 " (SELECT string_agg(quote_literal(left(l.key, 60)), ', ') FROM dlock.leases l "
							 "WHERE strpos(l.key, chr(31)) > 0 AND NOT EXISTS (SELECT FROM dlock.leases h "
							 "WHERE h.key = split_part(l.key, chr(31), 1) AND split_part(l.key, chr(31), 2) ~ '^[0-9]{1,4}$' "
							 "AND h.slots >= split_part(l.key, chr(31), 2)::int))");
	res = PQprepare(dig, "invariants", q.data, 0, NULL);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		fprintf(stderr, "%s: cannot prepare the invariants: %s", progname,
				PQerrorMessage(dig));
		exit(2);
	}
	PQclear(res);
	termPQExpBuffer(&q);
}

/*
 * Check the invariants of permits and shared leases (issue 20) in
 * dlock.lease_status, over the digest connection, in either storage mode:
 * no token names two leases; no key has a live exclusive lease (permit
 * NULL) together with a live permit or shared lease, nor one whose time
 * [granted_at, expires_at) overlapped theirs (session-bound leases, which
 * end with their connection before expires_at, aside); no key that was
 * never asked for a shared lease shows more live permits, or a higher
 * permit, than the largest permits => N asked of it; every key shown is a
 * key (1 to 512 bytes, no U+001F) and every permit between 1 and 1000; no
 * token is above the token counter; dlock.leader() of the kind and pool
 * keys shows the exclusive lease or nothing; and (table mode) no permit's
 * lease is stored beyond the slot count of its key's row.  c: the call
 * after which it runs.
 */
static void
check_invariants(const Call *c)
{
	static const char *const what[] = {
		"a token names two leases",
		"an exclusive lease is live together with a permit or shared lease of the same key",
		"an exclusive lease and a permit or shared lease of the same key overlapped in time",
		"more live permits than the largest permits => N asked",
		"a key or permit that dlock refuses is in dlock.lease_status",
		"a token above the token counter",
		"dlock.leader() does not show the key's exclusive lease (or shows one for a key without)",
		"a permit's lease is stored beyond the slot count of its key",
	};
	static char *last[lengthof(what)];
	char		bounds[NKIND + NPOOL][16];
	const char *params[NKIND + NPOOL];
	PGresult   *res;
	int			i;
	int64		t0;

	if (!has_kinds || horizon)
		return;
	invariant_checks++;
	t0 = now_ms();
	for (i = 0; i < NKIND + NPOOL; i++)
	{
		snprintf(bounds[i], sizeof(bounds[i]), "%d", kinds[i].max_permits);
		params[i] = kinds[i].shared ? NULL : bounds[i];
	}
	res = PQexecPrepared(dig, "invariants", NKIND + NPOOL, params, NULL, NULL, 0);
	invariants_ms += now_ms() - t0;
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		violation(c, "cannot check the invariants of permits: %s", PQerrorMessage(dig));
		PQclear(res);
		return;
	}
	for (i = 0; i < (int) lengthof(what); i++)
	{
		const char *v = PQgetisnull(res, 0, i) ? NULL : PQgetvalue(res, 0, i);

		/* a state that stays wrong is reported once */
		if (v && !(last[i] && strcmp(last[i], v) == 0))
			violation(c, "invariant: %s: %.600s", what[i], v);
		free(last[i]);
		last[i] = v ? pg_strdup(v) : NULL;
	}
	PQclear(res);
}

/*
 * Read the NOTIFYs the ordinary role's connection has received (it LISTENs
 * on channel dlock now and then, and the superuser sets dlock.notify): each
 * payload must be the JSON object dlock documents, naming an event, a key
 * (a key, not the key a permit is stored under), its permit if any, and a
 * token.
 */
static void
drain_notifications(const Call *c)
{
	PGnotify   *n;

	PQconsumeInput(usr);
	while ((n = PQnotifies(usr)) != NULL)
	{
		notifications++;
		if (strcmp(n->relname, "dlock") == 0 && notifications <= 500)
		{
			const char *params[1] = {n->extra};
			PGresult   *res = PQexecParams(dig,
										   "SELECT (p->>'event') IN ('grant', 'takeover', 'release', 'expired', 'proclaim') "
										   "AND (p->>'fence')::bigint > 0 AND octet_length(p->>'key') BETWEEN 1 AND 512 "
										   "AND strpos(p->>'key', chr(31)) = 0 "
										   "AND (p->'permit' IS NULL OR (p->>'permit')::int BETWEEN 1 AND 1000) "
										   "FROM (SELECT $1::json AS p) s",
										   1, NULL, params, NULL, NULL, 0);

			if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1 ||
				strcmp(PQgetvalue(res, 0, 0), "t") != 0)
				violation(c, "a NOTIFY of dlock is not what dlock documents: %.300s (%s)",
						  n->extra, PQresultErrorMessage(res));
			PQclear(res);
		}
		PQfreemem(n);
	}
}

/* Run one statement of call c on conn; false when it failed. */
static bool
run_stmt(PGconn *conn, Call *c, int i)
{
	PGresult   *res;
	ExecStatusType st;
	const char *tuples;

	if (i == 0 && c->async_sent)
	{
		PGresult   *r;

		/*
		 * Sent before with PQsendQuery, maybe several statements: keep the
		 * first error, else the last row set (the call's value).
		 */
		res = NULL;
		while ((r = PQgetResult(conn)) != NULL)
		{
			ExecStatusType rs = PQresultStatus(r);

			if (res && (PQresultStatus(res) == PGRES_FATAL_ERROR ||
						(rs != PGRES_TUPLES_OK && rs != PGRES_FATAL_ERROR)))
				PQclear(r);
			else
			{
				PQclear(res);
				res = r;
			}
		}
		if (res == NULL)
			res = PQmakeEmptyPGresult(conn, PGRES_FATAL_ERROR);
	}
	else if (c->nparams > 0 && strstr(c->stmt[i], "$1"))
		res = PQexecParams(conn, c->stmt[i], c->nparams, c->ptypes,
						   (const char *const *) c->pvalues, c->plengths,
						   c->pformats, 0);
	else
		res = PQexec(conn, c->stmt[i]);
	st = PQresultStatus(res);
	if (st == PGRES_COPY_IN)
	{
		PQclear(res);
		if (PQputCopyData(conn, c->copydata ? c->copydata : "",
						  c->copydata ? strlen(c->copydata) : 0) != 1 ||
			PQputCopyEnd(conn, NULL) != 1)
		{
			c->lost = true;
			return false;
		}
		res = PQgetResult(conn);
		st = PQresultStatus(res);
		/* drain */
		{
			PGresult   *more;

			while ((more = PQgetResult(conn)) != NULL)
				PQclear(more);
		}
	}
	if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
	{
		tuples = PQcmdTuples(res);
		if (tuples[0] && strncmp(PQcmdStatus(res), "SELECT", 6) != 0 &&
			strncmp(PQcmdStatus(res), "FETCH", 5) != 0 &&
			strncmp(PQcmdStatus(res), "MOVE", 4) != 0)
			c->changed += atoll(tuples);
		if (st == PGRES_TUPLES_OK && PQnfields(res) > 0)
		{
			free(c->value);
			free(c->value2);
			c->ntuples = PQntuples(res);
			c->value = NULL;
			c->value2 = NULL;
			c->value_null = true;
			if (c->ntuples > 0 && !PQgetisnull(res, 0, 0))
			{
				c->value = pg_strdup(PQgetvalue(res, 0, 0));
				c->value_null = false;
			}
			if (c->ntuples > 0 && PQnfields(res) > 1 && !PQgetisnull(res, 0, 1))
				c->value2 = pg_strdup(PQgetvalue(res, 0, 1));
		}
		if (strncmp(c->stmt[i], "PREPARE TRANSACTION", 19) == 0)
			c->prepared = true;
		PQclear(res);
		return true;
	}
	{
		const char *s = PQresultErrorField(res, PG_DIAG_SQLSTATE);

		c->errmsg = pg_strdup(PQerrorMessage(conn));
		if (s == NULL || PQstatus(conn) != CONNECTION_OK ||
			strncmp(s, "57P", 3) == 0 || strncmp(s, "08", 2) == 0)
		{
			c->lost = true;
			c->sqlstate = pg_strdup(s ? s : "conn-lost");
		}
		else
			c->sqlstate = pg_strdup(s);
	}
	PQclear(res);
	return false;
}

/* Wait for the server to take connections again, and reconnect all. */
static void
reconnect_all(void)
{
	int			i;

	for (i = 0; i < 60; i++)
	{
		PQfinish(dig);
		dig = connect_as(NULL, "dlock-fuzz-digest",
						 psprintf("-c search_path=pg_catalog -c dlock_fuzz.role=%s", role));
		if (PQstatus(dig) == CONNECTION_OK)
			break;
		sleep(1);
	}
	if (PQstatus(dig) != CONNECTION_OK)
	{
		fprintf(stderr, "%s: the server did not come back\n", progname);
		exit(1);
	}
	prepare_digest();
	free(digest_pid);
	digest_pid = must_value(dig, "SELECT pg_backend_pid()");
	PQfinish(su);
	su = connect_as(NULL, "dlock-fuzz-su", "-c statement_timeout=10s");
	PQfinish(usr);
	usr = connect_as(role, "dlock-fuzz-usr", "-c statement_timeout=10s");
	evil_path = false;
	usr_loaded = false;
}

/*
 * Does call c prune or forget as the superuser in memory mode?  There
 * they take effect at once, and a rollback does not bring the leases back
 * (docs/memory-mode.md): a rolled-back or refused call may have dropped
 * some.
 */
static bool
at_once(const Call *c)
{
	int			i;

	if (!memory_mode || c->who != AS_SU)
		return false;
	for (i = 0; i < c->nstmt; i++)
		if (strstr(c->stmt[i], "dlock.prune(") || strstr(c->stmt[i], "dlock.forget("))
			return true;
	return false;
}

/*
 * Make call c and check it: record its outcome in the histograms, compare
 * the digest with the one before it, and report violations.
 */
static void
make_call(Call *c)
{
	PGconn	   *conn = c->who == AS_SU ? su : usr;
	Digest		after;
	char	   *err = NULL;
	int			i;
	bool		refused;
	bool		full;
	int64		t0;
	char		catstate[64];

	calls_made++;
	t0 = now_ms();
	for (i = 0; i < c->nstmt; i++)
		if (!run_stmt(conn, c, i))
			break;
	c->t_done = now_ms();
	{
		int			j;

		for (j = 0; j < ntimes && strcmp(times[j].name, c->cat) != 0; j++)
			;
		if (j == ntimes && ntimes < MAX_STATES)
			strlcpy(times[ntimes++].name, c->cat, sizeof(times[0].name));
		if (j < ntimes)
			times[j].n += now_ms() - t0;
	}
	if (!c->lost && PQstatus(conn) != CONNECTION_OK)
	{
		c->lost = true;
		if (!c->sqlstate)
			c->sqlstate = pg_strdup("conn-lost");
	}
	if (!c->lost && PQtransactionStatus(conn) != PQTRANS_IDLE)
	{
		PGresult   *res = PQexec(conn, "ROLLBACK");

		PQclear(res);
	}
	if (!c->lost && conn == usr)
		drain_notifications(c);
	if (c->prepared)
	{
		PGresult   *res = PQexec(su, "ROLLBACK PREPARED 'dlock_fuzz'");

		PQclear(res);
		if (c->uses_dlock)
			violation(c, "PREPARE TRANSACTION succeeded after the transaction used dlock");
	}
	refused = c->sqlstate != NULL;
	if (c->who == AS_USR && !refused)
		for (i = 0; i < c->nstmt; i++)
			if (strstr(c->stmt[i], "dlock.") || strstr(c->stmt[i], "fz."))
				usr_loaded = true;
	count(states, &nstates, refused ? c->sqlstate : "00000");
	snprintf(catstate, sizeof(catstate), "%s %s", c->cat,
			 refused ? c->sqlstate : "00000");
	count(cats, &ncats, catstate);

	if (c->lost)
	{
		crashes++;
		stop = true;
		violation(c, "connection lost (crash?)");
		reconnect_all();
	}
	else if (refused && strncmp(c->sqlstate, "XX", 2) == 0)
		violation(c, "internal error %s", c->sqlstate);
	else if (refused && !is_allowed(c->sqlstate))
		violation(c, "SQLSTATE %s is not in the allowlist", c->sqlstate);

	/*
	 * dlock's catalog entries are read after every call that could make DDL
	 * (attacks, templates, session settings) and after every 20th call.
	 */
	full = strcmp(c->cat, "attack") == 0 || strcmp(c->cat, "template") == 0 ||
		strncmp(c->cat, "odd", 3) == 0 ||
		strcmp(c->cat, "session") == 0 || strcmp(c->cat, "injected") == 0 ||
		calls_made % 20 == 0;
	if (!read_digest(&after, full, &err))
	{
		crashes++;
		stop = true;
		violation(c, "cannot read the state afterwards (crash?): %s", err);
		free(err);
		reconnect_all();
		if (!read_digest(&after, true, &err))
		{
			fprintf(stderr, "%s: cannot read the state: %s", progname, err);
			exit(1);
		}
	}
	if (strcmp(after.started, cur.started) != 0)
	{
		crashes++;
		stop = true;
		violation(c, "the server restarted (postmaster start time %s, was %s)",
				  after.started, cur.started);
	}
	if (stop)
	{
		/* after a crash the state says nothing about this call */
		free_digest(&cur);
		cur = after;
		return;
	}

	if (!refused)
	{
		switch (c->expect)
		{
			case EXP_REFUSE:
				if (c->refuse_what)
					violation(c, "%s was accepted (it must be refused)",
							  c->refuse_what);
				else
					violation(c, "attack succeeded (it must be refused)");
				break;
			case EXP_VALUE:
				if (c->ntuples != 1 ||
					(c->expect_value == NULL) != c->value_null ||
					(c->expect_value && strcmp(c->expect_value, c->value) != 0))
					violation(c, "returned %s, must return %s",
							  c->ntuples == 0 ? "no row" :
							  c->value_null ? "NULL" : c->value,
							  c->expect_value ? c->expect_value : "NULL");
				else if (c->refuse_what)
					tokens_refused++;
				break;
			case EXP_NOROWS:
				if (c->ntuples != 0)
					violation(c, "returned %d rows: %s", c->ntuples,
							  c->refuse_what ? c->refuse_what : "a held key was granted to another");
				break;
			case EXP_STALE:
				if (c->changed > 0)
					violation(c, "a write under a token that is not current changed %lld rows",
							  c->changed);
				break;
			case EXP_ACCEPT:
				accepted_writes++;
				break;
			default:
				break;
		}
	}
	else
	{
		if (c->expect == EXP_REFUSE && c->refuse_what)
			tokens_refused++;
		else if (c->expect == EXP_REFUSE)
			forgeries_refused++;
		if (c->expect_state && strcmp(c->sqlstate, c->expect_state) != 0 &&
			strncmp(c->sqlstate, "XX", 2) != 0)
			violation(c, "refused with %s, must be refused with %s",
					  c->sqlstate, c->expect_state);
		if (c->expect == EXP_STALE)
			stale_refused++;
		/* the token's lease: the key's own, or one of its permits */
		if (c->expect == EXP_ACCEPT && strcmp(c->sqlstate, "LF001") == 0 &&
			token_held(c->accept_key, c->accept_token, true))
			violation(c, "a write under the current token %lld of a live lease was refused",
					  c->accept_token);
	}

	/* state: a refused call, or one that must change nothing */
	if (refused || c->expect == EXP_REFUSE || c->expect == EXP_NOCHANGE ||
		c->expect == EXP_VALUE || c->expect == EXP_NOROWS ||
		c->expect == EXP_STALE)
	{
		bool		seq_ok;

		/*
		 * A grant rolled back or refused late still drew its token; one
		 * refused for its arguments, before dlock looked at the key, drew
		 * none.
		 */
		if (c->strict_seq && refused &&
			(strncmp(c->sqlstate, "22", 2) == 0 ||
			 strcmp(c->sqlstate, "42883") == 0))
			seq_ok = after.tokens == cur.tokens && after.seq == cur.seq;
		else if (c->api)
			seq_ok = after.seq >= cur.seq;
		else
			seq_ok = after.seq == cur.seq &&
				strcmp(after.seq_called, cur.seq_called) == 0;
		if (strcmp(after.leases, cur.leases) != 0 && !at_once(c))
			violation(c, "dlock.leases changed");
		if (!seq_ok && after.tokens != cur.tokens)
			violation(c, "the token counter moved from %lld to %lld (a call refused for its arguments)",
					  cur.tokens, after.tokens);
		else if (!seq_ok)
			violation(c, "dlock.fence_seq moved from %lld to %lld",
					  cur.seq, after.seq);
		if (strcmp(after.catalog, cur.catalog) != 0)
			violation(c, "dlock's catalog entries or the odd-type tables changed%s",
					  full ? "" : " (by this call or one of the 20 before)");
		if (strcmp(after.tables, cur.tables) != 0)
			violation(c, "the protected tables changed");
	}
	free_digest(&cur);
	cur = after;
	if (c->invariants)
		kinds_calls++;
	if (c->invariants || (has_kinds && calls_made % 20 == 0))
		check_invariants(c);
	if (verbose)
	{
		char	   *t = call_text(c);

		fprintf(stderr, "%ld %s %s: %s\n", calls_made, c->cat,
				refused ? c->sqlstate : "00000", t);
		free(t);
	}
}

/* Make call c, then free it. */
static void
call(Call *c)
{
	make_call(c);
	free_call(c);
}

/* ---- argument pools (SQL expressions) --------------------------------- */

static const char *const hostile_keys[] = {
	"NULL", "''", "' '", "'a'",
	"repeat('a', 511)", "repeat('a', 512)", "repeat('a', 513)",
	"repeat('a', 510) || E'\\u00e9'",	/* 512 bytes */
	"repeat('a', 511) || E'\\u00e9'",	/* 513: the character straddles */
	"repeat('a', 508) || E'\\U0001F600'",	/* 512 */
	"repeat('a', 509) || E'\\U0001F600'",	/* 513 */
	"repeat('a', 510) || E'\\u20ac'",	/* 513 */
	"repeat(E'\\u00e9', 256)", "repeat(E'\\u00e9', 256) || 'a'",
	"repeat(E'\\u20ac', 170) || 'ab'", "repeat(E'\\u20ac', 171)",
	"repeat(E'\\U0001F600', 128)", "repeat(E'\\U0001F600', 128) || 'a'",
	"repeat('x', 10485760)",
	"E'e\\u0301\\u0301\\u0301\\u0301'", "E'\\u202Eevil\\u202C'",
	"E'\\u200B'", "E'\\uFEFF'", "E'\\U0010FFFF'", "E'\\U0001F600'",
	"E'\\u0627\\u0644\\u200F'", "E'\\uFFFD'",
	"E'a\\tb\\nc\\r'", "E'\\\\'", "'\"'", "''''", "'{'", "'}'", "'{k}'",
	"'%s%n%x'", "'fz:k0 '", "upper('fz:k0')", "'FZ:K0'",
	"convert_from('\\xc3'::bytea, 'UTF8')",
	"convert_from('\\xeda080'::bytea, 'UTF8')",
	"convert_from('\\xf4908080'::bytea, 'UTF8')",
	"convert_from('\\xc0af'::bytea, 'UTF8')",
	"chr(0)", "chr(55296)", "chr(1114112)",
	"repeat('k', 600)::varchar(511)",
	"(SELECT string_agg(chr(n), '') FROM generate_series(1, 127) n)",
	"(SELECT string_agg(chr(n), '') FROM generate_series(1, 600) n)",
	"1::text", "'fz:g0'", "'fz:g1'",
	/*
	 * U+001F, which dlock puts between a key and its permit's number
	 * (0.7): refused in a key at every position, also where it makes the
	 * key look like one of a pool key's permits
	 */
	"E'\\x1f'", "E'\\x1fa'", "E'a\\x1f'", "E'a\\x1fb'", "E'\\x1f\\x1f'", "chr(31)",
	"E'fz:k0\\x1f'", "E'fz:k0\\x1f1'", "E'fz:p0\\x1f2'", "E'fz:k1\\x1f1000'",
	"repeat('a', 511) || E'\\x1f'", "E'\\x1f' || repeat('a', 511)",
	"repeat('a', 255) || E'\\x1f' || repeat('a', 256)",
	"repeat(E'\\u00e9', 255) || E'\\x1f1'",	/* 513 */
	"repeat('p', 512) || E'\\x1f1'",	/* a 512-byte key's first permit */
	"E'\\x1e\\x01\\x7f'",	/* other control characters are keys */
};

/* hostile_keys[i] is a key dlock accepts (1 to 512 bytes; setup) */
static bool hostile_valid[lengthof(hostile_keys)];

static const char *const ttls[] = {
	"NULL", "'0'", "'-0'", "'-1 us'", "'1 us'", "'1 ms'", "'20 ms'",
	"'200 ms'", "'1 s'", "'5 s'", "'1 hour'", "'1 day'", "'1 day 1 us'",
	"'24 days'", "'infinity'", "'-infinity'", "'1000000 years'",
	"'-1000000 years'", "'178956970 years 7 months'",
	"'-178956970 years -8 months'", "'1 mon'",
	"'1 mon -29 days -23:59:59.999999'", "'-1 mon +30 days 00:00:00.000001'",
	"'1 day -86399.999999 s'", "'2147483647 days'", "'-2147483648 days'",
	"'2147483647 hours'", "'-2147483648 days 2147483647 hours'",
	"'@ 1 hour ago'", "'P1D'", "'PT0.000001S'", "'00:00:00.0000001'",
	"'1 year -12 months 1 us'", "'1 week'", "'1 millennium'",
	"make_interval(secs => 1e300)", "interval '1 s' * 1e12",
	"'1 s'::text", "'10 s'::interval(0)",
};

static const char *const waits[] = {
	"'0'", "'1 ms'", "'2 ms'", "'-1 us'", "'1 mon -30 days'", "'infinity'",
	"'-1000000 years'", "'10 ms'",
};

static const char *const fences[] = {
	"NULL", "0", "-1", "1", "2", "9223372036854775807",
	"(-9223372036854775807 - 1)", "9223372036854775808::bigint",
	"'-9223372036854775808'", "'x'::bigint", "1.5::bigint",
};

static const char *const owners[] = {
	"NULL", "'00000000-0000-0000-0000-000000000000'",
	"'ffffffff-ffff-ffff-ffff-ffffffffffff'", "gen_random_uuid()",
	"'not-a-uuid'::uuid", "'{00000000-0000-0000-0000-000000000000}'",
	"md5('x')::uuid",
};

static const char *const holders[] = {
	"NULL", "''", "'w'", "repeat('h', 1024)", "repeat('h', 1025)",
	"repeat(E'\\u00e9', 512)", "repeat(E'\\u00e9', 512) || 'x'",
	"repeat('x', 10485760)", "E'\\u202E\\u0301'", "E'\\n\\\\\"\\t'",
};

static const char *const delays[] = {
	"NULL", "'0'", "'-1 us'", "'1 ms'", "'10 ms'", "'1 day 1 us'",
	"'1000000 years'", "'infinity'", "'-1 mon +30 days'",
};

static const char *const bools[] = {"NULL", "true", "false"};

static const char *const ages[] = {
	"NULL", "'0'", "'-1 us'", "'1 ms'", "'1 day'", "'1000000 years'",
	"'-1000000 years'", "'infinity'", "'178956970 years 7 months'",
};

/*
 * permits => (issue 20): SQL, and the number of permits it asks for when
 * dlock takes it (1 to 1000), else 0.
 */
typedef struct PermitArg
{
	const char *sql;
	int			n;
} PermitArg;

static const PermitArg permit_args[] = {
	{"1", 1}, {"2", 2}, {"3", 3}, {"5", 5}, {"1000", 1000}, {"0", 0},
	{"1001", 0}, {"-1", 0}, {"2147483647", 0}, {"(-2147483647 - 1)", 0},
	{"NULL", 0}, {"2147483648::int", 0}, {"'x'::int", 0}, {"'  4 '::int", 4},
	{"1.5", 0}, {"3::smallint", 3}, {"'999'::int + 1", 1000},
};

/*
 * mode => (issue 20): SQL, and what dlock takes it for: 0 exclusive, 1
 * shared, -1 neither (refused).  Every case, trailing and leading spaces,
 * control characters, look-alikes, NUL-like bytes.
 */
typedef struct ModeArg
{
	const char *sql;
	int			kind;
} ModeArg;

static const ModeArg mode_args[] = {
	{"'exclusive'", 0}, {"'shared'", 1}, {"NULL", -1}, {"''", -1},
	{"'Shared'", -1}, {"'SHARED'", -1}, {"'Exclusive'", -1}, {"'EXCLUSIVE'", -1},
	{"'sHaReD'", -1}, {"'shared '", -1}, {"' shared'", -1}, {"'exclusive '", -1},
	{"E'shared\\t'", -1}, {"E'shared\\n'", -1}, {"E'shared\\x01'", -1},
	{"E'shared\\x1f'", -1}, {"E'exclusive\\x7f'", -1}, {"'shared' || chr(0)", -1},
	{"E'shared\\x00'", -1}, {"E'shar\\u0435d'", -1}, {"E'shared\\u200B'", -1},
	{"E'\\uFEFFshared'", -1}, {"repeat('shared', 2000)", -1}, {"'shared'::char(10)", 1},
	{"'shared'::name", 1}, {"lower('SHARED')", 1}, {"'exclusive'::varchar(5)", -1},
	{"convert_from('\\x736861726564ff'::bytea, 'UTF8')", -1}, {"'shared'", 1},
	{"'exclusive'", 0}, {"'share'", -1}, {"'s'", -1}, {"'read'", -1},
};

/* permits => for a grant: mostly a few, else any of permit_args. */
static const PermitArg *
pick_permits(void)
{
	return chance(60) ? &permit_args[rnd(4)] : &PICK(permit_args);
}

/* mode => for a grant (NULL: none): mostly a valid one, else any. */
static const ModeArg *
pick_mode(void)
{
	if (chance(40))
		return NULL;
	return chance(60) ? &mode_args[rnd(2)] : &PICK(mode_args);
}

/* An election's value (campaign, proclaim, observe's seen_value). */
static const char *const elect_values[] = {
	"'v'", "'node-a:5432'", "''", "NULL", "repeat('v', 1023)", "repeat('v', 1024)",
	"repeat('v', 1025)", "repeat(E'\\u00e9', 512)", "repeat(E'\\u00e9', 512) || 'x'",
	"repeat(E'\\u20ac', 341) || 'a'", "repeat(E'\\u20ac', 342)",
	"repeat(E'\\U0001F600', 256)", "repeat(E'\\U0001F600', 255) || 'abcd'",
	"repeat(E'\\U0001F600', 256) || 'a'", "repeat('x', 10485760)", "E'\\x1f'",
	"E'a\\x1fb'", "E'\\x01\\x02\\x7f'", "E'\\u202Eevil\\u202C'", "E'\\uFEFF'",
	"E'\\U0010FFFF'", "E'line\\nbreak\\r\\t'", "'\"q\"\\\\'",
	"convert_from('\\xc3'::bytea, 'UTF8')", "chr(0)", "'{\"json\": 1}'", "'%s%n'",
	"1::text", "E'e\\u0301'", "'v'",
};

/* observe()'s after_fence, besides the tokens of the key itself. */
static const char *const after_fences[] = {
	"0", "0", "-1", "NULL", "1", "9223372036854775807", "(-9223372036854775807 - 1)",
	"9223372036854775806", "'x'::bigint", "2::smallint",
};

/*
 * observe()'s waits: short, so that a run stays fast (an observe that
 * nothing wakes sleeps them out); NULL and decades are the unlimited ones,
 * ended by statement_timeout.
 */
static const char *const observe_waits[] = {
	"'0'", "'1 ms'", "'5 ms'", "'-1 us'", "'-0'", "'1 mon -30 days'", "'infinity'",
	"'00:00:00.002'", "make_interval(secs => 0.003)", "'-1000000 years'", "'1 us'",
};

/* A key: a pool key, a guard key or a hostile one. */
static const char *
any_key(void)
{
	int			r = rnd(100);

	if (r < 55)
		return pool_keys[rnd(NPOOL)];
	if (r < 65)
		return guard_keys[rnd(NGUARD)];
	return PICK(hostile_keys);
}

/* A ttl: mostly short ones that let keys change hands. */
static const char *
any_ttl(void)
{
	static const char *const usual[] = {"'20 ms'", "'100 ms'", "'1 s'", "'5 s'"};

	return chance(50) ? PICK(usual) : PICK(ttls);
}

/* Index of the pool key k (a pointer from pool_keys), or -1. */
static int
pool_index(const char *k)
{
	int			i;

	for (i = 0; i < NPOOL; i++)
		if (k == pool_keys[i])
			return i;
	return -1;
}

/* Index of the guard key k, or -1. */
static int
guard_index(const char *k)
{
	int			i;

	for (i = 0; i < NGUARD; i++)
		if (k == guard_keys[i])
			return i;
	return -1;
}

/*
 * Note that a grant of key asks for permits pa and mode ma (either NULL:
 * not passed), for the invariants: the largest permits => N asked of each
 * key, and whether a shared lease may have been.
 */
static void
note_ask(const char *key, const PermitArg *pa, const ModeArg *ma)
{
	KindKey    *kk = kind_of(key);

	if (kk == NULL)
		return;
	if (ma && ma->kind == 1)
		kk->shared = true;
	if (pa && pa->n > kk->max_permits)
		kk->max_permits = pa->n;
}

/*
 * Now and then (0.7) append permits => and mode => to the named arguments
 * of a grant of key in b, and note what they ask.
 */
static void
add_kind_args(PQExpBuffer b, const char *key)
{
	const PermitArg *pa = NULL;
	const ModeArg *ma = NULL;

	if (!has_kinds || !chance(15))
		return;
	if (chance(70))
	{
		pa = pick_permits();
		appendPQExpBuffer(b, ", permits => %s", pa->sql);
	}
	if ((ma = pick_mode()) != NULL)
		appendPQExpBuffer(b, ", mode => %s", ma->sql);
	note_ask(key, pa, ma);
}

/*
 * A grant of a pool key by who, in a plain form whose result we keep, so
 * that later calls have a real owner and token.
 */
static void
grant_pool(Who who, int i, const char *ttl)
{
	Call	   *c = new_call("grant", who, EXP_ANY);

	c->api = true;
	add(c, "SELECT fence, owner FROM dlock.try_acquire(%s, %s, holder => 'fuzz')",
		pool_keys[i], ttl);
	make_call(c);
	if (!c->sqlstate && c->ntuples == 1 && c->value && c->value2)
	{
		free(held[i].owner);
		held[i].owner = psprintf("'%s'", c->value2);
		held[i].fence = atoll(c->value);
	}
	free_call(c);
}

/* ---- the generators ------------------------------------------------------ */

/*
 * A call of dlock's lease API with random arguments, by the ordinary role
 * (sometimes by the superuser), in a random wrapping.
 */
static void
gen_api(void)
{
	Who			who = chance(15) ? AS_SU : AS_USR;
	Call	   *c;
	const char *key = any_key();
	int			g = guard_index(key);
	int			p = pool_index(key);
	int			f = rnd(13);
	char	   *body = NULL;
	Expect		expect = EXP_ANY;
	const char *expval = NULL;

	switch (f)
	{
		case 0:
		case 1:
			/* try_acquire */
			{
				PQExpBufferData b;

				initPQExpBuffer(&b);
				appendPQExpBuffer(&b, "SELECT count(*) FROM dlock.try_acquire(%s, %s", key, any_ttl());
				if (chance(30))
					appendPQExpBuffer(&b, ", holder => %s", PICK(holders));
				if (chance(20))
					appendPQExpBuffer(&b, ", lock_delay => %s", PICK(delays));
				if (chance(20))
					appendPQExpBuffer(&b, ", session_bound => %s", PICK(bools));
				add_kind_args(&b, key);
				appendPQExpBufferStr(&b, ")");
				body = b.data;
				if (g >= 0)
				{
					expect = EXP_VALUE;
					expval = "0";
				}
				break;
			}
		case 2:
			/* acquire with a short wait */
			{
				PQExpBufferData b;
				const char *w = PICK(waits);

				initPQExpBuffer(&b);
				appendPQExpBuffer(&b, "SELECT fence FROM dlock.acquire(%s, %s, wait => %s", key, any_ttl(), w);
				if (chance(30))
					appendPQExpBuffer(&b, ", holder => %s", PICK(holders));
				if (chance(20))
					appendPQExpBuffer(&b, ", lock_delay => %s", PICK(delays));
				if (chance(20))
					appendPQExpBuffer(&b, ", session_bound => %s", PICK(bools));
				add_kind_args(&b, key);
				appendPQExpBufferStr(&b, ")");
				body = b.data;
				if (g >= 0)
					expect = EXP_REFUSE;
				break;
			}
		case 3:
			/* acquire without a limit of its own: statement_timeout ends it */
			{
				c = new_call("api", who, g >= 0 ? EXP_REFUSE : EXP_ANY);
				c->api = true;
				add(c, "BEGIN");
				add(c, "SET LOCAL statement_timeout = '%dms'", 5 + (int) rnd(20));
				add(c, "SELECT fence FROM dlock.acquire(%s, %s, wait => %s)", key,
					any_ttl(), chance(50) ? "NULL" : "'1000000 years'");
				add(c, "COMMIT");
				call(c);
				return;
			}
		case 4:
			/* renew */
			{
				const char *o = (p >= 0 && held[p].owner && chance(60)) ?
				held[p].owner : PICK(owners);

				body = psprintf("SELECT dlock.renew(%s, %s, %s)", key, o, any_ttl());
				if (g >= 0)
				{
					expect = EXP_VALUE;
					expval = NULL;
				}
				break;
			}
		case 5:
			/* release */
			{
				const char *o = (p >= 0 && held[p].owner && chance(60)) ?
				held[p].owner : PICK(owners);

				body = psprintf("SELECT dlock.release(%s, %s)", key, o);
				if (g >= 0)
				{
					expect = EXP_VALUE;
					expval = "f";
				}
				break;
			}
		case 6:
		case 7:
			/* use_fence / check_fence */
			{
				char	   *fe;
				long long	fv = 0;
				bool		known = false;

				if (p >= 0 && held[p].fence && chance(50))
				{
					fv = held[p].fence + (chance(70) ? 0 : (chance(50) ? 1 : -1));
					fe = psprintf("%lld", fv);
					known = true;
				}
				else if (g >= 0 && chance(30))
				{
					fv = guard_fence[g] + (chance(50) ? 1 : -1);
					fe = psprintf("%lld", fv);
					known = true;
				}
				else
				{
					fe = pg_strdup(PICK(fences));
					/* the small ones may be a guard's current token */
					if (strcmp(fe, "1.5::bigint") == 0)
					{
						fv = 2;
						known = true;
					}
					else if (strcmp(fe, "1") == 0 || strcmp(fe, "2") == 0)
					{
						fv = atoll(fe);
						known = true;
					}
				}
				if (f == 6)
				{
					body = psprintf("SELECT dlock.use_fence(%s, %s)", key, fe);
					if (g >= 0 && (!known || fv != guard_fence[g]) &&
						strcmp(fe, "NULL") != 0)
						expect = EXP_REFUSE;
				}
				else
				{
					body = psprintf("SELECT dlock.check_fence(%s, %s)", key, fe);
					if (g >= 0 && (!known || fv != guard_fence[g]))
					{
						expect = EXP_VALUE;
						expval = "f";
					}
				}
				free(fe);
				break;
			}
		case 8:
			/* prune */
			body = psprintf("SELECT dlock.prune(%s)", PICK(ages));
			if (who == AS_USR)
				expect = EXP_REFUSE;
			break;
		case 9:
			/* stats_reset */
			body = pg_strdup("SELECT dlock.stats_reset()");
			if (who == AS_USR)
				expect = EXP_REFUSE;
			break;
		case 10:
			/* the views and their functions */
			{
				static const char *const views[] = {
					"SELECT count(*) FROM dlock.lease_status WHERE key = %s",
					"SELECT count(*) FROM dlock.stats WHERE key = %s OR key IS NULL",
					"SELECT count(*) FROM dlock.lease_status() WHERE key = %s",
					"SELECT count(*) FROM dlock.stats() s WHERE s.key IS DISTINCT FROM %s",
					"SELECT state, remaining > '0' FROM dlock.lease_status WHERE key = %s",
					"SELECT sum(acquired) FROM dlock.stats WHERE key >= %s",
				};

				body = psprintf(PICK(views), key);
				expect = EXP_NOCHANGE;
				break;
			}
		case 11:
			/* wrong types, direct trigger call, positional calls */
			{
				static const char *const odd[] = {
					"SELECT dlock.fence_guard()",
					"SELECT * FROM dlock.try_acquire(1, 2)",
					"SELECT * FROM dlock.try_acquire(%s, '1 s', NULL, NULL, NULL)",
					"SELECT * FROM dlock.acquire(%s, '1 s', '0', NULL, NULL, NULL)",
					"SELECT (dlock.try_acquire(%s, '20 ms')).*",
					"SELECT dlock.renew(%s, NULL::uuid, NULL::interval)",
					"SELECT dlock.release(%s, 'fz:k0')",
					"SELECT dlock.use_fence(%s, 1.5)",
					"SELECT dlock.check_fence(%s, NULL::bigint)",
					"SELECT * FROM dlock.try_acquire(key => %s, ttl => '20 ms', holder => NULL, lock_delay => NULL, session_bound => true)",
				};

				body = psprintf(PICK(odd), key);
				break;
			}
		default:
			/* binary parameters: intervals and uuids no text can spell */
			{
				static const int64 times[] = {
					PG_INT64_MAX, PG_INT64_MIN, 0, 1, -1, 20000,
					INT64CONST(86400000000), INT64CONST(-86400000000)
				};
				static const int32 days[] = {0, 1, -1, PG_INT32_MAX, PG_INT32_MIN};
				static const int32 months[] = {0, 1, -1, PG_INT32_MAX, PG_INT32_MIN};
				char	   *iv = pg_malloc(16);
				int64		t = PICK(times);
				int32		d = PICK(days);
				int32		m = PICK(months);
				uint32		hi = (uint32) ((uint64) t >> 32);
				uint32		lo = (uint32) t;
				uint32		ud = (uint32) d;
				uint32		um = (uint32) m;
				int			fn = rnd(3);
				int			j;

				for (j = 0; j < 4; j++)
				{
					iv[j] = (char) (hi >> (24 - 8 * j));
					iv[4 + j] = (char) (lo >> (24 - 8 * j));
					iv[8 + j] = (char) (ud >> (24 - 8 * j));
					iv[12 + j] = (char) (um >> (24 - 8 * j));
				}
				c = new_call("api-binary", who, EXP_ANY);
				c->api = true;
				if (fn == 0)
					add(c, "SELECT count(*) FROM dlock.try_acquire(%s, $1)", key);
				else if (fn == 1)
				{
					/* a wait of days: statement_timeout ends it */
					add(c, "BEGIN");
					add(c, "SET LOCAL statement_timeout = '20ms'");
					add(c, "SELECT fence FROM dlock.acquire(%s, '20 ms', wait => $1)", key);
					add(c, "COMMIT");
				}
				else
					add(c, "SELECT dlock.prune($1)");
				c->nparams = 1;
				c->ptypes[0] = 1186;	/* interval */
				c->pvalues[0] = iv;
				c->plengths[0] = 16;
				c->pformats[0] = 1;
				if (fn == 0 && g >= 0)
				{
					c->expect = EXP_VALUE;
					c->expect_value = "0";
				}
				else if (fn == 1 && g >= 0)
					c->expect = EXP_REFUSE;
				else if (fn == 2 && who == AS_USR)
					c->expect = EXP_REFUSE;
				call(c);
				return;
			}
	}

	c = new_call("api", who, expect);
	c->api = true;
	c->expect_value = expval;
	/* wrap it */
	switch (rnd(10))
	{
		case 0:
			add(c, "BEGIN");
			add(c, "%s", body);
			add(c, "COMMIT");
			break;
		case 1:
			add(c, "BEGIN READ ONLY");
			add(c, "%s", body);
			add(c, "COMMIT");
			break;
		case 2:
			add(c, "BEGIN ISOLATION LEVEL SERIALIZABLE");
			add(c, "SELECT count(*) FROM dlock.leases WHERE key = %s", key);
			add(c, "%s", body);
			add(c, "COMMIT");
			break;
		case 3:
			/* rolled back to a savepoint: must leave no trace but tokens */
			add(c, "BEGIN");
			add(c, "SAVEPOINT s");
			add(c, "%s", body);
			add(c, "ROLLBACK TO s");
			add(c, "COMMIT");
			if (c->expect == EXP_ANY)
				c->expect = EXP_NOCHANGE;
			else if (c->expect == EXP_VALUE)
				c->expect = EXP_ANY;	/* the value is no longer the last one */
			break;
		case 4:
			add(c, "BEGIN");
			add(c, "%s", body);
			add(c, "ROLLBACK");
			if (c->expect == EXP_ANY)
				c->expect = EXP_NOCHANGE;
			else if (c->expect == EXP_VALUE)
				c->expect = EXP_ANY;
			break;
		default:
			add(c, "%s", body);
			break;
	}
	/* in a transaction that is rolled back a refused grant is no forgery */
	if (c->expect == EXP_NOCHANGE && f == 8 && who == AS_USR)
		c->expect = EXP_REFUSE;
	free(body);
	call(c);
}

/*
 * The token to present for pool key p.  *kind: 1 when it is the live
 * current token of a lease we hold, 0 when the lease rule must refuse it
 * (not the key's current token, or the lease has already ended), 2 when
 * it is the current token of a lease that is about to run out (either
 * outcome is right).  *current is the key's current token.
 */
static long long
pick_token(int p, int *kind, long long *current)
{
	bool		live;
	bool		ended;
	long long	curf = key_state(pool_keys[p], &live, &ended);
	long long	t;

	*current = curf;
	if (curf > 0 && live && held[p].fence == curf && chance(50))
	{
		*kind = 1;
		return curf;
	}
	switch (rnd(8))
	{
		case 0:
			t = 0;
			break;
		case 1:
			t = -1;
			break;
		case 2:
			t = PG_INT64_MAX;
			break;
		case 3:
			t = PG_INT64_MIN;
			break;
		case 4:
			t = curf > 0 ? curf - 1 : 1;
			break;
		case 5:
			t = curf > 0 ? curf + 1 : 2;
			break;
		case 6:
			t = held[(p + 1) % NPOOL].fence ? held[(p + 1) % NPOOL].fence : 3;
			break;
		default:
			/* the current token of an expired or released lease */
			t = (curf > 0 && ended) ? curf : (curf > 2 ? curf - 2 : 4);
			break;
	}
	if (t != curf)
		*kind = 0;
	else
		*kind = ended ? 0 : 2;
	/* since 0.7: a token of one of the key's live permits is good too */
	if (*kind == 0 && has_kinds && t > 0 && token_held(pool_keys[p], t, false))
		*kind = 2;
	return t;
}

/*
 * A write through the fencing trigger, in one of many shapes, presenting
 * either the live current token of the key or a wrong one.
 */
static void
gen_write(void)
{
	int			p = rnd(NPOOL);
	int			p2 = (p + 1 + rnd(NPOOL - 1)) % NPOOL;
	const char *k = pool_keys[p];
	const char *k2 = pool_keys[p2];
	int			kind;
	bool		legit;
	long long	t;
	long long	curf;
	Call	   *c;
	int			shape = rnd(22);

	/* most writes under a live lease need one: take it first */
	if (chance(30))
	{
		bool		live;
		bool		ended;
		long long	f = key_state(k, &live, &ended);

		if (!(live && held[p].fence == f))
			grant_pool(AS_USR, p, "'10 s'");
	}
	t = pick_token(p, &kind, &curf);
	legit = kind == 1;
	/*
	 * With '=' shadowed a WHERE may match the rows of every key: the token
	 * is then stale for all of them only if it is no key's token at all
	 * (dlock.lease_status: in memory mode dlock.leases is empty).
	 */
	if (evil_path && kind == 0)
	{
		char	   *q = psprintf("SELECT count(*) FROM dlock.lease_status WHERE fence = %lld", t);
		PGresult   *r = PQexec(dig, q);

		if (PQresultStatus(r) != PGRES_TUPLES_OK || strcmp(PQgetvalue(r, 0, 0), "0") != 0)
			kind = 2;
		PQclear(r);
		free(q);
	}
	c = new_call("write", AS_USR, kind == 0 ? EXP_STALE : EXP_ANY);
	c->uses_dlock = true;
	switch (shape)
	{
		case 0:
			add(c, "UPDATE fz.t_text SET v = v + 1, fence = %lld WHERE k = %s", t, k);
			if (legit)
			{
				/* the row's own token written back never counts */
				char	   *q = psprintf("SELECT fence FROM fz.t_text WHERE k = %s", k);
				PGresult   *r = PQexec(dig, q);

				if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
					atoll(PQgetvalue(r, 0, 0)) != t)
					c->expect = EXP_ACCEPT;
				PQclear(r);
				free(q);
			}
			break;
		case 1:
			add(c, "INSERT INTO fz.t_hist (k, v, fence) VALUES (%s, 1, %lld)", k, t);
			if (legit)
				c->expect = EXP_ACCEPT;
			break;
		case 2:
			add(c, "BEGIN");
			add(c, "SELECT dlock.use_fence(%s, %lld)", k, t);
			add(c, "UPDATE fz.t_usefence SET v = v + 1 WHERE k = %s", k);
			add(c, "COMMIT");
			if (legit)
				c->expect = EXP_ACCEPT;
			break;
		case 3:
			add(c, "BEGIN");
			add(c, "SELECT dlock.use_fence(%s, %lld)", k, t);
			add(c, "DELETE FROM fz.t_hist WHERE k = %s", k);
			add(c, "COMMIT");
			break;
		case 4:
			/* no token at all */
			add(c, "DELETE FROM fz.t_hist WHERE k = %s", k);
			c->expect = EXP_STALE;
			break;
		case 5:
			add(c, "INSERT INTO fz.t_text AS t (k, v, fence) VALUES (%s, 1, %lld) "
				"ON CONFLICT (k) DO UPDATE SET v = t.v + 1, fence = excluded.fence", k, t);
			break;
		case 6:
			add(c, "MERGE INTO fz.t_text t USING (VALUES (%s, %lld::bigint)) s(k, f) ON t.k = s.k "
				"WHEN MATCHED THEN UPDATE SET v = t.v + 1, fence = s.f "
				"WHEN NOT MATCHED THEN INSERT VALUES (s.k, 0, s.f)", k, t);
			break;
		case 7:
			/* move the row to another key: needs both leases */
			add(c, "UPDATE fz.t_hist SET k = %s, fence = %lld WHERE k = %s", k2, t, k);
			c->expect = EXP_STALE;
			break;
		case 8:
			/* move between partitions */
			add(c, "UPDATE fz.parted SET part = 3 - part, fence = %lld WHERE k = %s", t, k);
			break;
		case 9:
			/* to another partition and another key */
			add(c, "UPDATE fz.parted SET part = 3 - part, k = %s, fence = %lld WHERE k = %s", k2, t, k);
			c->expect = EXP_STALE;
			break;
		case 10:
			add(c, "UPDATE fz.inh_parent SET v = v + 1, fence = %lld WHERE k = %s", t, k);
			break;
		case 11:
			add(c, "UPDATE fz.v_auto SET v = v + 1, fence = %lld WHERE k = %s", t, k);
			break;
		case 12:
			add(c, "UPDATE fz.v_instead SET v = v + 1, fence = %lld WHERE k = %s", t, k);
			break;
		case 13:
			add(c, "COPY fz.t_hist (k, v, fence) FROM STDIN");
			{
				PGresult   *r = PQexec(dig, psprintf("SELECT %s", k));

				c->copydata = psprintf("%s\t7\t%lld\n%s\t8\t%lld\n",
									   PQgetvalue(r, 0, 0), t,
									   PQgetvalue(r, 0, 0), t);
				PQclear(r);
			}
			break;
		case 14:
			add(c, "BEGIN");
			add(c, "SELECT dlock.use_fence(%s, %lld)", k, t);
			add(c, "SAVEPOINT a");
			add(c, "UPDATE fz.t_usefence SET v = v + 1 WHERE k = %s", k);
			add(c, "ROLLBACK TO a");
			add(c, "UPDATE fz.t_usefence SET v = v + 10 WHERE k = %s", k);
			add(c, "COMMIT");
			break;
		case 15:
			add(c, "BEGIN");
			add(c, "DECLARE cur CURSOR FOR SELECT * FROM fz.t_text WHERE k = %s FOR UPDATE", k);
			add(c, "FETCH cur");
			add(c, "UPDATE fz.t_text SET v = v + 1, fence = %lld WHERE CURRENT OF cur", t);
			add(c, "COMMIT");
			break;
		case 16:
			/* the refusal is swallowed: the write must still not happen */
			add(c, "DO $d$BEGIN BEGIN UPDATE fz.t_text SET v = v + 1, fence = %lld WHERE k = %s; "
				"EXCEPTION WHEN SQLSTATE 'LF001' THEN NULL; END; END$d$", t, k);
			break;
		case 17:
			add(c, "BEGIN");
			add(c, "SELECT dlock.use_fence(%s, %lld)", k, t);
			add(c, "UPDATE fz.t_usefence SET v = v + 1 WHERE k = %s", k);
			add(c, "PREPARE TRANSACTION 'dlock_fuzz'");
			c->expect = legit ? EXP_NOCHANGE : EXP_STALE;
			break;
		case 18:
			/* monotonic: the highest token is good even once expired */
			add(c, "UPDATE fz.t_mono SET v = v + 1, fence = %lld WHERE k = %s", t, k);
			if (t == curf)
				c->expect = EXP_ANY;
			break;
		case 19:
			/* the row's own token written back, or none */
			add(c, "UPDATE fz.t_text SET v = v + 1, fence = fence WHERE k = %s", k);
			c->expect = EXP_STALE;
			break;
		case 20:
			/* every row, under one key's token */
			add(c, "BEGIN");
			add(c, "SELECT dlock.use_fence(%s, %lld)", k, t);
			add(c, "UPDATE fz.t_usefence SET v = v + 1");
			add(c, "COMMIT");
			c->expect = EXP_STALE;
			break;
		default:
			add(c, "INSERT INTO fz.v_check (k, v, fence) VALUES (%s, %d, %lld)", k,
				chance(50) ? -1 : 1, t);
			break;
	}
	/* with a shadowed '=' a WHERE may match every row: only staleness holds */
	if (evil_path && c->expect == EXP_ACCEPT)
		c->expect = EXP_ANY;
	if (c->expect == EXP_ACCEPT)
	{
		c->accept_key = pg_strdup(k);
		c->accept_token = t;
	}
	call(c);
}

/* Odd column types, one protected table each (see setup). */
typedef struct OddType
{
	const char *name;			/* table fz.odd_<name> */
	const char *type;
	const char *const vals[6];	/* hostile values (SQL), NULL ends */
	const char *good;			/* a value dlock accepts, or NULL */
	const char *rendered;		/* how dlock spells it in the key */
} OddType;

static const OddType odd_types[] = {
	{"interval", "interval", {"'1 day'", "'infinity'", "NULL"}, NULL, NULL},
	{"money", "money", {"'1.50'", "'-0'", "NULL"}, NULL, NULL},
	{"json", "json", {"'{}'", "'[1,{\"a\":null}]'", "NULL"}, NULL, NULL},
	{"jsonb", "jsonb", {"'{\"k\": 1}'", "'null'"}, NULL, NULL},
	{"bytea", "bytea", {"'\\x00ff'", "''", "NULL"}, NULL, NULL},
	{"intarr", "int[]", {"'{1,2}'", "'{}'", "NULL"}, NULL, NULL},
	{"textarr", "text[]", {"'{a,b}'", "ARRAY[NULL]::text[]"}, NULL, NULL},
	{"inet", "inet", {"'::1'", "'10.0.0.1/8'"}, NULL, NULL},
	{"point", "point", {"'(1,2)'", "'(NaN,Infinity)'"}, NULL, NULL},
	{"domtext", "fz.dom_text", {"'bad'", "''", "NULL", "repeat('d', 600)"}, "'ok'", "ok"},
	{"domint", "fz.dom_int", {"0", "-1", "2147483647"}, "7", "7"},
	{"enum", "fz.mood", {"'sad'", "'nope'", "NULL"}, "'happy'", "happy"},
	{"char5", "char(5)", {"'abcdef'", "''", "'   '", "NULL"}, "'ab'", "ab"},
	{"qchar", "\"char\"", {"''", "E'\\\\351'", "NULL"}, "'q'", "q"},
	{"name", "name", {"repeat('n', 100)", "''", "NULL"}, "'nm'", "nm"},
	{"varchar3", "varchar(3)", {"'abcd'", "''", "NULL"}, "'vc'", "vc"},
	{"float8", "float8", {"'NaN'", "'Infinity'", "'-Infinity'", "'-0'", "'1e-320'", "NULL"}, "'-0'", "-0"},
	{"float4", "float4", {"'NaN'", "'-0'", "'3.4e38'", "'1e-45'"}, "'0.1'", "0.1"},
	{"tstz", "timestamptz", {"'infinity'", "'-infinity'", "'294276-12-31 23:59:59+00'", "'4713-01-01 BC'", "NULL"}, "'2026-01-01 00:00:00+05'", "2025-12-31 19:00:00+00"},
	{"ts", "timestamp", {"'infinity'", "'-infinity'", "'epoch'"}, "'infinity'", "infinity"},
	{"date", "date", {"'infinity'", "'-infinity'", "'5874897-12-31'"}, "'-infinity'", "-infinity"},
	{"numeric", "numeric", {"'NaN'", "'1.50'", "'-0'", "'1e-1000'"}, "'NaN'", "NaN"},
	{"bool", "boolean", {"'yes'", "'off'", "NULL"}, "'t'", "true"},
	{"uuid", "uuid", {"gen_random_uuid()", "NULL"}, "'00000000-0000-0000-0000-000000000000'", "00000000-0000-0000-0000-000000000000"},
	{"oid", "oid", {"4294967295", "0"}, "'42'", "42"},
	{"int2", "smallint", {"-32768", "32767", "NULL"}, "'-32768'", "-32768"},
};

/*
 * A write to a table whose key column is of an odd type: refused types
 * must give 39P01, accepted ones a key spelled the same in every session
 * (a write under the lease of the key as README spells it must succeed,
 * whatever the session's TimeZone, DateStyle and extra_float_digits).
 */
static void
gen_odd(void)
{
	const OddType *o = &odd_types[rnd(lengthof(odd_types))];
	Call	   *c;

	if (o->good && chance(40))
	{
		/* grant the key as documented, write under it, release it */
		char	   *key = psprintf("'odd:%s'", o->rendered);
		Call	   *g = new_call("odd-grant", AS_USR, EXP_ANY);
		long long	t = 0;
		char	   *owner = NULL;

		g->api = true;
		add(g, "SELECT fence, owner FROM dlock.try_acquire(%s, '5 s')", key);
		make_call(g);
		if (!g->sqlstate && g->ntuples == 1 && g->value && g->value2)
		{
			t = atoll(g->value);
			owner = pg_strdup(g->value2);
		}
		free_call(g);
		if (t == 0)
		{
			free(key);
			return;
		}
		c = new_call("odd-write", AS_USR, evil_path ? EXP_ANY : EXP_ACCEPT);
		c->uses_dlock = true;
		add(c, "INSERT INTO fz.odd_%s (c, fence) VALUES (%s, %lld)", o->name, o->good, t);
		c->accept_key = pg_strdup(key);
		c->accept_token = t;
		call(c);
		c = new_call("odd-release", AS_USR, EXP_ANY);
		c->api = true;
		add(c, "SELECT dlock.release(%s, '%s')", key, owner);
		call(c);
		free(key);
		free(owner);
		return;
	}
	c = new_call("odd-write", AS_USR, EXP_STALE);
	c->uses_dlock = true;
	{
		int			n = 0;

		while (n < 6 && o->vals[n])
			n++;
		add(c, "INSERT INTO fz.odd_%s (c, fence) VALUES (%s, %s)", o->name,
			o->vals[rnd(n)], chance(50) ? "1" : PICK(fences));
	}
	call(c);
}

/*
 * The ordinary role puts dlock.fence_guard on a table of its own with a
 * hostile template (or the wrong kind of trigger), fires it and rolls back.
 */
static void
gen_template(void)
{
	static const char *const templates[] = {
		"'{'", "'}'", "'{{}}'", "'{a}{b}'", "'{}'", "'{a'", "'a}'", "'{ a}'",
		"'{A}'", "'{\"a\"}'", "'{nosuch}'", "'fz:k{c}'", "'{b}:{b}:{b}'",
		"'fz:g0'", "''", "@{a}200", "@x600", "@{a}20000", "@y505",
		"'{fence}'",
		"E'\\u00e9{a}\\u0301'", "'{c}{c}{c}{c}{c}'", "'{g}'", "'{ab}'",
	};
	static const char *const extra[] = {
		"", ", 'fence'", ", ''", ", 'nosuch'", ", 'a'", ", 'c'",
		", 'fence', 'monotonic'", ", 'fence', 'lease'", ", 'fence', 'bogus'",
		", 'fence', 'lease', 'x'", ", NULL", ", 'g'",
	};
	static const char *const kinds[] = {
		"BEFORE INSERT OR UPDATE OR DELETE", "BEFORE INSERT", "AFTER INSERT",
		"BEFORE INSERT OR UPDATE",
	};
	const char *tpl = PICK(templates);
	char	   *long_tpl = NULL;
	const char *ex = PICK(extra);
	int			kind = rnd(12);
	Call	   *c = new_call("template", AS_USR, EXP_STALE);

	c->uses_dlock = true;
	/* "@<piece><n>": a literal of n pieces (arguments must be literals) */
	if (tpl[0] == '@')
	{
		const char *piece = tpl[1] == '{' ? "{a}" : (tpl[1] == 'x' ? "x" : "y");
		int			n = atoi(tpl + (tpl[1] == '{' ? 4 : 2));
		PQExpBufferData b;
		int			j;

		initPQExpBuffer(&b);
		appendPQExpBufferStr(&b, tpl[1] == 'y' ? "'{a}" : "'");
		for (j = 0; j < n; j++)
			appendPQExpBufferStr(&b, piece);
		appendPQExpBufferStr(&b, "'");
		long_tpl = b.data;
		tpl = long_tpl;
	}
	add(c, "BEGIN");
	if (kind == 0)
		add(c, "CREATE TRIGGER zz_guard BEFORE INSERT ON public.tpl FOR EACH STATEMENT "
			"EXECUTE FUNCTION dlock.fence_guard(%s%s)", tpl, ex);
	else if (kind == 1)
		add(c, "CREATE TRIGGER zz_guard BEFORE TRUNCATE ON public.tpl "
			"EXECUTE FUNCTION dlock.fence_guard(%s%s)", tpl, ex);
	else
		add(c, "CREATE TRIGGER zz_guard %s ON public.tpl FOR EACH ROW "
			"EXECUTE FUNCTION dlock.fence_guard(%s%s)", PICK(kinds), tpl, ex);
	if (kind == 1)
		add(c, "TRUNCATE public.tpl");
	else
		add(c, "INSERT INTO public.tpl (a, b, c, g, fence) VALUES (%s, %s, %d, %s, %s)",
			chance(80) ? "'x'" : PICK(hostile_keys), chance(80) ? "'y'" : "NULL",
			(int) rnd(3), chance(50) ? "'{}'" : "NULL", PICK(fences));
	add(c, "ROLLBACK");
	/* the INSERT was rolled back anyway; what matters is no XX000/crash */
	c->expect = EXP_NOCHANGE;
	call(c);
	free(long_tpl);
}

/* Parallel-mode wrappers (created in setup) around every function. */
static void
gen_parallel(void)
{
	static const char *const fns[] = {
		"public.par_try(%s)", "public.par_use(%s, 1)", "public.par_check(%s, 1)",
		"public.par_renew(%s)", "public.par_release(%s)", "public.par_status(%s)",
		"public.par_stats(%s)", "public.par_acquire(%s)",
	};
	Call	   *c = new_call("parallel", AS_USR, EXP_ANY);

	c->api = true;
	add(c, "BEGIN");
	add(c, "SET LOCAL force_parallel_mode = %s", chance(70) ? "on" : "regress");
	add(c, "SET LOCAL parallel_setup_cost = 0");
	add(c, "SET LOCAL parallel_tuple_cost = 0");
	add(c, "SET LOCAL min_parallel_table_scan_size = 0");
	{
		char	   *f = psprintf(PICK(fns), any_key());

		/* over a parallel scan, so that even the leader is in parallel mode */
		if (chance(50))
			add(c, "SELECT %s", f);
		else
			add(c, "SELECT %s, n FROM (SELECT count(*) AS n FROM fz.t_hist) s", f);
		free(f);
	}
	add(c, "COMMIT");
	call(c);
}

/* Session settings that must not change any key or any outcome. */
static void
gen_session(void)
{
	static const char *const sets[] = {
		"SET TimeZone = 'Asia/Kathmandu'", "SET TimeZone = 'UTC'",
		"SET TimeZone = '-12:34'", "SET TimeZone = 'America/St_Johns'",
		"SET DateStyle = 'SQL, DMY'", "SET DateStyle = 'German'",
		"SET DateStyle = 'Postgres, MDY'", "SET DateStyle = 'ISO'",
		"SET IntervalStyle = 'sql_standard'", "SET IntervalStyle = 'iso_8601'",
		"SET IntervalStyle = 'postgres_verbose'", "SET IntervalStyle = 'postgres'",
		"SET extra_float_digits = -15", "SET extra_float_digits = 3",
		"SET synchronous_commit = off", "SET synchronous_commit = on",
		"SET default_transaction_isolation = 'serializable'",
		"SET default_transaction_isolation = 'read committed'",
		"SET lc_monetary = 'C'", "SET bytea_output = 'escape'",
		"SET search_path = evil, pg_catalog, public",
		"SET search_path = evil, dlock, pg_catalog, public",
		"SET search_path = pg_temp, evil, pg_catalog, public",
		"SET search_path = \"$user\", public",
		"SET search_path = DEFAULT",
	};
	const char *s = PICK(sets);
	Call	   *c = new_call("session", AS_USR, EXP_NOCHANGE);

	add(c, "%s", s);
	if (strncmp(s, "SET search_path", 15) == 0)
		evil_path = strstr(s, "evil") != NULL;
	call(c);
}

/*
 * Attacks of the ordinary role.  Each must be refused and change nothing
 * (EXP_REFUSE) or, where PostgreSQL answers with a warning instead of an
 * error, change nothing (EXP_NOCHANGE).  %G is a guard key.
 */
typedef struct Attack
{
	Expect		expect;
	const char *sql;			/* statements separated by "; " run in one
								 * transaction */
	const char *value;			/* EXP_VALUE: the value of the last one */
	bool		kinds;			/* needs dlock 0.7 (issue 20) */
} Attack;

static const Attack attacks[] = {
	/* write the storage */
	{EXP_REFUSE, "INSERT INTO dlock.leases (key, fence, owner, expires_at, granted_at) VALUES ('fz:forged', 9223372036854775807, gen_random_uuid(), 'infinity', now())"},
	{EXP_REFUSE, "INSERT INTO dlock.leases VALUES ('fz:k0', 1, NULL, now(), NULL, now()) ON CONFLICT (key) DO UPDATE SET owner = gen_random_uuid()"},
	{EXP_REFUSE, "UPDATE dlock.leases SET owner = '00000000-0000-0000-0000-000000000000' WHERE key = %G"},
	{EXP_REFUSE, "UPDATE dlock.leases SET fence = fence + 1000000"},
	{EXP_REFUSE, "UPDATE dlock.leases SET expires_at = now() - interval '1 day' WHERE key = %G"},
	{EXP_REFUSE, "DELETE FROM dlock.leases WHERE key = %G"},
	{EXP_REFUSE, "DELETE FROM dlock.leases"},
	{EXP_REFUSE, "TRUNCATE dlock.leases"},
	{EXP_REFUSE, "TRUNCATE dlock.leases CASCADE"},
	{EXP_REFUSE, "MERGE INTO dlock.leases l USING (VALUES (%G)) s(k) ON l.key = s.k WHEN MATCHED THEN DELETE"},
	{EXP_REFUSE, "COPY dlock.leases (key, fence, expires_at, granted_at) FROM STDIN"},
	{EXP_REFUSE, "WITH d AS (DELETE FROM dlock.leases RETURNING *) SELECT count(*) FROM d"},
	/* read the capabilities */
	{EXP_REFUSE, "SELECT owner FROM dlock.leases WHERE key = %G"},
	{EXP_REFUSE, "SELECT * FROM dlock.leases"},
	{EXP_REFUSE, "SELECT l FROM dlock.leases l"},
	{EXP_REFUSE, "SELECT session_id FROM dlock.leases"},
	{EXP_REFUSE, "COPY dlock.leases TO STDOUT"},
	{EXP_REFUSE, "SELECT key FROM dlock.leases WHERE owner IS NOT NULL"},
	{EXP_REFUSE, "SELECT key FROM dlock.leases FOR UPDATE"},
	{EXP_REFUSE, "SELECT key FROM dlock.leases FOR KEY SHARE"},
	{EXP_REFUSE, "LOCK TABLE dlock.leases IN ACCESS EXCLUSIVE MODE; SELECT 1"},
	{EXP_REFUSE, "LOCK TABLE dlock.fence_seq IN ACCESS EXCLUSIVE MODE; SELECT 1"},
	{EXP_REFUSE, "SELECT * FROM public.owner_view"},
	/* the token counter */
	{EXP_REFUSE, "SELECT pg_catalog.setval('dlock.fence_seq', 1)"},
	{EXP_REFUSE, "SELECT pg_catalog.setval('dlock.fence_seq'::regclass, 1, false)"},
	{EXP_REFUSE, "SELECT pg_catalog.setval('dlock.fence_seq', 9223372036854775807)"},
	{EXP_REFUSE, "SELECT pg_catalog.nextval('dlock.fence_seq')"},
	{EXP_REFUSE, "SELECT pg_catalog.nextval('dlock.fence_seq') / 0"},
	{EXP_REFUSE, "SELECT pg_catalog.currval('dlock.fence_seq')"},
	{EXP_REFUSE, "SELECT * FROM dlock.fence_seq"},
	{EXP_REFUSE, "ALTER SEQUENCE dlock.fence_seq RESTART"},
	{EXP_REFUSE, "ALTER SEQUENCE dlock.fence_seq RESTART WITH 1"},
	{EXP_REFUSE, "ALTER SEQUENCE dlock.fence_seq INCREMENT BY -1"},
	{EXP_REFUSE, "ALTER SEQUENCE dlock.fence_seq MAXVALUE 5 CYCLE"},
	{EXP_REFUSE, "ALTER SEQUENCE dlock.fence_seq OWNED BY NONE"},
	{EXP_REFUSE, "ALTER SEQUENCE dlock.fence_seq RENAME TO fence_seq_old"},
	{EXP_REFUSE, "DROP SEQUENCE dlock.fence_seq"},
	/* administrator functions */
	{EXP_REFUSE, "SELECT dlock.prune('0')"},
	{EXP_REFUSE, "SELECT dlock.prune()"},
	{EXP_REFUSE, "SELECT dlock.prune(NULL)"},
	{EXP_REFUSE, "SELECT dlock.stats_reset()"},
	{EXP_REFUSE, "SELECT pg_catalog.pg_extension_config_dump('dlock.leases', 'WHERE false')"},
	/* settings */
	{EXP_REFUSE, "SET dlock.fence_bypass = on"},
	{EXP_REFUSE, "SET dlock.max_hold = 0"},
	{EXP_REFUSE, "SET dlock.max_hold = '1s'"},
	{EXP_REFUSE, "SET dlock.log_events = off"},
	{EXP_REFUSE, "SET dlock.max_ttl = '24d'"},
	{EXP_REFUSE, "SET \"Dlock\".\"Fence_Bypass\" = on"},
	{EXP_REFUSE, "SELECT set_config('dlock.fence_bypass', 'on', false)"},
	{EXP_REFUSE, "SELECT set_config('dlock.fence_bypass', 'on', true)"},
	{EXP_REFUSE, "SET dlock.stats_max = 1"},
	/* before dlock is loaded the SETs above are taken as placeholders: */
	{EXP_VALUE, "SET dlock.fence_bypass = on; SELECT dlock.check_fence('fz:k0', 0); SELECT pg_catalog.current_setting('dlock.fence_bypass')", "off"},
	{EXP_VALUE, "SET dlock.max_hold = '1ms'; SELECT dlock.check_fence('fz:k0', 0); SELECT pg_catalog.current_setting('dlock.max_hold')", "0"},
	{EXP_VALUE, "SET dlock.max_ttl = '24d'; SELECT dlock.check_fence('fz:k0', 0); SELECT pg_catalog.current_setting('dlock.max_ttl')", "1d"},
	{EXP_REFUSE, "SET dlock.max_ttl = '24d'; SELECT count(*) FROM dlock.try_acquire('fz:ttl', '2 days')"},
	{EXP_VALUE, "SET dlock.log_events = on; SELECT dlock.check_fence('fz:k0', 0); SELECT pg_catalog.current_setting('dlock.log_events')", "off"},
	{EXP_REFUSE, "ALTER SYSTEM SET dlock.fence_bypass = on"},
	{EXP_REFUSE, "ALTER ROLE CURRENT_USER SET dlock.fence_bypass = on"},
	{EXP_REFUSE, "ALTER ROLE CURRENT_USER SET dlock.max_hold = 0"},
	{EXP_REFUSE, "ALTER DATABASE %D SET dlock.fence_bypass = on"},
	{EXP_REFUSE, "GRANT SET ON PARAMETER dlock.fence_bypass TO CURRENT_USER"},
	{EXP_REFUSE, "SET session_replication_role = replica"},
	{EXP_REFUSE, "SET ROLE %S"},
	{EXP_REFUSE, "SET SESSION AUTHORIZATION %S"},
	{EXP_REFUSE, "SELECT pg_reload_conf()"},
	/* the bypass, set and then used at once */
	{EXP_REFUSE, "SET LOCAL dlock.fence_bypass = on; UPDATE fz.t_text SET v = v + 1 WHERE k = %G"},
	{EXP_REFUSE, "SET dlock.fence_bypass = on; UPDATE fz.t_text SET v = v + 1 WHERE k = %G"},
	{EXP_REFUSE, "WITH u AS (UPDATE fz.t_text SET v = v + 1 WHERE k = %G RETURNING 1) SELECT set_config('dlock.fence_bypass', 'on', true), count(*) FROM u"},
	{EXP_REFUSE, "SET session_replication_role = replica; UPDATE fz.t_text SET v = v + 1 WHERE k = %G"},
	/* create objects in schema dlock */
	{EXP_REFUSE, "CREATE TABLE dlock.leases2 (key text)"},
	{EXP_REFUSE, "CREATE FUNCTION dlock.try_acquire(key text, ttl interval, holder text DEFAULT NULL, lock_delay interval DEFAULT NULL, session_bound boolean DEFAULT false, x int DEFAULT 0) RETURNS SETOF dlock.lease LANGUAGE sql AS 'SELECT NULL::dlock.lease'"},
	{EXP_REFUSE, "CREATE FUNCTION dlock.nextval(regclass) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint'"},
	{EXP_REFUSE, "CREATE OPERATOR dlock.= (leftarg = uuid, rightarg = uuid, function = evil.always)"},
	{EXP_REFUSE, "CREATE VIEW dlock.v AS SELECT 1"},
	{EXP_REFUSE, "CREATE SEQUENCE dlock.s"},
	{EXP_REFUSE, "CREATE TYPE dlock.t AS (a int)"},
	{EXP_REFUSE, "CREATE INDEX ON dlock.leases (owner)"},
	{EXP_REFUSE, "CREATE TRIGGER x BEFORE INSERT OR UPDATE ON dlock.leases FOR EACH ROW EXECUTE FUNCTION evil.trg()"},
	{EXP_REFUSE, "CREATE RULE r AS ON UPDATE TO dlock.leases DO INSTEAD NOTHING"},
	{EXP_REFUSE, "CREATE POLICY p ON dlock.leases USING (true)"},
	{EXP_REFUSE, "CREATE STATISTICS dlock.st ON key, fence FROM dlock.leases"},
	{EXP_REFUSE, "CREATE PUBLICATION fuzz_pub FOR TABLE dlock.leases"},
	/* alter and drop dlock's objects */
	{EXP_REFUSE, "ALTER TABLE dlock.leases OWNER TO CURRENT_USER"},
	{EXP_REFUSE, "ALTER TABLE dlock.leases ADD COLUMN x int"},
	{EXP_REFUSE, "ALTER TABLE dlock.leases DISABLE TRIGGER ALL"},
	{EXP_REFUSE, "ALTER TABLE dlock.leases ENABLE ROW LEVEL SECURITY"},
	{EXP_REFUSE, "ALTER TABLE dlock.leases RENAME TO leases_old"},
	{EXP_REFUSE, "ALTER TABLE dlock.leases SET SCHEMA public"},
	{EXP_REFUSE, "ALTER TABLE dlock.leases ALTER COLUMN fence TYPE numeric"},
	{EXP_REFUSE, "ALTER TABLE dlock.leases SET UNLOGGED"},
	{EXP_REFUSE, "ALTER TABLE dlock.leases DROP CONSTRAINT leases_pkey"},
	{EXP_REFUSE, "ALTER INDEX dlock.leases_pkey RENAME TO x"},
	{EXP_REFUSE, "DROP TABLE dlock.leases"},
	{EXP_REFUSE, "DROP TABLE dlock.leases CASCADE"},
	{EXP_REFUSE, "DROP VIEW dlock.lease_status"},
	{EXP_REFUSE, "DROP TYPE dlock.lease CASCADE"},
	{EXP_REFUSE, "DROP FUNCTION dlock.release(text, uuid)"},
	{EXP_REFUSE, "DROP SCHEMA dlock CASCADE"},
	{EXP_REFUSE, "DROP EXTENSION dlock"},
	{EXP_REFUSE, "DROP EXTENSION dlock CASCADE"},
	{EXP_REFUSE, "DROP OWNED BY %S"},
	{EXP_REFUSE, "REASSIGN OWNED BY %S TO CURRENT_USER"},
	{EXP_REFUSE, "ALTER EXTENSION dlock UPDATE"},
	{EXP_REFUSE, "ALTER EXTENSION dlock UPDATE TO '0.2'"},
	{EXP_REFUSE, "ALTER EXTENSION dlock DROP TABLE dlock.leases"},
	{EXP_REFUSE, "ALTER EXTENSION dlock ADD FUNCTION evil.always(uuid, uuid)"},
	{EXP_REFUSE, "ALTER EXTENSION dlock SET SCHEMA public"},
	{EXP_REFUSE, "CREATE EXTENSION dlock SCHEMA public"},
	{EXP_NOCHANGE, "CREATE EXTENSION IF NOT EXISTS dlock VERSION '0.1'"},
	{EXP_REFUSE, "ALTER SCHEMA dlock RENAME TO dlock_old"},
	{EXP_REFUSE, "ALTER SCHEMA dlock OWNER TO CURRENT_USER"},
	{EXP_REFUSE, "CREATE SCHEMA dlock"},
	{EXP_REFUSE, "ALTER FUNCTION dlock.release(text, uuid) SECURITY DEFINER"},
	{EXP_REFUSE, "ALTER FUNCTION dlock.release(text, uuid) OWNER TO CURRENT_USER"},
	{EXP_REFUSE, "ALTER FUNCTION dlock.release(text, uuid) RENAME TO release_old"},
	{EXP_REFUSE, "ALTER FUNCTION dlock.try_acquire(text, interval, text, interval, boolean) SET search_path = evil"},
	{EXP_REFUSE, "ALTER FUNCTION dlock.fence_guard() SET dlock.fence_bypass = on"},
	{EXP_REFUSE, "ALTER FUNCTION dlock.use_fence(text, bigint) SET SCHEMA public"},
	{EXP_REFUSE, "CREATE OR REPLACE FUNCTION dlock.check_fence(key text, fence bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true'"},
	{EXP_REFUSE, "CREATE OR REPLACE VIEW dlock.lease_status AS SELECT * FROM dlock.lease_status()"},
	{EXP_REFUSE, "ALTER VIEW dlock.lease_status OWNER TO CURRENT_USER"},
	{EXP_REFUSE, "ALTER TYPE dlock.lease ADD ATTRIBUTE x int"},
	{EXP_REFUSE, "COMMENT ON TABLE dlock.leases IS 'mine'"},
	{EXP_REFUSE, "SECURITY LABEL ON TABLE dlock.leases IS 'x'"},
	{EXP_REFUSE, "REINDEX TABLE dlock.leases"},
	{EXP_REFUSE, "CLUSTER dlock.leases USING leases_pkey"},
	{EXP_NOCHANGE, "VACUUM FULL dlock.leases"},
	{EXP_NOCHANGE, "ANALYZE dlock.leases"},
	{EXP_NOCHANGE, "GRANT ALL ON dlock.leases TO CURRENT_USER"},
	{EXP_NOCHANGE, "GRANT SELECT (owner) ON dlock.leases TO PUBLIC"},
	{EXP_NOCHANGE, "GRANT USAGE, CREATE ON SCHEMA dlock TO PUBLIC"},
	{EXP_NOCHANGE, "GRANT ALL ON SEQUENCE dlock.fence_seq TO PUBLIC"},
	{EXP_NOCHANGE, "GRANT EXECUTE ON FUNCTION dlock.prune(interval) TO PUBLIC"},
	{EXP_NOCHANGE, "REVOKE ALL ON FUNCTION dlock.try_acquire(text, interval, text, interval, boolean) FROM PUBLIC"},
	{EXP_NOCHANGE, "REVOKE USAGE ON SCHEMA dlock FROM PUBLIC"},
	{EXP_REFUSE, "ALTER DEFAULT PRIVILEGES FOR ROLE %S IN SCHEMA dlock GRANT ALL ON TABLES TO PUBLIC"},
	/* the C functions themselves, bound to a function of ours */
	{EXP_REFUSE, "CREATE FUNCTION public.my_guard() RETURNS trigger AS '$libdir/dlock', 'dlock_fence_guard' LANGUAGE C"},
	{EXP_REFUSE, "CREATE FUNCTION public.my_grant(text, interval) RETURNS SETOF record AS '$libdir/dlock', 'dlock_try_acquire' LANGUAGE C"},
	{EXP_REFUSE, "CREATE FUNCTION public.my_nextval(regclass) RETURNS bigint AS 'nextval_oid' LANGUAGE internal"},
	{EXP_REFUSE, "LOAD '$libdir/dlock'"},
	/* the protected tables: triggers, ownership, TRUNCATE */
	{EXP_REFUSE, "ALTER TABLE fz.t_text DISABLE TRIGGER guard"},
	{EXP_REFUSE, "ALTER TABLE fz.t_text DISABLE TRIGGER ALL"},
	{EXP_REFUSE, "DROP TRIGGER guard ON fz.t_text"},
	{EXP_REFUSE, "CREATE TRIGGER zzz BEFORE UPDATE ON fz.t_text FOR EACH ROW EXECUTE FUNCTION evil.trg()"},
	{EXP_REFUSE, "CREATE TRIGGER aaa BEFORE UPDATE ON fz.t_text FOR EACH ROW EXECUTE FUNCTION evil.trg()"},
	{EXP_REFUSE, "CREATE RULE r AS ON UPDATE TO fz.t_text DO INSTEAD NOTHING"},
	{EXP_REFUSE, "TRUNCATE fz.t_text"},
	{EXP_REFUSE, "TRUNCATE fz.parted"},
	{EXP_REFUSE, "ALTER TABLE fz.t_text OWNER TO CURRENT_USER"},
	{EXP_REFUSE, "CREATE TABLE public.p3 PARTITION OF fz.parted FOR VALUES IN (3)"},
	{EXP_REFUSE, "ALTER TABLE fz.parted DETACH PARTITION fz.parted_1"},
	{EXP_REFUSE, "CREATE TABLE public.kid () INHERITS (fz.inh_parent)"},
	{EXP_REFUSE, "ALTER TABLE fz.inh_child NO INHERIT fz.inh_parent"},
	/* other sessions */
	{EXP_REFUSE, "SELECT pg_terminate_backend(%P)"},
	{EXP_REFUSE, "SELECT pg_cancel_backend(%P)"},
	/* more privileges */
	{EXP_REFUSE, "CREATE ROLE fuzz_evil SUPERUSER"},
	{EXP_REFUSE, "CREATE DATABASE fuzz_evil"},
	{EXP_REFUSE, "CREATE EVENT TRIGGER fuzz_evt ON ddl_command_start EXECUTE FUNCTION evil.evt()"},
	{EXP_REFUSE, "COPY public.tpl FROM PROGRAM 'true'"},
	{EXP_REFUSE, "SELECT pg_read_file('postgresql.conf')"},
	{EXP_REFUSE, "SELECT lo_import('/etc/passwd')"},
	{EXP_REFUSE, "GRANT pg_signal_backend TO CURRENT_USER"},
	{EXP_REFUSE, "ALTER ROLE CURRENT_USER SUPERUSER"},
	{EXP_REFUSE, "ALTER ROLE CURRENT_USER BYPASSRLS"},
	/* guard keys through the API, under every search_path */
	{EXP_VALUE, "SELECT count(*) FROM dlock.try_acquire(%G, '1 hour')"},
	{EXP_VALUE, "SELECT dlock.release(%G, gen_random_uuid())"},
	{EXP_VALUE, "SELECT dlock.release(%G, '00000000-0000-0000-0000-000000000000')"},
	{EXP_VALUE, "SELECT dlock.renew(%G, gen_random_uuid(), '1 hour')"},
	{EXP_VALUE, "SELECT dlock.check_fence(%G, 0)"},
	{EXP_REFUSE, "SELECT dlock.use_fence(%G, 0)"},
	{EXP_REFUSE, "SELECT dlock.use_fence(%G, 9223372036854775807)"},
	{EXP_REFUSE, "SELECT fence FROM dlock.acquire(%G, '1 s', wait => '1 ms')"},
	{EXP_STALE, "UPDATE fz.t_text SET v = v + 1, fence = 0 WHERE k = %G"},
	{EXP_STALE, "UPDATE fz.t_text SET v = v + 1, fence = 9223372036854775807 WHERE k = %G"},
	{EXP_STALE, "DELETE FROM fz.t_text WHERE k = %G"},
	{EXP_STALE, "UPDATE fz.t_mono SET v = v + 1, fence = 9223372036854775807 WHERE k = %G"},
	{EXP_STALE, "INSERT INTO public.mine (k, fence) VALUES (%G, 0)"},
	{EXP_STALE, "INSERT INTO public.mine (k, fence) VALUES (%G, %N)"},
	{EXP_STALE, "INSERT INTO public.mine (k, fence) VALUES (%G, 9223372036854775807)"},
	{EXP_STALE, "UPDATE fz.t_text SET v = v + 1, fence = (SELECT max(fence) + 1 FROM dlock.leases) WHERE k = %G"},
	/* temp shadows of dlock's storage */
	{EXP_VALUE, "SELECT dlock.check_fence(%G, 1) AND false"},
	/* issue 20: dlock.notify, values and slots, permits, elections */
	{EXP_REFUSE, "SET dlock.notify = on", NULL, true},
	{EXP_REFUSE, "SELECT set_config('dlock.notify', 'on', false)", NULL, true},
	{EXP_REFUSE, "ALTER ROLE CURRENT_USER SET dlock.notify = on", NULL, true},
	{EXP_REFUSE, "ALTER DATABASE %D SET dlock.notify = on", NULL, true},
	{EXP_VALUE, "SET dlock.notify = on; SELECT dlock.check_fence('fz:k0', 0); SELECT pg_catalog.current_setting('dlock.notify')", "off", true},
	{EXP_REFUSE, "UPDATE dlock.leases SET value = 'forged' WHERE key = %G", NULL, true},
	{EXP_REFUSE, "UPDATE dlock.leases SET slots = 1000 WHERE key = %G", NULL, true},
	{EXP_REFUSE, "INSERT INTO dlock.leases (key, fence, owner, expires_at, granted_at) VALUES (%G || E'\\x1f1', 9223372036854775807, gen_random_uuid(), 'infinity', now())", NULL, true},
	{EXP_REFUSE, "SELECT dlock.proclaim(key, owner, 'forged') FROM dlock.leases WHERE key = %G", NULL, true},
	{EXP_REFUSE, "SELECT dlock.forget(%G)", NULL, true},
	{EXP_VALUE, "SELECT dlock.proclaim(%G, gen_random_uuid(), 'forged')", NULL, true},
	{EXP_VALUE, "SELECT dlock.proclaim(%G, '00000000-0000-0000-0000-000000000000', 'forged')", NULL, true},
	{EXP_VALUE, "SELECT count(*) FROM dlock.try_acquire(%G, '1 hour', mode => 'shared')", NULL, true},
	{EXP_VALUE, "SELECT count(*) FROM dlock.try_acquire(%G, '1 hour', permits => 1000)", NULL, true},
	{EXP_VALUE, "SELECT count(*) FROM dlock.try_acquire(%G, '1 hour', permits => 2, mode => 'exclusive')", NULL, true},
	{EXP_REFUSE, "SELECT fence FROM dlock.campaign(%G, 'usurper', '1 s', wait => '1 ms')", NULL, true},
	{EXP_REFUSE, "SELECT fence FROM dlock.acquire(%G, '1 s', wait => '1 ms', mode => 'shared')", NULL, true},
	{EXP_REFUSE, "SELECT fence FROM dlock.acquire(%G, '1 s', wait => '1 ms', permits => 1000)", NULL, true},
	{EXP_REFUSE, "SELECT dlock.use_fence(%G || E'\\x1f1', %F)", NULL, true},
	{EXP_REFUSE, "SELECT dlock.release(%G || E'\\x1f1', gen_random_uuid())", NULL, true},
	{EXP_VALUE, "SELECT dlock.check_fence(%G || E'\\x1f1', %F) AND false", NULL, true},
	{EXP_STALE, "INSERT INTO public.mine (k, fence) VALUES (%G || E'\\x1f1', %F)", NULL, true},
	{EXP_REFUSE, "ALTER FUNCTION dlock.campaign(text, text, interval, interval, text, interval, boolean) SECURITY DEFINER", NULL, true},
	{EXP_REFUSE, "DROP FUNCTION dlock.observe(text, bigint, interval, text, boolean)", NULL, true},
	{EXP_REFUSE, "CREATE OR REPLACE FUNCTION dlock.leader(election text, OUT value text, OUT fence bigint, OUT since timestamptz, OUT expires_at timestamptz) RETURNS SETOF record LANGUAGE sql AS 'SELECT NULL::text, 1::bigint, now(), now()'", NULL, true},
	{EXP_REFUSE, "CREATE FUNCTION dlock.campaign(election text, value text, ttl interval, wait interval DEFAULT NULL, holder text DEFAULT NULL, lock_delay interval DEFAULT NULL, session_bound boolean DEFAULT false, x int DEFAULT 0) RETURNS dlock.lease LANGUAGE sql AS 'SELECT NULL::dlock.lease'", NULL, true},
	{EXP_REFUSE, "ALTER FUNCTION dlock.proclaim(text, uuid, text) OWNER TO CURRENT_USER", NULL, true},
};

/* Run one attack, with %G (a guard key) and %P (the digest pid) filled in. */
static void
gen_attack(void)
{
	const Attack *a = &attacks[rnd(lengthof(attacks))];
	int			g = rnd(NGUARD);
	PQExpBufferData s;
	const char *p;
	Call	   *c;

	while (a->kinds && !has_kinds)
		a = &attacks[rnd(lengthof(attacks))];

	if (inject && chance(2))
	{
		c = new_call("injected", AS_USR, EXP_REFUSE);
		add(c, "%s", inject);
		call(c);
		return;
	}
	initPQExpBuffer(&s);
	for (p = a->sql; *p; p++)
	{
		if (p[0] == '%' && p[1] == 'G')
		{
			appendPQExpBufferStr(&s, guard_keys[g]);
			p++;
		}
		else if (p[0] == '%' && p[1] == 'N')
		{
			/* the token after the guard's: never current */
			appendPQExpBuffer(&s, "%lld", guard_fence[g] + 1);
			p++;
		}
		else if (p[0] == '%' && p[1] == 'F')
		{
			/* the guard's own token */
			appendPQExpBuffer(&s, "%lld", guard_fence[g]);
			p++;
		}
		else if (p[0] == '%' && p[1] == 'D')
		{
			appendPQExpBufferStr(&s, dbname_q);
			p++;
		}
		else if (p[0] == '%' && p[1] == 'S')
		{
			appendPQExpBufferStr(&s, superuser_name);
			p++;
		}
		else if (p[0] == '%' && p[1] == 'P')
		{
			appendPQExpBufferStr(&s, digest_pid);
			p++;
		}
		else
			appendPQExpBufferChar(&s, *p);
	}
	c = new_call("attack", AS_USR, a->expect);
	c->api = false;
	/* "a; b; c" runs in one transaction */
	if (strstr(s.data, "; ") && strncmp(s.data, "DO ", 3) != 0)
	{
		char	   *part = s.data;
		char	   *semi;

		add(c, "BEGIN");
		while ((semi = strstr(part, "; ")) != NULL)
		{
			*semi = '\0';
			add(c, "%s", part);
			part = semi + 2;
		}
		add(c, "%s", part);
		add(c, "COMMIT");
	}
	else
		add(c, "%s", s.data);
	/* before dlock is loaded PostgreSQL takes these as placeholders */
	if (!usr_loaded && a->expect == EXP_REFUSE && c->nstmt == 1 &&
		(strncmp(a->sql, "SET dlock.", 10) == 0 ||
		 strncmp(a->sql, "SET \"Dlock", 10) == 0 ||
		 strncmp(a->sql, "SELECT set_config('dlock.", 25) == 0))
		c->expect = EXP_NOCHANGE;
	if (strstr(s.data, "COPY dlock.leases (key"))
		c->copydata = pg_strdup("fz:forged\t1\tinfinity\tnow\n");
	if (a->expect == EXP_VALUE)
	{
		if (a->value)
			c->expect_value = a->value;
		else if (strstr(s.data, "count(*)"))
			c->expect_value = "0";
		else if (strstr(s.data, "renew"))
			c->expect_value = NULL;
		else
			c->expect_value = "f";
	}
	/* check_fence(guard, 0) is false; so is anything AND false */
	termPQExpBuffer(&s);
	call(c);
}

/* A fresh connection for the ordinary role: dlock not loaded yet. */
static void
gen_reconnect(void)
{
	PQfinish(usr);
	usr = connect_as(role, "dlock-fuzz-usr", "-c statement_timeout=10s");
	if (PQstatus(usr) != CONNECTION_OK)
	{
		crashes++;
		stop = true;
		violation(NULL, "cannot reconnect as %s (crash?)", role);
		return;
	}
	evil_path = false;
	usr_loaded = false;
	count(cats, &ncats, "reconnect");
	refresh_digest();
}

/* Keep the history and odd-type tables small. */
static void
maintain(void)
{
	must(su, "SET dlock.fence_bypass = on");
	must(su, "DELETE FROM fz.t_hist WHERE ctid IN (SELECT ctid FROM fz.t_hist OFFSET 50)");
	must(su, "DO $$DECLARE r record; BEGIN FOR r IN SELECT relname FROM pg_class "
		 "WHERE relnamespace = 'fz'::regnamespace AND relname LIKE 'odd\\_%' AND relkind = 'r' "
		 "LOOP EXECUTE format('DELETE FROM fz.%I', r.relname); END LOOP; END$$");
	must(su, "RESET dlock.fence_bypass");
	refresh_digest();
}

/* ---- tokens never issued, and wrappers with SET clauses (issue 18) ------ */

/*
 * The surfaces a token is presented through.  The UPDATE forms need the
 * key's rows, which setup made for the pool and guard keys only.
 */
typedef enum Surface
{
	SURF_USE,					/* use_fence, alone */
	SURF_FENCED,				/* fenced, alone */
	SURF_CHECK,					/* check_fence: must say false */
	SURF_INSERT,				/* INSERT with the token column, lease mode */
	SURF_MONO_INSERT,			/* the same, 'monotonic' mode */
	SURF_USE_WRITE,				/* use_fence, then a write without a token */
	SURF_UPDATE,				/* UPDATE of the key's row, lease mode */
	SURF_MONO_UPDATE,			/* the same, 'monotonic' mode */
	SURF_FENCED_WHERE,			/* UPDATE ... WHERE k = key AND fenced(...) */
	NSURF
} Surface;

#define NSURF_ANY_KEY	SURF_UPDATE /* the surfaces every key can take */

/* The tokens never issued: 0, below 0, above the counter, the maximum. */
#define NNEVER			5

/* The last value of the token counter, read as the superuser. */
static long long
last_token(void)
{
	PGresult   *res = PQexec(dig, token_sql);
	long long	v = -1;

	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
		v = atoll(PQgetvalue(res, 0, 0));
	PQclear(res);
	return v;
}

/* Never-issued token i (< NNEVER) as SQL; "last" is the counter's value. */
static char *
never_issued(int i, long long last)
{
	switch (i)
	{
		case 0:
			return pg_strdup("0");
		case 1:
			return pg_strdup("-1");
		case 2:
			return pg_strdup("(-9223372036854775807 - 1)");
		case 3:
			/* a huge one if the counter cannot be read */
			return psprintf("%lld", last >= 0 ? last + 1 : PG_INT64_MAX / 2);
		default:
			return pg_strdup("9223372036854775807");
	}
}

/* Is key (an SQL expression from our pools) one dlock accepts as a key? */
static bool
key_is_valid(const char *key)
{
	int			i;

	if (pool_index(key) >= 0 || guard_index(key) >= 0 || kind_of(key))
		return true;
	for (i = 0; i < (int) lengthof(hostile_keys); i++)
		if (key == hostile_keys[i])
			return hostile_valid[i];
	return false;
}

/*
 * Present token tok (SQL) for key through surface surf, as who.  The
 * token must be refused: with LF001 when the key is valid (an invalid key
 * is refused by its own check first), and check_fence must say false.
 * what names the token, for the report.
 */
static void
present_token(const char *cat, Who who, const char *key, const char *tok,
			  Surface surf, const char *what)
{
	Call	   *c = new_call(cat, who, surf == SURF_CHECK ? EXP_VALUE : EXP_REFUSE);

	c->uses_dlock = true;
	c->refuse_what = what;
	if (surf == SURF_CHECK)
		c->expect_value = "f";
	else if (key_is_valid(key))
		c->expect_state = "LF001";
	switch (surf)
	{
		case SURF_USE:
			add(c, "SELECT dlock.use_fence(%s, %s)", key, tok);
			break;
		case SURF_FENCED:
			add(c, "SELECT dlock.fenced(%s, %s)", key, tok);
			break;
		case SURF_CHECK:
			add(c, "SELECT dlock.check_fence(%s, %s)", key, tok);
			break;
		case SURF_INSERT:
			add(c, "INSERT INTO fz.t_hist (k, v, fence) VALUES (%s, 1, %s)", key, tok);
			break;
		case SURF_MONO_INSERT:
			add(c, "INSERT INTO fz.t_mono (k, v, fence) VALUES (%s, 1, %s) "
				"ON CONFLICT (k) DO UPDATE SET v = excluded.v, fence = excluded.fence", key, tok);
			break;
		case SURF_USE_WRITE:
			add(c, "BEGIN");
			add(c, "SELECT dlock.use_fence(%s, %s)", key, tok);
			add(c, "INSERT INTO fz.t_usefence AS t (k, v) VALUES (%s, 1) "
				"ON CONFLICT (k) DO UPDATE SET v = t.v + 1", key);
			add(c, "COMMIT");
			break;
		case SURF_UPDATE:
			add(c, "UPDATE fz.t_text SET v = v + 1, fence = %s WHERE k = %s", tok, key);
			break;
		case SURF_MONO_UPDATE:
			add(c, "UPDATE fz.t_mono SET v = v + 1, fence = %s WHERE k = %s", tok, key);
			break;
		default:
			add(c, "UPDATE fz.t_usefence SET v = v + 1 WHERE k = %s AND dlock.fenced(%s, %s)",
				key, key, tok);
			break;
	}
	call(c);
}

/* Settings a wrapper function's SET clause changes (see setup). */
typedef struct WrapSetting
{
	const char *name;			/* in the wrapper's name */
	const char *set;			/* the SET clause */
	bool		su_only;		/* only a superuser may set it */
	bool		set_local;		/* the direct call runs after SET LOCAL of it */
	bool		kinds;			/* needs dlock 0.7 (issue 20) */
} WrapSetting;

static const WrapSetting wrap_settings[] = {
	{"sclocal", "synchronous_commit = local", false, true},
	{"scoff", "synchronous_commit = off", false, true},
	{"evil", "search_path = evil, pg_catalog, public", false, true},
	{"evtemp", "search_path = pg_temp, evil, dlock, pg_catalog, public", false, true},
	{"locktmo", "lock_timeout = '1ms'", false, true},
	/* a SET clause does not rearm the running statement's timer */
	{"stmttmo", "statement_timeout = '1ms'", false, false},
	{"dtro", "default_transaction_read_only = on", false, true},
	{"tro", "transaction_read_only = on", false, true},
	{"asyncrel", "dlock.async_release = off", false, true},
	{"maxttl", "dlock.max_ttl = '1s'", true, true},
	{"maxhold", "dlock.max_hold = '1s'", true, true},
	{"logev", "dlock.log_events = on", true, true},
	{"notify", "dlock.notify = on", true, true, true},
};

/*
 * The calls wrapped, as SQL with $1 key, $2 owner, $3 ttl, $4 token; the
 * same text is the wrapper's body and, with the values filled in, the
 * direct call.  Statements are separated by "; ".
 */
typedef struct WrapFn
{
	const char *name;
	const char *rettype;
	const char *body;
	bool		held;			/* takes a lease granted just before */
	bool		token;			/* presents a token */
	bool		grant;			/* draws tokens */
	bool		kinds;			/* needs dlock 0.7 (issue 20) */
} WrapFn;

static const WrapFn wrap_fns[] = {
	{"try", "bigint", "SELECT count(*) FROM dlock.try_acquire($1, $3)", false, false, true},
	{"acquire", "boolean", "SELECT fence IS NOT NULL FROM dlock.acquire($1, $3, wait => '10 ms')", false, false, true},
	{"renew", "boolean", "SELECT dlock.renew($1, $2, $3) IS NOT NULL", true, false, true},
	{"release", "boolean", "SELECT dlock.release($1, $2)", true, false, false},
	{"use", "integer", "SELECT dlock.use_fence($1, $4); INSERT INTO fz.t_usefence (k, v) VALUES ($1, 1) RETURNING 1", true, true, false},
	{"fenced", "boolean", "SELECT dlock.fenced($1, $4)", true, true, false},
	{"check", "boolean", "SELECT dlock.check_fence($1, $4)", true, true, false},
	{"write", "integer", "INSERT INTO fz.t_hist (k, v, fence) VALUES ($1, 1, $4) RETURNING 1", true, true, false},
	{"mono", "integer", "INSERT INTO fz.t_mono (k, v, fence) VALUES ($1, 1, $4) RETURNING 1", true, true, false},
	{"campaign", "boolean", "SELECT fence IS NOT NULL FROM dlock.campaign($1, 'v', $3, wait => '10 ms')", false, false, true, true},
	{"proclaim", "boolean", "SELECT dlock.proclaim($1, $2, 'v2')", true, false, false, true},
	{"permit", "bigint", "SELECT count(*) FROM dlock.try_acquire($1, $3, permits => 3)", false, false, true, true},
	{"shared", "bigint", "SELECT count(*) FROM dlock.try_acquire($1, $3, mode => 'shared')", false, false, true, true},
	{"observe", "text", "SELECT concat_ws(' ', state, value) FROM dlock.observe($1, 0, '0')", true, false, false, true},
};

/* Is there a wrapper of wrap_fns[fi] with the SET clause wrap_settings[si]? */
static bool
wrap_exists(int si, int fi)
{
	return has_kinds || (!wrap_settings[si].kinds && !wrap_fns[fi].kinds);
}

/* body with $1..$4 replaced by the SQL of vals[0..3]. */
static char *
fill_params(const char *body, const char *const vals[4])
{
	PQExpBufferData b;
	const char *p;

	initPQExpBuffer(&b);
	for (p = body; *p; p++)
	{
		if (p[0] == '$' && p[1] >= '1' && p[1] <= '4')
		{
			appendPQExpBufferStr(&b, vals[p[1] - '1']);
			p++;
		}
		else
			appendPQExpBufferChar(&b, *p);
	}
	return b.data;
}

/* What a call ended with, for comparing two calls. */
static const char *
verdict(const Call *c)
{
	if (c->sqlstate)
		return c->sqlstate;
	if (c->ntuples == 0)
		return "no row";
	return c->value_null ? "NULL" : c->value;
}

/* Grant a fresh key for a wrapped case; its fence and owner, or false. */
static bool
wrap_grant(Who who, const char *key, long long *fence, char **owner)
{
	Call	   *g = new_call("wrap-grant", who, EXP_ANY);
	bool		ok;

	g->api = true;
	add(g, "SELECT fence, owner FROM dlock.try_acquire(%s, '5 s')", key);
	make_call(g);
	ok = !g->sqlstate && g->ntuples == 1 && g->value && g->value2;
	if (ok)
	{
		*fence = atoll(g->value);
		*owner = psprintf("'%s'::uuid", g->value2);
	}
	free_call(g);
	return ok;
}

/*
 * One wrapped case: call wrap_fns[fi] through the wrapper whose SET clause
 * is wrap_settings[si], and directly (after SET LOCAL of the same setting,
 * where that is what the clause means), each on a fresh key of its own in
 * the same state; the two must end the same way.  tk: 0 presents the
 * key's current token (and the owner), 1 a token never issued, 2 the one
 * below the current (and a wrong owner).
 */
static void
wrap_case(int si, int fi, int tk, Who who)
{
	static long n = 0;
	const WrapSetting *ws = &wrap_settings[si];
	const WrapFn *wf = &wrap_fns[fi];
	char	   *keys[2];
	long long	fence[2] = {0, 0};
	char	   *owner[2] = {NULL, NULL};
	char	   *tok[2] = {NULL, NULL};
	const char *ttl = chance(10) ? "'2 days'" : "'5 s'";
	int			never = rnd(NNEVER);
	Call	   *c[2];
	int			i;

	if (ws->su_only)
		who = AS_SU;
	n++;
	for (i = 0; i < 2; i++)
		keys[i] = psprintf("'fz:w%ld:%llu:%c'", n, (unsigned long long) run_seed,
						   i == 0 ? 'd' : 'w');
	if (wf->held)
	{
		long long	last;

		for (i = 0; i < 2; i++)
			if (!wrap_grant(who, keys[i], &fence[i], &owner[i]))
				goto done;
		last = last_token();
		for (i = 0; i < 2; i++)
		{
			if (tk == 0)
				tok[i] = psprintf("%lld", fence[i]);
			else if (tk == 1)
				tok[i] = never_issued(never, last);
			else
			{
				tok[i] = psprintf("%lld", fence[i] - 1);
				free(owner[i]);
				owner[i] = pg_strdup("'00000000-0000-0000-0000-000000000000'::uuid");
			}
		}
	}
	for (i = 0; i < 2; i++)
	{
		const char *vals[4];
		char	   *tk_sql = psprintf("(%s)::bigint", tok[i] ? tok[i] : "NULL");
		char	   *ttl_sql = psprintf("%s::interval", ttl);

		vals[0] = keys[i];
		vals[1] = owner[i] ? owner[i] : "NULL::uuid";
		vals[2] = ttl_sql;
		vals[3] = tk_sql;
		c[i] = new_call(i == 0 ? "wrap-direct" : "wrapped", who, EXP_ANY);
		c[i]->api = wf->grant;
		c[i]->uses_dlock = true;
		if (wf->token && tk != 0)
		{
			c[i]->refuse_what = "a stale or never-issued token";
			if (strcmp(wf->name, "check") == 0)
			{
				c[i]->expect = EXP_VALUE;
				c[i]->expect_value = "f";
			}
			else
				c[i]->expect = EXP_REFUSE;
		}
		else if (wf->token && strcmp(wf->name, "check") != 0 &&
				 strcmp(wf->name, "fenced") != 0 && !evil_path)
		{
			c[i]->expect = EXP_ACCEPT;
			c[i]->accept_key = pg_strdup(keys[i]);
			c[i]->accept_token = fence[i];
		}
		else if (wf->held && tk == 2 && strcmp(wf->rettype, "boolean") == 0)
		{
			/* a wrong owner's renew or release */
			c[i]->expect = EXP_VALUE;
			c[i]->expect_value = "f";
		}
		if (i == 0)
		{
			char	   *body = fill_params(wf->body, vals);
			char	   *part = body;
			char	   *semi;

			add(c[i], "BEGIN");
			if (ws->set_local)
				add(c[i], "SET LOCAL %s", ws->set);
			while ((semi = strstr(part, "; ")) != NULL)
			{
				*semi = '\0';
				add(c[i], "%s", part);
				part = semi + 2;
			}
			add(c[i], "%s", part);
			add(c[i], "COMMIT");
			free(body);
		}
		else
			add(c[i], "SELECT fz.w_%s_%s(%s, %s, %s, %s)", ws->name, wf->name,
				vals[0], vals[1], vals[2], vals[3]);
		make_call(c[i]);
		free(tk_sql);
		free(ttl_sql);
	}
	wrapped_cases++;
	if (strcmp(verdict(c[0]), verdict(c[1])) != 0)
		violation(c[1], "through a wrapper with SET %s: %s; called directly: %s",
				  ws->set, verdict(c[1]), verdict(c[0]));
	free_call(c[0]);
	free_call(c[1]);
done:
	for (i = 0; i < 2; i++)
	{
		free(keys[i]);
		free(owner[i]);
		free(tok[i]);
	}
}

/* A random wrapped case. */
static void
gen_wrapped(void)
{
	int			si = rnd(lengthof(wrap_settings));
	int			fi = rnd(lengthof(wrap_fns));

	if (wrap_exists(si, fi))
		wrap_case(si, fi, rnd(3), chance(20) ? AS_SU : AS_USR);
}

/* A never-issued token for a random key through a random surface. */
static void
gen_never_issued(void)
{
	const char *key = chance(30) ? PICK(hostile_keys) :
		has_kinds && chance(15) ? kinds[rnd(NKIND)].key : any_key();
	char	   *tok = never_issued(rnd(NNEVER), last_token());

	/* a shadowed '=' makes a WHERE match other keys' rows: no UPDATE then */
	present_token("never-issued", chance(15) ? AS_SU : AS_USR, key, tok,
				  rnd(NSURF_ANY_KEY), "a never-issued token");
	free(tok);
}

/* ---- permits, shared leases, elections, observe (issue 20) ------------- */

/* Remember a lease of kk, token fence and owner (text of a uuid). */
static void
remember(KindKey *kk, const char *fence, const char *owner)
{
	int			i = kk->nleases++ % NREMEMBER;

	free(kk->owner[i]);
	kk->owner[i] = psprintf("'%s'::uuid", owner);
	kk->fence[i] = atoll(fence);
}

/* A remembered lease of kk (its index), or -1. */
static int
remembered(const KindKey *kk)
{
	int			n = Min(kk->nleases, NREMEMBER);

	return n > 0 ? (int) rnd(n) : -1;
}

/* The kind keys and pool keys that have remembered leases: one of them. */
static KindKey *
any_remembered(void)
{
	int			start = rnd(NKIND + NPOOL);
	int			i;

	for (i = 0; i < NKIND + NPOOL; i++)
	{
		KindKey    *kk = &kinds[(start + i) % (NKIND + NPOOL)];

		if (kk->nleases > 0)
			return kk;
	}
	return NULL;
}

/*
 * A key for a call of the kinds: mostly the kind keys (fz:p0..2 and three
 * of 512 bytes, of 1-, 2- and 4-byte characters, whose permits' keys are
 * 514 to 517 bytes), where permits, shared leases and elections mix; the
 * pool keys, where they mix with exclusive leases and writes; the guard
 * keys, held by the superuser for an hour; the hostile keys.
 */
static const char *
kind_key(void)
{
	int			r = rnd(100);

	if (r < 55)
		return kinds[rnd(NKIND)].key;
	if (r < 70)
		return pool_keys[rnd(NPOOL)];
	if (r < 85)
		return guard_keys[rnd(NGUARD)];
	return PICK(hostile_keys);
}

/* A ttl for a grant of key: short ones for the kind and pool keys. */
static const char *
kind_ttl(const char *key)
{
	static const char *const usual[] = {"'20 ms'", "'100 ms'", "'300 ms'", "'1 s'", "'3 s'"};

	if (kind_of(key) && chance(85))
		return PICK(usual);
	return chance(50) ? PICK(usual) : PICK(ttls);
}

/* Append holder, lock_delay and session_bound (named) now and then. */
static void
grant_options(PQExpBuffer b)
{
	if (chance(25))
		appendPQExpBuffer(b, ", holder => %s", PICK(holders));
	if (chance(15))
		appendPQExpBuffer(b, ", lock_delay => %s", PICK(delays));
	if (chance(15))
		appendPQExpBuffer(b, ", session_bound => %s", PICK(bools));
}

/*
 * Put body into call c in a random wrapping, as gen_api does; return true
 * when what body does is kept (not rolled back).
 */
static bool
kind_wrap(Call *c, const char *body, const char *key)
{
	switch (rnd(14))
	{
		case 0:
			add(c, "BEGIN");
			add(c, "%s", body);
			add(c, "COMMIT");
			return true;
		case 1:
			add(c, "BEGIN READ ONLY");
			add(c, "%s", body);
			add(c, "COMMIT");
			return true;
		case 2:
			add(c, "BEGIN ISOLATION LEVEL REPEATABLE READ");
			add(c, "SELECT count(*) FROM dlock.lease_status WHERE key = %s", key);
			add(c, "%s", body);
			add(c, "COMMIT");
			return true;
		case 3:
			add(c, "BEGIN");
			add(c, "SAVEPOINT s");
			add(c, "%s", body);
			add(c, "ROLLBACK TO s");
			add(c, "COMMIT");
			break;
		case 4:
			add(c, "BEGIN");
			add(c, "%s", body);
			add(c, "ROLLBACK");
			break;
		default:
			add(c, "%s", body);
			c->strict_seq = true;
			return true;
	}
	/* rolled back: must leave no trace but drawn tokens */
	if (c->expect == EXP_ANY)
		c->expect = EXP_NOCHANGE;
	else if (c->expect == EXP_VALUE)
		c->expect = EXP_ANY;	/* the value is no longer the last one */
	return false;
}

/*
 * Make a grant-like call c (its first column the token, its second the
 * owner), and remember the lease it granted on key if kept.
 */
static void
call_remember(Call *c, const char *key, bool kept)
{
	KindKey    *kk = kind_of(key);

	make_call(c);
	if (kk && kept && !c->sqlstate && c->ntuples == 1 && c->value && c->value2)
	{
		remember(kk, c->value, c->value2);
		kinds_leases++;
	}
	free_call(c);
}

/* A binary interval parameter $1 of call c (as gen_api sends them). */
static void
binary_interval(Call *c)
{
	static const int64 times[] = {
		PG_INT64_MAX, PG_INT64_MIN, 0, 1, -1, 20000,
		INT64CONST(86400000000), INT64CONST(-86400000000)
	};
	static const int32 days[] = {0, 1, -1, PG_INT32_MAX, PG_INT32_MIN};
	static const int32 months[] = {0, 1, -1, PG_INT32_MAX, PG_INT32_MIN};
	char	   *iv = pg_malloc(16);
	uint64		t = (uint64) PICK(times);
	uint32		d = (uint32) PICK(days);
	uint32		m = (uint32) PICK(months);
	int			j;

	for (j = 0; j < 8; j++)
		iv[j] = (char) (t >> (56 - 8 * j));
	for (j = 0; j < 4; j++)
	{
		iv[8 + j] = (char) (d >> (24 - 8 * j));
		iv[12 + j] = (char) (m >> (24 - 8 * j));
	}
	c->nparams = 1;
	c->ptypes[0] = 1186;		/* interval */
	c->pvalues[0] = iv;
	c->plengths[0] = 16;
	c->pformats[0] = 1;
}

/* The token of key's own lease (-1: none), over the digest connection. */
static long long
own_token(const char *key)
{
	bool		live;
	bool		ended;

	return key_state(key, &live, &ended);
}

/*
 * after_fence for observe() of key: its own lease's token, the one below
 * or above, a remembered one, one never issued, or a hostile one.
 * *cmp_guard: for a guard key, -1 when it is below the guard's token (the
 * guard's lease must be reported at once), 1 when at or above (nothing
 * happens to a guard: no row), 0 when unknown.
 */
static char *
kind_after(const char *key, int *cmp_guard)
{
	int			g = guard_index(key);
	KindKey    *kk = kind_of(key);
	int			r = rnd(10);

	*cmp_guard = 0;
	if (g >= 0 && r < 6)
	{
		long long	a = guard_fence[g] + (r < 2 ? -1 : r < 4 ? 0 : 1);

		*cmp_guard = a < guard_fence[g] ? -1 : 1;
		return psprintf("%lld", a);
	}
	if (r < 4)
	{
		long long	t = own_token(key);

		if (t > 0)
			return psprintf("%lld", t + (long long) rnd(3) - 1);
	}
	if (r < 6 && kk && kk->nleases > 0)
		return psprintf("%lld", kk->fence[remembered(kk)]);
	if (r < 7)
		return psprintf("%lld", last_token() + 1);
	return pg_strdup(PICK(after_fences));
}

/*
 * A write under the token of a remembered lease (a permit's, a shared
 * lease's, a leader's): under its own key it must be accepted while the
 * lease is live (with more than a second to go) and refused once it has
 * ended or its permit was granted again; under another kind key it must
 * be refused; with a permit's key spelled out (key || U+001F || n) the key
 * is refused (22023).
 */
static void
gen_kind_write(void)
{
	KindKey    *kk = any_remembered();
	KindKey    *other;
	const char *target;
	long long	t;
	Expect		expect;
	Call	   *c;
	bool		own;
	int			shape = rnd(9);

	if (kk == NULL || chance(40))
	{
		/* a fresh permit or shared lease of a kind key, to write under */
		const char *key = kinds[rnd(NKIND)].key;
		bool		shared = chance(30);
		int			n;

		kk = kind_of(key);
		n = kk->nleases;
		c = new_call("kinds", AS_USR, EXP_ANY);
		c->api = true;
		c->invariants = true;
		add(c, "SELECT fence, owner FROM dlock.try_acquire(%s, '5 s', %s)", key,
			shared ? "mode => 'shared'" : "permits => 3");
		note_ask(key, shared ? NULL : &permit_args[2], shared ? &mode_args[1] : NULL);
		call_remember(c, key, true);
		if (kk->nleases == n)
			return;				/* none free */
		t = kk->fence[(kk->nleases - 1) % NREMEMBER];
	}
	else
		t = kk->fence[remembered(kk)];
	other = &kinds[rnd(NKIND + NPOOL)];
	own = other == kk || chance(75);
	target = own ? kk->key : other->key;
	if (!own)
		expect = EXP_STALE;		/* tokens name one lease, of one key */
	else if (token_held(target, t, true))
		expect = EXP_ACCEPT;
	else if (token_held(target, t, false))
		expect = EXP_ANY;		/* about to end: either outcome is right */
	else
		expect = EXP_STALE;		/* ended, or its permit granted again */
	c = new_call("kinds-write", AS_USR, expect);
	c->uses_dlock = true;
	c->invariants = true;
	switch (shape)
	{
		case 0:
		case 1:
			add(c, "INSERT INTO fz.t_hist (k, v, fence) VALUES (%s, 1, %lld)", target, t);
			break;
		case 2:
			add(c, "BEGIN");
			add(c, "SELECT dlock.use_fence(%s, %lld)", target, t);
			add(c, "INSERT INTO fz.t_usefence AS u (k, v) VALUES (%s, 1) "
				"ON CONFLICT (k) DO UPDATE SET v = u.v + 1", target);
			add(c, "COMMIT");
			break;
		case 3:
			add(c, "INSERT INTO fz.t_hist (k, v, fence) SELECT %s, 2, %lld WHERE dlock.fenced(%s, %lld)",
				target, t, target, t);
			break;
		case 4:
			/* check_fence: true for a live lease's token, false otherwise */
			add(c, "SELECT dlock.check_fence(%s, %lld)", target, t);
			if (expect == EXP_ACCEPT)
			{
				c->expect = EXP_VALUE;
				c->expect_value = "t";
			}
			else if (expect == EXP_STALE)
			{
				c->expect = EXP_VALUE;
				c->expect_value = "f";
			}
			break;
		case 5:
			/* 'monotonic': a permit's own token; another key's is refused */
			add(c, "INSERT INTO fz.t_mono AS m (k, v, fence) VALUES (%s, 1, %lld) "
				"ON CONFLICT (k) DO UPDATE SET v = m.v + 1, fence = excluded.fence", target, t);
			if (own)
				c->expect = EXP_ANY;
			break;
		case 6:
			/* the key of one of its permits, spelled out: not a key */
			add(c, "SELECT dlock.use_fence(%s || E'\\x1f%d', %lld)", target, 1 + (int) rnd(3), t);
			c->expect = EXP_REFUSE;
			c->expect_state = "22023";
			c->refuse_what = "a permit's key (key || U+001F || n) as a key";
			break;
		case 7:
			add(c, "BEGIN");
			add(c, "SELECT dlock.use_fence(%s, %lld)", target, t);
			add(c, "INSERT INTO fz.t_hist (k, v, fence) VALUES (%s, 3, %lld)", target, t);
			add(c, "PREPARE TRANSACTION 'dlock_fuzz'");
			if (c->expect != EXP_STALE)
				c->expect = EXP_NOCHANGE;
			break;
		default:
			/* a shadowed '=' makes the WHERE match every key's row */
			if (evil_path)
				add(c, "INSERT INTO fz.t_hist (k, v, fence) VALUES (%s, 4, %lld)", target, t);
			else
				add(c, "UPDATE fz.t_usefence SET v = v + 1 WHERE k = %s AND dlock.fenced(%s, %lld)",
					target, target, t);
			break;
	}
	if (c->expect == EXP_ACCEPT && evil_path)
		c->expect = EXP_ANY;
	if (c->expect == EXP_ACCEPT)
	{
		c->accept_key = pg_strdup(target);
		c->accept_token = t;
	}
	call(c);
}

/*
 * A change of key by the superuser while an observe() of it waits (no
 * assertion on what the observer sees): a grant of a permit, a shared or
 * an exclusive lease, a release, a proclaim by a remembered owner, or a
 * forget().
 */
static void
kind_change(const char *key)
{
	KindKey    *kk = kind_of(key);
	int			i = kk ? remembered(kk) : -1;
	Call	   *c = new_call("observe-change", AS_SU, EXP_ANY);
	bool		kept = false;

	c->api = true;
	c->invariants = true;
	switch (rnd(6))
	{
		case 0:
			add(c, "SELECT fence, owner FROM dlock.try_acquire(%s, '300 ms', permits => 3)", key);
			note_ask(key, &permit_args[2], NULL);
			kept = true;
			break;
		case 1:
			add(c, "SELECT fence, owner FROM dlock.try_acquire(%s, '300 ms', mode => 'shared')", key);
			note_ask(key, NULL, &mode_args[1]);
			kept = true;
			break;
		case 2:
			add(c, "SELECT fence, owner FROM dlock.campaign(%s, 'w', '300 ms', wait => '0')", key);
			kept = true;
			break;
		case 3:
			if (i >= 0)
				add(c, "SELECT dlock.release(%s, %s)", key, kk->owner[i]);
			else
				add(c, "SELECT dlock.release(%s, gen_random_uuid())", key);
			break;
		case 4:
			if (i >= 0)
				add(c, "SELECT dlock.proclaim(%s, %s, 'w%d')", key, kk->owner[i], (int) rnd(3));
			else
				add(c, "SELECT fence, owner FROM dlock.try_acquire(%s, '300 ms')", key);
			kept = i < 0;
			break;
		default:
			add(c, "SELECT dlock.forget(%s)", key);
			break;
	}
	call_remember(c, key, kept);
}

/* Time observe() may take to report a change beyond what it waits for. */
#define OBSERVE_SLACK_MS	2500

/*
 * observe() while the key changes: the superuser campaigns for a fresh key
 * with value 'v1'; the ordinary role observes it (after the epoch, seen
 * value 'v1'; maybe in a REPEATABLE READ, READ ONLY or SERIALIZABLE
 * transaction), sent without waiting for its result; then the superuser
 * changes the key, or does something that must not count as a change.
 * observe() must report a change (proclaim of a new value, release,
 * release and a new leader, forget, a renewal that shortens the lease to
 * 200 ms) with what it is, and within OBSERVE_SLACK_MS of its commit (a
 * missed wake-up would make it sleep out its 5 s); and report nothing
 * within its 30 ms for the rest (a stranger's proclaim, the leader's
 * proclaim of the same value, grants that the live lease refuses, a
 * renewal that extends it).  Now and then, instead, a kind key is observed
 * for a few milliseconds while the superuser changes it any way.
 */
static void
gen_observe_race(void)
{
	static long n = 0;
	char	   *key;
	long long	f = 0;
	char	   *owner = NULL;
	Call	   *g;
	Call	   *obs;
	Call	   *chg;
	int			change = rnd(10);
	bool		reports = change < 5;
	int			wrapping = rnd(5);
	char	   *sel;
	const char *what = NULL;
	bool		as_meant = false;
	long long	f2 = 0;
	int64		sent;

	if (chance(25))
	{
		/* a kind key, observed briefly while it changes any way */
		const char *k = chance(80) ? kinds[rnd(NKIND)].key : pool_keys[rnd(NPOOL)];
		int			cmp;
		char	   *after = kind_after(k, &cmp);

		obs = new_call("observe-busy", AS_USR, EXP_ANY);
		obs->uses_dlock = true;
		obs->invariants = true;
		add(obs, "SELECT fence, state FROM dlock.observe(%s, %s, '%d ms'%s)", k, after,
			1 + (int) rnd(40), chance(30) ? ", 'w1'" : "");
		free(after);
		if (PQsendQuery(usr, obs->stmt[0]))
			obs->async_sent = true;
		kind_change(k);
		call(obs);
		return;
	}

	n++;
	key = psprintf("'fz:o%ld:%llu'", n, (unsigned long long) run_seed);
	g = new_call("observe-grant", AS_SU, EXP_ANY);
	g->api = true;
	add(g, "SELECT fence, owner FROM dlock.campaign(%s, 'v1', '10 s', wait => '0')", key);
	make_call(g);
	if (!g->sqlstate && g->ntuples == 1 && g->value && g->value2)
	{
		f = atoll(g->value);
		owner = psprintf("'%s'::uuid", g->value2);
	}
	free_call(g);
	if (f == 0 || stop)
	{
		free(key);
		free(owner);
		return;
	}

	sel = psprintf("SELECT concat_ws(' ', state, fence, value) FROM dlock.observe(%s, %lld, '%s', 'v1')",
				   key, f, reports ? "5 s" : "30 ms");
	obs = new_call("observe-race", AS_USR, EXP_ANY);
	obs->uses_dlock = true;
	obs->invariants = true;
	if (wrapping == 1)
		add(obs, "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM dlock.leases; %s; COMMIT", sel);
	else if (wrapping == 2)
		add(obs, "BEGIN READ ONLY; %s; COMMIT", sel);
	else if (wrapping == 3)
		add(obs, "BEGIN ISOLATION LEVEL SERIALIZABLE; %s; COMMIT", sel);
	else
		add(obs, "%s", sel);
	free(sel);
	if (!PQsendQuery(usr, obs->stmt[0]))
	{
		/* could not even send: make it the ordinary way */
		call(obs);
		free(key);
		free(owner);
		return;
	}
	obs->async_sent = true;
	sent = now_ms();
	if (chance(50))
		pg_usleep(rnd(5000));

	chg = new_call("observe-change", AS_SU, EXP_ANY);
	chg->api = true;
	switch (change)
	{
		case 0:
			what = "the leader's proclaim of a new value";
			add(chg, "SELECT dlock.proclaim(%s, %s, 'v2')", key, owner);
			break;
		case 1:
			what = "a release";
			add(chg, "SELECT dlock.release(%s, %s)", key, owner);
			break;
		case 2:
			what = "a release and a new leader";
			add(chg, "SELECT dlock.release(%s, %s)", key, owner);
			add(chg, "SELECT fence FROM dlock.campaign(%s, 'v3', '10 s', wait => '0')", key);
			break;
		case 3:
			what = "forget()";
			add(chg, "SELECT dlock.forget(%s)", key);
			break;
		case 4:
			what = "a renewal that shortens the lease to 200 ms";
			add(chg, "SELECT dlock.renew(%s, %s, '200 ms') IS NOT NULL", key, owner);
			break;
		case 5:
			what = "a stranger's proclaim";
			add(chg, "SELECT dlock.proclaim(%s, gen_random_uuid(), 'v2')", key);
			chg->expect = EXP_VALUE;
			chg->expect_value = "f";
			break;
		case 6:
			what = "the leader's proclaim of the same value";
			add(chg, "SELECT dlock.proclaim(%s, %s, 'v1')", key, owner);
			break;
		case 7:
			what = "a grant that the live lease refuses";
			add(chg, "SELECT fence FROM dlock.try_acquire(%s, '1 s', %s)", key,
				chance(50) ? "permits => 3" : "mode => 'shared'");
			chg->expect = EXP_NOROWS;
			break;
		case 8:
			what = "a campaign that the live lease refuses";
			add(chg, "SELECT fence FROM dlock.campaign(%s, 'v9', '1 s', wait => '0')", key);
			chg->expect = EXP_REFUSE;
			chg->refuse_what = "a campaign for a key with a live leader";
			break;
		default:
			what = "a renewal that extends the lease";
			add(chg, "SELECT dlock.renew(%s, %s, '10 s') IS NOT NULL", key, owner);
			break;
	}
	make_call(chg);
	/* did the change do what it was meant to? */
	if (change == 8)
		as_meant = chg->sqlstate != NULL;
	else if (change == 7)
		as_meant = !chg->sqlstate && chg->ntuples == 0;
	else if (change == 5)
		as_meant = !chg->sqlstate && chg->value && strcmp(chg->value, "f") == 0;
	else if (change == 2)
		as_meant = !chg->sqlstate;
	else
		as_meant = !chg->sqlstate && chg->value && strcmp(chg->value, "t") == 0;
	if (change == 2 && as_meant && chg->value)
		f2 = atoll(chg->value);

	make_call(obs);
	if (as_meant && !obs->sqlstate)
	{
		observe_races++;
		if (!reports && obs->ntuples != 0)
			violation(obs, "observe() reported a change after %s, which changes nothing: %s",
					  what, obs->value ? obs->value : "NULL");
		else if (reports && obs->ntuples != 1)
			violation(obs, "observe() missed %s: no row within its 5 s", what);
		else if (reports)
		{
			char	   *want;
			char	   *want2 = NULL;

			switch (change)
			{
				case 0:
					want = psprintf("held %lld v2", f);
					break;
				case 1:
					want = psprintf("released %lld v1", f);
					break;
				case 2:
					want = psprintf("released %lld v1", f);
					want2 = psprintf("held %lld v3", f2);
					break;
				case 3:
					want = pg_strdup("none");
					break;
				default:
					want = psprintf("expired %lld v1", f);
					break;
			}
			if (obs->value == NULL ||
				(strcmp(obs->value, want) != 0 &&
				 !(want2 && f2 > f && strcmp(obs->value, want2) == 0)))
				violation(obs, "observe() after %s reported \"%s\", must report \"%s\"%s%s%s",
						  what, obs->value ? obs->value : "NULL", want,
						  want2 ? " or \"" : "", want2 ? want2 : "", want2 ? "\"" : "");
			else if (chg->t_done - sent < 500 &&
					 obs->t_done - chg->t_done > OBSERVE_SLACK_MS + (change == 4 ? 200 : 0))
				violation(obs, "observe() reported %s %lld ms after it was made (a missed wake-up?)",
						  what, (long long) (obs->t_done - chg->t_done));
			free(want);
			free(want2);
		}
	}
	free_call(chg);
	free_call(obs);
	free(key);
	free(owner);
}

/*
 * forget() of a key while a fenced write under one of its permits is in
 * progress: three permits of a fresh key; the ordinary role presents the
 * third one's token and keeps its transaction open for 50 ms (sent
 * without waiting); the superuser's forget() must then fail with 55P03,
 * and (in table mode; memory mode's forget takes effect at once) change
 * nothing: the first permits' leases stay.
 */
static void
gen_forget_race(void)
{
	static long n = 0;
	char	   *key;
	long long	t[3];
	int			got = 0;
	Call	   *w;
	Call	   *c;
	int			i;

	n++;
	key = psprintf("'fz:f%ld:%llu'", n, (unsigned long long) run_seed);
	for (i = 0; i < 3 && !stop; i++)
	{
		c = new_call("kinds", AS_USR, EXP_ANY);
		c->api = true;
		c->invariants = true;
		add(c, "SELECT fence FROM dlock.try_acquire(%s, '10 s', permits => 3)", key);
		make_call(c);
		if (!c->sqlstate && c->ntuples == 1 && c->value)
			t[got++] = atoll(c->value);
		free_call(c);
	}
	if (got < 3 || stop)
	{
		free(key);
		return;
	}
	w = new_call("forget-writer", AS_USR, EXP_ANY);
	w->uses_dlock = true;
	add(w, "BEGIN; SELECT dlock.use_fence(%s, %lld); SELECT pg_sleep(0.05); COMMIT", key, t[2]);
	if (PQsendQuery(usr, w->stmt[0]))
	{
		w->async_sent = true;
		pg_usleep(15000);
	}
	c = new_call("kinds-forget", AS_SU, EXP_ANY);
	c->api = true;
	c->invariants = true;
	add(c, "SELECT dlock.forget(%s)", key);
	call(c);
	call(w);
	free(key);
}

/*
 * An acquire() that waits (for an exclusive lease, a permit or a shared
 * lease) while the superuser holds a fresh key: sent without waiting; it
 * must show in dlock.waiters (preloaded) as what it asks for, first in
 * the key's line, and be granted soon after the superuser's release.
 */
static void
gen_waiters_race(void)
{
	static long n = 0;
	static const char *const asks[][2] = {
		{"", "exclusive 1 1"},
		{", permits => 3", "permit 3 1"},
		{", mode => 'shared'", "shared 1"},
		{", permits => 1, mode => 'exclusive'", "exclusive 1 1"},
	};
	int			a = rnd(lengthof(asks));
	char	   *key;
	char	   *owner = NULL;
	char	   *sql;
	Call	   *c;
	Call	   *w;
	int			i;
	bool		seen = false;
	int64		released;

	n++;
	key = psprintf("'fz:q%ld:%llu'", n, (unsigned long long) run_seed);
	c = new_call("kinds", AS_SU, EXP_ANY);
	c->api = true;
	add(c, "SELECT fence, owner FROM dlock.try_acquire(%s, '10 s')", key);
	make_call(c);
	if (!c->sqlstate && c->ntuples == 1 && c->value2)
		owner = psprintf("'%s'::uuid", c->value2);
	free_call(c);
	if (owner == NULL || stop)
	{
		free(key);
		return;
	}
	w = new_call("waiter", AS_USR, EXP_ANY);
	w->api = true;
	w->uses_dlock = true;
	w->invariants = true;
	add(w, "SELECT fence FROM dlock.acquire(%s, '1 s', wait => '5 s'%s)", key, asks[a][0]);
	if (!PQsendQuery(usr, w->stmt[0]))
	{
		call(w);
		free(key);
		free(owner);
		return;
	}
	w->async_sent = true;
	/* until it queues (a few ms; give up after 2 s under load) */
	sql = psprintf("SELECT concat_ws(' ', mode, permits, position) FROM dlock.waiters "
				   "WHERE key = %s AND pid = %d", key, PQbackendPID(usr));
	for (i = 0; i < 100 && !seen; i++)
	{
		PGresult   *res = PQexec(dig, sql);

		if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
		{
			seen = true;
			if (strcmp(PQgetvalue(res, 0, 0), asks[a][1]) != 0)
				violation(w, "dlock.waiters shows a waiting acquire() as \"%s\", must show \"%s\" (mode, permits, position)",
						  PQgetvalue(res, 0, 0), asks[a][1]);
		}
		PQclear(res);
		if (!seen)
			pg_usleep(20000);
	}
	free(sql);
	c = new_call("kinds", AS_SU, EXP_ANY);
	c->api = true;
	add(c, "SELECT dlock.release(%s, %s)", key, owner);
	make_call(c);
	released = c->t_done;
	if (c->sqlstate || c->value == NULL || strcmp(c->value, "t") != 0)
		seen = false;			/* not released: nothing to wait for */
	free_call(c);
	make_call(w);
	if (seen && !w->sqlstate && (w->ntuples != 1 || w->value_null))
		violation(w, "an acquire() waiting for a released key was not granted");
	else if (seen && !w->sqlstate && w->t_done - released > OBSERVE_SLACK_MS)
		violation(w, "an acquire() waiting for a released key was granted %lld ms after the release (a missed wake-up?)",
				  (long long) (w->t_done - released));
	free_call(w);
	free(key);
	free(owner);
}

/*
 * Fill one 512-byte key with shared leases, once per run: 1000 grants (in
 * four statements of 250, so that no transaction holds too many locks)
 * must all be granted, on permits 1 to 1000 (keys of 514 to 517 bytes);
 * then no shared lease, no permit of 1000 and no exclusive lease is
 * granted, and a stranger can neither release nor proclaim.
 */
static void
gen_crowd(void)
{
	char	   *key = psprintf("rpad('crowd:%llu:', 512, 'c')", (unsigned long long) run_seed);
	long		total = 0;
	Call	   *c;
	int			i;
	char	   *sql;
	PGresult   *res;

	for (i = 0; i < 4 && !stop; i++)
	{
		c = new_call("crowd", chance(50) ? AS_SU : AS_USR, EXP_ANY);
		c->api = true;
		c->invariants = true;
		/* the key depends on g: try_acquire is called for every row */
		add(c, "SELECT count(*) FROM generate_series(1, 250) g, "
			"LATERAL dlock.try_acquire(left(%s || g::text, 512), '60 s', holder => 'crowd', mode => 'shared')",
			key);
		make_call(c);
		if (!c->sqlstate && c->value)
			total += atol(c->value);
		else if (c->sqlstate && strcmp(c->sqlstate, "57014") == 0)
			total = -1;			/* statement_timeout, under load */
		else if (c->sqlstate)
			violation(c, "a crowd of shared leases on one key was refused");
		free_call(c);
		if (total < 0)
			break;
	}
	if (stop)
	{
		free(key);
		return;
	}
	if (total >= 0 && total != 1000)
		violation(NULL, "1000 shared leases of one free 512-byte key granted %ld", total);
	sql = psprintf("SELECT count(*) || ' ' || max(permit) FROM dlock.lease_status WHERE key = %s AND state = 'held'", key);
	res = PQexec(dig, sql);
	if (total >= 0 &&
		(PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1 ||
		 strcmp(PQgetvalue(res, 0, 0), "1000 1000") != 0))
		violation(NULL, "after 1000 shared leases of one 512-byte key, dlock.lease_status shows %s held (count, highest permit), must show 1000 1000",
				  PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 ? PQgetvalue(res, 0, 0) : PQerrorMessage(dig));
	PQclear(res);
	free(sql);
	for (i = 0; i < 6 && total >= 0 && !stop; i++)
	{
		static const char *const full[] = {
			"SELECT count(*) FROM dlock.try_acquire(%s, '1 s', mode => 'shared')",
			"SELECT count(*) FROM dlock.try_acquire(%s, '1 s', permits => 1000)",
			"SELECT count(*) FROM dlock.try_acquire(%s, '1 s')",
			"SELECT fence FROM dlock.acquire(%s, '1 s', wait => '5 ms', mode => 'shared')",
			"SELECT dlock.release(%s, gen_random_uuid())",
			"SELECT dlock.proclaim(%s, gen_random_uuid(), 'crowd')",
		};

		c = new_call("crowd", AS_USR, i == 3 ? EXP_REFUSE : EXP_VALUE);
		c->api = true;
		c->invariants = true;
		c->expect_value = i < 3 ? "0" : "f";
		if (i == 3)
			c->refuse_what = "a shared lease of a key with 1000 of them";
		add(c, full[i], key);
		call(c);
	}
	/* the superuser drops the key and its 1000 permits' rows */
	c = new_call("crowd", AS_SU, EXP_ANY);
	c->api = true;
	c->invariants = true;
	add(c, "SELECT dlock.forget(%s)", key);
	make_call(c);
	if (!c->sqlstate && (c->value == NULL || strcmp(c->value, "t") != 0))
		violation(c, "forget() of a key with 1000 shared leases returned %s, must return true",
				  c->value ? c->value : "NULL");
	free_call(c);
	free(key);
}

/*
 * One call of the 0.7 API (issue 20): try_acquire and acquire with permits
 * and modes, campaign, proclaim, leader, observe, renew and release of
 * permits, writes under their tokens, the views, concurrent observes,
 * dlock.notify, forget; on keys where permits, shared and exclusive leases
 * and elections mix, on guard keys (held by the superuser for an hour:
 * nothing may be granted on them, no stranger's proclaim accepted, and
 * observe() must show them unchanged) and on hostile keys.
 */
static void
gen_kinds(void)
{
	const char *key = kind_key();
	KindKey    *kk = kind_of(key);
	int			g = guard_index(key);
	Who			who = chance(15) ? AS_SU : AS_USR;
	int			f = rnd(100);
	PQExpBufferData b;
	Call	   *c;
	bool		kept;

	if (f >= 72)
	{
		if (f < 82)
			gen_kind_write();
		else if (f < 90)
			gen_observe_race();
		else if (f < 93)
		{
			/* dlock.notify for the superuser, LISTEN for the ordinary role */
			static const char *const su_sets[] = {
				"SET dlock.notify = on", "SET dlock.notify = off", "RESET dlock.notify",
				"SET dlock.notify = on",
			};
			static const char *const usr_sets[] = {
				"LISTEN dlock", "UNLISTEN dlock", "UNLISTEN *", "LISTEN dlock", "LISTEN \"Dlock\"",
			};

			c = chance(50) ? new_call("kinds-session", AS_SU, EXP_NOCHANGE) :
				new_call("kinds-session", AS_USR, EXP_NOCHANGE);
			add(c, "%s", c->who == AS_SU ? PICK(su_sets) : PICK(usr_sets));
			call(c);
		}
		else if (f < 94 && chance(60))
		{
			/* the superuser drops a key with its permits */
			const char *k = chance(80) ? kinds[rnd(NKIND)].key : pool_keys[rnd(NPOOL)];

			c = new_call("kinds-forget", AS_SU, EXP_ANY);
			c->api = true;
			c->invariants = true;
			add(c, "SELECT dlock.forget(%s)", k);
			call(c);
		}
		else if (f < 94)
			gen_forget_race();
		else if (f < 95)
			gen_waiters_race();
		else
		{
			/* binary intervals: campaign's ttl, observe's and acquire's wait */
			int			fn = rnd(3);

			c = new_call("kinds-binary", who, EXP_ANY);
			c->api = true;
			c->invariants = true;
			binary_interval(c);
			if (fn == 0)
				add(c, "SELECT fence FROM dlock.campaign(%s, 'b', $1, wait => '0')", key);
			else
			{
				add(c, "BEGIN");
				add(c, "SET LOCAL statement_timeout = '20ms'");
				if (fn == 1)
					add(c, "SELECT fence FROM dlock.observe(%s, 0, $1)", key);
				else
					add(c, "SELECT fence FROM dlock.acquire(%s, '20 ms', wait => $1, permits => 2)", key);
				add(c, "COMMIT");
				if (fn == 2)
					note_ask(key, &permit_args[1], NULL);
			}
			if (g >= 0 && fn != 1)
				c->expect = EXP_REFUSE;
			call(c);
		}
		return;
	}

	initPQExpBuffer(&b);
	c = new_call("kinds", who, EXP_ANY);
	c->api = true;
	c->invariants = true;
	if (f < 22)
	{
		/* try_acquire with permits and a mode */
		const PermitArg *pa = chance(85) ? pick_permits() : NULL;
		const ModeArg *ma = pick_mode();

		if (chance(15))
			/* positional: key, ttl, holder, lock_delay, session_bound, permits, mode */
			appendPQExpBuffer(&b, "SELECT fence, owner FROM dlock.try_acquire(%s, %s, %s, %s, %s, %s%s%s)",
							  key, kind_ttl(key), chance(50) ? "NULL" : PICK(holders),
							  chance(50) ? "NULL" : PICK(delays), chance(50) ? "false" : PICK(bools),
							  pa ? pa->sql : "1", ma ? ", " : "", ma ? ma->sql : "");
		else
		{
			appendPQExpBuffer(&b, "SELECT fence, owner FROM dlock.try_acquire(%s, %s", key, kind_ttl(key));
			grant_options(&b);
			if (pa)
				appendPQExpBuffer(&b, ", permits => %s", pa->sql);
			if (ma)
				appendPQExpBuffer(&b, ", mode => %s", ma->sql);
			appendPQExpBufferStr(&b, ")");
		}
		note_ask(key, pa, ma);
		if (g >= 0)
			c->expect = EXP_NOROWS;
	}
	else if (f < 29)
	{
		/* acquire with permits and a mode: a short wait, or statement_timeout */
		const PermitArg *pa = chance(85) ? pick_permits() : NULL;
		const ModeArg *ma = pick_mode();
		bool		unlimited = chance(15);

		appendPQExpBuffer(&b, "SELECT fence, owner FROM dlock.acquire(%s, %s, wait => %s", key,
						  kind_ttl(key), unlimited ? (chance(50) ? "NULL" : "'1000000 years'") : PICK(waits));
		grant_options(&b);
		if (pa)
			appendPQExpBuffer(&b, ", permits => %s", pa->sql);
		if (ma)
			appendPQExpBuffer(&b, ", mode => %s", ma->sql);
		appendPQExpBufferStr(&b, ")");
		note_ask(key, pa, ma);
		if (g >= 0)
			c->expect = EXP_REFUSE;
		if (unlimited)
		{
			add(c, "BEGIN");
			add(c, "SET LOCAL statement_timeout = '%dms'", 5 + (int) rnd(20));
			add(c, "%s", b.data);
			add(c, "COMMIT");
			call_remember(c, key, true);
			termPQExpBuffer(&b);
			return;
		}
	}
	else if (f < 38)
	{
		/* campaign: its wait defaults to none of its own, so always one */
		const char *v = chance(70) ? "'v'" : PICK(elect_values);
		bool		unlimited = chance(10);

		if (chance(15))
			appendPQExpBuffer(&b, "SELECT fence, owner FROM dlock.campaign(%s, %s, %s, %s, %s, %s, %s)",
							  key, v, kind_ttl(key), unlimited ? "NULL" : PICK(waits),
							  chance(50) ? "NULL" : PICK(holders), chance(50) ? "NULL" : PICK(delays),
							  chance(50) ? "false" : PICK(bools));
		else
		{
		{
			bool		named = chance(20);

			appendPQExpBuffer(&b, "SELECT fence, owner FROM dlock.campaign(%s%s, %s%s, %s%s, wait => %s",
							  named ? "election => " : "", key, named ? "value => " : "", v,
							  named ? "ttl => " : "", kind_ttl(key),
							  unlimited ? "'1000000 years'" : PICK(waits));
		}
			grant_options(&b);
			appendPQExpBufferStr(&b, ")");
		}
		if (g >= 0)
			c->expect = EXP_REFUSE;
		if (unlimited)
		{
			add(c, "BEGIN");
			add(c, "SET LOCAL statement_timeout = '%dms'", 5 + (int) rnd(20));
			add(c, "%s", b.data);
			add(c, "COMMIT");
			call_remember(c, key, true);
			termPQExpBuffer(&b);
			return;
		}
	}
	else if (f < 47)
	{
		/* proclaim: by a remembered owner, another key's, a stranger */
		int			i = kk ? remembered(kk) : -1;
		KindKey    *other = &kinds[rnd(NKIND + NPOOL)];
		int			j = remembered(other);
		const char *o;

		if (i >= 0 && chance(60))
			o = kk->owner[i];
		else if (j >= 0 && other != kk && chance(50))
		{
			o = other->owner[j];
			c->expect = EXP_VALUE;	/* owners name one lease, of one key */
		}
		else
		{
			o = PICK(owners);
			c->expect = EXP_VALUE;
		}
		appendPQExpBuffer(&b, "SELECT dlock.proclaim(%s, %s, %s)", key, o,
						  chance(60) ? "'v2'" : PICK(elect_values));
		if (g >= 0)
			c->expect = EXP_VALUE;
		c->expect_value = "f";
		c->api = false;
	}
	else if (f < 54)
	{
		/* renew or release a remembered lease, or a stranger's */
		int			i = kk ? remembered(kk) : -1;
		const char *o = i >= 0 && chance(70) ? kk->owner[i] : PICK(owners);
		bool		renew = chance(40);

		if (renew)
			appendPQExpBuffer(&b, "SELECT dlock.renew(%s, %s, %s)", key, o, kind_ttl(key));
		else
			appendPQExpBuffer(&b, "SELECT dlock.release(%s, %s)", key, o);
		if (g >= 0 || i < 0 || o != kk->owner[i])
		{
			c->expect = EXP_VALUE;
			c->expect_value = renew ? NULL : "f";
		}
	}
	else if (f < 59)
	{
		/* leader */
		static const char *const forms[] = {
			"SELECT fence, value FROM dlock.leader(%s)",
			"SELECT count(*) FROM dlock.leader(election => %s)",
			"SELECT since <= expires_at FROM dlock.leader(%s)",
			"SELECT (dlock.leader(%s)).fence",
		};

		appendPQExpBuffer(&b, PICK(forms), key);
		c->expect = EXP_NOCHANGE;
		c->api = false;
		if (g >= 0)
		{
			/* the guard leads, without a value */
			termPQExpBuffer(&b);
			initPQExpBuffer(&b);
			appendPQExpBuffer(&b, "SELECT fence FROM dlock.leader(%s)", key);
			c->expect = EXP_VALUE;
			c->expect_value = psprintf("%lld", guard_fence[g]);
		}
	}
	else if (f < 68)
	{
		/* observe, with short waits (or statement_timeout) */
		int			cmp;
		char	   *after = kind_after(key, &cmp);
		bool		unlimited = chance(12);
		bool		seen = chance(40);
		const char *sv = seen ? (chance(50) ? "'v'" : PICK(elect_values)) : NULL;
		const char *se = chance(30) ? PICK(bools) : NULL;

		appendPQExpBuffer(&b, "SELECT fence, state FROM dlock.observe(%s, %s, %s", key, after,
						  unlimited ? (chance(50) ? "NULL" : "'1000000 years'") : PICK(observe_waits));
		if (sv || se)
			appendPQExpBuffer(&b, ", %s", sv ? sv : "NULL");
		if (se)
			appendPQExpBuffer(&b, ", %s", se);
		appendPQExpBufferStr(&b, ")");
		c->expect = EXP_NOCHANGE;
		c->api = false;
		if (g >= 0 && cmp < 0)
		{
			/* a token below the guard's: its lease, at once */
			c->expect = EXP_VALUE;
			c->expect_value = psprintf("%lld", guard_fence[g]);
		}
		else if (g >= 0 && cmp > 0 && (sv == NULL || strcmp(sv, "NULL") == 0))
			c->expect = EXP_NOROWS;		/* nothing happens to a guard */
		free(after);
		if (unlimited)
		{
			add(c, "BEGIN");
			add(c, "SET LOCAL statement_timeout = '%dms'", 5 + (int) rnd(20));
			add(c, "%s", b.data);
			add(c, "COMMIT");
			call(c);
			termPQExpBuffer(&b);
			return;
		}
	}
	else
	{
		/* the views, with the permits */
		static const char *const views[] = {
			"SELECT count(*), max(permit), count(*) FILTER (WHERE state = 'held') FROM dlock.lease_status WHERE key = %s",
			"SELECT string_agg(coalesce(permit::text, 'x') || state, ',' ORDER BY permit) FROM dlock.lease_status() WHERE key = %s",
			"SELECT count(*) FROM dlock.stats WHERE key = %s OR key LIKE 'fz:%%'",
			"SELECT count(*) FROM dlock.leases WHERE key >= %s AND slots IS NOT NULL",
			"SELECT value, slots FROM dlock.leases WHERE key = %s",
			"SELECT count(*), max(position) FROM dlock.waiters WHERE key = %s",
			"SELECT string_agg(mode || coalesce(permits::text, ''), ',') FROM dlock.waiters() WHERE key >= %s",
		};

		appendPQExpBuffer(&b, PICK(views), key);
		c->expect = EXP_NOCHANGE;
		c->api = false;
	}
	kept = kind_wrap(c, b.data, key);
	termPQExpBuffer(&b);
	/* a leader or observe value string is the call's to free */
	if (c->expect_value && (f >= 54 && f < 68))
	{
		char	   *v = (char *) c->expect_value;

		make_call(c);
		free(v);
		free_call(c);
		return;
	}
	call_remember(c, key, kept);
}

/*
 * --sweep, 0.7 (issue 20): every permits => and every mode => through
 * try_acquire of the kind keys and of a guard key (where nothing may be
 * granted); every election value through campaign of a fresh key, its
 * leader's proclaim and a stranger's proclaim of a guard key; every
 * after_fence and every observe wait on a guard key; every hostile key
 * through two of campaign, a stranger's proclaim, leader, observe, a
 * permit and a shared lease; then permits and shared leases of two kind
 * keys, which the never-issued tokens of the sweep meet, and a key
 * crowded with 1000 shared leases.
 */
static void
gen_kinds_sweep(void)
{
	const char *gk = guard_keys[0];
	int			i;
	Call	   *c;

	for (i = 0; i < (int) lengthof(permit_args) + (int) lengthof(mode_args) && !stop; i++)
	{
		bool		p = i < (int) lengthof(permit_args);
		const PermitArg *pa = p ? &permit_args[i] : NULL;
		const ModeArg *ma = p ? NULL : &mode_args[i - lengthof(permit_args)];
		const char *k = kinds[i % NKIND].key;
		int			j;

		for (j = 0; j < 2; j++)
		{
			c = new_call("kinds", AS_USR, j == 0 ? EXP_ANY : EXP_NOROWS);
			c->api = true;
			c->invariants = true;
			c->strict_seq = true;
			add(c, "SELECT fence, owner FROM dlock.try_acquire(%s, '1 s', %s => %s)",
				j == 0 ? k : gk, p ? "permits" : "mode", p ? pa->sql : ma->sql);
			if (j == 0)
				note_ask(k, pa, ma);
			call_remember(c, k, j == 0);
		}
	}
	for (i = 0; i < (int) lengthof(elect_values) && !stop; i++)
	{
		char	   *k = psprintf("'fz:e%d:%llu'", i, (unsigned long long) run_seed);
		char	   *owner = NULL;

		c = new_call("kinds", AS_USR, EXP_ANY);
		c->api = true;
		c->invariants = true;
		c->strict_seq = true;
		add(c, "SELECT fence, owner FROM dlock.campaign(%s, %s, '1 s', wait => '0')", k, elect_values[i]);
		make_call(c);
		if (!c->sqlstate && c->ntuples == 1 && c->value2)
			owner = psprintf("'%s'::uuid", c->value2);
		free_call(c);
		c = new_call("kinds", AS_USR, owner ? EXP_ANY : EXP_VALUE);
		c->expect_value = "f";
		c->invariants = true;
		add(c, "SELECT dlock.proclaim(%s, %s, %s)", owner ? k : gk,
			owner ? owner : "gen_random_uuid()", elect_values[(i + 1) % lengthof(elect_values)]);
		call(c);
		free(owner);
		free(k);
	}
	for (i = 0; i < (int) lengthof(after_fences) + (int) lengthof(observe_waits) && !stop; i++)
	{
		bool		a = i < (int) lengthof(after_fences);

		c = new_call("kinds", AS_USR, a ? EXP_NOCHANGE : EXP_NOROWS);
		c->refuse_what = "observe() of a guard key reported a change";
		c->invariants = true;
		if (a)
			add(c, "SELECT fence FROM dlock.observe(%s, %s, '0')", gk, after_fences[i]);
		else
			add(c, "SELECT fence FROM dlock.observe(%s, %lld, %s)", gk, guard_fence[0],
				observe_waits[i - lengthof(after_fences)]);
		call(c);
	}
	for (i = 0; i < 2 * (int) lengthof(hostile_keys) && !stop; i++)
	{
		static const char *const fns[] = {
			"SELECT fence FROM dlock.campaign(%s, 'v', '1 s', wait => '0')",
			"SELECT dlock.proclaim(%s, gen_random_uuid(), 'v')",
			"SELECT fence FROM dlock.leader(%s)",
			"SELECT fence FROM dlock.observe(%s, 0, '0')",
			"SELECT fence FROM dlock.try_acquire(%s, '1 s', permits => 2)",
			"SELECT fence FROM dlock.try_acquire(%s, '1 s', mode => 'shared')",
		};
		int			k = i % lengthof(hostile_keys);
		int			fn = (k + (i < (int) lengthof(hostile_keys) ? 0 : 3)) % lengthof(fns);

		c = new_call("kinds", AS_USR, fn == 1 ? EXP_VALUE : fn == 2 || fn == 3 ? EXP_NOCHANGE : EXP_ANY);
		c->expect_value = "f";
		c->api = fn != 1 && fn != 2 && fn != 3;
		c->invariants = true;
		c->strict_seq = true;
		add(c, fns[fn], hostile_keys[k]);
		call(c);
	}
	/* live permits and shared leases for the never-issued tokens */
	for (i = 0; i < 3 && !stop; i++)
	{
		const char *k = kinds[i == 2 ? 4 : 3 * i].key;

		c = new_call("kinds", AS_USR, EXP_ANY);
		c->api = true;
		c->invariants = true;
		add(c, "SELECT fence, owner FROM dlock.try_acquire(%s, '30 s', %s)", k,
			i == 2 ? "mode => 'shared'" : "permits => 3");
		note_ask(k, i == 2 ? NULL : &permit_args[2], i == 2 ? &mode_args[1] : NULL);
		call_remember(c, k, true);
	}
	gen_crowd();
}

/*
 * --sweep: every key shape, every never-issued token, every surface (a key
 * dlock refuses, 10 MB ones among them, is refused before its token is
 * looked at: it takes each surface once, with the tokens in turn); then
 * every wrapper with the current token and with a never-issued one.
 */
static void
gen_sweep(void)
{
	int			nhostile = NPOOL + NGUARD + lengthof(hostile_keys);
	/* since 0.7 also two kind keys, with permits and shared leases */
	int			nkeys = nhostile + (has_kinds ? 2 : 0);
	int			k;
	int			si;
	int			fi;

	if (has_kinds)
		gen_kinds_sweep();
	for (k = 0; k < nkeys && !stop; k++)
	{
		const char *key = k < NPOOL ? pool_keys[k] :
		k < NPOOL + NGUARD ? guard_keys[k - NPOOL] :
		k < nhostile ? hostile_keys[k - NPOOL - NGUARD] :
		kinds[k == nhostile ? 3 : 4].key;
		long long	last = last_token();
		int			t;
		int			surf;
		int			nsurf = k < NPOOL + NGUARD ? NSURF : NSURF_ANY_KEY;

		for (t = 0; t < NNEVER && !stop; t++)
		{
			char	   *tok = never_issued(t, last);

			for (surf = 0; surf < nsurf && !stop; surf++)
				if (key_is_valid(key) || (k + surf) % NNEVER == t)
					present_token("never-issued", (k + t + surf) % 5 == 0 ? AS_SU : AS_USR,
								  key, tok, surf, "a never-issued token");
			free(tok);
		}
	}
	for (si = 0; si < (int) lengthof(wrap_settings) && !stop; si++)
		for (fi = 0; fi < (int) lengthof(wrap_fns) && !stop; fi++)
		{
			if (!wrap_exists(si, fi))
				continue;
			wrap_case(si, fi, 0, (si + fi) % 4 == 0 ? AS_SU : AS_USR);
			if (wrap_fns[fi].held)
				wrap_case(si, fi, 1 + (si + fi) % 2, AS_USR);
		}
}

/* Milliseconds until the horizon passes (negative once it has). */
static long long
horizon_left_ms(void)
{
	PGresult   *res = PQexec(dig, horizon_sql);
	long long	v = -1;

	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
		!PQgetisnull(res, 0, 0))
		v = atoll(PQgetvalue(res, 0, 0));
	PQclear(res);
	return v;
}

/*
 * --horizon: the server has just been restarted in memory mode, and the
 * horizon still holds every key.  No key may be granted, and every token,
 * real ones included (the counter's last, 1, the one before the last), is
 * refused with LF001 through every surface, directly and through every
 * wrapper, check_fence says false; until shortly before the horizon
 * passes.  Returns the number of milliseconds left at the last call.
 */
static long long
gen_horizon(void)
{
	long long	left = horizon_left_ms();
	int64		deadline;
	long long	last = last_token();
	int			nkeys = NPOOL + NGUARD + lengthof(hostile_keys);
	int			k;
	int			t;
	int			surf;
	int			si;
	int			fi;
	Call	   *c;

	printf("horizon: %lld ms ahead, token counter at %lld\n", left, last);
	fflush(stdout);
	if (left < 1000)
	{
		fprintf(stderr, "%s: --horizon: the horizon is not ahead (%lld ms)\n",
				progname, left);
		exit(2);
	}
	/* stop 300 ms early: a call may take that long under load */
	deadline = now_ms() + left - 300;

#define BEFORE_HORIZON() (now_ms() < deadline && !stop && ++horizon_calls)

	/* no key is granted: the one held before the restart, nor a new one */
	for (k = 0; k < 2 && BEFORE_HORIZON(); k++)
	{
		c = new_call("horizon", AS_USR, EXP_NOROWS);
		c->api = true;
		add(c, "SELECT fence FROM dlock.try_acquire(%s, '1 s')",
			k == 0 ? pool_keys[0] : "'fz:horizon-new'");
		call(c);
	}

	/*
	 * 0.7: nor a permit, a shared lease or a leader; nobody leads, nothing
	 * is observed (the key's state is not known), no proclaim is accepted
	 */
	for (k = 0; has_kinds && k < NKIND + NPOOL; k++)
	{
		static const struct
		{
			Expect		expect;
			const char *sql;
			const char *what;
		}			checks[] = {
			{EXP_NOROWS, "SELECT fence FROM dlock.try_acquire(%s, '1 s', permits => 3)", "a permit granted during the horizon"},
			{EXP_NOROWS, "SELECT fence FROM dlock.try_acquire(%s, '1 s', mode => 'shared')", "a shared lease granted during the horizon"},
			{EXP_REFUSE, "SELECT fence FROM dlock.acquire(%s, '1 s', wait => '1 ms', permits => 2)", "a permit granted during the horizon"},
			{EXP_REFUSE, "SELECT fence FROM dlock.campaign(%s, 'v', '1 s', wait => '0')", "an election won during the horizon"},
			{EXP_NOROWS, "SELECT fence FROM dlock.leader(%s)", "a leader shown during the horizon"},
			{EXP_NOROWS, "SELECT state FROM dlock.observe(%s, 0, '0')", "a state observed during the horizon"},
			{EXP_VALUE, "SELECT dlock.proclaim(%s, gen_random_uuid(), 'v')", NULL},
		};
		int			i;

		for (i = 0; i < (int) lengthof(checks) && BEFORE_HORIZON(); i++)
		{
			c = new_call("horizon-kinds", AS_USR, checks[i].expect);
			c->api = true;
			c->uses_dlock = true;
			c->refuse_what = checks[i].what;
			c->expect_value = "f";
			add(c, checks[i].sql, kinds[k].key);
			call(c);
		}
	}

	/* the first pool key (held before the restart) through every wrapper */
	for (si = 0; si < (int) lengthof(wrap_settings); si++)
		for (fi = 0; fi < (int) lengthof(wrap_fns); fi++)
		{
			const WrapFn *wf = &wrap_fns[fi];

			if (!wf->token || !wrap_exists(si, fi) || !BEFORE_HORIZON())
				continue;
			c = new_call("horizon-wrapped", wrap_settings[si].su_only ? AS_SU : AS_USR,
						 strcmp(wf->name, "check") == 0 ? EXP_VALUE : EXP_REFUSE);
			c->expect_value = "f";
			c->refuse_what = "a token during the horizon";
			c->uses_dlock = true;
			add(c, "SELECT fz.w_%s_%s(%s, NULL, '5 s', %lld)",
				wrap_settings[si].name, wf->name, pool_keys[0], last);
			call(c);
		}

	/* every valid key shape, every token, every surface */
	for (k = 0; k < nkeys; k++)
	{
		const char *key = k < NPOOL ? pool_keys[k] :
		k < NPOOL + NGUARD ? guard_keys[k - NPOOL] :
		hostile_keys[k - NPOOL - NGUARD];
		int			nsurf = k < NPOOL + NGUARD ? NSURF : NSURF_ANY_KEY;

		if (!key_is_valid(key))
			continue;
		for (t = 0; t < NNEVER + 3; t++)
		{
			char	   *tok;

			if (t < NNEVER)
				tok = never_issued(t, last);
			else
				tok = psprintf("%lld", t == NNEVER ? last :
							   t == NNEVER + 1 ? 1 : last - 1);
			for (surf = 0; surf < nsurf; surf++)
				if (BEFORE_HORIZON())
					present_token("horizon", (k + t + surf) % 5 == 0 ? AS_SU : AS_USR,
								  key, tok, surf, "a token during the horizon");
			free(tok);
		}
	}
#undef BEFORE_HORIZON
	return horizon_left_ms();
}

/* ---- setup --------------------------------------------------------------- */

/* Create what the run needs; idempotent. */
static void
setup(uint64 seed)
{
	PQExpBufferData t;
	int			i;
	char	   *sql;

	must(dig, "CREATE EXTENSION IF NOT EXISTS dlock");
	has_kinds = strcmp(must_value(dig, "SELECT to_regproc('dlock.campaign') IS NOT NULL"), "t") == 0;
	memory_mode = strcmp(must_value(dig, "SELECT coalesce(current_setting('dlock.storage', true), '')"),
						 "memory") == 0;
	sql = psprintf("DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '%s') "
				   "THEN CREATE ROLE %s LOGIN; END IF; END$$", role, role);
	must(dig, sql);
	free(sql);
	sql = psprintf("DROP OWNED BY %s CASCADE", role);
	must(dig, sql);
	free(sql);
	sql = psprintf("DO $$BEGIN EXECUTE format('GRANT CREATE ON DATABASE %%I TO %s', current_database()); END$$", role);
	must(dig, sql);
	free(sql);
	sql = psprintf("GRANT CREATE, USAGE ON SCHEMA public TO %s", role);
	must(dig, sql);
	free(sql);
	must(dig, "DROP SCHEMA IF EXISTS fz CASCADE");
	must(dig, "CREATE SCHEMA fz");
	must(dig,
		 "CREATE DOMAIN fz.dom_text AS text CHECK (VALUE <> 'bad');"
		 "CREATE DOMAIN fz.dom_int AS int CHECK (VALUE > 0);"
		 "CREATE TYPE fz.mood AS ENUM ('happy', 'sad');"
		 "CREATE TABLE fz.t_text (k text PRIMARY KEY, v int NOT NULL DEFAULT 0, fence bigint);"
		 "CREATE TRIGGER guard BEFORE INSERT OR UPDATE OR DELETE ON fz.t_text FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{k}', 'fence');"
		 "CREATE TABLE fz.t_mono (k text PRIMARY KEY, v int NOT NULL DEFAULT 0, fence bigint);"
		 "CREATE TRIGGER guard BEFORE INSERT OR UPDATE OR DELETE ON fz.t_mono FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{k}', 'fence', 'monotonic');"
		 "CREATE TABLE fz.t_usefence (k text PRIMARY KEY, v int NOT NULL DEFAULT 0);"
		 "CREATE TRIGGER guard BEFORE INSERT OR UPDATE OR DELETE ON fz.t_usefence FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{k}');"
		 "CREATE TABLE fz.t_hist (k text NOT NULL, v int, fence bigint);"
		 "CREATE TRIGGER guard BEFORE INSERT OR UPDATE OR DELETE ON fz.t_hist FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{k}', 'fence');"
		 "CREATE TABLE fz.parted (part int NOT NULL, k text NOT NULL, v int NOT NULL DEFAULT 0, fence bigint) PARTITION BY LIST (part);"
		 "CREATE TABLE fz.parted_1 PARTITION OF fz.parted FOR VALUES IN (1);"
		 "CREATE TABLE fz.parted_2 PARTITION OF fz.parted FOR VALUES IN (2);"
		 "CREATE TRIGGER guard BEFORE INSERT OR UPDATE OR DELETE ON fz.parted FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{k}', 'fence');"
		 "CREATE TABLE fz.inh_parent (k text NOT NULL, v int NOT NULL DEFAULT 0, fence bigint);"
		 "CREATE TABLE fz.inh_child (extra int) INHERITS (fz.inh_parent);"
		 "CREATE TRIGGER guard BEFORE INSERT OR UPDATE OR DELETE ON fz.inh_parent FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{k}', 'fence');"
		 "CREATE TRIGGER guard BEFORE INSERT OR UPDATE OR DELETE ON fz.inh_child FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{k}', 'fence');"
		 "CREATE VIEW fz.v_auto AS SELECT * FROM fz.t_text;"
		 "CREATE VIEW fz.v_check AS SELECT * FROM fz.t_hist WHERE v >= 0 WITH CHECK OPTION;"
		 "CREATE VIEW fz.v_instead AS SELECT k, v, fence FROM fz.t_text;"
		 "CREATE FUNCTION fz.v_instead_upd() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
		 " UPDATE fz.t_text SET v = NEW.v, fence = NEW.fence WHERE k = OLD.k; RETURN NEW; END$$;"
		 "CREATE TRIGGER instead INSTEAD OF UPDATE ON fz.v_instead FOR EACH ROW EXECUTE FUNCTION fz.v_instead_upd();");
	for (i = 0; i < (int) lengthof(odd_types); i++)
	{
		sql = psprintf("CREATE TABLE fz.odd_%s (c %s, fence bigint);"
					   "CREATE TRIGGER guard BEFORE INSERT OR UPDATE OR DELETE ON fz.odd_%s "
					   "FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('odd:{c}', 'fence')",
					   odd_types[i].name, odd_types[i].type, odd_types[i].name);
		must(dig, sql);
		free(sql);
	}
	sql = psprintf("GRANT USAGE ON SCHEMA fz TO %s;"
				   "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA fz TO %s",
				   role, role);
	must(dig, sql);
	free(sql);

	/* keys, guards and their rows */
	for (i = 0; i < NPOOL; i++)
		pool_keys[i] = psprintf("'fz:k%d'", i);
	for (i = 0; i < NKIND + NPOOL; i++)
	{
		static const char *const kind_keys[NKIND] = {
			"'fz:p0'", "'fz:p1'", "'fz:p2'", "repeat('p', 512)",
			"repeat('q', 510) || E'\\u00e9'", "repeat(E'\\U0001F601', 128)",
		};

		kinds[i].key = i < NKIND ? kind_keys[i] : pool_keys[i - NKIND];
		kinds[i].max_permits = 1;
	}
	for (i = 0; i < NGUARD; i++)
	{
		char	   *v;

		guard_keys[i] = psprintf("'fz:g%d:%llu'", i, (unsigned long long) seed);
		/* during the horizon no key can be granted: they are just keys */
		if (horizon)
			continue;
		sql = psprintf("SELECT count(*) FROM dlock.try_acquire(%s, '1 hour', holder => 'dlock-fuzz guard')",
					   guard_keys[i]);
		must(dig, sql);
		free(sql);
		sql = psprintf("SELECT fence FROM dlock.lease_status WHERE key = %s AND state = 'held' "
					   "AND remaining > '10 min'", guard_keys[i]);
		v = must_value(dig, sql);
		guard_fence[i] = atoll(v);
		free(v);
		free(sql);
	}
	must(dig, "SET dlock.fence_bypass = on");
	for (i = 0; i < NPOOL + NGUARD; i++)
	{
		const char *k = i < NPOOL ? pool_keys[i] : guard_keys[i - NPOOL];

		sql = psprintf("INSERT INTO fz.t_text VALUES (%s, 0, 0);"
					   "INSERT INTO fz.t_mono VALUES (%s, 0, 0);"
					   "INSERT INTO fz.t_usefence VALUES (%s, 0);"
					   "INSERT INTO fz.t_hist VALUES (%s, 0, 0);"
					   "INSERT INTO fz.parted VALUES (%d, %s, 0, 0);"
					   "INSERT INTO fz.inh_parent VALUES (%s, 0, 0);"
					   "INSERT INTO fz.inh_child VALUES (%s, 0, 0, 1)",
					   k, k, k, k, 1 + i % 2, k, k, k);
		must(dig, sql);
		free(sql);
	}
	must(dig, "RESET dlock.fence_bypass");

	/*
	 * The wrappers (issue 18): every call of wrap_fns in a function with a
	 * SET clause of wrap_settings, fz.w_<setting>_<call>(key, owner, ttl,
	 * token).  Made by the superuser, so that the settings only a
	 * superuser may set can be in them; called by whoever may set them.
	 */
	initPQExpBuffer(&t);
	for (i = 0; i < (int) lengthof(wrap_settings); i++)
	{
		int			j;

		for (j = 0; j < (int) lengthof(wrap_fns); j++)
			if (wrap_exists(i, j))
				appendPQExpBuffer(&t, "CREATE FUNCTION fz.w_%s_%s(k text, o uuid, t interval, f bigint) "
							  "RETURNS %s LANGUAGE sql SET %s AS $w$%s$w$;\n",
							  wrap_settings[i].name, wrap_fns[j].name,
							  wrap_fns[j].rettype, wrap_settings[i].set,
							  wrap_fns[j].body);
	}
	must(dig, t.data);
	termPQExpBuffer(&t);

	/* which hostile keys dlock takes as keys (1 to 512 bytes of UTF-8) */
	for (i = 0; i < (int) lengthof(hostile_keys); i++)
	{
		PGresult   *res;

		sql = psprintf("SELECT octet_length(k) BETWEEN 1 AND 512%s FROM (SELECT %s AS k) s",
					   has_kinds ? " AND strpos(k, chr(31)) = 0" : "", hostile_keys[i]);
		res = PQexec(dig, sql);
		hostile_valid[i] = PQresultStatus(res) == PGRES_TUPLES_OK &&
			PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
		PQclear(res);
		free(sql);
	}

	/*
	 * The token counter: dlock.token_seq since 0.6, dlock.fence_seq
	 * before.  The horizon: the later of dlock.horizon_seq and (0.6)
	 * dlock.horizon_mark, microseconds since 2000-01-01.
	 */
	if (strcmp(must_value(dig, "SELECT to_regclass('dlock.token_seq') IS NOT NULL"), "t") == 0)
		token_sql = "SELECT last_value FROM dlock.token_seq";
	else
		token_sql = "SELECT last_value FROM dlock.fence_seq";
	horizon_sql = psprintf("SELECT (extract(epoch FROM timestamptz '2000-01-01 00:00:00+00' "
						   "+ greatest(h.last_value, %s) * interval '1 microsecond' "
						   "- clock_timestamp()) * 1000)::bigint FROM dlock.horizon_seq h",
						   strcmp(must_value(dig, "SELECT to_regclass('dlock.horizon_mark') IS NOT NULL"), "t") == 0 ?
						   "(SELECT last_value FROM dlock.horizon_mark)" : "0");

	/* the protected tables' part of the digest */
	for (i = 0; i < 2; i++)
	{
		PGresult   *res = PQexec(dig, i == 0 ?
								 "SELECT relname FROM pg_class WHERE relnamespace = 'fz'::regnamespace "
								 "AND relkind = 'r' AND relname NOT LIKE 'odd\\_%' ORDER BY relname" :
								 "SELECT relname FROM pg_class WHERE relnamespace = 'fz'::regnamespace "
								 "AND relkind = 'r' AND relname LIKE 'odd\\_%' ORDER BY relname");
		int			j;

		initPQExpBuffer(&t);
		appendPQExpBufferStr(&t, "md5(''");
		for (j = 0; j < PQntuples(res); j++)
			appendPQExpBuffer(&t, " || (SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text COLLATE \"C\"), '')) FROM ONLY fz.%s t)",
							  PQgetvalue(res, j, 0));
		PQclear(res);
		appendPQExpBufferStr(&t, ")");
		if (i == 0)
			tables_sql = t.data;
		else
			odd_tables_sql = t.data;
	}

	/* what the ordinary role makes for itself */
	usr = connect_as(role, "dlock-fuzz-usr", "-c statement_timeout=10s");
	if (PQstatus(usr) != CONNECTION_OK)
		exit(2);
	must(usr,
		 "CREATE SCHEMA evil;"
		 "CREATE FUNCTION evil.always(uuid, uuid) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true';"
		 "CREATE FUNCTION evil.always(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true';"
		 "CREATE FUNCTION evil.always(bigint, bigint) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true';"
		 "CREATE FUNCTION evil.always(timestamptz, timestamptz) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true';"
		 "CREATE OPERATOR evil.= (leftarg = uuid, rightarg = uuid, function = evil.always);"
		 "CREATE OPERATOR evil.= (leftarg = text, rightarg = text, function = evil.always);"
		 "CREATE OPERATOR evil.= (leftarg = bigint, rightarg = bigint, function = evil.always);"
		 "CREATE OPERATOR evil.<> (leftarg = bigint, rightarg = bigint, function = evil.always);"
		 "CREATE OPERATOR evil.< (leftarg = bigint, rightarg = bigint, function = evil.always);"
		 "CREATE OPERATOR evil.> (leftarg = bigint, rightarg = bigint, function = evil.always);"
		 "CREATE OPERATOR evil.< (leftarg = timestamptz, rightarg = timestamptz, function = evil.always);"
		 "CREATE OPERATOR evil.> (leftarg = timestamptz, rightarg = timestamptz, function = evil.always);"
		 "CREATE OPERATOR evil.<= (leftarg = timestamptz, rightarg = timestamptz, function = evil.always);"
		 "CREATE OPERATOR evil.>= (leftarg = timestamptz, rightarg = timestamptz, function = evil.always);"
		 "CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$SELECT 'infinity'::timestamptz$$;"
		 "CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$SELECT '2000-01-01'::timestamptz$$;"
		 "CREATE FUNCTION evil.statement_timestamp() RETURNS timestamptz LANGUAGE sql AS $$SELECT '2000-01-01'::timestamptz$$;"
		 "CREATE FUNCTION evil.nextval(regclass) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint';"
		 "CREATE FUNCTION evil.setval(regclass, bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint';"
		 "CREATE FUNCTION evil.gen_random_uuid() RETURNS uuid LANGUAGE sql AS $$SELECT '00000000-0000-0000-0000-000000000000'::uuid$$;"
		 "CREATE FUNCTION evil.current_setting(text) RETURNS text LANGUAGE sql AS $$SELECT 'on'$$;"
		 "CREATE FUNCTION evil.current_setting(text, boolean) RETURNS text LANGUAGE sql AS $$SELECT 'on'$$;"
		 "CREATE FUNCTION evil.has_parameter_privilege(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';"
		 "CREATE FUNCTION evil.has_parameter_privilege(name, text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';"
		 "CREATE FUNCTION evil.pg_has_role(name, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';"
		 "CREATE FUNCTION evil.superuser() RETURNS boolean LANGUAGE sql AS 'SELECT true';"
		 "CREATE FUNCTION evil.texteq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';"
		 "CREATE FUNCTION evil.uuid_eq(uuid, uuid) RETURNS boolean LANGUAGE sql AS 'SELECT true';"
		 "CREATE FUNCTION evil.int8eq(bigint, bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true';"
		 "CREATE FUNCTION evil.hashtext(text) RETURNS int LANGUAGE sql AS 'SELECT 0';"
		 "CREATE FUNCTION evil.sha256(bytea) RETURNS bytea LANGUAGE sql AS $$SELECT '\\x00'::bytea$$;"
		 "CREATE FUNCTION evil.dlock_try_acquire(text, interval) RETURNS int LANGUAGE sql AS 'SELECT 1';"
		 "CREATE FUNCTION evil.try_acquire(text, interval, text DEFAULT NULL, interval DEFAULT NULL, boolean DEFAULT false) RETURNS int LANGUAGE sql AS 'SELECT 1';"
		 "CREATE FUNCTION evil.fence_guard() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';"
		 "CREATE FUNCTION evil.trg() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';"
		 "CREATE FUNCTION evil.evt() RETURNS event_trigger LANGUAGE plpgsql AS 'BEGIN END';"
		 "CREATE TABLE evil.leases (key text PRIMARY KEY, fence bigint, owner uuid, expires_at timestamptz, holder text, granted_at timestamptz);"
		 "CREATE SEQUENCE evil.fence_seq;"
		 "CREATE TYPE evil.lease AS (key text, owner uuid, fence bigint, expires_at timestamptz);"
		 "CREATE TEMP TABLE leases (key text, fence bigint, owner uuid, expires_at timestamptz);"
		 "CREATE VIEW public.owner_view AS SELECT key, owner FROM dlock.leases;"
		 "CREATE TABLE public.mine (k text, fence bigint);"
		 "CREATE TRIGGER guard BEFORE INSERT OR UPDATE OR DELETE ON public.mine FOR EACH ROW EXECUTE FUNCTION dlock.fence_guard('{k}', 'fence');"
		 "CREATE TABLE public.tpl (a text, b text, c int, g json, fence bigint, \"A\" text, ab text);"
		 "CREATE FUNCTION public.par_try(k text) RETURNS bigint LANGUAGE plpgsql PARALLEL SAFE AS $$BEGIN RETURN (SELECT count(*) FROM dlock.try_acquire(k, '20 ms')); END$$;"
		 "CREATE FUNCTION public.par_acquire(k text) RETURNS bigint LANGUAGE plpgsql PARALLEL RESTRICTED AS $$BEGIN RETURN (SELECT fence FROM dlock.acquire(k, '20 ms', wait => '1 ms')); END$$;"
		 "CREATE FUNCTION public.par_use(k text, f bigint) RETURNS void LANGUAGE plpgsql PARALLEL SAFE AS $$BEGIN PERFORM dlock.use_fence(k, f); END$$;"
		 "CREATE FUNCTION public.par_check(k text, f bigint) RETURNS boolean LANGUAGE plpgsql PARALLEL SAFE AS $$BEGIN RETURN dlock.check_fence(k, f); END$$;"
		 "CREATE FUNCTION public.par_renew(k text) RETURNS timestamptz LANGUAGE plpgsql PARALLEL SAFE AS $$BEGIN RETURN dlock.renew(k, gen_random_uuid(), '1 s'); END$$;"
		 "CREATE FUNCTION public.par_release(k text) RETURNS boolean LANGUAGE plpgsql PARALLEL SAFE AS $$BEGIN RETURN dlock.release(k, gen_random_uuid()); END$$;"
		 "CREATE FUNCTION public.par_status(k text) RETURNS bigint LANGUAGE plpgsql PARALLEL SAFE AS $$BEGIN RETURN (SELECT count(*) FROM dlock.lease_status WHERE key = k); END$$;"
		 "CREATE FUNCTION public.par_stats(k text) RETURNS bigint LANGUAGE plpgsql PARALLEL SAFE AS $$BEGIN RETURN (SELECT count(*) FROM dlock.stats WHERE key = k); END$$;");
}

/*
 * Look for signs of a crash in the server log written since we started,
 * and for any FATAL: nothing the generator does may end a session so.
 */
static void
check_server_log(bool at_start)
{
	FILE	   *f;
	char		line[8192];

	if (!server_log)
		return;
	f = fopen(server_log, "r");
	if (!f)
	{
		fprintf(stderr, "%s: cannot open %s: %m\n", progname, server_log);
		exit(2);
	}
	if (at_start)
	{
		fseek(f, 0, SEEK_END);
		log_offset = ftell(f);
		fclose(f);
		return;
	}
	fseek(f, log_offset, SEEK_SET);
	while (fgets(line, sizeof(line), f))
	{
		if (strstr(line, "PANIC") || strstr(line, "TRAP") ||
			strstr(line, "terminated by signal") ||
			strstr(line, "was terminated by exception") ||
			strstr(line, "terminating any other active server processes") ||
			strstr(line, "all server processes terminated"))
		{
			crashes++;
			violation(NULL, "server log: %.400s", line);
		}
		else if (strstr(line, "FATAL:"))
			violation(NULL, "server log: %.400s", line);
	}
	fclose(f);
}

/* Print the help. */
static void
usage(void)
{
	printf("%s makes calls of every function of the dlock extension with hostile\n"
		   "arguments, and attacks as an ordinary role, checking that nothing crashes\n"
		   "and that every refused call changes nothing.\n\n", progname);
	printf("Usage:\n  %s --calls N [--seed X] [OPTION]...\n\n", progname);
	printf("Options:\n"
		   "  -n, --calls=N         number of calls to make (default 1000)\n"
		   "  -s, --seed=X          seed of the generator (default: random, printed)\n"
		   "      --role=NAME       ordinary role to create and attack with (default dlock_fuzz)\n"
		   "      --server-log=FILE look for PANIC, TRAP and signal deaths in FILE\n"
		   "      --inject=SQL      also make this call as an attack that must be\n"
		   "                        refused (to see the checker go red)\n"
		   "      --sweep           first present every never-issued token for every\n"
		   "                        key shape through every fencing surface, and make\n"
		   "                        every wrapped call\n"
		   "      --horizon         the server was just restarted in memory mode: check\n"
		   "                        that every token is refused until the horizon, then\n"
		   "                        stop (no other calls)\n"
		   "  -v, --verbose         print every call\n"
		   "  -d, --dbname=CONNSTR  database or connection string (as a superuser)\n"
		   "  -h, --host=HOST       -p, --port=PORT       -U, --username=USER\n"
		   "      --help            show this help\n\n"
		   "Exit status: 0 no violation, 1 violations (printed), 2 bad usage or setup.\n");
}

int
main(int argc, char **argv)
{
	static struct option long_options[] = {
		{"calls", required_argument, NULL, 'n'},
		{"seed", required_argument, NULL, 's'},
		{"dbname", required_argument, NULL, 'd'},
		{"host", required_argument, NULL, 'h'},
		{"port", required_argument, NULL, 'p'},
		{"username", required_argument, NULL, 'U'},
		{"verbose", no_argument, NULL, 'v'},
		{"role", required_argument, NULL, 1},
		{"server-log", required_argument, NULL, 2},
		{"inject", required_argument, NULL, 3},
		{"help", no_argument, NULL, 4},
		{"sweep", no_argument, NULL, 5},
		{"horizon", no_argument, NULL, 6},
		{NULL, 0, NULL, 0}
	};
	long		ncalls = 1000;
	uint64		seed;
	bool		seeded = false;

	int			opt;
	int			i;
	int64		start;
	char	   *err;
	char	   *sql;

	while ((opt = getopt_long(argc, argv, "n:s:d:h:p:U:v", long_options, NULL)) != -1)
	{
		switch (opt)
		{
			case 'n':
				ncalls = atol(optarg);
				break;
			case 's':
				seed = strtoull(optarg, NULL, 10);
				seeded = true;
				break;
			case 'd':
				keywords[nconnopts] = "dbname";
				values[nconnopts++] = optarg;
				break;
			case 'h':
				keywords[nconnopts] = "host";
				values[nconnopts++] = optarg;
				break;
			case 'p':
				keywords[nconnopts] = "port";
				values[nconnopts++] = optarg;
				break;
			case 'U':
				keywords[nconnopts] = "user";
				values[nconnopts++] = optarg;
				break;
			case 'v':
				verbose = true;
				break;
			case 1:
				role = optarg;
				break;
			case 2:
				server_log = optarg;
				break;
			case 3:
				inject = optarg;
				break;
			case 4:
				usage();
				exit(0);
			case 5:
				sweep = true;
				break;
			case 6:
				horizon = true;
				break;
			default:
				fprintf(stderr, "Try \"%s --help\" for more information.\n", progname);
				exit(2);
		}
		if (nconnopts >= 6)
		{
			fprintf(stderr, "%s: too many connection options\n", progname);
			exit(2);
		}
	}
	if (optind < argc || ncalls <= 0)
	{
		fprintf(stderr, "%s: bad arguments; try \"%s --help\"\n", progname, progname);
		exit(2);
	}
	for (i = 0; role[i]; i++)
		if (!(role[i] >= 'a' && role[i] <= 'z') && role[i] != '_' &&
			!(role[i] >= '0' && role[i] <= '9'))
		{
			fprintf(stderr, "%s: --role must be a lower-case name\n", progname);
			exit(2);
		}
	if (!seeded)
	{
		struct timeval tv;

		gettimeofday(&tv, NULL);
		seed = ((uint64) tv.tv_sec * 1000003) ^ tv.tv_usec ^ ((uint64) getpid() << 20);
		seed %= UINT64CONST(1000000000000);
	}
	rng_state = seed;
	run_seed = seed;
	printf("dlock-fuzz: seed %llu, %ld calls\n", (unsigned long long) seed, ncalls);
	fflush(stdout);

	sql = psprintf("-c search_path=pg_catalog -c dlock_fuzz.role=%s", role);
	dig = connect_as(NULL, "dlock-fuzz-digest", sql);
	if (PQstatus(dig) != CONNECTION_OK)
		exit(2);
	if (strcmp(must_value(dig, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"), "t") != 0)
	{
		fprintf(stderr, "%s: connect as a superuser (it creates the role %s)\n", progname, role);
		exit(2);
	}
	digest_pid = must_value(dig, "SELECT pg_backend_pid()");
	superuser_name = must_value(dig, "SELECT quote_ident(current_user)");
	dbname_q = must_value(dig, "SELECT quote_ident(current_database())");
	su = connect_as(NULL, "dlock-fuzz-su", "-c statement_timeout=10s");
	if (PQstatus(su) != CONNECTION_OK)
		exit(2);
	check_server_log(true);
	setup(seed);
	prepare_digest();
	if (!read_digest(&cur, true, &err))
	{
		fprintf(stderr, "%s: cannot read the state: %s", progname, err);
		exit(2);
	}

	start = now_ms();
	if (horizon)
	{
		long long	left = gen_horizon();

		printf("horizon: %ld calls made before it, the last %lld ms before it passed\n",
			   horizon_calls, left);
		ncalls = 0;
	}
	else if (sweep)
	{
		gen_sweep();
		ncalls += calls_made;	/* --calls counts the random calls */
	}
	check_invariants(NULL);
	while (calls_made < ncalls && !stop)
	{
		/* calls in a hundred of each generator; since 0.7 the kinds too */
		static const int mix06[] = {30, 22, 8, 6, 1, 7, 1, 3, 2, 0, 20};
		static const int mix07[] = {26, 20, 7, 5, 1, 6, 1, 3, 2, 12, 17};
		static void (*const gen[]) (void) = {
			gen_api, gen_write, gen_odd, gen_template, gen_parallel,
			gen_session, gen_reconnect, gen_never_issued, gen_wrapped,
			gen_kinds, gen_attack,
		};
		const int  *mix = has_kinds ? mix07 : mix06;
		int			r = rnd(100);
		int			g;

		if (calls_made % 500 == 499)
			maintain();
		for (g = 0; r >= mix[g]; g++)
			r -= mix[g];
		gen[g] ();
	}
	if (!stop)
		check_invariants(NULL);
	check_server_log(false);

	/* the histograms */
	printf("SQLSTATE histogram (%ld calls in %.1f s):\n", calls_made,
		   (now_ms() - start) / 1000.0);
	for (i = 0; i < nstates; i++)
	{
		int			j;
		int			best = i;
		Count		tmp;

		for (j = i + 1; j < nstates; j++)
			if (states[j].n > states[best].n)
				best = j;
		tmp = states[i];
		states[i] = states[best];
		states[best] = tmp;
		printf("  %-8s %7ld\n", states[i].name, states[i].n);
	}
	printf("by category and SQLSTATE:\n");
	for (i = 0; i < ncats; i++)
		printf("  %-24s %7ld\n", cats[i].name, cats[i].n);
	printf("attacks refused: %ld, stale writes refused: %ld, writes under the current token accepted: %ld\n",
		   forgeries_refused, stale_refused, accepted_writes);
	printf("never-issued tokens (and tokens during the horizon) refused: %ld, wrapped calls compared with direct ones: %ld\n",
		   tokens_refused, wrapped_cases);
	if (has_kinds)
		printf("permits, shared leases and elections: %ld calls, %ld leases granted to known owners, %ld observe races checked, %ld invariant checks, %ld notifications\n",
			   kinds_calls, kinds_leases, observe_races, invariant_checks, notifications);
	printf("time spent reading the state: %.1f s (and checking invariants: %.1f s); in calls:",
		   digest_ms / 1000.0, invariants_ms / 1000.0);
	for (i = 0; i < ntimes; i++)
		printf(" %s %.1f s", times[i].name, times[i].n / 1000.0);
	printf("\n");
	printf("crashes: %ld, violations: %ld\n", crashes, violations);
	if (violations > MAX_SHOWN)
		printf("(only the first %d violations were printed)\n", MAX_SHOWN);
	PQfinish(usr);
	PQfinish(su);
	PQfinish(dig);
	return violations ? 1 : 0;
}
