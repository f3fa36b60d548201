# Targets named in the README. Everything runs inside .venv (make install creates it).
PY ?= .venv/bin/python
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: install models serve test lint bench soak clean

install:            ## create .venv and install the project with its test extras
	python3 -m venv .venv
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[test,bench]'

models:             ## build FP32 + INT8 and write the quality report
	$(PY) -m app.models build
	$(PY) -m app.models quantize

serve: models       ## the app on this machine, CPU only (HAProxy in front: see README "Performance")
	RAY_SERVE_ENABLE_HA_PROXY=1 serve run configs/local.yaml

test:               ## the whole test suite (slow and multi-node included), as CI runs it
	$(PY) -m pytest -q
	$(PY) -m pytest -q -m cluster

lint:
	$(PY) -m ruff check app tests benchmarks
	$(PY) -m ruff format --check app tests benchmarks
	$(PY) -m mypy

bench:              ## peers and this app, one run, results in benchmarks/results/
	$(PY) -m benchmarks.run

soak:               ## 10 minutes at ~70% of capacity: memory per replica, errors, dashboard panels
	$(PY) -m benchmarks.soak --start --minutes 10 --shadow-fraction 0.05

clean:
	rm -rf models .pytest_cache .mypy_cache .ruff_cache
