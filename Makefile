# Every target runs inside .venv, created on first use from pyproject.toml.
PY := .venv/bin/python
STAMP := .venv/.installed
TRITON_STAMP := .venv-triton/.installed
PERF_ANALYZER := .perf_analyzer/bin/perf_analyzer
KSERVE := .venv-kserve/.installed
MODELS := models/efficientnet_lite0-fp32.onnx models/efficientnet_lite0-int8.onnx models/efficientnet_lite0-int8-trt.onnx \
          models/efficientnet_lite0-fp16.onnx

.PHONY: install models serve status test test-unit lint bench overload fairness hostile autoscale soak k8s clean perf-analyzer system-deps proto

$(STAMP): pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $@

install: $(STAMP)   ## create .venv and install the project with its test and benchmark extras

# The built-in model through the same commands as any model: its declaration is configs/local.yaml's args.model.
# Each INT8 and FP16 build gets its report beside it (models/<name>.report.{json,md}).
QUANTIZE := $(PY) -m app.models quantize --model models/efficientnet_lite0-fp32.onnx --config configs/local.yaml
FP32 := models/efficientnet_lite0-fp32.onnx
$(FP32): | $(STAMP)
	$(PY) -m app.models build
# Each build its own rule: a missing one is built alone, the others kept.
models/efficientnet_lite0-int8-trt.onnx: | $(FP32)
	$(QUANTIZE) --output $@ --target tensorrt
models/efficientnet_lite0-int8.onnx: | $(FP32)
	$(QUANTIZE) --output $@
models/efficientnet_lite0-fp16.onnx: | $(FP32)
	$(QUANTIZE) --output $@ --target fp16

models: $(MODELS)   ## FP32 + INT8 + TensorRT INT8 + FP16 + their quality reports (models/), built once

# Serve's environment: configs/serve.env, the admission front's limits from local.yaml's args.front, and the front
# as Serve's HAProxy. Once the app is ready, a line says whether the front is in place (app/front/).
serve: $(MODELS)    ## the app on this machine, CPU only, with Serve's environment from configs/serve.env
	@$(PY) -m app.front status http://127.0.0.1:8000 &
	set -a && . configs/serve.env && eval "$$($(PY) -m app.front env configs/local.yaml)" && set +a && \
	  RAY_SERVE_HAPROXY_BINARY_PATH=$(CURDIR)/.venv/bin/app-haproxy .venv/bin/serve run configs/local.yaml

status: $(STAMP)    ## serve status of the running app (Ray 2.60 clusters use token auth)
	RAY_AUTH_MODE=token .venv/bin/serve status

# Triton's perf_analyzer (from the tritonclient 2.41 wheel, benchmarks/perf_analyzer.py says why), for the tests
# that run it unmodified against the service.
$(PERF_ANALYZER): | $(STAMP)
	$(PY) -m benchmarks.perf_analyzer --setup

# KServe's Python SDK in a venv of its own, for tests/test_kserve_client.py (tests/kserve_client.py says why).
$(KSERVE): | $(STAMP)
	$(PY) -m tests.kserve_client --setup

# The Debian packages the tests run (wrk, prometheus, redis-server, chromium, libb64-0d), installed when missing:
# with apt-get as root or with passwordless sudo, else one line naming them and the command, and make stops.
system-deps:
	@bash .ci/system-deps

test-unit: $(STAMP)  ## the fast tier while working: the unit tests of pure code (no Ray, no Debian packages)
	$(PY) -m pytest -q $$(ls tests/test_*_unit.py)

test: system-deps $(STAMP) $(PERF_ANALYZER) $(KSERVE)      ## the whole suite, slow and multi-node tests included, as CI runs it
	$(PY) -m pytest -q
	@# Each module with its own Ray cluster in a process of its own, as Ray runs its fault tests (--forked): a
	@# driver that outlived a killed GCS, and threads left by one module, are not inherited by the next (CI once
	@# saw the next module's GCS never start, without a line of log: most likely forked under those threads).
	for f in $$(grep -l '^pytestmark = .*pytest.mark.cluster' tests/test_*.py); do \
	  $(PY) -m pytest -q -m cluster $$f || exit 1; done

lint: $(STAMP)
	$(PY) -m ruff check app tests benchmarks
	$(PY) -m ruff format --check app tests benchmarks
	$(PY) -m mypy
	.venv/bin/lint-imports
	$(PY) -m app.ops.config_reference --check
	$(PY) -m app.config configs/local.yaml configs/prod.yaml configs/serve.env configs/examples/*.yaml
	$(PY) -m app.ops.k8s render --check

# The Open Inference Protocol's gRPC messages (app/protocol/v2/pb/), generated anew from the installed tritonclient's
# descriptors by grpcio-tools' protoc, in a venv of its own (app/ops/proto_gen.py: what is pinned, and why).
PROTOGEN := .venv-protogen/bin/python
$(PROTOGEN): | $(STAMP)
	python3 -m venv .venv-protogen
	$(PROTOGEN) -m pip install --quiet "grpcio-tools==$$($(PY) -c 'import app.ops.proto_gen as g; print(g.GRPCIO_TOOLS)')"

proto: $(PROTOGEN)   ## regenerate app/protocol/v2/pb/*_pb2* (python -m app.ops.proto_gen --check: are they current?)
	$(PY) -m app.ops.proto_gen --tools-python $(PROTOGEN)

# Triton's peer runs in a venv made from the system's Python (benchmarks/baselines/triton_peer.py says why).
$(TRITON_STAMP): | $(STAMP)
	$(PY) -m benchmarks.baselines.triton_peer --setup
	touch $@

bench: $(MODELS) $(TRITON_STAMP)   ## the peers (Triton, LitServe, FastAPI, Serve) and this app in one run: benchmarks/results/<date>-<host>.{json,md,png}
	$(PY) -m benchmarks.run
	$(PY) -m benchmarks.model_bench
	$(PY) -m benchmarks.preprocess_bench
	$(PY) -m benchmarks.engine_bench

overload: $(MODELS) $(TRITON_STAMP)   ## a retry storm (32..1024 connections) and 2x/4x/10x open-loop load: this app with and without its admission front, and Triton
	$(PY) -m benchmarks.overload --targets app,app_fastrefuse,app_router,triton

fairness: $(MODELS)   ## one greedy client (500 connections) beside a polite one (4): this app's front with and without its per-client bound, and without the front
	$(PY) -m benchmarks.fairness --targets app,app_nofair,app_router

hostile: $(MODELS)   ## against `make serve` (running): memory bombs, gzip bombs, 200 slow bodies, 200 slow heads, 30 s each, beside a probe
	$(PY) -m benchmarks.hostile_load --url http://127.0.0.1:8000 --attack all --duration 30 --clients 16 --connections 200

autoscale: $(MODELS)   ## prod.yaml's autoscaling policies on a local multi-node cluster under a 4x load step
	$(PY) -m benchmarks.autoscale

perf-analyzer: $(PERF_ANALYZER)   ## Triton's perf_analyzer against `make serve` (HTTP 8000, gRPC 9000): every model, both protocols
	$(PY) -m benchmarks.perf_analyzer

soak: $(MODELS)     ## 10 minutes at ~70% of capacity: memory per replica, errors, dashboard panels (needs `prometheus`)
	$(PY) -m benchmarks.soak --start --minutes 10 --shadow-fraction 0.05

k8s: $(STAMP)       ## re-render k8s/rayservice.yaml from configs/prod.yaml
	$(PY) -m app.ops.k8s render

clean:
	rm -rf models .pytest_cache .mypy_cache .ruff_cache .venv-triton .perf_analyzer .venv-kserve
