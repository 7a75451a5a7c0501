# dlock: distributed leases with fencing tokens, as a PostgreSQL extension.
# Build with PGXS: make && make install; test against a running server with
# make installcheck (pg_regress, isolation specs, TAP).  tools/test does all of
# that on a throwaway cluster.

MODULE_big = dlock
OBJS = \
	extension/args.o \
	extension/common.o \
	extension/dlock.o \
	extension/durable.o \
	extension/election.o \
	extension/events.o \
	extension/fence.o \
	extension/horizon.o \
	extension/keyhash.o \
	extension/keylock.o \
	extension/lease.o \
	extension/leasetable.o \
	extension/liveness.o \
	extension/memstore.o \
	extension/objects.o \
	extension/settings.o \
	extension/shmem.o \
	extension/stats.o \
	extension/storage.o \
	extension/trigger.o \
	extension/wait.o

EXTENSION = dlock
DATA = extension/dlock--0.1.sql \
	extension/dlock--0.1--0.2.sql extension/dlock--0.2--0.3.sql \
	extension/dlock--0.3--0.4.sql extension/dlock--0.4--0.5.sql \
	extension/dlock--0.5--0.6.sql extension/dlock--0.6--0.7.sql
PGFILEDESC = "dlock - leases with fencing tokens"

REGRESS = lease_api lease_errors fence_trigger trust operate election permits
REGRESS_OPTS = --inputdir=. --load-extension=dlock
ISOLATION = acquire_race stale_owner repeatable_read \
	fence_takeover fence_stale_write fence_isolation fence_two_keys \
	fence_savepoint renew_shortening no_wait_for_strangers \
	renew_in_flight lock_delay session_bound_release \
	election_observe election_fence permits_fence shared_exclusive \
	permits_renewal
ISOLATION_OPTS = --load-extension=dlock
# (TAP_TESTS= in the environment, as for "pgxn check", leaves them out)
TAP_TESTS ?= 1

# Tests that need shared_preload_libraries = 'dlock' (counters, FIFO
# queues).  tools/test runs them on its cluster restarted with it:
# make installcheck REGRESS="$(PRELOADED_REGRESS)" ISOLATION= TAP_TESTS= ...
PRELOADED_REGRESS = stats
PRELOADED_ISOLATION = fifo_order

# Isolation specs that tools/test runs once more with dlock.storage =
# memory (preloaded), with the same expected outputs: all but
# no_wait_for_strangers, whose prune() deletes only at its commit in table
# mode (in memory at once).
MEMORY_ISOLATION = $(filter-out no_wait_for_strangers,$(ISOLATION)) \
	$(PRELOADED_ISOLATION)

# print-VAR: print a variable (tools/test reads the lists above)
print-%:
	@echo '$($*)'

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The command-line client (client/, its own PGXS Makefile: PGXS allows one
# PROGRAM or MODULE_big per Makefile), and the test programs that are never
# installed (TOOLDIRS: the chaos checker, the hostile-input generator).
# Prerequisites only, so that "all" stays the default goal and PGXS's own
# recipes stay as they are.
TOOLDIRS = chaos fuzz

all: all-client $(addprefix all-,$(TOOLDIRS))
install: install-client
clean: clean-client $(addprefix clean-,$(TOOLDIRS))
# the TAP tests run the client and the test programs; the package's
# installcheck (TAP_TESTS=, debian/) needs neither, nor a compiler
ifneq ($(TAP_TESTS),)
installcheck: all-client $(addprefix all-,$(TOOLDIRS))
endif

.PHONY: all-client install-client clean-client \
	$(addprefix all-,$(TOOLDIRS)) $(addprefix clean-,$(TOOLDIRS))

all-client:
	$(MAKE) -C client PG_CONFIG=$(PG_CONFIG)

install-client: all-client
	$(MAKE) -C client PG_CONFIG=$(PG_CONFIG) install

clean-client:
	$(MAKE) -C client PG_CONFIG=$(PG_CONFIG) clean

$(addprefix all-,$(TOOLDIRS)): all-%:
	$(MAKE) -C $* PG_CONFIG=$(PG_CONFIG)

$(addprefix clean-,$(TOOLDIRS)): clean-%:
	$(MAKE) -C $* PG_CONFIG=$(PG_CONFIG) clean

# make dist: the release tarball (for PGXN: META.json is at the top) of
# what is committed at HEAD, as dlock-VERSION.zip and .tar.gz.
DIST_VERSION := $(shell sed -n 's/^ *"version": "\(.*\)",$$/\1/p' META.json | head -n 1)

.PHONY: dist
dist:
	git archive --format=zip --prefix=dlock-$(DIST_VERSION)/ -o dlock-$(DIST_VERSION).zip HEAD
	git archive --format=tar.gz --prefix=dlock-$(DIST_VERSION)/ -o dlock-$(DIST_VERSION).tar.gz HEAD
