/*-------------------------------------------------------------------------
 *
 * main.c
 *	  The dlock command-line client: run a program under a lease of the
 *	  dlock extension or while leader of an election, or grant, renew,
 *	  release and show leases and leaders.
 *
 *	  dlock [CONNECTION-OPTION]... COMMAND [OPTION]... ARGS
 *
 * This file parses the command line, prints the help texts, and carries
 * out the one-query commands (acquire, renew, release, status, proclaim).
 * The run and elect commands live in run.c, leader in leader.c,
 * connections and error reporting in conn.c.
 *
 * All SQL is fixed text calling the extension's functions by their
 * schema-qualified names, with every user-supplied value passed as a
 * parameter (PQexecParams / PQsendQueryParams, unnamed statements only, so
 * that it works through PgBouncer's transaction pooling).
 *
 * client/main.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres_fe.h"

#include <ctype.h>
#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include "client.h"
#include "pqexpbuffer.h"

/*
 * remaining_ms: the lease's expiry minus the server's clock, read after the
 * grant or renewal.  It is a duration measured by the server alone, never
 * compared with our clock; it is shorter than the TTL asked for when
 * dlock.max_hold cut the lease short.  Rounded down: send time + a duration
 * rounded up could end after the server's expiry (over a Unix socket the
 * round trip is shorter than the half millisecond rounding adds).
 */
#define REMAINING_MS(col) \
	"pg_catalog.floor(pg_catalog.date_part('epoch', " col " OPERATOR(pg_catalog.-) " \
	"pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8"

#define LEASE_COLUMNS \
	"SELECT l.key, l.owner, l.fence, l.expires_at, " REMAINING_MS("l.expires_at")

const char *const dlock_sql_try_acquire =
LEASE_COLUMNS " FROM dlock.try_acquire($1, $2::pg_catalog.interval, "
"holder => $3) AS l";
const char *const dlock_sql_try_acquire_sb =
LEASE_COLUMNS " FROM dlock.try_acquire($1, $2::pg_catalog.interval, "
"holder => $3, session_bound => true) AS l";
const char *const dlock_sql_acquire =
LEASE_COLUMNS " FROM dlock.acquire($1, $2::pg_catalog.interval, "
"wait => $3::pg_catalog.interval, holder => $4) AS l";
const char *const dlock_sql_acquire_sb =
LEASE_COLUMNS " FROM dlock.acquire($1, $2::pg_catalog.interval, "
"wait => $3::pg_catalog.interval, holder => $4, session_bound => true) AS l";
const char *const dlock_sql_renew =
"SELECT e, " REMAINING_MS("e")
" FROM dlock.renew($1, $2::pg_catalog.uuid, $3::pg_catalog.interval) AS e";
const char *const dlock_sql_release =
"SELECT dlock.release($1, $2::pg_catalog.uuid)";

/* wait and lock_delay may be NULL: no limit, no delay */
const char *const dlock_sql_campaign =
LEASE_COLUMNS " FROM dlock.campaign($1, $2, $3::pg_catalog.interval, "
"wait => $4::pg_catalog.interval, holder => $5, "
"lock_delay => $6::pg_catalog.interval, session_bound => $7::pg_catalog.bool) AS l";

static const char *const sql_proclaim =
"SELECT dlock.proclaim($1, $2::pg_catalog.uuid, $3)";

static const char *const sql_status =
"SELECT key, holder, fence, granted_at, expires_at, remaining, state, pid, "
"application_name, session_bound FROM dlock.lease_status ORDER BY key";
static const char *const sql_status_key =
"SELECT key, holder, fence, granted_at, expires_at, remaining, state, pid, "
"application_name, session_bound FROM dlock.lease_status "
"WHERE key OPERATOR(pg_catalog.=) $1 ORDER BY key";

/* Which commands take an option */
#define FOR_RUN		0x01
#define FOR_ACQUIRE 0x02
#define FOR_RENEW	0x04
#define FOR_RELEASE 0x08
#define FOR_STATUS	0x10
#define FOR_ELECT	0x20
#define FOR_LEADER	0x40
#define FOR_PROCLAIM 0x80
#define FOR_ALL		0xff

/* Commands that run a COMMAND (after their last argument or "--") */
#define FOR_EXEC	(FOR_RUN | FOR_ELECT)

typedef enum OptId
{
	OPT_DBNAME,
	OPT_HOST,
	OPT_PORT,
	OPT_USERNAME,
	OPT_NO_PASSWORD,
	OPT_HELP,
	OPT_VERSION,
	OPT_TTL,
	OPT_WAIT,
	OPT_HOLDER,
	OPT_SESSION_BOUND,
	OPT_ON_LOST,
	OPT_GRACE,
	OPT_SKIP_OK,
	OPT_RENEW_EVERY,
	OPT_FORMAT,
	OPT_LOCK_DELAY,
	OPT_WATCH
} OptId;

typedef struct OptDef
{
	const char *name;			/* long name */
	char		short_name;		/* or '\0' */
	bool		has_arg;
	int			commands;		/* FOR_* bits */
	OptId		id;
} OptDef;

static const OptDef optdefs[] = {
	{"dbname", 'd', true, FOR_ALL, OPT_DBNAME},
	{"host", 'h', true, FOR_ALL, OPT_HOST},
	{"port", 'p', true, FOR_ALL, OPT_PORT},
	{"username", 'U', true, FOR_ALL, OPT_USERNAME},
	{"no-password", 'w', false, FOR_ALL, OPT_NO_PASSWORD},
	{"help", '?', false, FOR_ALL, OPT_HELP},
	{"version", 'V', false, FOR_ALL, OPT_VERSION},
	{"ttl", '\0', true, FOR_EXEC | FOR_ACQUIRE | FOR_RENEW, OPT_TTL},
	{"wait", '\0', true, FOR_EXEC | FOR_ACQUIRE, OPT_WAIT},
	{"holder", '\0', true, FOR_EXEC | FOR_ACQUIRE, OPT_HOLDER},
	{"session-bound", '\0', false, FOR_EXEC, OPT_SESSION_BOUND},
	{"on-lost", '\0', true, FOR_EXEC, OPT_ON_LOST},
	{"grace", '\0', true, FOR_EXEC, OPT_GRACE},
	{"skip-ok", '\0', false, FOR_EXEC, OPT_SKIP_OK},
	{"renew-every", '\0', true, FOR_EXEC, OPT_RENEW_EVERY},
	{"lock-delay", '\0', true, FOR_ELECT, OPT_LOCK_DELAY},
	{"format", '\0', true, FOR_ACQUIRE | FOR_STATUS | FOR_LEADER, OPT_FORMAT},
	{"watch", '\0', false, FOR_LEADER, OPT_WATCH},
	{NULL, '\0', false, 0, OPT_DBNAME}
};

typedef struct CommandDef
{
	const char *name;
	int			bit;			/* FOR_* */
	int			min_args;
	int			max_args;
} CommandDef;

static const CommandDef commands[] = {
	{"run", FOR_RUN, 1, 1},
	{"acquire", FOR_ACQUIRE, 1, 1},
	{"renew", FOR_RENEW, 2, 2},
	{"release", FOR_RELEASE, 2, 2},
	{"status", FOR_STATUS, 0, 1},
	{"elect", FOR_ELECT, 2, 2},
	{"leader", FOR_LEADER, 1, 1},
	{"proclaim", FOR_PROCLAIM, 3, 3},
	{NULL, 0, 0, 0}
};

/* An option as seen on the command line, checked once the command is known */
typedef struct SeenOpt
{
	const OptDef *def;
	const char *spelling;		/* as the user wrote it, for messages */
	const char *value;
} SeenOpt;

/*
 * Report a usage error (one line, with a pointer to the help) and exit 64.
 */
static void
usage_error(const char *command, const char *fmt,...)
pg_attribute_printf(2, 3) pg_attribute_noreturn();

static void
usage_error(const char *command, const char *fmt,...)
{
	va_list		ap;
	char		msg[1024];

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (command)
		dlock_fatal(DLOCK_EXIT_USAGE, "%s (try \"dlock %s --help\")", msg, command);
	dlock_fatal(DLOCK_EXIT_USAGE, "%s (try \"dlock --help\")", msg);
}

/* The general help */
static void
help(void)
{
	printf("dlock runs a program under a lease of the PostgreSQL extension dlock, or\n"
		   "while it leads an election; it grants, renews, releases and shows leases,\n"
		   "and shows who leads.\n\n");
	printf("Usage:\n");
	printf("  dlock [CONNECTION-OPTION]... COMMAND [OPTION]... [ARG]...\n\n");
	printf("Commands:\n");
	printf("  run KEY -- COMMAND [ARG]...  run COMMAND while holding the lease on KEY\n");
	printf("  acquire KEY                  grant the lease on KEY and print it\n");
	printf("  renew KEY OWNER              extend OWNER's lease on KEY, print the new expiry\n");
	printf("  release KEY OWNER            release OWNER's lease on KEY\n");
	printf("  status [KEY]                 show the leases (dlock.lease_status)\n");
	printf("  elect NAME VALUE -- COMMAND [ARG]...\n"
		   "                               campaign in election NAME with VALUE, and run\n"
		   "                               COMMAND while leader\n");
	printf("  leader NAME                  show who leads election NAME (--watch: follow)\n");
	printf("  proclaim NAME OWNER VALUE    change the VALUE of OWNER, the leader of NAME\n");
	printf("\nGeneral options:\n");
	printf("  -V, --version            output version information, then exit\n");
	printf("  -?, --help               show this help, then exit\n");
	printf("\nConnection options (before or after COMMAND):\n");
	printf("  -d, --dbname=CONNSTR     database name, connection string or URI\n");
	printf("  -h, --host=HOSTNAME      database server host or socket directory\n");
	printf("  -p, --port=PORT          database server port\n");
	printf("  -U, --username=USERNAME  database user name\n");
	printf("  -w, --no-password        never prompt for password\n");
	printf("\nThe PG* environment variables, ~/.pgpass and service files work as in psql.\n");
	printf("Durations (DUR) are a number with unit ms, s, min or h (500ms, 30s, 2min),\n"
		   "or plain seconds.\n");
	printf("\nExit status: 0 success; run, elect: COMMAND's status (128+N if signal N\n"
		   "killed it); 3 leader: nobody leads; 64 bad usage; 69 cannot connect;\n"
		   "70 server error; 75 key busy (elect: not elected within --wait);\n"
		   "77 permission denied; 78 extension dlock missing or too old; 79 lease lost\n"
		   "(proclaim: OWNER does not lead); 126/127 run, elect: COMMAND not\n"
		   "executable/not found.\n");
	printf("\nRun \"dlock COMMAND --help\" for the options of a command.\n");
}

/* The help of one command */
static void
help_command(const char *command)
{
	if (strcmp(command, "run") == 0)
	{
		printf("dlock run grants the lease on KEY, runs COMMAND while renewing it in the\n"
			   "background, and releases it when COMMAND exits.\n\n");
		printf("Usage:\n");
		printf("  dlock [CONNECTION-OPTION]... run [OPTION]... KEY -- COMMAND [ARG]...\n\n");
		printf("Options:\n");
		printf("      --ttl=DUR            time to live of the lease (default 30s)\n");
		printf("      --wait=DUR           wait up to DUR while the key is held\n"
			   "                           (default 0: try once)\n");
		printf("      --holder=LABEL       label shown in dlock.lease_status\n"
			   "                           (default USER@HOST:PID)\n");
		printf("      --session-bound      the lease also ends when dlock's connection ends\n"
			   "                           (not behind a transaction-pooling PgBouncer)\n");
		printf("      --renew-every=DUR    renew this often (default TTL/3)\n");
		printf("      --on-lost=ACTION     when the lease is lost: term (SIGTERM, SIGKILL after\n"
			   "                           the grace time), kill (SIGKILL) or ignore\n"
			   "                           (default term)\n");
		printf("      --grace=DUR          time from SIGTERM to SIGKILL (default 5s)\n");
		printf("      --skip-ok            exit 0, silently, when the key is busy\n");
		printf("  -?, --help               show this help, then exit\n");
		printf("\nCOMMAND runs in its own process group, with DLOCK_KEY, DLOCK_OWNER,\n"
			   "DLOCK_FENCE and DLOCK_EXPIRES_AT in its environment.  SIGINT, SIGTERM,\n"
			   "SIGHUP and SIGQUIT sent to dlock are passed on to it.  The lease counts as\n"
			   "lost when a renewal returns NULL, or when none is confirmed within the TTL\n"
			   "of the last one (timed from when its request was sent).\n");
		printf("\nExit status: COMMAND's (128+N if signal N killed it); 75 key busy;\n"
			   "79 lease lost; 126/127 COMMAND not executable/not found; see \"dlock --help\".\n");
	}
	else if (strcmp(command, "acquire") == 0)
	{
		printf("dlock acquire grants the lease on KEY and prints it.\n\n");
		printf("Usage:\n");
		printf("  dlock [CONNECTION-OPTION]... acquire [OPTION]... KEY\n\n");
		printf("Options:\n");
		printf("      --ttl=DUR            time to live of the lease (default 30s)\n");
		printf("      --wait=DUR           wait up to DUR while the key is held\n"
			   "                           (default 0: try once)\n");
		printf("      --holder=LABEL       label shown in dlock.lease_status\n"
			   "                           (default USER@HOST:PID)\n");
		printf("      --format=FORMAT      text (key, owner, fence, expires_at separated by\n"
			   "                           tabs), shell (DLOCK_KEY=... lines for eval) or\n"
			   "                           json (default text)\n");
		printf("  -?, --help               show this help, then exit\n");
		printf("\nKeep the owner secret: it is what renews and releases the lease.\n");
		printf("Exit status: 0 granted; 75 key busy; see \"dlock --help\".\n");
	}
	else if (strcmp(command, "renew") == 0)
	{
		printf("dlock renew extends OWNER's unexpired lease on KEY to now + TTL and prints\n"
			   "the new expiry.\n\n");
		printf("Usage:\n");
		printf("  dlock [CONNECTION-OPTION]... renew [OPTION]... KEY OWNER\n\n");
		printf("Options:\n");
		printf("      --ttl=DUR            new time to live (default 30s)\n");
		printf("  -?, --help               show this help, then exit\n");
		printf("\nExit status: 0 renewed; 79 the lease is lost; see \"dlock --help\".\n");
	}
	else if (strcmp(command, "release") == 0)
	{
		printf("dlock release releases OWNER's unexpired lease on KEY.\n\n");
		printf("Usage:\n");
		printf("  dlock [CONNECTION-OPTION]... release KEY OWNER\n\n");
		printf("Options:\n");
		printf("  -?, --help               show this help, then exit\n");
		printf("\nExit status: 0 released; 79 OWNER did not hold the lease; see \"dlock --help\".\n");
	}
	else if (strcmp(command, "elect") == 0)
	{
		printf("dlock elect campaigns in election NAME with VALUE (dlock.campaign), waits\n"
			   "until elected, runs COMMAND while leader, renewing the leadership's lease\n"
			   "in the background, and resigns when COMMAND exits.\n\n");
		printf("Usage:\n");
		printf("  dlock [CONNECTION-OPTION]... elect [OPTION]... NAME VALUE --\n"
			   "        COMMAND [ARG]...\n\n");
		printf("Options:\n");
		printf("      --ttl=DUR            time to live of the lease (default 30s)\n");
		printf("      --wait=DUR           give up when not elected within DUR\n"
			   "                           (default: wait as long as it takes; 0: try once)\n");
		printf("      --holder=LABEL       label shown in dlock.lease_status\n"
			   "                           (default USER@HOST:PID)\n");
		printf("      --lock-delay=DUR     when the lease expires unreleased, nobody is elected\n"
			   "                           for DUR after its expiry (default none); give at\n"
			   "                           least --grace for COMMAND to be gone by then\n");
		printf("      --session-bound      the lease also ends when dlock's connection ends\n"
			   "                           (not behind a transaction-pooling PgBouncer)\n");
		printf("      --renew-every=DUR    renew this often (default TTL/3)\n");
		printf("      --on-lost=ACTION     when the leadership is lost: term (SIGTERM, SIGKILL\n"
			   "                           after the grace time), kill (SIGKILL) or ignore\n"
			   "                           (default term)\n");
		printf("      --grace=DUR          time from SIGTERM to SIGKILL (default 5s)\n");
		printf("      --skip-ok            exit 0, silently, when not elected within --wait\n");
		printf("  -?, --help               show this help, then exit\n");
		printf("\nCOMMAND runs in its own process group, with DLOCK_EPOCH (the term's\n"
			   "epoch: its fencing token), DLOCK_KEY (NAME), DLOCK_OWNER, DLOCK_FENCE (the\n"
			   "epoch again) and DLOCK_EXPIRES_AT in its environment.  SIGINT, SIGTERM,\n"
			   "SIGHUP and SIGQUIT sent to dlock are passed on to it.  The leadership\n"
			   "counts as lost when a renewal returns NULL, or when none is confirmed\n"
			   "within the TTL of the last one (timed from when its request was sent).\n"
			   "Writes that must not outlive the term present the epoch:\n"
			   "dlock.fenced(NAME, $DLOCK_EPOCH).\n");
		printf("\nExit status: COMMAND's (128+N if signal N killed it); 75 not elected\n"
			   "within --wait; 79 leadership lost; 126/127 COMMAND not executable/not\n"
			   "found; see \"dlock --help\".\n");
	}
	else if (strcmp(command, "leader") == 0)
	{
		printf("dlock leader prints who leads election NAME (dlock.leader); with --watch it\n"
			   "prints a line for every change until interrupted.\n\n");
		printf("Usage:\n");
		printf("  dlock [CONNECTION-OPTION]... leader [OPTION]... NAME\n\n");
		printf("Options:\n");
		printf("      --watch              print the state, then a line for every change\n"
			   "                           (dlock.observe), until SIGINT, SIGTERM or\n"
			   "                           SIGHUP; reconnect when the connection drops\n");
		printf("      --format=FORMAT      text or json (one object per line) (default text)\n");
		printf("  -?, --help               show this help, then exit\n");
		printf("\nEach state is one line: STATE EPOCH SINCE EXPIRES_AT VALUE, separated by\n"
			   "tabs, empty when unknown.  STATE is leader (someone leads) or, when nobody\n"
			   "leads, resigned, expired or none (no term on record).  Times are UTC,\n"
			   "as 2026-01-31T12:34:56.789012Z.  In VALUE, a backslash, tab, newline and\n"
			   "carriage return are written \\\\, \\t, \\n and \\r.\n");
		printf("\nExit status: 0 someone leads (--watch: stopped by a signal); 3 nobody\n"
			   "leads; see \"dlock --help\".\n");
	}
	else if (strcmp(command, "proclaim") == 0)
	{
		printf("dlock proclaim sets a new VALUE for the leader of election NAME, when\n"
			   "OWNER (DLOCK_OWNER of dlock elect's COMMAND) leads it.\n\n");
		printf("Usage:\n");
		printf("  dlock [CONNECTION-OPTION]... proclaim NAME OWNER VALUE\n\n");
		printf("Options:\n");
		printf("  -?, --help               show this help, then exit\n");
		printf("\nExit status: 0 proclaimed; 79 OWNER does not lead NAME; see \"dlock --help\".\n");
	}
	else
	{
		printf("dlock status shows the leases from dlock.lease_status: all keys, or one.\n\n");
		printf("Usage:\n");
		printf("  dlock [CONNECTION-OPTION]... status [OPTION]... [KEY]\n\n");
		printf("Options:\n");
		printf("      --format=FORMAT      text (an aligned table) or json (an array of\n"
			   "                           objects) (default text)\n");
		printf("  -?, --help               show this help, then exit\n");
	}
	printf("\nConnection options: see \"dlock --help\".\n");
}

/*
 * Parse a duration: a number (decimals allowed) with unit ms, s, min or h,
 * or no unit for seconds.  False when malformed or over about 24 days
 * (what fits in an int of milliseconds; dlock.max_ttl is below that).
 */
static bool
parse_duration(const char *s, int *ms)
{
	int64		whole = 0;
	int64		frac = 0;
	int64		scale = 1;
	int64		unit;
	int64		total;
	const char *p = s;
	bool		digits = false;

	while (*p >= '0' && *p <= '9')
	{
		whole = whole * 10 + (*p - '0');
		if (whole > (int64) PG_INT32_MAX)
			return false;
		digits = true;
		p++;
	}
	if (*p == '.')
	{
		p++;
		while (*p >= '0' && *p <= '9')
		{
			if (scale < 1000000000)
			{
				frac = frac * 10 + (*p - '0');
				scale *= 10;
			}
			digits = true;
			p++;
		}
	}
	if (!digits)
		return false;
	if (strcmp(p, "ms") == 0)
		unit = 1;
	else if (strcmp(p, "s") == 0 || *p == '\0')
		unit = 1000;
	else if (strcmp(p, "min") == 0)
		unit = 60 * 1000;
	else if (strcmp(p, "h") == 0)
		unit = 60 * 60 * 1000;
	else
		return false;
	total = whole * unit + frac * unit / scale;
	if (total > PG_INT32_MAX)
		return false;
	*ms = (int) total;
	return true;
}

/* --ttl and friends: a duration, or exit 64 */
static int
duration_option(const char *command, const SeenOpt *so, bool positive)
{
	int			ms;

	if (!parse_duration(so->value, &ms))
		usage_error(command, "invalid duration for %s: \"%s\" (use e.g. 500ms, 30s, 2min, 1h)",
					so->spelling, so->value);
	if (positive && ms <= 0)
		usage_error(command, "%s must be positive", so->spelling);
	return ms;
}

/* Find a long option by name (the part after "--", up to any "=") */
static const OptDef *
find_long(const char *name, size_t len)
{
	const OptDef *d;

	for (d = optdefs; d->name; d++)
		if (strlen(d->name) == len && strncmp(d->name, name, len) == 0)
			return d;
	return NULL;
}

static const OptDef *
find_short(char c)
{
	const OptDef *d;

	for (d = optdefs; d->name; d++)
		if (d->short_name == c)
			return d;
	return NULL;
}

/*
 * Parse the command line.  Options may come before or after the command
 * word and between the arguments; "--" ends the options.  For run (elect),
 * the first argument after KEY (VALUE), or everything after "--", is
 * COMMAND, and nothing of it is parsed.  Options are checked against the
 * command once it is known.  Exits on any error (64) or after
 * --help/--version (0).
 */
static void
parse_args(int argc, char **argv, DlockOptions *o)
{
	SeenOpt    *seen;
	size_t		maxseen = 1;
	int			nseen = 0;
	const CommandDef *cmd = NULL;
	bool		want_help = false;
	bool		want_version = false;
	bool		options_done = false;
	const char *bad_command = NULL;
	bool		exec_dashes = false;
	int			i;

	/* a cluster of short options yields one entry per letter */
	for (i = 1; i < argc; i++)
		maxseen += strlen(argv[i]) + 1;
	seen = pg_malloc0(sizeof(SeenOpt) * maxseen);
	o->args = pg_malloc0(sizeof(char *) * (argc + 1));
	o->nargs = 0;

	for (i = 1; i < argc; i++)
	{
		char	   *arg = argv[i];

		if (cmd != NULL && (cmd->bit & FOR_EXEC) && o->nargs == cmd->max_args)
		{
			/*
			 * run, elect: a "--" after the last argument ends the options
			 * (even after "--")
			 */
			if (strcmp(arg, "--") == 0 && !exec_dashes)
			{
				exec_dashes = options_done = true;
				continue;
			}
			/* and the next argument starts COMMAND */
			if (options_done || arg[0] != '-' || arg[1] == '\0')
			{
				o->exec_argv = &argv[i];
				break;
			}
		}
		if (!options_done && strcmp(arg, "--") == 0)
		{
			options_done = true;
			continue;
		}
		if (!options_done && arg[0] == '-' && arg[1] == '-')
		{
			const char *name = arg + 2;
			const char *eq = strchr(name, '=');
			const OptDef *d = find_long(name, eq ? (size_t) (eq - name) : strlen(name));

			if (d == NULL)
			{
				char	   *shown = pg_strdup(arg);

				if (strchr(shown, '='))
					*strchr(shown, '=') = '\0';
				usage_error(cmd ? cmd->name : NULL, "unrecognized option \"%s\"", shown);
			}
			seen[nseen].def = d;
			seen[nseen].spelling = psprintf("--%s", d->name);
			if (d->has_arg)
			{
				if (eq)
					seen[nseen].value = eq + 1;
				else if (i + 1 < argc)
					seen[nseen].value = argv[++i];
				else
					usage_error(cmd ? cmd->name : NULL,
								"option \"--%s\" requires a value", d->name);
			}
			else if (eq)
				usage_error(cmd ? cmd->name : NULL,
							"option \"--%s\" takes no value", d->name);
			nseen++;
			continue;
		}
		if (!options_done && arg[0] == '-' && arg[1] != '\0')
		{
			const char *p;

			/* a cluster of short options; one taking a value ends it */
			for (p = arg + 1; *p; p++)
			{
				const OptDef *d = find_short(*p);

				if (d == NULL)
					usage_error(cmd ? cmd->name : NULL, "invalid option \"-%c\"", *p);
				seen[nseen].def = d;
				seen[nseen].spelling = psprintf("-%c", *p);
				if (d->has_arg)
				{
					if (p[1] != '\0')
						seen[nseen].value = p + 1;
					else if (i + 1 < argc)
						seen[nseen].value = argv[++i];
					else
						usage_error(cmd ? cmd->name : NULL,
									"option \"-%c\" requires a value", *p);
					nseen++;
					break;
				}
				nseen++;
			}
			continue;
		}

		/* a positional argument: the command word, then its arguments */
		if (cmd == NULL)
		{
			for (cmd = commands; cmd->name; cmd++)
				if (strcmp(cmd->name, arg) == 0)
					break;
			if (cmd->name == NULL)
			{
				/* reported after the loop: --help wins */
				cmd = NULL;
				if (bad_command == NULL)
					bad_command = arg;
				continue;
			}
			o->command = cmd->name;
			continue;
		}
		o->args[o->nargs++] = arg;
	}

	/* --help and --version first, whatever else is wrong */
	for (i = 0; i < nseen; i++)
	{
		if (seen[i].def->id == OPT_HELP)
			want_help = true;
		else if (seen[i].def->id == OPT_VERSION)
			want_version = true;
	}
	if (want_help)
	{
		if (cmd)
			help_command(cmd->name);
		else
			help();
		exit(0);
	}
	if (want_version)
	{
		printf("dlock (dlock) " DLOCK_VERSION "\n");
		exit(0);
	}

	if (bad_command != NULL)
		usage_error(NULL, "unknown command \"%s\"", bad_command);
	if (cmd == NULL)
		usage_error(NULL, "no command given");

	/* defaults */
	o->ttl_ms = 30 * 1000;
	o->wait_ms = (cmd->bit == FOR_ELECT) ? -1 : 0;
	o->lock_delay_ms = -1;
	o->grace_ms = 5 * 1000;
	o->renew_every_ms = 0;
	o->on_lost = DLOCK_ON_LOST_TERM;
	o->format = DLOCK_FORMAT_TEXT;

	for (i = 0; i < nseen; i++)
	{
		const SeenOpt *so = &seen[i];

		if ((so->def->commands & cmd->bit) == 0)
			usage_error(cmd->name, "option \"%s\" does not apply to command %s",
						so->spelling, cmd->name);
		switch (so->def->id)
		{
			case OPT_DBNAME:
				o->conn.dbname = so->value;
				break;
			case OPT_HOST:
				o->conn.host = so->value;
				break;
			case OPT_PORT:
				o->conn.port = so->value;
				break;
			case OPT_USERNAME:
				o->conn.username = so->value;
				break;
			case OPT_NO_PASSWORD:
				o->conn.no_password = true;
				break;
			case OPT_HELP:
			case OPT_VERSION:
				break;
			case OPT_TTL:
				o->ttl_ms = duration_option(cmd->name, so, true);
				break;
			case OPT_WAIT:
				o->wait_ms = duration_option(cmd->name, so, false);
				break;
			case OPT_GRACE:
				o->grace_ms = duration_option(cmd->name, so, false);
				break;
			case OPT_RENEW_EVERY:
				o->renew_every_ms = duration_option(cmd->name, so, true);
				break;
			case OPT_LOCK_DELAY:
				o->lock_delay_ms = duration_option(cmd->name, so, false);
				break;
			case OPT_WATCH:
				o->watch = true;
				break;
			case OPT_HOLDER:
				o->holder = so->value;
				break;
			case OPT_SESSION_BOUND:
				o->session_bound = true;
				break;
			case OPT_SKIP_OK:
				o->skip_ok = true;
				break;
			case OPT_ON_LOST:
				if (strcmp(so->value, "term") == 0)
					o->on_lost = DLOCK_ON_LOST_TERM;
				else if (strcmp(so->value, "kill") == 0)
					o->on_lost = DLOCK_ON_LOST_KILL;
				else if (strcmp(so->value, "ignore") == 0)
					o->on_lost = DLOCK_ON_LOST_IGNORE;
				else
					usage_error(cmd->name, "invalid value for --on-lost: \"%s\" (term, kill or ignore)",
								so->value);
				break;
			case OPT_FORMAT:
				if (strcmp(so->value, "text") == 0)
					o->format = DLOCK_FORMAT_TEXT;
				else if (strcmp(so->value, "json") == 0)
					o->format = DLOCK_FORMAT_JSON;
				else if (strcmp(so->value, "shell") == 0 && cmd->bit == FOR_ACQUIRE)
					o->format = DLOCK_FORMAT_SHELL;
				else
					usage_error(cmd->name, "invalid value for --format: \"%s\" (%s)",
								so->value,
								cmd->bit == FOR_ACQUIRE ? "text, shell or json" : "text or json");
				break;
		}
	}

	if (o->nargs < cmd->min_args)
	{
		static const char *const missing_renew[] = {"KEY and OWNER", "OWNER"};
		static const char *const missing_elect[] = {"NAME and VALUE", "VALUE"};
		static const char *const missing_proclaim[] =
		{"NAME, OWNER and VALUE", "OWNER and VALUE", "VALUE"};

		if (cmd->bit == FOR_RENEW || cmd->bit == FOR_RELEASE)
			usage_error(cmd->name, "missing %s", missing_renew[o->nargs]);
		if (cmd->bit == FOR_ELECT)
			usage_error(cmd->name, "missing %s", missing_elect[o->nargs]);
		if (cmd->bit == FOR_PROCLAIM)
			usage_error(cmd->name, "missing %s", missing_proclaim[o->nargs]);
		if (cmd->bit == FOR_LEADER)
			usage_error(cmd->name, "missing NAME");
		usage_error(cmd->name, "missing KEY");
	}
	if (o->nargs > cmd->max_args)
		usage_error(cmd->name, "too many arguments, starting with \"%s\"",
					o->args[cmd->max_args]);
	if (cmd->bit & FOR_EXEC)
	{
		if (o->exec_argv == NULL || o->exec_argv[0] == NULL)
			usage_error(cmd->name, "missing COMMAND (%s)",
						cmd->bit == FOR_RUN ?
						"dlock run KEY -- COMMAND [ARG]..." :
						"dlock elect NAME VALUE -- COMMAND [ARG]...");
		if (o->renew_every_ms == 0)
			o->renew_every_ms = Max(o->ttl_ms / 3, 1);
		if (o->renew_every_ms >= o->ttl_ms)
			usage_error(cmd->name, "--renew-every must be shorter than --ttl");
	}
	if (cmd->bit == FOR_ELECT)
	{
		o->elect = true;
		o->value = o->args[1];
	}
	if (cmd->bit & (FOR_ELECT | FOR_LEADER | FOR_PROCLAIM))
		dlock_min_version = "0.7";	/* elections came with 0.7 */
	if (o->format == DLOCK_FORMAT_JSON)
		o->conn.client_encoding = "UTF8";	/* JSON is UTF-8 */
	free(seen);
}

/* The default holder label: user@host:pid */
const char *
dlock_default_holder(void)
{
	static char label[512];
	char		host[256];
	struct passwd *pw = getpwuid(geteuid());
	const char *user = pw ? pw->pw_name : getenv("USER");

	if (gethostname(host, sizeof(host)) != 0)
		strlcpy(host, "localhost", sizeof(host));
	host[sizeof(host) - 1] = '\0';
	snprintf(label, sizeof(label), "%s@%s:%d",
			 user ? user : "unknown", host, (int) getpid());
	return label;
}

/* Print a string as a JSON string literal (on stdout) */
void
dlock_print_json_string(const char *s)
{
	const unsigned char *p;

	putchar('"');
	for (p = (const unsigned char *) s; *p; p++)
	{
		switch (*p)
		{
			case '"':
				fputs("\\\"", stdout);
				break;
			case '\\':
				fputs("\\\\", stdout);
				break;
			case '\n':
				fputs("\\n", stdout);
				break;
			case '\r':
				fputs("\\r", stdout);
				break;
			case '\t':
				fputs("\\t", stdout);
				break;
			default:
				if (*p < 0x20)
					printf("\\u%04x", *p);
				else
					putchar(*p);
		}
	}
	putchar('"');
}

/* Print a string single-quoted for a POSIX shell: ' becomes '\'' */
static void
print_shell_string(const char *s)
{
	putchar('\'');
	for (; *s; s++)
	{
		if (*s == '\'')
			fputs("'\\''", stdout);
		else
			putchar(*s);
	}
	putchar('\'');
}

/*
 * Release a lease, waiting no later than until.  Returns 1 when released,
 * 0 when it was not held by its owner, -1 on failure (*errmsg then says
 * why, malloc'd).
 */
int
dlock_release_until(PGconn *conn, const DlockLease *lease, int64 until,
					char **errmsg)
{
	const char *values[2];
	PGresult   *res;
	DlockWait	w;
	int			rc;

	values[0] = lease->key;
	values[1] = lease->owner;
	*errmsg = NULL;
	if (!dlock_send(conn, dlock_sql_release, 2, values))
	{
		*errmsg = dlock_one_line(PQerrorMessage(conn));
		return -1;
	}
	w = dlock_wait(conn, until, -1, &res);
	if (w == DLOCK_WAIT_TIMEOUT)
	{
		*errmsg = pg_strdup("no answer from the server in time");
		return -1;
	}
	if (w != DLOCK_WAIT_DONE)
	{
		*errmsg = dlock_one_line(PQerrorMessage(conn));
		return -1;
	}
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		*errmsg = dlock_result_message(res, conn);
		PQclear(res);
		return -1;
	}
	rc = (strcmp(PQgetvalue(res, 0, 0), "t") == 0) ? 1 : 0;
	PQclear(res);
	return rc;
}

/*
 * Grant the lease on key: try_acquire when there is no wait, else acquire
 * with the wait; for elect, campaign (with o->value) and its wait, which
 * may be unlimited.  *req_start is when the request was sent (our clock).
 * Returns 0 with *lease filled in, or an exit status after printing the
 * one line (for a busy key nothing is printed when quiet_busy).  A signal
 * (when dlock_signals_install was called) cancels the request: a lease
 * granted meanwhile is released, and the status is 128 + the signal.
 */
int
dlock_grant(PGconn *conn, const DlockOptions *o, const char *key,
			int64 *req_start, DlockLease *lease, bool quiet_busy)
{
	char		ttl[32];
	char		wait[32];
	char		lock_delay[32];
	const char *values[7];
	const char *holder = o->holder ? o->holder : dlock_default_holder();
	const char *sql;
	int			nparams;
	int64		until;
	PGresult   *res = NULL;
	DlockWait	w;
	int			status;

	dlock_interval_param(ttl, sizeof(ttl), o->ttl_ms);
	values[0] = key;
	values[1] = ttl;
	if (o->elect)
	{
		values[1] = o->value;
		values[2] = ttl;
		values[3] = NULL;		/* no limit */
		if (o->wait_ms >= 0)
		{
			dlock_interval_param(wait, sizeof(wait), o->wait_ms);
			values[3] = wait;
		}
		values[4] = holder;
		values[5] = NULL;		/* no lock delay */
		if (o->lock_delay_ms >= 0)
		{
			dlock_interval_param(lock_delay, sizeof(lock_delay), o->lock_delay_ms);
			values[5] = lock_delay;
		}
		values[6] = o->session_bound ? "true" : "false";
		nparams = 7;
		sql = dlock_sql_campaign;
	}
	else if (o->wait_ms > 0)
	{
		dlock_interval_param(wait, sizeof(wait), o->wait_ms);
		values[2] = wait;
		values[3] = holder;
		nparams = 4;
		sql = o->session_bound ? dlock_sql_acquire_sb : dlock_sql_acquire;
	}
	else
	{
		values[2] = holder;
		nparams = 3;
		sql = o->session_bound ? dlock_sql_try_acquire_sb : dlock_sql_try_acquire;
	}

	*req_start = dlock_now_ms();
	if (!dlock_send(conn, sql, nparams, values))
		dlock_fatal(DLOCK_EXIT_UNAVAILABLE, "%s", PQerrorMessage(conn));

	/*
	 * An answer later than wait + ttl would bring a lease that has already
	 * run out by our clock: stop waiting for it then.  Without a limit on
	 * the wait there is no such time; the caller confirms a lease granted
	 * late with a renewal before relying on it (see run.c).
	 */
	until = o->wait_ms < 0 ? -1 : *req_start + o->wait_ms + o->ttl_ms;
	for (;;)
	{
		int			sig;

		w = dlock_wait(conn, until, dlock_signal_fd, &res);
		if (w != DLOCK_WAIT_SIGNAL)
			break;
		sig = dlock_take_signal();
		if (sig == 0)
			continue;

		/* interrupted: cancel, and give back whatever was granted */
		{
			PGcancel   *cancel = PQgetCancel(conn);
			char		errbuf[256];

			if (cancel)
			{
				(void) PQcancel(cancel, errbuf, sizeof(errbuf));
				PQfreeCancel(cancel);
			}
			w = dlock_wait(conn, dlock_now_ms() + 5000, -1, &res);
			if (w == DLOCK_WAIT_DONE && PQresultStatus(res) == PGRES_TUPLES_OK &&
				dlock_read_lease(res, lease))
			{
				char	   *errmsg;

				if (dlock_release_until(conn, lease, dlock_now_ms() + 5000, &errmsg) < 0)
					dlock_error("could not release the lease on key \"%s\" after signal %d: %s",
								key, sig, errmsg);
			}
			if (w == DLOCK_WAIT_DONE)
				PQclear(res);
			if (o->elect)
				dlock_error("interrupted by signal %d while campaigning in election \"%s\"",
							sig, key);
			else
				dlock_error("interrupted by signal %d while acquiring key \"%s\"", sig, key);
			return 128 + sig;
		}
	}
	if (w == DLOCK_WAIT_TIMEOUT)
		dlock_fatal(DLOCK_EXIT_UNAVAILABLE,
					"no answer from the server within %d ms while %s \"%s\"",
					o->wait_ms + o->ttl_ms,
					o->elect ? "campaigning in election" : "acquiring key", key);
	if (w != DLOCK_WAIT_DONE)
		dlock_fatal(DLOCK_EXIT_UNAVAILABLE, "%s", PQerrorMessage(conn));

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		status = dlock_result_exit(res, conn);
		if (status == DLOCK_EXIT_TEMPFAIL)
		{
			if (!quiet_busy)
			{
				char	   *msg = dlock_result_message(res, conn);

				if (o->elect)
					dlock_error("not elected in election \"%s\" within --wait: %s",
								key, msg);
				else
					dlock_error("key \"%s\" is busy: %s", key, msg);
				free(msg);
			}
		}
		else
		{
			char	   *msg = dlock_result_message(res, conn);

			dlock_error("%s", msg);
			free(msg);
		}
		PQclear(res);
		return status;
	}
	if (!dlock_read_lease(res, lease))
	{
		if (!quiet_busy && o->elect)
			dlock_error("election \"%s\": the campaign returned no lease", key);
		else if (!quiet_busy)
			dlock_error("key \"%s\" is held by someone else", key);
		PQclear(res);
		return DLOCK_EXIT_TEMPFAIL;
	}
	PQclear(res);
	return 0;
}

/* dlock acquire KEY */
static int
cmd_acquire(DlockOptions *o)
{
	PGconn	   *conn = dlock_connect(&o->conn);
	DlockLease	lease;
	int64		start;
	int			status;

	if (o->wait_ms > 0)
		dlock_signals_install(false);
	status = dlock_grant(conn, o, o->args[0], &start, &lease, false);
	if (status != 0)
	{
		PQfinish(conn);
		return status;
	}
	switch (o->format)
	{
		case DLOCK_FORMAT_TEXT:
			printf("%s\t%s\t%s\t%s\n", lease.key, lease.owner, lease.fence,
				   lease.expires_at);
			break;
		case DLOCK_FORMAT_SHELL:
			fputs("DLOCK_KEY=", stdout);
			print_shell_string(lease.key);
			fputs("\nDLOCK_OWNER=", stdout);
			print_shell_string(lease.owner);
			fputs("\nDLOCK_FENCE=", stdout);
			print_shell_string(lease.fence);
			fputs("\nDLOCK_EXPIRES_AT=", stdout);
			print_shell_string(lease.expires_at);
			putchar('\n');
			break;
		case DLOCK_FORMAT_JSON:
			fputs("{\"key\":", stdout);
			dlock_print_json_string(lease.key);
			fputs(",\"owner\":", stdout);
			dlock_print_json_string(lease.owner);
			printf(",\"fence\":%s,\"expires_at\":", lease.fence);
			dlock_print_json_string(lease.expires_at);
			fputs("}\n", stdout);
			break;
	}
	PQfinish(conn);
	return 0;
}

/*
 * A quick local check that OWNER looks like a UUID (32 hex digits, with
 * optional hyphens and braces), so that a mistyped owner is a usage error
 * rather than a server error.  The server has the last word.
 */
static void
check_owner(const char *command, const char *owner)
{
	int			hex = 0;
	const char *p;

	for (p = owner; *p; p++)
	{
		if (isxdigit((unsigned char) *p))
			hex++;
		else if (*p != '-' && *p != '{' && *p != '}')
			break;
	}
	if (*p != '\0' || hex != 32)
		usage_error(command, "invalid OWNER \"%s\": not a UUID", owner);
}

/* Run a one-shot query; on failure print one line and exit. */
PGresult *
dlock_exec_or_exit(PGconn *conn, const char *sql, int nparams,
			 const char *const *values)
{
	PGresult   *res = PQexecParams(conn, sql, nparams, NULL, values,
								   NULL, NULL, 0);

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		int			status = dlock_result_exit(res, conn);
		char	   *msg = dlock_result_message(res, conn);

		PQclear(res);
		PQfinish(conn);
		dlock_fatal(status, "%s", msg);
	}
	return res;
}

/* dlock renew KEY OWNER */
static int
cmd_renew(DlockOptions *o)
{
	PGconn	   *conn;
	PGresult   *res;
	char		ttl[32];
	const char *values[3];

	check_owner("renew", o->args[1]);
	conn = dlock_connect(&o->conn);
	dlock_interval_param(ttl, sizeof(ttl), o->ttl_ms);
	values[0] = o->args[0];
	values[1] = o->args[1];
	values[2] = ttl;
	res = dlock_exec_or_exit(conn, dlock_sql_renew, 3, values);
	if (PQntuples(res) != 1 || PQgetisnull(res, 0, 0))
	{
		PQclear(res);
		PQfinish(conn);
		dlock_fatal(DLOCK_EXIT_LOST,
					"the lease on key \"%s\" is lost: it is not held by that owner (expired, released or taken)",
					o->args[0]);
	}
	printf("%s\n", PQgetvalue(res, 0, 0));
	PQclear(res);
	PQfinish(conn);
	return 0;
}

/* dlock release KEY OWNER */
static int
cmd_release(DlockOptions *o)
{
	PGconn	   *conn;
	PGresult   *res;
	const char *values[2];
	bool		released;

	check_owner("release", o->args[1]);
	conn = dlock_connect(&o->conn);
	values[0] = o->args[0];
	values[1] = o->args[1];
	res = dlock_exec_or_exit(conn, dlock_sql_release, 2, values);
	released = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	PQfinish(conn);
	if (!released)
		dlock_fatal(DLOCK_EXIT_LOST,
					"the lease on key \"%s\" was not held by that owner (expired, released or taken)",
					o->args[0]);
	return 0;
}

/* dlock proclaim NAME OWNER VALUE */
static int
cmd_proclaim(DlockOptions *o)
{
	PGconn	   *conn;
	PGresult   *res;
	bool		proclaimed;

	check_owner("proclaim", o->args[1]);
	conn = dlock_connect(&o->conn);
	res = dlock_exec_or_exit(conn, sql_proclaim, 3, (const char *const *) o->args);
	proclaimed = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	PQfinish(conn);
	if (!proclaimed)
		dlock_fatal(DLOCK_EXIT_LOST,
					"that owner does not lead election \"%s\" (its term ended, or it never led)",
					o->args[0]);
	return 0;
}

/* Display width of a UTF-8 string, counting code points */
static int
text_width(const char *s)
{
	int			w = 0;

	for (; *s; s++)
		if (((unsigned char) *s & 0xC0) != 0x80)
			w++;
	return w;
}

static void
print_padded(const char *s, int width, bool right)
{
	int			pad = width - text_width(s);

	if (right)
		printf("%*s%s", Max(pad, 0), "", s);
	else
		printf("%s%*s", s, Max(pad, 0), "");
}

/* Is column i of the status query a number or a boolean (JSON, alignment)? */
static bool
is_number_column(const char *name)
{
	return strcmp(name, "fence") == 0 || strcmp(name, "pid") == 0;
}

/* dlock status [KEY] */
static int
cmd_status(DlockOptions *o)
{
	PGconn	   *conn = dlock_connect(&o->conn);
	PGresult   *res;
	const char *values[1];
	int			nrows;
	int			ncols;
	int			r;
	int			c;

	if (o->nargs == 1)
	{
		values[0] = o->args[0];
		res = dlock_exec_or_exit(conn, sql_status_key, 1, values);
	}
	else
		res = dlock_exec_or_exit(conn, sql_status, 0, NULL);
	nrows = PQntuples(res);
	ncols = PQnfields(res);

	if (o->format == DLOCK_FORMAT_JSON)
	{
		fputs("[", stdout);
		for (r = 0; r < nrows; r++)
		{
			fputs(r == 0 ? "\n  {" : ",\n  {", stdout);
			for (c = 0; c < ncols; c++)
			{
				const char *name = PQfname(res, c);

				if (c > 0)
					putchar(',');
				dlock_print_json_string(name);
				putchar(':');
				if (PQgetisnull(res, r, c))
					fputs("null", stdout);
				else if (is_number_column(name))
					fputs(PQgetvalue(res, r, c), stdout);
				else if (strcmp(name, "session_bound") == 0)
					fputs(strcmp(PQgetvalue(res, r, c), "t") == 0 ? "true" : "false",
						  stdout);
				else
					dlock_print_json_string(PQgetvalue(res, r, c));
			}
			putchar('}');
		}
		fputs(nrows > 0 ? "\n]\n" : "]\n", stdout);
	}
	else
	{
		/* an aligned table, as psql prints it */
		int		   *width = pg_malloc0(sizeof(int) * ncols);

		for (c = 0; c < ncols; c++)
		{
			width[c] = text_width(PQfname(res, c));
			for (r = 0; r < nrows; r++)
				width[c] = Max(width[c], text_width(PQgetvalue(res, r, c)));
		}
		for (c = 0; c < ncols; c++)
		{
			const char *name = PQfname(res, c);
			int			left = (width[c] - text_width(name)) / 2;

			printf("%s%*s%s", c == 0 ? " " : " | ", left, "", name);
			if (c < ncols - 1)	/* no trailing blanks, as in psql */
				printf("%*s", width[c] - text_width(name) - left, "");
		}
		putchar('\n');
		for (c = 0; c < ncols; c++)
		{
			int			k;

			fputs(c == 0 ? "-" : "-+-", stdout);
			for (k = 0; k < width[c]; k++)
				putchar('-');
		}
		fputs("-\n", stdout);
		for (r = 0; r < nrows; r++)
		{
			for (c = 0; c < ncols; c++)
			{
				fputs(c == 0 ? " " : " | ", stdout);
				if (c == ncols - 1 && !is_number_column(PQfname(res, c)))
					fputs(PQgetvalue(res, r, c), stdout);
				else
					print_padded(PQgetvalue(res, r, c), width[c],
								 is_number_column(PQfname(res, c)));
			}
			putchar('\n');
		}
		printf("(%d %s)\n", nrows, nrows == 1 ? "row" : "rows");
		free(width);
	}
	PQclear(res);
	PQfinish(conn);
	return 0;
}

int
main(int argc, char **argv)
{
	DlockOptions opts;
	int			status;

	memset(&opts, 0, sizeof(opts));
	set_pglocale_pgservice(argv[0], PG_TEXTDOMAIN("dlock"));
	parse_args(argc, argv, &opts);

	if (strcmp(opts.command, "run") == 0 || strcmp(opts.command, "elect") == 0)
		status = dlock_cmd_run(&opts);
	else if (strcmp(opts.command, "leader") == 0)
		status = dlock_cmd_leader(&opts);
	else if (strcmp(opts.command, "proclaim") == 0)
		status = cmd_proclaim(&opts);
	else if (strcmp(opts.command, "acquire") == 0)
		status = cmd_acquire(&opts);
	else if (strcmp(opts.command, "renew") == 0)
		status = cmd_renew(&opts);
	else if (strcmp(opts.command, "release") == 0)
		status = cmd_release(&opts);
	else
		status = cmd_status(&opts);

	if (fflush(stdout) != 0 || ferror(stdout))
	{
		dlock_error("could not write to standard output: %m");
		if (status == 0)
			status = DLOCK_EXIT_SOFTWARE;
	}
	return status;
}
