# The README's two commands: `make up` runs gpulab, `make test` runs the tests.
# Both install what they need first (scripts/setup.sh is re-runnable).
.PHONY: up down test lint bench

up:
	bash scripts/setup.sh
	.venv/bin/gpulab up

down:
	.venv/bin/gpulab down

test:
	bash scripts/setup.sh test
	.venv/bin/ruff check .
	.venv/bin/python -m pytest

bench:
	bash scripts/setup.sh
	.venv/bin/python benchmarks/spawn.py
