/*-------------------------------------------------------------------------
 *
 * run.c
 *	  dlock run: hold a lease while a program runs; dlock elect: the same
 *	  with a lease granted by an election's campaign.
 *
 * The lease is granted (elect: dlock.campaign, which also records the
 * candidate's value; its fencing token is the term's epoch), COMMAND is
 * started in its own process group with the lease in its environment, and
 * one loop then does everything else:
 * it renews the lease every --renew-every, passes signals on to COMMAND's
 * process group, notices COMMAND's exit, and stops COMMAND when the lease
 * is lost.
 *
 * Whether we still hold the lease is judged by our own clock only, never
 * by the server's timestamps: a grant or renewal that the server confirms
 * holds for ttl from when its request was *sent* (the server can only
 * have started the lease later than that), so the lease is known to be
 * ours until deadline = send time + ttl.  If no renewal has been
 * confirmed by then, whatever the reason (the server or the network hung,
 * the server restarts, we were stopped), the lease is treated as lost.
 * Meanwhile the loop keeps trying: every request and connection attempt
 * gets a timeout well under the time left, after which the connection is
 * dropped and a new one started, so a hung server can never keep us past
 * the deadline.  Nothing here blocks in libpq: requests go out with
 * PQsendQueryParams, connections are made with PQconnectStartParams and
 * PQconnectPoll, and the loop sleeps in poll() on the socket, the
 * self-pipe of the signal handlers, and the next deadline.
 *
 * Signal handlers only set a flag and write a byte to a non-blocking
 * self-pipe, which wakes the poll(); everything else happens in the loop.
 *
 * client/run.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres_fe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "client.h"

/* The signals passed on to COMMAND */
static const int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

#define NFORWARDED lengthof(forwarded_signals)

int			dlock_signal_fd = -1;
static int	signal_pipe_w = -1;
static volatile sig_atomic_t got_signal[NFORWARDED];

typedef enum RenewerState
{
	RS_NONE,					/* no connection: connect at next_try */
	RS_CONNECTING,				/* PQconnectPoll in progress */
	RS_IDLE,					/* connected: renew at next_try */
	RS_BUSY						/* a renewal is in flight */
} RenewerState;

typedef struct Run
{
	DlockOptions *o;
	DlockLease	lease;
	char	   *what;			/* "the lease on key ..." for messages */
	char		ttl_param[32];

	/* the renewer */
	PGconn	   *conn;
	RenewerState state;
	PostgresPollingStatusType connect_poll;
	bool		flushing;		/* the request is not all sent yet */
	int64		op_start;		/* when the connection attempt or renewal
								 * began (for a renewal: before it was sent) */
	int64		op_until;		/* give up on it then; -1: never */
	int64		next_try;		/* the next renewal or connection attempt */
	PGresult   *result;			/* of the renewal in flight, so far */
	char	   *last_error;		/* why the last attempt failed, or NULL */

	/* the lease */
	int64		deadline;		/* known to be ours until then */
	int			granted_ms;		/* deadline minus the send time of the last
								 * confirmed request */
	bool		lost;
	int64		kill_at;		/* --on-lost=term: SIGKILL then; -1: none */
	bool		killed;

	/* COMMAND */
	pid_t		child;			/* also its process group */
	bool		child_done;
	int			child_status;	/* as from waitpid */
} Run;

/*
 * Wake the loop from a signal handler, through the self-pipe (a full pipe
 * will wake it anyway).
 */
static void
wake_loop(void)
{
	if (signal_pipe_w >= 0)
	{
		ssize_t		rc = write(signal_pipe_w, "", 1);

		(void) rc;
	}
}

/*
 * The watchdog: a timer armed for the lease's deadline whenever the loop
 * runs (ITIMER_REAL), which stops COMMAND's process group by itself if the
 * loop has not come round by then, because something blocked it (libpq
 * resolves host names synchronously when it reconnects, a write to a full
 * stderr, ...).  The loop, once back, sees the lease lost and does the rest.
 */
static volatile sig_atomic_t watchdog_group = 0;	/* 0: disarmed */
static volatile sig_atomic_t watchdog_kill = 0;	/* SIGKILL, not SIGTERM */

static void
watchdog_fire(int sig)
{
	int			save_errno = errno;
	pid_t		group = (pid_t) watchdog_group;

	if (group > 0)
	{
		if (watchdog_kill)
			kill(-group, SIGKILL);
		else
		{
			kill(-group, SIGTERM);
			kill(-group, SIGCONT);
		}
		watchdog_group = 0;
	}
	wake_loop();
	errno = save_errno;
}

/* Arm the watchdog for deadline (0: disarm it). */
static void
watchdog_arm(const Run *r, int64 deadline)
{
	struct itimerval it;
	int64		left;

	memset(&it, 0, sizeof(it));
	if (deadline == 0 || r->o->on_lost == DLOCK_ON_LOST_IGNORE || r->child <= 0)
	{
		watchdog_group = 0;
		(void) setitimer(ITIMER_REAL, &it, NULL);
		return;
	}
	left = Max(deadline - dlock_now_ms(), 1);
	it.it_value.tv_sec = left / 1000;
	it.it_value.tv_usec = (left % 1000) * 1000;
	watchdog_kill = (r->o->on_lost == DLOCK_ON_LOST_KILL);
	watchdog_group = r->child;
	(void) setitimer(ITIMER_REAL, &it, NULL);
}

/*
 * ^Z (SIGTSTP, and SIGTTIN/SIGTTOU): stop COMMAND's process group too
 * before stopping ourselves, so that it does not run on while nobody
 * renews its lease; continue it when we are continued (the loop then
 * checks the deadline at once).
 */
static volatile sig_atomic_t stop_group = 0;

static void
handle_stop(int sig)
{
	int			save_errno = errno;
	pid_t		group = (pid_t) stop_group;

	if (group > 0)
		kill(-group, SIGSTOP);

	/*
	 * Stop ourselves with SIGSTOP, not the signal itself: the kernel
	 * discards SIGTSTP, SIGTTIN and SIGTTOU in an orphaned process group,
	 * and then COMMAND would be left stopped while we ran on.
	 */
	kill(getpid(), SIGSTOP);
	/* continued */
	if (group > 0)
		kill(-group, SIGCONT);
	wake_loop();
	errno = save_errno;
}

/* Note a signal, and wake the loop through the self-pipe. */
static void
handle_signal(int sig)
{
	int			save_errno = errno;
	int			i;

	for (i = 0; i < (int) NFORWARDED; i++)
		if (forwarded_signals[i] == sig)
			got_signal[i] = 1;
	wake_loop();
	errno = save_errno;
}

/*
 * Install the handlers of the forwarded signals (and SIGCHLD when child is
 * true) and make the self-pipe; dlock_signal_fd is its reading end.
 */
void
dlock_signals_install(bool child)
{
	int			fds[2];
	struct sigaction sa;
	int			i;

	if (dlock_signal_fd < 0)
	{
		if (pipe(fds) != 0)
			dlock_fatal(DLOCK_EXIT_SOFTWARE, "could not create a pipe: %m");
		for (i = 0; i < 2; i++)
		{
			if (fcntl(fds[i], F_SETFD, FD_CLOEXEC) == -1 ||
				fcntl(fds[i], F_SETFL, O_NONBLOCK) == -1)
				dlock_fatal(DLOCK_EXIT_SOFTWARE, "could not set up a pipe: %m");
		}
		dlock_signal_fd = fds[0];
		signal_pipe_w = fds[1];
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = handle_signal;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	for (i = 0; i < (int) NFORWARDED; i++)
		sigaction(forwarded_signals[i], &sa, NULL);
	if (child)
	{
		sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
		sigaction(SIGCHLD, &sa, NULL);
		sa.sa_handler = watchdog_fire;
		sa.sa_flags = SA_RESTART;
		sigaction(SIGALRM, &sa, NULL);
		sa.sa_handler = handle_stop;
		sigaction(SIGTSTP, &sa, NULL);
		sigaction(SIGTTIN, &sa, NULL);
		sigaction(SIGTTOU, &sa, NULL);
	}
}

/*
 * Empty the self-pipe, then return one signal that arrived (and forget
 * it), or 0 when none did.  Call it until it returns 0.
 */
int
dlock_take_signal(void)
{
	char		buf[64];
	int			i;

	if (dlock_signal_fd >= 0)
		while (read(dlock_signal_fd, buf, sizeof(buf)) > 0)
			;
	for (i = 0; i < (int) NFORWARDED; i++)
	{
		if (got_signal[i])
		{
			got_signal[i] = 0;
			return forwarded_signals[i];
		}
	}
	return 0;
}

/* How long to give a connection attempt or a renewal before dropping it */
static int64
attempt_timeout(const Run *r, int64 now)
{
	int64		t = Min((r->deadline - now) / 2, (int64) r->o->renew_every_ms);

	return Max(t, 100);
}

/* How long to wait after a failed attempt before the next */
static int64
retry_delay(const Run *r)
{
	return Min(1000, Max(50, r->o->renew_every_ms / 4));
}

static void
set_last_error(Run *r, char *msg)
{
	free(r->last_error);
	r->last_error = msg;
}

/* Is any process of COMMAND's process group still there? */
static bool
group_alive(const Run *r)
{
	return kill(-r->child, 0) == 0 || errno == EPERM;
}

/* Close the renewer's connection, if any, without further ado */
static void
close_connection(Run *r)
{
	if (r->result)
	{
		PQclear(r->result);
		r->result = NULL;
	}
	if (r->conn)
	{
		PQfinish(r->conn);
		r->conn = NULL;
	}
	r->state = RS_NONE;
	r->flushing = false;
}

/*
 * The lease is lost: say so (one line), stop COMMAND as --on-lost says,
 * and stop renewing.
 */
static void
lose(Run *r, const char *why)
{
	const char *action = "";
	char		buf[128];

	if (r->lost)
		return;
	r->lost = true;
	close_connection(r);

	switch (r->o->on_lost)
	{
		case DLOCK_ON_LOST_TERM:
			snprintf(buf, sizeof(buf),
					 "; sending SIGTERM to COMMAND (SIGKILL after %d ms)",
					 r->o->grace_ms);
			action = buf;
			if (r->child > 0)
			{
				kill(-r->child, SIGTERM);
				/* a stopped process acts on SIGTERM only once continued */
				kill(-r->child, SIGCONT);
				r->kill_at = dlock_now_ms() + r->o->grace_ms;
			}
			break;
		case DLOCK_ON_LOST_KILL:
			action = "; killing COMMAND (SIGKILL)";
			if (r->child > 0)
			{
				kill(-r->child, SIGKILL);
				r->killed = true;
			}
			break;
		case DLOCK_ON_LOST_IGNORE:
			action = "; COMMAND keeps running (--on-lost=ignore)";
			break;
	}
	dlock_error("lost %s: %s%s", r->what, why, action);
}

/*
 * The connection failed or was dropped.  A session-bound lease ends with
 * its connection, so that lease is lost at once; any other is renewed over
 * a new connection.
 */
static void
connection_failed(Run *r, char *msg)
{
	close_connection(r);
	if (r->o->session_bound)
	{
		char		why[1024];

		snprintf(why, sizeof(why),
				 "the connection of the session-bound lease failed: %s", msg);
		free(msg);
		lose(r, why);
		return;
	}
	set_last_error(r, msg);
}

/* Start a connection attempt */
static void
start_connect(Run *r, int64 now)
{
	r->conn = dlock_connect_start(&r->o->conn);
	if (r->conn == NULL)
	{
		set_last_error(r, pg_strdup("out of memory"));
		r->next_try = now + retry_delay(r);
		return;
	}
	if (PQstatus(r->conn) == CONNECTION_BAD)
	{
		connection_failed(r, dlock_one_line(PQerrorMessage(r->conn)));
		r->next_try = now + retry_delay(r);
		return;
	}
	r->state = RS_CONNECTING;
	r->connect_poll = PGRES_POLLING_WRITING;
	r->op_start = now;
	r->op_until = now + attempt_timeout(r, now);
}

/* Send a renewal; the clock is read before the request goes out */
static void
send_renew(Run *r)
{
	const char *values[3];
	int64		now = dlock_now_ms();
	int			f;

	values[0] = r->lease.key;
	values[1] = r->lease.owner;
	values[2] = r->ttl_param;
	r->op_start = now;
	if (!dlock_send(r->conn, dlock_sql_renew, 3, values) ||
		(f = PQflush(r->conn)) < 0)
	{
		connection_failed(r, dlock_one_line(PQerrorMessage(r->conn)));
		r->next_try = now + retry_delay(r);
		return;
	}
	r->flushing = (f == 1);
	r->state = RS_BUSY;
	/* dropping the connection of a session-bound lease would end it */
	r->op_until = r->o->session_bound ? -1 : now + attempt_timeout(r, now);
}

/* A renewal's answer is complete: act on it */
static void
finish_renew(Run *r, int64 now)
{
	PGresult   *res = r->result;

	r->result = NULL;
	if (res != NULL && PQresultStatus(res) == PGRES_TUPLES_OK &&
		PQntuples(res) == 1)
	{
		if (PQgetisnull(res, 0, 0))
			lose(r, "a renewal found it no longer held (expired, released or taken)");
		else
		{
			int64		remaining = PQgetisnull(res, 0, 1) ? 0 :
				strtoll(PQgetvalue(res, 0, 1), NULL, 10);

			r->granted_ms = (int) Min((int64) r->o->ttl_ms, Max(remaining, 0));
			r->deadline = r->op_start + r->granted_ms;
			r->next_try = r->op_start + r->o->renew_every_ms;
			r->state = RS_IDLE;
			set_last_error(r, NULL);
		}
		PQclear(res);
		return;
	}

	if (res == NULL || PQstatus(r->conn) == CONNECTION_BAD)
		connection_failed(r, dlock_result_message(res, r->conn));
	else
	{
		/* the server refused (e.g. read-only after a failover): retry */
		set_last_error(r, dlock_result_message(res, r->conn));
		r->state = RS_IDLE;
	}
	PQclear(res);
	r->next_try = now + retry_delay(r);
}

/* Keep the error result of a renewal if there is one, else the last */
static void
keep_result(Run *r, PGresult *res)
{
	if (r->result == NULL ||
		(PQresultStatus(r->result) != PGRES_FATAL_ERROR &&
		 PQresultStatus(res) == PGRES_FATAL_ERROR))
	{
		PQclear(r->result);
		r->result = res;
	}
	else
		PQclear(res);
}

/* The renewer's socket is ready (or failed): move on */
static void
on_socket(Run *r, short revents, int64 now)
{
	switch (r->state)
	{
		case RS_NONE:
			break;
		case RS_CONNECTING:
			r->connect_poll = PQconnectPoll(r->conn);
			if (r->connect_poll == PGRES_POLLING_OK)
			{
				r->state = RS_IDLE;
				set_last_error(r, NULL);
			}
			else if (r->connect_poll == PGRES_POLLING_FAILED)
			{
				connection_failed(r, dlock_one_line(PQerrorMessage(r->conn)));
				r->next_try = now + retry_delay(r);
			}
			break;
		case RS_IDLE:
			/* nothing is expected; this notices a connection closed */
			if (PQconsumeInput(r->conn) == 0 ||
				PQstatus(r->conn) == CONNECTION_BAD)
			{
				connection_failed(r, dlock_one_line(PQerrorMessage(r->conn)));
				break;
			}
			while (!PQisBusy(r->conn))
			{
				PGresult   *res = PQgetResult(r->conn);

				if (res == NULL)
					break;
				PQclear(res);
			}
			break;
		case RS_BUSY:
			if (r->flushing)
			{
				int			f = PQflush(r->conn);

				if (f < 0)
				{
					connection_failed(r, dlock_one_line(PQerrorMessage(r->conn)));
					r->next_try = now + retry_delay(r);
					break;
				}
				r->flushing = (f == 1);
			}
			if ((revents & (POLLIN | POLLERR | POLLHUP)) &&
				PQconsumeInput(r->conn) == 0)
			{
				/* libpq may have made an error result of it */
				if (!PQisBusy(r->conn))
				{
					PGresult   *res = PQgetResult(r->conn);

					if (res != NULL)
						keep_result(r, res);
				}
				if (r->result == NULL ||
					PQresultStatus(r->result) != PGRES_FATAL_ERROR)
				{
					connection_failed(r, dlock_one_line(PQerrorMessage(r->conn)));
					r->next_try = now + retry_delay(r);
					break;
				}
				finish_renew(r, now);
				break;
			}
			while (r->state == RS_BUSY && !PQisBusy(r->conn))
			{
				PGresult   *res = PQgetResult(r->conn);

				if (res == NULL)
				{
					finish_renew(r, now);
					break;
				}
				keep_result(r, res);
			}
			break;
	}
}

/* Poll events wanted on the renewer's socket */
static short
socket_events(const Run *r)
{
	switch (r->state)
	{
		case RS_CONNECTING:
			return r->connect_poll == PGRES_POLLING_READING ? POLLIN : POLLOUT;
		case RS_IDLE:
			return POLLIN;
		case RS_BUSY:
			return POLLIN | (r->flushing ? POLLOUT : 0);
		case RS_NONE:
			break;
	}
	return 0;
}

/* Reap COMMAND if it has exited */
static void
reap(Run *r)
{
	int			status;
	pid_t		pid;

	if (r->child_done || r->child <= 0)
		return;
	pid = waitpid(r->child, &status, WNOHANG);
	if (pid == r->child)
	{
		r->child_done = true;
		r->child_status = status;
	}
	else if (pid < 0 && errno == ECHILD)
	{
		/* cannot happen: nobody else waits for it */
		r->child_done = true;
		r->child_status = 0;
	}
}

/* COMMAND's exit status as a shell reports it */
static int
shell_status(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return DLOCK_EXIT_SOFTWARE;
}

/*
 * Give the lease back (best effort, before exiting on a failure before
 * COMMAND ran) and exit.
 */
static void
give_back_and_exit(Run *r, int status)
{
	char	   *errmsg;

	if (r->conn != NULL && r->state == RS_IDLE &&
		dlock_release_until(r->conn, &r->lease, dlock_now_ms() + 5000, &errmsg) < 0)
		dlock_error("could not release %s (it expires by itself): %s",
					r->what, errmsg);
	close_connection(r);
	exit(status);
}

/*
 * A grant that took a while (acquire waited): the lease may have been
 * granted long after the request was sent, so its deadline cannot be
 * judged from the send time.  Renew once, before COMMAND starts, and judge
 * from that.
 */
static void
confirm_lease(Run *r)
{
	const char *values[3];
	PGresult   *res;
	DlockWait	w;
	int64		start = dlock_now_ms();

	values[0] = r->lease.key;
	values[1] = r->lease.owner;
	values[2] = r->ttl_param;
	if (!dlock_send(r->conn, dlock_sql_renew, 3, values))
		dlock_fatal(DLOCK_EXIT_UNAVAILABLE, "%s", PQerrorMessage(r->conn));
	for (;;)
	{
		int			sig;

		w = dlock_wait(r->conn, start + r->o->ttl_ms, dlock_signal_fd, &res);
		if (w != DLOCK_WAIT_SIGNAL)
			break;
		if ((sig = dlock_take_signal()) != 0)
		{
			/* the renewal is in flight; the release waits for it */
			w = dlock_wait(r->conn, dlock_now_ms() + 5000, -1, &res);
			if (w == DLOCK_WAIT_DONE)
				PQclear(res);
			dlock_error("interrupted by signal %d before COMMAND started", sig);
			give_back_and_exit(r, 128 + sig);
		}
	}
	if (w == DLOCK_WAIT_TIMEOUT)
		dlock_fatal(DLOCK_EXIT_LOST,
					"lost %s: its first renewal was not confirmed within the TTL",
					r->what);
	if (w != DLOCK_WAIT_DONE)
		dlock_fatal(DLOCK_EXIT_UNAVAILABLE, "%s", PQerrorMessage(r->conn));
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		int			status = dlock_result_exit(res, r->conn);

		dlock_fatal(status, "%s", dlock_result_message(res, r->conn));
	}
	if (PQgetisnull(res, 0, 0))
		dlock_fatal(DLOCK_EXIT_LOST,
					"lost %s before COMMAND started", r->what);
	r->lease.expires_at = pg_strdup(PQgetvalue(res, 0, 0));
	r->granted_ms = (int) Min((int64) r->o->ttl_ms,
							  Max(strtoll(PQgetvalue(res, 0, 1), NULL, 10), 0));
	r->deadline = start + r->granted_ms;
	r->next_try = start + r->o->renew_every_ms;
	PQclear(res);
}

/*
 * Start COMMAND in a process group of its own, with the lease in its
 * environment (for elect its token also as DLOCK_EPOCH, the term's epoch;
 * run removes an outer elect's DLOCK_EPOCH, which would not go with
 * DLOCK_KEY).  An exec failure comes back through a close-on-exec pipe
 * (nothing arrives when exec succeeds), and then we exit 126 or 127.
 */
static void
start_child(Run *r)
{
	char	  **argv = r->o->exec_argv;
	int			exec_pipe[2];
	sigset_t	block;
	sigset_t	old;
	pid_t		pid;
	pid_t		parent = getpid();
	int			err = 0;
	ssize_t		n;
	int			i;

	if (setenv("DLOCK_KEY", r->lease.key, 1) != 0 ||
		setenv("DLOCK_OWNER", r->lease.owner, 1) != 0 ||
		setenv("DLOCK_FENCE", r->lease.fence, 1) != 0 ||
		setenv("DLOCK_EXPIRES_AT", r->lease.expires_at, 1) != 0 ||
		(r->o->elect ? setenv("DLOCK_EPOCH", r->lease.fence, 1) :
		 unsetenv("DLOCK_EPOCH")) != 0)
	{
		dlock_error("could not set the environment: %m");
		give_back_and_exit(r, DLOCK_EXIT_SOFTWARE);
	}
	if (pipe(exec_pipe) != 0 ||
		fcntl(exec_pipe[0], F_SETFD, FD_CLOEXEC) == -1 ||
		fcntl(exec_pipe[1], F_SETFD, FD_CLOEXEC) == -1)
	{
		dlock_error("could not create a pipe: %m");
		give_back_and_exit(r, DLOCK_EXIT_SOFTWARE);
	}

	fflush(stdout);
	fflush(stderr);

	/* no handler of ours may run in the child */
	sigemptyset(&block);
	for (i = 0; i < (int) NFORWARDED; i++)
		sigaddset(&block, forwarded_signals[i]);
	sigaddset(&block, SIGCHLD);
	sigprocmask(SIG_BLOCK, &block, &old);

	pid = fork();
	if (pid < 0)
	{
		sigprocmask(SIG_SETMASK, &old, NULL);
		dlock_error("could not fork: %m");
		give_back_and_exit(r, DLOCK_EXIT_SOFTWARE);
	}
	if (pid == 0)
	{
		struct sigaction sa;

		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = SIG_DFL;
		sigemptyset(&sa.sa_mask);
		for (i = 0; i < (int) NFORWARDED; i++)
			sigaction(forwarded_signals[i], &sa, NULL);
		sigaction(SIGCHLD, &sa, NULL);
		close(exec_pipe[0]);
		(void) setpgid(0, 0);
#ifdef __linux__

		/*
		 * Should dlock itself die (SIGKILL, the OOM killer), nobody renews
		 * the lease any more: tell COMMAND, as a lost lease would.
		 */
		if (r->o->on_lost != DLOCK_ON_LOST_IGNORE)
		{
			(void) prctl(PR_SET_PDEATHSIG, SIGTERM);
			if (getppid() != parent)
				_exit(DLOCK_EXIT_LOST);
		}
#endif
		sigprocmask(SIG_SETMASK, &old, NULL);
		execvp(argv[0], argv);
		err = errno;
		n = write(exec_pipe[1], &err, sizeof(err));
		(void) n;
		_exit(err == ENOENT ? DLOCK_EXIT_NOTFOUND : DLOCK_EXIT_NOEXEC);
	}

	/* both set the group, so that it exists before either goes on */
	(void) setpgid(pid, pid);
	r->child = pid;
	sigprocmask(SIG_SETMASK, &old, NULL);
	close(exec_pipe[1]);
	(void) parent;

	do
		n = read(exec_pipe[0], &err, sizeof(err));
	while (n < 0 && errno == EINTR);
	close(exec_pipe[0]);
	if (n == sizeof(err))
	{
		int			status;

		while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
			;
		r->child_done = true;
		dlock_error("could not execute \"%s\": %s", argv[0], strerror(err));
		give_back_and_exit(r, err == ENOENT ? DLOCK_EXIT_NOTFOUND : DLOCK_EXIT_NOEXEC);
	}
}

/*
 * Make sure the renewer has a connection, connecting if need be, no later
 * than until.  False (with *errmsg set) when that fails.
 */
static bool
ensure_connected(Run *r, int64 until, char **errmsg)
{
	if (r->state == RS_IDLE)
		return true;
	if (r->state == RS_NONE)
	{
		r->conn = dlock_connect_start(&r->o->conn);
		r->state = RS_CONNECTING;
	}
	if (r->conn != NULL && dlock_connect_until(r->conn, until))
	{
		r->state = RS_IDLE;
		return true;
	}
	*errmsg = r->conn ? dlock_one_line(PQerrorMessage(r->conn)) :
		pg_strdup("out of memory");
	if ((*errmsg)[0] == '\0')
		*errmsg = pg_strdup("could not connect in time");
	close_connection(r);
	return false;
}

/*
 * After COMMAND exited with the lease held: release it, best effort, and
 * return the exit status (COMMAND's, or 79 when the lease turns out to
 * have been lost meanwhile).
 */
static int
finish(Run *r)
{
	int			status = shell_status(r->child_status);
	int64		now = dlock_now_ms();
	int64		until = Min(r->deadline, now + 5000);
	char	   *errmsg = NULL;
	int			rc = -1;

	if (until <= now)
		return status;			/* it runs out by itself now */

	/* a renewal in flight: hear its answer first */
	while (r->state == RS_BUSY)
	{
		struct pollfd fd;

		now = dlock_now_ms();
		if (now >= until)
		{
			close_connection(r);
			break;
		}
		fd.fd = PQsocket(r->conn);
		fd.events = socket_events(r);
		fd.revents = 0;
		if (poll(&fd, 1, (int) Min(until - now, 1000)) > 0)
			on_socket(r, fd.revents, dlock_now_ms());
	}
	if (r->lost)
		return DLOCK_EXIT_LOST;
	/* a session-bound lease ends with its connection anyway */
	if (r->o->session_bound && r->state != RS_IDLE)
	{
		close_connection(r);
		return status;
	}
	/* release; over a new connection while the old one was dead */
	for (;;)
	{
		if (ensure_connected(r, until, &errmsg))
		{
			rc = dlock_release_until(r->conn, &r->lease, until, &errmsg);
			if (rc >= 0 || r->o->session_bound ||
				PQstatus(r->conn) != CONNECTION_BAD)
				break;
			close_connection(r);
		}
		if (r->o->session_bound || dlock_now_ms() + retry_delay(r) >= until)
			break;
		pg_usleep(retry_delay(r) * 1000L);
	}
	close_connection(r);
	if (rc < 0)
		dlock_error("could not release %s (it expires by itself): %s",
					r->what, errmsg);
	else if (rc == 0)
	{
		dlock_error("lost %s: it was no longer held when COMMAND exited",
					r->what);
		return DLOCK_EXIT_LOST;
	}
	return status;
}

/*
 * dlock run KEY -- COMMAND [ARG]...
 * dlock elect NAME VALUE -- COMMAND [ARG]...
 */
int
dlock_cmd_run(DlockOptions *o)
{
	Run			run;
	Run		   *r = &run;
	int64		start;
	int			status;

	memset(r, 0, sizeof(Run));
	r->o = o;
	r->kill_at = -1;
	r->child = -1;
	r->what = o->elect ?
		psprintf("the leadership of election \"%s\"", o->args[0]) :
		psprintf("the lease on key \"%s\"", o->args[0]);
	dlock_interval_param(r->ttl_param, sizeof(r->ttl_param), o->ttl_ms);

	r->conn = dlock_connect(&o->conn);
	dlock_signals_install(true);
	status = dlock_grant(r->conn, o, o->args[0], &start, &r->lease, o->skip_ok);
	if (status != 0)
	{
		PQfinish(r->conn);
		if (status == DLOCK_EXIT_TEMPFAIL && o->skip_ok)
			return 0;
		return status;
	}
	r->state = RS_IDLE;
	r->granted_ms = (int) Min((int64) o->ttl_ms, Max(r->lease.remaining_ms, 0));
	r->deadline = start + r->granted_ms;
	r->next_try = start + o->renew_every_ms;
	if (dlock_now_ms() >= r->next_try)
		confirm_lease(r);

	start_child(r);
	/* from now on the server's notices are no news to anyone */
	dlock_quiet_notices = true;

	for (;;)
	{
		int64		now = dlock_now_ms();
		int64		wake = now + 1000;	/* look around at least once a
										 * second */
		struct pollfd fds[2];
		int			nfds = 1;
		int			sig;
		int			rc;

		while ((sig = dlock_take_signal()) != 0)
		{
			if (!r->child_done)
				kill(-r->child, sig);
		}
		/* the watchdog guards the deadline while we are elsewhere */
		watchdog_arm(r, (r->lost || r->child_done) ? 0 : r->deadline);
		stop_group = r->child_done ? 0 : r->child;

		if (!r->lost && now >= r->deadline)
		{
			char		why[1024];

			snprintf(why, sizeof(why),
					 "no renewal was confirmed before it ran out (%d ms after the last confirmed request was sent)%s%s",
					 r->granted_ms, r->last_error ? ": " : "",
					 r->last_error ? r->last_error : "");
			lose(r, why);
		}
		reap(r);

		if (r->lost)
		{
			if (r->kill_at >= 0 && !r->killed && now >= r->kill_at)
			{
				if (!r->child_done || group_alive(r))
					kill(-r->child, SIGKILL);
				r->killed = true;
			}
			/* with term, wait for the whole group, up to the SIGKILL */
			if (r->child_done &&
				(o->on_lost != DLOCK_ON_LOST_TERM || r->killed || !group_alive(r)))
				break;
			if (r->kill_at >= 0 && !r->killed)
				wake = Min(wake, r->kill_at);
			if (r->child_done)
				wake = Min(wake, now + 50);
		}
		else
		{
			if (r->child_done)
				break;
			if (r->state == RS_NONE && now >= r->next_try)
				start_connect(r, now);
			if (r->state == RS_IDLE && now >= r->next_try)
				send_renew(r);
			if ((r->state == RS_CONNECTING || r->state == RS_BUSY) &&
				r->op_until >= 0 && now >= r->op_until)
			{
				char		msg[128];

				snprintf(msg, sizeof(msg), "no answer from the server within %d ms",
						 (int) (r->op_until - r->op_start));
				connection_failed(r, pg_strdup(msg));
				r->next_try = now;
				continue;
			}
			if (r->lost)
				continue;
			wake = Min(wake, r->deadline);
			if (r->state == RS_NONE || r->state == RS_IDLE)
				wake = Min(wake, r->next_try);
			else if (r->op_until >= 0)
				wake = Min(wake, r->op_until);
		}

		fds[0].fd = dlock_signal_fd;
		fds[0].events = POLLIN;
		fds[0].revents = 0;
		if (!r->lost && r->conn != NULL && r->state != RS_NONE)
		{
			fds[1].fd = PQsocket(r->conn);
			fds[1].events = socket_events(r);
			fds[1].revents = 0;
			nfds = 2;
		}
		now = dlock_now_ms();
		rc = poll(fds, nfds, wake > now ? (int) (wake - now) : 0);
		if (rc < 0 && errno != EINTR)
			dlock_error("poll failed: %m");
		if (rc > 0 && nfds == 2 && fds[1].revents != 0)
			on_socket(r, fds[1].revents, dlock_now_ms());
	}

	if (r->lost)
	{
		close_connection(r);
		return DLOCK_EXIT_LOST;
	}
	return finish(r);
}
