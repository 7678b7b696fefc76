# The README's two commands: `make up` runs gpulab, `make test` runs the tests.
# Both install what they need first (scripts/setup.sh is re-runnable).
# `make test-fast` is the fast lane (docs/testing.md): no Docker engine (a test that
# reaches for one fails), no hub start, no kernels; `make test` stays the whole suite, CI's.
.PHONY: up down test test-fast lint bench

up:
	bash scripts/setup.sh
	.venv/bin/gpulab up

down:
	.venv/bin/gpulab down

# The whole suite's test files spread over this many workers (pytest-xdist; a file stays
# on one worker): most of a run waits on builds, containers and browsers, not the CPU.
TEST_WORKERS ?= 2

test:
	bash scripts/setup.sh test
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile

test-fast:
	bash scripts/setup.sh fast
	.venv/bin/ruff check .
	DOCKER_HOST=unix:///nonexistent/the-fast-lane-has-no-docker.sock \
	  .venv/bin/python -m pytest -m "not docker and not browser and not gpu and not slow"

bench:
	bash scripts/setup.sh
	.venv/bin/python benchmarks/spawn.py
