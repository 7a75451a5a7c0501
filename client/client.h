/*-------------------------------------------------------------------------
 *
 * client.h
 *	  Declarations shared by the files of the dlock command-line client:
 *	  the parsed command line, a granted lease, exit statuses, and the
 *	  connection, error-reporting and signal helpers.
 *
 * client/client.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef DLOCK_CLIENT_H
#define DLOCK_CLIENT_H

#include "libpq-fe.h"

#define DLOCK_VERSION "0.4"

/*
 * Exit statuses.  The numbers are those of <sysexits.h> (not every platform
 * has the header) plus 79 of our own, and 3 for "nobody leads" (the LSB's
 * "program is not running" of a status command); docs/client.md has the
 * table.
 */
#define DLOCK_EXIT_NO_LEADER	3	/* leader: nobody leads the election */
#define DLOCK_EXIT_USAGE		64	/* EX_USAGE */
#define DLOCK_EXIT_UNAVAILABLE	69	/* EX_UNAVAILABLE: cannot connect */
#define DLOCK_EXIT_SOFTWARE		70	/* EX_SOFTWARE: unexpected server error */
#define DLOCK_EXIT_TEMPFAIL		75	/* EX_TEMPFAIL: the key is busy */
#define DLOCK_EXIT_NOPERM		77	/* EX_NOPERM: SQLSTATE 42501 */
#define DLOCK_EXIT_CONFIG		78	/* EX_CONFIG: extension missing or old */
#define DLOCK_EXIT_LOST			79	/* the lease was lost */
#define DLOCK_EXIT_NOEXEC		126 /* run: COMMAND not executable */
#define DLOCK_EXIT_NOTFOUND		127 /* run: COMMAND not found */

typedef enum DlockFormat
{
	DLOCK_FORMAT_TEXT,
	DLOCK_FORMAT_SHELL,
	DLOCK_FORMAT_JSON
} DlockFormat;

typedef enum DlockOnLost
{
	DLOCK_ON_LOST_TERM,
	DLOCK_ON_LOST_KILL,
	DLOCK_ON_LOST_IGNORE
} DlockOnLost;

/* What libpq needs to (re)connect; see dlock_connect() */
typedef struct DlockConnOptions
{
	const char *dbname;			/* -d: a database name, conninfo or URI */
	const char *host;
	const char *port;
	const char *username;
	bool		no_password;	/* -w: never prompt */
	char	   *password;		/* prompted for, or NULL */
	const char *client_encoding;	/* NULL: libpq's default */
} DlockConnOptions;

/* The command line, parsed */
typedef struct DlockOptions
{
	DlockConnOptions conn;
	const char *command;		/* "run", "acquire", ... */
	char	  **args;			/* positional arguments after the command */
	int			nargs;
	char	  **exec_argv;		/* run, elect: COMMAND [ARGS...],
								 * NULL-terminated */
	bool		elect;			/* elect: campaign rather than acquire */
	const char *value;			/* elect: the candidate's VALUE */
	int			ttl_ms;
	int			wait_ms;		/* -1: no limit (elect's default) */
	int			lock_delay_ms;	/* -1: none given */
	int			grace_ms;
	int			renew_every_ms; /* 0: ttl / 3 */
	const char *holder;			/* NULL: user@host:pid */
	bool		session_bound;
	bool		skip_ok;
	bool		watch;			/* leader --watch */
	DlockOnLost on_lost;
	DlockFormat format;
} DlockOptions;

/* A lease as the server granted it (strings as the server printed them) */
typedef struct DlockLease
{
	char	   *key;
	char	   *owner;
	char	   *fence;
	char	   *expires_at;
	int64		remaining_ms;	/* expiry minus the server's clock, after the
								 * grant or renewal */
} DlockLease;

/* The outcome of waiting for a query sent with dlock_send() */
typedef enum DlockWait
{
	DLOCK_WAIT_DONE,			/* *result is set (may be an error result) */
	DLOCK_WAIT_TIMEOUT,			/* the time ran out; query still in flight */
	DLOCK_WAIT_SIGNAL,			/* a signal arrived; query still in flight */
	DLOCK_WAIT_BROKEN			/* the connection failed; see PQerrorMessage */
} DlockWait;

/* SQL texts (main.c) */
extern const char *const dlock_sql_try_acquire;
extern const char *const dlock_sql_try_acquire_sb;
extern const char *const dlock_sql_acquire;
extern const char *const dlock_sql_acquire_sb;
extern const char *const dlock_sql_renew;
extern const char *const dlock_sql_release;
extern const char *const dlock_sql_campaign;

/* conn.c */
extern bool dlock_quiet_notices;
extern const char *dlock_min_version;
extern int64 dlock_now_ms(void);
extern void dlock_add_secret(const char *secret);
extern char *dlock_one_line(const char *msg);
extern void dlock_error(const char *fmt,...) pg_attribute_printf(1, 2);
extern void dlock_fatal(int status, const char *fmt,...) pg_attribute_printf(2, 3) pg_attribute_noreturn();
extern PGconn *dlock_connect(DlockConnOptions *co);
extern PGconn *dlock_connect_start(const DlockConnOptions *co);
extern bool dlock_connect_until(PGconn *conn, int64 until);
extern DlockWait dlock_connect_wait(PGconn *conn, int64 until, int signal_fd);
extern int	dlock_result_exit(const PGresult *res, PGconn *conn);
extern char *dlock_result_message(const PGresult *res, PGconn *conn);
extern bool dlock_send(PGconn *conn, const char *sql, int nparams,
					   const char *const *values);
extern DlockWait dlock_wait(PGconn *conn, int64 until, int signal_fd,
							PGresult **result);
extern bool dlock_read_lease(const PGresult *res, DlockLease *lease);
extern void dlock_interval_param(char *buf, size_t len, int ms);

/* signals (run.c) */
extern int	dlock_signal_fd;
extern void dlock_signals_install(bool child);
extern int	dlock_take_signal(void);

/* main.c */
extern const char *dlock_default_holder(void);
extern void dlock_print_json_string(const char *s);
extern PGresult *dlock_exec_or_exit(PGconn *conn, const char *sql, int nparams,
									const char *const *values);
extern int	dlock_grant(PGconn *conn, const DlockOptions *o, const char *key,
						int64 *req_start, DlockLease *lease, bool quiet_busy);
extern int	dlock_release_until(PGconn *conn, const DlockLease *lease,
								int64 until, char **errmsg);

/* run.c (run and elect) */
extern int	dlock_cmd_run(DlockOptions *opts);

/* leader.c */
extern int	dlock_cmd_leader(DlockOptions *opts);

#endif							/* DLOCK_CLIENT_H */
