# ranksight: `make demo` and `make test` set everything up from nothing (venv, packages, Kafka jars).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.ranksight-installed
PYTEST_ARGS ?=
# The UI's charting library, from the npm registry at build time (never a CDN at run time).
ECHARTS_VERSION := 6.0.0
ECHARTS_JS      := ui/static/vendor/echarts.min.js

.PHONY: demo test unit integration lint bench kafka-jars ui-assets clean help

help:
	@echo "make demo   - start a local Kafka, simulate a cluster, detect, store in ClickHouse (chDB), show alerts"
	@echo "make test   - the whole test suite (starts its own Kafka broker)"
	@echo "make lint   - ruff + mypy"
	@echo "make bench  - benchmarks (print numbers; never part of the tests)"

$(STAMP): pyproject.toml
	@command -v java >/dev/null || { echo "error: Java 17+ is required (the local Kafka broker runs on it)"; exit 1; }
	@command -v mvn >/dev/null || { echo "error: Maven is required (it fetches the Kafka jars from Maven Central)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev,rocksdb]"
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

test: $(STAMP) kafka-jars ui-assets
	$(BIN)/python -m pytest $(PYTEST_ARGS)

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

integration: $(STAMP) kafka-jars ui-assets
	$(BIN)/python -m pytest -m integration $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy schemas producers streams sinks infra ranksight

bench: $(STAMP) kafka-jars ui-assets
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
