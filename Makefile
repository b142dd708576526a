# finetune-operator developer entry points. `make` (or `make help`) lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV = $(shell bash .ci/venv.sh --path)
PY = $(VENV)/bin/python
CLUSTER = python3 -m tests.localcluster

.PHONY: help setup binaries cluster-up cluster-down cluster-status run test test-unit test-integration \
        test-trainer test-e2e lint bench generate verify

help: ## show this help
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-18s %s\n", $$1, $$2}'

binaries: ## build (or reuse) the real Kubernetes control-plane binaries from the Go module proxy
	@bash tests/localcluster/build.sh

setup: binaries ## install everything: the venv (cached outside the repo) and the control-plane binaries
	@bash .ci/venv.sh

cluster-up: binaries ## start the local control plane (etcd, kube-apiserver, kube-controller-manager); prints KUBECONFIG
	@$(CLUSTER) up

cluster-down: ## stop the local control plane; leaves no process or port behind
	@$(CLUSTER) down

cluster-status: ## report whether every control-plane component is alive (with the log of one that died)
	@$(CLUSTER) status

run: setup ## the main job: control plane, CRD, operator, node agent and the example FineTuneJob until it succeeds
	@$(PY) -m finetune_operator.demo

test: setup ## run every test tier (unit, integration, trainer, e2e) against the real control plane
	@$(PY) -m pytest

test-unit: setup ## unit tests only (pure code, seconds)
	@$(PY) -m pytest -m unit

test-integration: setup ## integration tests against the real kube-apiserver
	@$(PY) -m pytest -m integration

test-trainer: setup ## trainer tests: real torchrun/DDP training on CPU
	@$(PY) -m pytest -m trainer

test-e2e: setup ## end-to-end: operator + node agent + trainer on the real control plane
	@$(PY) -m pytest -m e2e

lint: setup ## ruff (lint + format check), mypy --strict on the operator, hadolint on the Dockerfiles
	@$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

bench: setup ## run the benchmarks in bench/ (figures go to docs/benchmarks.md by hand)
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b; done
