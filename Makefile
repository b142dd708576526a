# finetune-operator developer entry points. `make` (or `make help`) lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV = $(shell bash .ci/venv.sh --path)
PY = $(VENV)/bin/python
# The ONNX Runtime stack's venv: the ORT tests start its `finetune-trainer`.
export FINETUNE_ORT_VENV := $(shell bash .ci/venv.sh --ort-path)
CLUSTER = python3 -m hack.localcluster

.PHONY: help setup host-packages binaries node-binaries images tools kueue cluster-up cluster-down cluster-status run \
        test test-unit test-integration test-trainer test-ort test-chart test-e2e test-realnodes test-faults test-kueue test-placement gangschedulers soak run-local kind-up kind-images kind-install kind-down lint bench generate verify operator

help: ## show this help
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-18s %s\n", $$1, $$2}'

binaries: ## build (or reuse) the real Kubernetes control-plane binaries from the Go module proxy
	@bash hack/localcluster/build.sh

host-packages: ## install (as root, from Debian) what real nodes and image builds need: containerd, runc, CNI, buildah, podman
	@bash hack/localcluster/host-packages.sh

node-binaries: binaries ## build (or reuse) kubelet, kube-proxy and CoreDNS from the Go module proxy
	@bash hack/localcluster/build-node.sh

images: host-packages binaries ## build (or reuse) the operator and CPU trainer images from their Dockerfiles, and the nodes' image store
	@bash hack/images/build.sh >/dev/null

tools: ## build (or reuse) helm, promtool and controller-gen (+ Prometheus Operator CRDs) from the Go module proxy
	@bash hack/helmtools/build.sh

kueue: ## build (or reuse) Kueue's controller manager (the Kueue tier's) from the Go module proxy
	@bash hack/kueue/build.sh

gangschedulers: ## build (or reuse) the coscheduling scheduler and the PodGroup CRDs (placement tests) from the Go module proxy
	@bash hack/gangschedulers/build.sh

setup: host-packages binaries node-binaries tools kueue gangschedulers images ## install everything: both venvs (cached outside the repo), Kubernetes, real nodes, images, Kueue, gang schedulers, chart tools
	@bash .ci/venv.sh

cluster-up: binaries ## start the local control plane (NODES=2: and real nodes running the built images); prints KUBECONFIG
	@$(if $(NODES),$(MAKE) -s node-binaries images &&) $(CLUSTER) up $(if $(NODES),--nodes $(NODES))

cluster-down: ## stop the local control plane; leaves no process or port behind
	@$(CLUSTER) down

cluster-status: ## report whether every control-plane component is alive (with the log of one that died)
	@$(CLUSTER) status

run: ## the main job: real nodes, the chart-installed operator and trainer images built here, the tiny job to Succeeded
	@bash hack/run.sh

run-local: setup ## the tiny example FineTuneJob on 2 local nodes, no Kubernetes (finetune run-local)
	@$(VENV)/bin/finetune run-local examples/tiny-job.yaml

operator: setup ## run the operator against the local control plane (make cluster-up first)
	@$(VENV)/bin/finetune operator --standalone --kubeconfig $${FINETUNE_CLUSTER_DIR:-/tmp/finetune-cluster-$$(id -u)}/admin.kubeconfig

test: host-packages binaries node-binaries images ## run every test tier (unit, integration, chart, trainer on both stacks, e2e, real nodes, faults, Kueue)
	@bash .ci/venv.sh
	@$(PY) -m pytest  # helm, promtool, Kueue and the gang schedulers build in the background meanwhile when not cached (tests/prebuild.py)

test-unit: setup ## unit tests only (pure code, seconds)
	@$(PY) -m pytest -m unit

test-integration: setup ## integration tests against the real kube-apiserver
	@$(PY) -m pytest -m integration

test-trainer: setup ## trainer tests: real torchrun/DDP training on CPU, default stack and ONNX Runtime stack
	@$(PY) -m pytest -m trainer

test-kueue: setup ## gang admission with a real Kueue (queueing, preemption, restarts and suspend that give quota back, topology)
	@$(PY) -m pytest -m kueue

test-placement: setup ## placement: Kueue's topology-aware scheduling, the coscheduling scheduler, Volcano's PodGroup CRD
	@$(PY) -m pytest -m "gangschedulers or kueue" -k "topology or gang"

test-ort: setup ## the ONNX Runtime stack's tests only (ORTTrainer loss curve, resume, rejections)
	@$(PY) -m pytest -m ort

lint: ## ruff (lint and format check) over the whole tree, mypy --strict on the operator and the trainer's deciding modules (the unit tier runs them too)
	@bash .ci/venv.sh --dev >/dev/null && $(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

generate: ## regenerate the runtime CRDs and docs/reference.md (from the FineTuneJob CRD), the Grafana dashboard, the operator's copy of the config contract, both stacks' TrainingArguments and the chart's README
	@$(PY) -m hack.runtime_crd && $(PY) -m hack.helmtools.crd_reference && $(PY) -m hack.helmtools.dashboard && $(PY) -m hack.contract && \
		$(PY) -m hack.training_args && $(PY) -m hack.helmtools.chart_readme

verify: ## fail when generated files drift from their sources
	@$(PY) -m hack.runtime_crd --check && $(PY) -m hack.helmtools.crd_reference --check && $(PY) -m hack.helmtools.dashboard --check && \
		$(PY) -m hack.contract --check && $(PY) -m hack.training_args --check && $(PY) -m hack.helmtools.chart_readme --check

test-faults: setup ## fault injection: operator SIGKILLs at random moments, invariants checked, figures printed
	@$(PY) -m pytest -m faults -s

soak: setup ## the long fault-injection run (120 operator kills, 50 with hostile metrics pages, 20 rank kills, 3 API-error rounds); figures in /tmp/finetune-soak*.json
	@FAULTS_KILLS=120 FAULTS_HOSTILE_KILLS=50 FAULTS_RANK_KILLS=20 FAULTS_API_ROUNDS=3 FAULTS_WRITE_KILL_SCRIPTS=fail-evict-fail,fail-once,evict-once \
		FAULTS_REPORT=/tmp/finetune-soak.json $(PY) -m pytest -m faults -s -o timeout=3600

test-e2e: setup ## the ONNX Runtime job end to end: operator + local node agent + the ORT trainer (root)
	@$(PY) -m pytest -m e2e

test-realnodes: setup ## the product as users get it: images from the Dockerfiles, real kubelets, helm install, the examples (root)
	@$(PY) -m pytest -m realnodes

test-chart: setup ## Helm chart tests: lint, snapshots, server-side dry-run, install as the chart's ServiceAccount
	@$(PY) -m pytest tests/chart

bench: setup ## run the benchmarks in bench/ (figures go to docs/benchmarks.md by hand)
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b; done

# --- kind quickstart (docs/quickstart-kind.md): needs Docker and kind, so it runs on your machine, not in CI ---
KIND_CLUSTER ?= finetune

kind-up: ## create the kind cluster from kind-config.yaml (one control plane, two workers)
	@kind create cluster --name $(KIND_CLUSTER) --config kind-config.yaml

kind-images: ## build the operator and CPU trainer images and load them into kind
	@docker build -f operator/Dockerfile -t finetune-operator:dev .
	@docker build -f trainer-image/Dockerfile.cpu -t finetune-trainer:cpu trainer-image
	@kind load docker-image finetune-operator:dev finetune-trainer:cpu --name $(KIND_CLUSTER)

kind-install: ## helm install the chart into kind with the locally built images
	@helm upgrade --install finetune-operator charts/finetune-operator -n finetune-system --create-namespace \
	  --set image.repository=finetune-operator --set image.tag=dev --set image.pullPolicy=Never \
	  --set trainer.image.repository=finetune-trainer --set trainer.image.tag=cpu --set trainer.image.pullPolicy=Never
	@kubectl -n finetune-system rollout status deploy/finetune-operator

kind-down: ## delete the kind cluster
	@kind delete cluster --name $(KIND_CLUSTER)
