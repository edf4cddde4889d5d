# cerebro_db: `make demo` sets everything up and runs the demo; `make test` runs every test tier.
SHELL := /bin/bash
CEREBRO := scripts/cerebro.sh
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python
PGDIR := $(CURDIR)/.pg

.PHONY: help deps install start stop psql demo test test-unit test-sql test-integration \
        test-upgrade bench bench-deps bench-preprocess bench-executors clean env \
        lint

help:
	@echo "make demo     set up (Debian packages, venv, private PostgreSQL) and run the demo"
	@echo "make test     run all test tiers against a private server started for them"
	@echo "make psql     psql on the demo database      make env   connection parameters"
	@echo "make stop     stop the private server        make clean remove server, venv, build"
	@echo "make install  install the extension into the local PostgreSQL (pg_config)"
	@echo "make bench    benchmark suite against the peers (BENCH_SCALE=tiny|default|large)"

deps:
	@$(CEREBRO) deps

install: deps
	@$(CEREBRO) install

start: install
	@$(CEREBRO) start
	@$(CEREBRO) createdb

demo: start
	@$(CEREBRO) createdb cerebro
	@eval "$$($(CEREBRO) env | sed 's/^/export /')" && $(PY) demo/load_data.py --if-missing
	@CEREBRO_PY=$(PY) $(CEREBRO) psql -f demo/demo.sql

psql:
	@$(CEREBRO) psql

env:
	@$(CEREBRO) env

stop:
	@$(CEREBRO) stop

# Test tiers: unit (no database), SQL regression (psql scripts vs expected output),
# integration (psycopg2 against the real server), upgrade (ALTER EXTENSION UPDATE).
# A server that `make test` starts is stopped when the tests end; one already running (the
# demo's) is left running.
test: install
	@was_running=0; $(CEREBRO) running && was_running=1; $(CEREBRO) start; \
	  $(PY) -m pytest -q tests; rc=$$?; \
	  [ $$was_running = 1 ] || $(CEREBRO) stop; exit $$rc

test-unit: deps
	@$(PY) -m pytest -q tests/unit

test-sql test-integration test-upgrade: start
	@$(PY) -m pytest -q tests/$(subst test-,,$@)

# The benchmark suite (never part of the tests): cerebro_db against sequential Keras, Ray Tune
# and model averaging; writes bench/RESULTS.md and bench/figures/. BENCH_SCALE=large for the
# larger scales, BENCH_ARGS for more options (e.g. --only adult,hetero --skip ray).
BENCH_SCALE ?= default
BENCH_DB ?= cerebro_bench
BENCH_ARGS ?=

bench-deps: deps
	@$(PY) -c "import ray.tune, psutil, matplotlib" 2>/dev/null || \
	    $(PY) -m pip install -q -r requirements-bench.txt

bench: start bench-deps
	@$(CEREBRO) createdb $(BENCH_DB)
	@CEREBRO_BENCH_DB=$(BENCH_DB) $(PY) bench/suite.py --scale $(BENCH_SCALE) $(BENCH_ARGS)

bench-preprocess: start
	@$(PY) bench/preprocess_bench.py

# Sessions vs Ray vs Dask executors vs Ray Tune on one workload (full Fashion-MNIST by
# default; BENCH_EXECUTORS_SCALE=tiny for a smoke run): bench/results/executors.md.
BENCH_EXECUTORS_SCALE ?= realistic

bench-executors: start bench-deps
	@$(PY) -c "import ray.util.client, distributed" 2>/dev/null || \
	    $(PY) -m pip install -q -r requirements-remote.txt
	@$(CEREBRO) createdb $(BENCH_DB)
	@CEREBRO_BENCH_DB=$(BENCH_DB) $(PY) bench/executors_bench.py \
	    --scale $(BENCH_EXECUTORS_SCALE) $(BENCH_ARGS)


# ruff on the code and tests, mypy on the package (settings in pyproject.toml).
lint: deps
	@$(VENV)/bin/ruff check cerebro_db tests scripts bench demo
	@$(PY) -m mypy

clean: stop
	rm -rf $(PGDIR) build $(VENV) .pytest_cache
