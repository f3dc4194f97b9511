# tideflow developer commands. `make help` lists them.
VENV ?= .venv
PY := $(VENV)/bin/python
# Test workers (pytest-xdist): tests/tiers.py gives a worker the cluster tier whole, else
# a whole module (its fixtures start once). TEST_JOBS=0 runs in this process.
TEST_JOBS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_JOBS)
# Bytecode is written and reused: where PYTHONDONTWRITEBYTECODE is set, each test worker
# and each process a test starts would compile tideflow and rewrite the tests' asserts
# again (collecting the unit tier: 22 s, 12 s with the cache).
unexport PYTHONDONTWRITEBYTECODE
.DEFAULT_GOAL := help

.PHONY: help bootstrap browser demo down status cluster cluster-build cluster-down cluster-pin test test-fast test-processes test-servers test-research test-torch-low lint fmt schema constraints bench docs clean

help: ## Show the available targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

bootstrap: $(VENV)/.installed ## Create .venv and install tideflow with pinned dependencies

$(VENV)/.installed: pyproject.toml deploy/local/constraints.txt deploy/local/bootstrap.sh
	deploy/local/bootstrap.sh
	@touch $@

browser: ## Install Debian's chromium and chromedriver for the browser test (root or sudo)
	deploy/local/install-browser.sh

demo: bootstrap ## Start S3 + MLflow + Airflow on 127.0.0.1 and run the digits pipeline
	$(PY) -m tideflow.stack demo

down: ## Stop the local stack
	@if [ -x $(PY) ]; then $(PY) -m tideflow.stack down; fi

status: ## Show the local stack's servers and login
	$(PY) -m tideflow.stack status

cluster: bootstrap ## Build (once per version) and start a real Kubernetes control plane with Kueue, JobSet and kwok nodes on 127.0.0.1
	$(PY) -m tideflow.stack cluster

cluster-build: bootstrap ## Build the control plane's binaries from Go modules, once per version (without Go the cluster tier skips)
	@if command -v go >/dev/null 2>&1; then $(PY) -m tideflow.stack.cluster.build; \
	else echo "Go is not installed: the cluster tier skips where no binaries are cached"; fi

cluster-down: ## Stop the local Kubernetes cluster
	@if [ -x $(PY) ]; then $(PY) -m tideflow.stack cluster-down; fi

cluster-pin: bootstrap ## Rewrite deploy/cluster/modules from deploy/cluster/versions.env (after changing a version)
	$(PY) -m tideflow.stack.cluster.pin

test: bootstrap cluster-build ## Run every test, every tier (tests/tiers.py: unit, processes, servers, browser, cluster, research)
	$(PYTEST)

test-fast: bootstrap ## Run the `unit` tier: no process, no server (a test that starts one fails)
	$(PYTEST) -m unit

test-processes: bootstrap ## Run the `processes` tier: tests that spawn workers, supervisors, CLIs
	$(PYTEST) -m "processes and not servers and not browser and not cluster"

test-servers: bootstrap ## Run the `servers` tier: tests that start S3, MLflow, Airflow
	$(PYTEST) -m servers

test-research: bootstrap ## Run the `research` tier: the tests of research/
	$(PYTEST) -m research

test-torch-low: bootstrap ## Run the runtime tests with the lowest torch the platform extra accepts (2.11; a second venv)
	deploy/local/torch-range.sh

lint: bootstrap ## ruff, mypy (strict on the core; operators, plugins, DAG files too) and the import contracts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) deploy/local/typecheck.py
	$(VENV)/bin/lint-imports

fmt: bootstrap ## Format the code
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

schema: bootstrap ## Regenerate pipelines/schema.json
	$(VENV)/bin/tideflow schema -o pipelines/schema.json

constraints: ## Re-pin deploy/local/constraints.txt from the current .venv
	@{ echo "# Pinned versions of every package in the environment, tested together."; \
	   echo "# Regenerate with \`make constraints\` after changing dependencies in pyproject.toml."; \
	   $(VENV)/bin/pip freeze | grep -vE '^(#|-e )|^tideflow' | sed 's/^torch==2.13.0+cpu$$/torch==2.13.0/'; \
	} > deploy/local/constraints.txt

bench: bootstrap ## Run the DAG-parsing benchmark (installs the dag-factory baseline)
	$(PY) -m pip install --quiet -c deploy/local/constraints.txt -e '.[bench]'
	$(PY) bench/parse_dags.py

docs: bootstrap ## Build the documentation site into site/ (strict: any warning fails)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --clean

clean: down cluster-down ## Stop the stack and delete local state (.tideflow/)
	rm -rf .tideflow
