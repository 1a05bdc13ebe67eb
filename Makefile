# gpusizer: every set-up step lives here, so a fresh machine needs only `make demo` or `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: help
help: ## List the targets with what they do
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-24s\033[0m %s\n", $$1, $$2}'

# The runtime dependencies at the lock's versions (the image's), so a new upstream release
# changes nothing here until `make lock` takes it.
$(VENV)/.installed: pyproject.toml requirements.lock
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --constraint requirements.lock -e '.[dev]'
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## Create the Python virtualenv with the operator and its dev tools

.PHONY: lock
lock: venv ## Upgrade the runtime dependencies to their newest releases and rewrite requirements.lock
	$(BIN)/pip install --quiet --upgrade --upgrade-strategy eager -e '.[dev]'
	$(PY) tests/unit/test_dockerfile.py > requirements.lock.new
	mv requirements.lock.new requirements.lock
	touch $(VENV)/.installed

.PHONY: prometheus
prometheus: ## Install Prometheus from Debian's packages if it is missing
	scripts/install-prometheus.sh

.PHONY: helm
helm: ## Build helm v3.21.4 from its Go module into ~/.cache/gpusizer/bin (once)
	scripts/install-helm.sh >/dev/null

.PHONY: podman
podman: ## Install podman, runc and debootstrap from Debian's packages if they are missing
	scripts/install-podman.sh

.PHONY: image
image: venv ## Build the operator's image without a daemon: localhost/gpusizer:<version> and :dev
	scripts/build-image.sh

.PHONY: lint
lint: venv ## ruff (lint and format check) and mypy strict on the package
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

.PHONY: crds
crds: venv ## Regenerate crds/, deploy/crd*.yaml and the chart's CRDs from the pydantic models
	$(BIN)/gpusizer crds > crds/gpusizer.io_workloadsizings.yaml
	cp crds/gpusizer.io_workloadsizings.yaml deploy/crd.yaml
	cp crds/gpusizer.io_workloadsizings.yaml charts/gpusizer/crds/gpusizer.io_workloadsizings.yaml
	$(BIN)/gpusizer crds --kind GPUPartitioning > crds/gpusizer.io_gpupartitionings.yaml
	cp crds/gpusizer.io_gpupartitionings.yaml deploy/crd-gpupartitionings.yaml
	cp crds/gpusizer.io_gpupartitionings.yaml charts/gpusizer/crds/gpusizer.io_gpupartitionings.yaml
	$(PY) scripts/gen_api_docs.py > docs/api-reference.md

.PHONY: unit
unit: venv helm prometheus ## Fast tests of the pure parts (policy, models, parsing)
	$(BIN)/pytest -q tests/unit

.PHONY: integration
integration: venv prometheus ## Tests against a real Prometheus server started on a free port
	$(BIN)/pytest -q tests/integration

.PHONY: cluster-binary
cluster-binary: ## Build (or reuse from the cache) the local control-plane binary
	e2e/scripts/build-cluster.sh

.PHONY: cluster-up
cluster-up: venv prometheus cluster-binary ## Start the local GPU cluster; writes .cluster/env
	e2e/scripts/cluster-up.sh

.PHONY: node-binary
node-binary: ## Build (or reuse from the cache) the real node: kubelet, containerd v2, CNI loopback, pause
	e2e/scripts/build-node.sh

.PHONY: node-up
node-up: venv cluster-up node-binary ## Join a real kubelet + containerd node to the local cluster; writes .node/env
	e2e/scripts/node-up.sh

.PHONY: node-down
node-down: ## Stop the real node (its pods, containerd, the kubelet) and delete its Node
	e2e/scripts/node-down.sh

.PHONY: cluster-down
cluster-down: ## Stop every process the local cluster started and remove its state
	e2e/scripts/cluster-down.sh

.PHONY: e2e
e2e: venv prometheus cluster-binary helm image node-binary ## End-to-end tests on the local GPU cluster (starts its own), fault injection last
	$(BIN)/pytest -q e2e/tests

.PHONY: e2e-image
e2e-image: venv prometheus cluster-binary helm image ## Only the image's e2e tests (also part of make e2e)
	$(BIN)/pytest -q e2e/tests/test_image.py

.PHONY: e2e-node
e2e-node: venv prometheus cluster-binary helm image node-binary ## Only the real node's e2e test: the chart's operator as a real pod (also part of make e2e)
	$(BIN)/pytest -q e2e/tests/test_node.py

.PHONY: e2e-faults
e2e-faults: venv prometheus cluster-binary helm ## Only the fault-injection e2e tests (also part of make e2e)
	$(BIN)/pytest -q e2e/tests/test_faults.py

.PHONY: test
test: lint unit integration e2e ## Everything CI runs: lint, types, unit, integration, e2e

.PHONY: demo
demo: venv prometheus cluster-binary ## The main job: the operator on the local GPU cluster under load
	$(PY) -m e2e.demo

.PHONY: bench-decision-quality
bench-decision-quality: venv ## Frontiers of gpusizer, HPA and KEDA over knob sweeps, shared and generated traces
	$(PY) bench/decision_quality.py

ACTIVATOR_OUT ?= bench-activator.json

.PHONY: bench-activator
bench-activator: venv prometheus cluster-binary ## Activator on the local cluster: wake latency, loss, overhead (ACTIVATOR_OUT=bench-activator.json)
	$(PY) bench/activator.py --out $(ACTIVATOR_OUT)

PARTITIONING_OUT ?= bench-partitioning.json

.PHONY: bench-partitioning
bench-partitioning: venv ## GPUs generated fleets need: whole GPUs, gpusizer's plan, the exact optimum (PARTITIONING_OUT=bench-partitioning.json)
	$(PY) bench/partitioning.py --out $(PARTITIONING_OUT)

# variables, not $(or ...): a function splits its arguments at the commas of the list
SIZES ?= 100,1000,5000
OUT ?= bench-scale.json

.PHONY: bench-scale
bench-scale: venv prometheus cluster-binary ## Operator scale: one operator, N WorkloadSizings (SIZES=100,1000,5000 OUT=bench-scale.json)
	$(PY) bench/scale.py --sizes $(SIZES) --out $(OUT)

MINUTES ?= 60
SOAK_OUT := $(if $(filter command line environment,$(origin OUT)),$(OUT),soak.json)

.PHONY: soak
soak: venv prometheus cluster-binary ## 200 workloads, two operator replicas, a random fault every 30 s, judged from the audit log (MINUTES=60 SEED= OUT=soak.json TRACES= FAULT_EVERY=30, 0: none)
	$(PY) -m e2e.soak --minutes $(MINUTES) --out $(SOAK_OUT) $(if $(SEED),--seed $(SEED)) $(if $(TRACES),--traces-dir $(TRACES)) $(if $(FAULT_EVERY),--fault-every $(FAULT_EVERY))
