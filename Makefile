# ranksight: `make demo` and `make test` set everything up from nothing (venv, packages, Kafka jars).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.ranksight-installed
PYTEST_ARGS ?=
# The UI's charting library, from the npm registry at build time (never a CDN at run time).
ECHARTS_VERSION := 6.0.0
ECHARTS_JS      := ui/static/vendor/echarts.min.js

.PHONY: demo test unit integration lint bench kafka-jars ui-assets clean help test-frameworks framework-torch test-scenarios
.PHONY: dist test-wheel test-deploy docs

help:
	@echo "make demo   - start a local Kafka, simulate a cluster, detect, store in ClickHouse (chDB), show alerts"
	@echo "make test   - the whole test suite (starts its own Kafka broker)"
	@echo "make unit   - the unit tests only (no broker, no services; seconds)"
	@echo "make integration - the integration tests (real Kafka broker, real chDB)"
	@echo "make lint   - ruff + mypy"
	@echo "make bench  - benchmarks (print numbers; never part of the tests)"
	@echo "make dist   - the sdist and the wheel in dist/ (the UI's charting library included)"
	@echo "make test-wheel  - install the wheel in fresh venvs outside the repository and run it there"
	@echo "make test-deploy - render and validate deploy/ (Kubernetes, systemd, Prometheus rules, compose)"
	@echo "make docs   - the documentation site in site/ (mkdocs build --strict)"

$(STAMP): pyproject.toml
	@command -v java >/dev/null || { echo "error: Java 17+ is required (the local Kafka broker runs on it)"; exit 1; }
	@command -v mvn >/dev/null || { echo "error: Maven is required (it fetches the Kafka jars from Maven Central)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[server,dev]"
	touch $(STAMP)

kafka-jars: $(STAMP)
	$(BIN)/ranksight kafka fetch

# ECharts: `npm pack` the pinned release into ~/.cache/ranksight once, copy its minified build in.
ui-assets: $(ECHARTS_JS)
$(ECHARTS_JS):
	@command -v npm >/dev/null || { echo "error: npm is required once, to fetch the UI's charting library (echarts@$(ECHARTS_VERSION))"; exit 1; }
	mkdir -p $(HOME)/.cache/ranksight/npm $(dir $@)
	test -f $(HOME)/.cache/ranksight/npm/echarts-$(ECHARTS_VERSION).tgz || \
		(cd $(HOME)/.cache/ranksight/npm && npm pack --silent echarts@$(ECHARTS_VERSION) >/dev/null)
	tar -xzf $(HOME)/.cache/ranksight/npm/echarts-$(ECHARTS_VERSION).tgz -O package/dist/echarts.min.js > $@.tmp
	mv $@.tmp $@

demo: $(STAMP) kafka-jars ui-assets
	$(BIN)/ranksight demo

# The whole suite as two pytest processes at once: the unit and scenario tests (pure CPU, no
# services; their output follows the other's) beside the integration tests (a broker, workers,
# chDB and a browser, much of it waiting on them). On the 2-core CI machine this is ~2/3 of the
# serial time; `make unit`, `make integration` and `make test-scenarios` run parts alone.
OFFLINE_LOG ?= $(VENV)/test-offline.log
test: $(STAMP) kafka-jars ui-assets
	@basetemp=$$(mktemp -d -t ranksight-offline.XXXXXX); \
	$(BIN)/python -m pytest tests/unit tests/scenarios --basetemp=$$basetemp/t $(PYTEST_ARGS) > $(OFFLINE_LOG) 2>&1 & offline=$$!; \
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS); integration=$$?; \
	wait $$offline; offline_rc=$$?; \
	echo "=== tests/unit + tests/scenarios (ran beside the integration tests) ==="; cat $(OFFLINE_LOG); \
	echo "=== integration exit $$integration, unit + scenarios exit $$offline_rc ==="; \
	test $$integration -eq 0 -a $$offline_rc -eq 0

# The SDK in the real frameworks (.ci/run runs it after `make test`): torchrun DDP over gloo, a
# Lightning Trainer (DDP on CPU), a Hugging Face Trainer, each publishing through the real broker to
# the real worker, and the callbacks' own tests. Own venv: PyPI's torch (its CUDA build runs on
# CPU; ~5 GB with its CUDA libraries, kept in pip's cache between runs) with every package pinned
# in .ci/framework-requirements.txt and installed without resolution (resolving lightning +
# transformers + faust took over 16 minutes: faust wants click<8.4, huggingface-hub click>=8.4.2).
FRAMEWORK_VENV ?= $(VENV)/frameworks
FRAMEWORK_REQS := .ci/framework-requirements.txt
FRAMEWORK_STAMP := $(FRAMEWORK_VENV)/.ranksight-frameworks
FRAMEWORK_TESTS := tests/unit/producers/test_training_callbacks.py tests/unit/producers/test_training_layout.py \
  tests/integration/producers/test_training_frameworks.py \
  tests/integration/producers/test_torch_example.py tests/integration/producers/test_frameworks_live.py \
  tests/integration/producers/test_comm_jobs.py tests/integration/producers/test_loader_real.py \
  tests/integration/producers/test_elastic.py
test-frameworks: kafka-jars framework-torch
	RANKSIGHT_FRAMEWORK_TESTS=1 RANKSIGHT_TORCH_TESTS=1 $(FRAMEWORK_VENV)/bin/python -m pytest $(FRAMEWORK_TESTS) $(PYTEST_ARGS)

framework-torch: $(FRAMEWORK_STAMP)
$(FRAMEWORK_STAMP): $(FRAMEWORK_REQS) pyproject.toml
	@test -x $(FRAMEWORK_VENV)/bin/python || $(PYTHON) -m venv $(FRAMEWORK_VENV)
	$(FRAMEWORK_VENV)/bin/python -m pip install -q --no-deps -r $(FRAMEWORK_REQS)
	$(FRAMEWORK_VENV)/bin/python -m pip install -q --no-deps --no-build-isolation -e .
	$(FRAMEWORK_VENV)/bin/python -c "import torch, lightning, transformers; print('torch', torch.__version__)"
	@touch $@

# Every shipped scenario through the worker's core as well as offline (`make test` compares a
# subset that raises every rule: tests/scenarios/test_scenarios.py CORE_SCENARIOS); ~15 minutes.
test-scenarios: $(STAMP)
	RANKSIGHT_ALL_SCENARIOS=1 $(BIN)/python -m pytest tests/scenarios $(PYTEST_ARGS)

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

integration: $(STAMP) kafka-jars ui-assets
	$(BIN)/python -m pytest -m integration $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy schemas producers streams sinks infra ranksight ui

bench: $(STAMP) kafka-jars ui-assets
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Packaging and deployment (issue 36). `dist` needs the charting library first: setup.py refuses
# to build a wheel without it. `test-wheel` runs outside the repository (.ci/check-wheel says what).
dist: $(STAMP) ui-assets
	rm -rf dist
	$(BIN)/python -m build -o dist .

test-wheel: dist kafka-jars
	PYTHON=$(PYTHON) .ci/check-wheel

# deploy/ alone (make test runs these too: they are under tests/unit and tests/integration).
test-deploy: $(STAMP)
	$(BIN)/python -m pytest tests/unit/deploy tests/integration/scheduler/test_slurm_prolog.py $(PYTEST_ARGS)

docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache dist build site
