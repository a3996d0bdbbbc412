# kubeinfer — every target does its own set-up on a fresh machine.
SHELL := /bin/bash
PY    := .venv/bin/python
VENV_STAMP := .venv/.installed
export PYTHONPATH := $(CURDIR)/e2e
# The cluster's processes are children of whoever starts them; CI's clean clone gets its own state dir.
export KUBEINFER_CLUSTER_DIR ?= $(CURDIR)/.cluster

.PHONY: help venv deps kernels test test-fast lint format crds crds-check cluster cluster-down demo \
        bench-engine bench-precisions bench-int8-accuracy bench-serve sim-autoscaling clean dashboards

help:
	@echo "make demo        cluster up, operator installed, tiny model served, one chat answered"
	@echo "make test        every test: unit, server, engine, cluster (installs what it needs)"
	@echo "make test-fast   unit tests only (no cluster, no live servers)"
	@echo "make cluster / cluster-down   the local Kubernetes (etcd, apiserver, controllers, process kubelet, Prometheus)"
	@echo "make crds        regenerate crds/ and the chart's copy from the pydantic models"
	@echo "make bench-engine / bench-serve / sim-autoscaling   benchmarks (numbers in README)"
	@echo "make bench-precisions / bench-int8-accuracy        fp32 vs int8 vs bf16 on CPU (speed, accuracy)"

$(VENV_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all]'
	touch $@

venv: $(VENV_STAMP)

# Debian packages (iproute2, iptables, ...) and the Go-built binaries (Kubernetes, etcd, helm, Prometheus, Jaeger),
# cached outside the repo by version.
deps: venv
	bash e2e/install_deps.sh
	bash e2e/build_binaries.sh
	nice -n 10 bash e2e/build_jaeger.sh  # the tracing tests' backend
	$(MAKE) kernels

# The engine's C++ CPU kernels, built once per machine (cached by torch under ~/.cache/torch_extensions).
kernels: venv
	$(PY) -m kubeinfer_runtime.models.fused_ops

lint: venv
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format: venv
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

crds: venv
	$(PY) -m kubeinfer_operator.api.crd
	bash charts/sync_crds.sh

# The Grafana dashboard the chart ships, generated (kubeinfer_operator/dashboard.py).
dashboards: venv
	$(PY) -m kubeinfer_operator.dashboard

crds-check: venv
	$(PY) -m kubeinfer_operator.api.crd --check

test: deps lint
	.venv/bin/pytest -p no:cacheprovider

test-fast: kernels
	.venv/bin/pytest -p no:cacheprovider -m "not cluster and not slow"

cluster: deps
	$(PY) -m localcluster up

cluster-down:
	test -x $(PY) && $(PY) -m localcluster down || true

demo: deps
	$(PY) e2e/demo.py

bench-engine: kernels
	$(PY) benchmarks/engine_throughput.py --repeats 3 --json benchmarks/results/engine_throughput.json

bench-precisions: kernels
	$(PY) benchmarks/engine_precisions.py --repeats 5 --json benchmarks/results/engine_precisions.json

bench-int8-accuracy: kernels
	$(PY) benchmarks/int8_accuracy.py --json benchmarks/results/int8_accuracy.json

bench-serve: venv
	mkdir -p out
	bash benchmarks/serve_sweep.sh

sim-autoscaling: venv
	$(PY) benchmarks/autoscaling_sim.py --json benchmarks/sim/results/autoscaling.json --plot-dir benchmarks/sim/results

clean: cluster-down
	rm -rf .venv out .pytest_cache .ruff_cache
