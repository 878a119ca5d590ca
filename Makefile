# tfdata-operator — `make help` lists every target.
SHELL := /bin/bash
.DEFAULT_GOAL := help

ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
VENV ?= $(ROOT)/.venv
PY := $(VENV)/bin/python
PYTEST := $(VENV)/bin/pytest
PYTHON_BOOTSTRAP ?= python3
# The Python code: the operator, its tests, the dev cluster, the benchmarks, generators and checks.
PYTHON_DIRS := operator tests devcluster benchmarks hack
# The kind cluster `make test-e2e-kind` creates and deletes (not `make kind-up`'s "tfdata").
KIND_TEST_CLUSTER ?= tfdata-test
KIND_WITH_INTEGRATION ?= 1
# kind clusters: a control plane and two worker nodes (the multi-node tests need 3; 1 also works).
KIND_NODES ?= 3
export KIND_NODES
# make test-integration: control planes at once (pytest-xdist processes, each a dev cluster of its own).
INTEGRATION_PROCESSES ?= 2
export PIP_DISABLE_PIP_VERSION_CHECK := 1

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
	  /^[a-zA-Z0-9_-]+:.*?##/ { printf "  \033[36m%-22s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Try it

.PHONY: demo
demo: venv ## From a fresh clone: dev cluster + node, CRD, operator, a TFDataService, and a real tf.data client reading through it.
	$(PY) -m devcluster.demo

##@ Development

# pip's HTTP cache stays empty behind proxies that strip caching headers, so the wheels
# (TensorFlow alone is ~270 MB) are kept in a wheelhouse outside the repository.
WHEELHOUSE ?= $(or $(TFDATA_CACHE),$(HOME)/.cache/tfdata-operator)/wheels

# tf-keras (Keras 2), for the tests' trainers that run `model.fit` under MultiWorkerMirroredStrategy,
# which Keras 3 cannot (keras-team/keras#20585; tests/server/test_lockstep.py). Its version follows the
# `server` extra's TensorFlow (operator/pyproject.toml). It goes in without its dependencies, which name
# `tensorflow`: with them pip would fetch and install a second TensorFlow over the -cpu build.
DEV_NO_DEPS := tf-keras==2.21.0

$(VENV)/.installed: operator/pyproject.toml
	@test -x $(PY) || $(PYTHON_BOOTSTRAP) -m venv $(VENV)
	@mkdir -p $(WHEELHOUSE)
	@install() { $(PY) -m pip install -q --no-index --find-links $(WHEELHOUSE) -e "operator[dev,server]" && \
	    $(PY) -m pip install -q --no-index --find-links $(WHEELHOUSE) --no-deps $(DEV_NO_DEPS); }; \
	  install 2>/dev/null || { \
	    echo "Fetching the Python packages into $(WHEELHOUSE) (the first time downloads TensorFlow)"; \
	    $(PY) -m pip download -q -d $(WHEELHOUSE) "./operator[dev,server]" && \
	    $(PY) -m pip download -q -d $(WHEELHOUSE) --no-deps $(DEV_NO_DEPS) && install; }
	@touch $@

.PHONY: venv
venv: $(VENV)/.installed ## Create .venv with the operator, the server program (TensorFlow) and dev tools.

# A user's image on the oldest TensorFlow the server program supports (serverconfig.OLDEST_TENSORFLOW):
# TensorFlow and tensorflow-text, nothing of ours; `make test-server-oldest` injects the server program
# into it as the operator does. tensorflow-text goes in without its dependencies, which name
# `tensorflow` (the -cpu build is the same TensorFlow). The wheels are kept beside the others.
VENV_OLDEST := $(ROOT)/.venv-tf2.16
WHEELHOUSE_OLDEST ?= $(WHEELHOUSE)-tf2.16
OLDEST_REQUIREMENTS := "tensorflow-cpu==2.16.2; platform_machine == 'x86_64'" "tensorflow==2.16.2; platform_machine != 'x86_64'"
OLDEST_TEXT := tensorflow-text==2.16.1
# TensorFlow 2.16 has wheels for Python 3.9 to 3.12.
OLDEST_PYTHON_BOOTSTRAP ?= python3.11

$(VENV_OLDEST)/.installed:
	@test -x $(VENV_OLDEST)/bin/python || $(OLDEST_PYTHON_BOOTSTRAP) -m venv $(VENV_OLDEST)
	@mkdir -p $(WHEELHOUSE_OLDEST)
	@pip() { $(VENV_OLDEST)/bin/python -m pip "$$@"; }; \
	  install() { pip install -q --no-index --find-links $(WHEELHOUSE_OLDEST) $(OLDEST_REQUIREMENTS) && \
	    pip install -q --no-index --find-links $(WHEELHOUSE_OLDEST) --no-deps $(OLDEST_TEXT); }; \
	  install 2>/dev/null || { \
	    echo "Fetching TensorFlow 2.16 into $(WHEELHOUSE_OLDEST) (once)"; \
	    pip download -q -d $(WHEELHOUSE_OLDEST) $(OLDEST_REQUIREMENTS) && \
	    pip download -q -d $(WHEELHOUSE_OLDEST) --no-deps $(OLDEST_TEXT) && install; }
	@touch $@

.PHONY: venv-oldest
venv-oldest: $(VENV_OLDEST)/.installed ## Create .venv-tf2.16: a user's image on the oldest TensorFlow supported (2.16), for make test-server-oldest.

.PHONY: binaries
binaries: ## Provide pinned etcd, kube-apiserver, controller-manager, scheduler, kubectl, helm (cached outside the repo).
	@devcluster/k8s-binaries.sh >/dev/null

.PHONY: fmt
fmt: venv ## Format the Python code.
	$(VENV)/bin/ruff format --config operator/pyproject.toml $(PYTHON_DIRS)
	$(VENV)/bin/ruff check --config operator/pyproject.toml --fix $(PYTHON_DIRS)

.PHONY: lint
lint: venv helm-lint ## Lint: ruff (lint and format check), mypy, the package's layers (import-linter: operator/.importlinter), the Helm chart, and a `Golden: <reason>` line in each commit that changes tests/unit/golden/.
	$(VENV)/bin/ruff check --config operator/pyproject.toml $(PYTHON_DIRS)
	$(VENV)/bin/ruff format --config operator/pyproject.toml --check $(PYTHON_DIRS)
	cd operator && $(VENV)/bin/mypy src/tfdata_operator
	cd operator && $(VENV)/bin/lint-imports --no-cache
	$(PY) hack/check-golden-commits.py

.PHONY: render-examples
render-examples: venv ## Render every example with `tfdata-operator render` (no cluster needed).
	@for f in examples/*.yaml; do echo "# $$f"; $(VENV)/bin/tfdata-operator render -f $$f >/dev/null && echo ok; done

.PHONY: check-manifests
check-manifests: venv ## Check every example's rendered children with kube-score (pinned, built from the Go module proxy); accepted findings and why: hack/kube-score-ignored.yaml.
	$(PY) hack/check-manifests.py

.PHONY: crd-schemas
crd-schemas: venv ## Rewrite the CRD's embedded Kubernetes schemas from hack/openapi/ (FETCH=1: refresh those from the dev cluster first).
	$(PY) hack/crd-schemas.py $(if $(FETCH),--fetch)
	$(MAKE) sync-crds

.PHONY: api-docs
api-docs: venv ## Rewrite docs/api.md, the API reference, from crds/ (tests/unit/project/test_docs.py fails when it is stale).
	$(PY) hack/api-docs.py

.PHONY: multi-worker-scripts
multi-worker-scripts: venv ## Rewrite examples/multi-worker/scripts.yaml, the ConfigMap of the example's trainer scripts, from its entry.py and train.py.
	$(PY) hack/multi-worker-scripts.py

##@ Development cluster

.PHONY: dev-cluster
dev-cluster: venv ## Start a local control plane on 127.0.0.1 with a node that runs pods as processes (kubeconfig: .local/kubeconfig).
	$(PY) -m devcluster up --node

# Fake nodes for `make dev-cluster-kwok` (the operator-at-scale benchmark, for one).
KWOK_NODES ?= 1

.PHONY: dev-cluster-kwok
dev-cluster-kwok: venv ## Start the local control plane with KWOK_NODES (default 1) kwok nodes: pods that tolerate their taint turn Ready, nothing runs.
	$(PY) -m devcluster up --kwok-nodes $(KWOK_NODES)

.PHONY: dev-cluster-down
dev-cluster-down: ## Stop the local control plane and its node; delete their state (logs stay in .local/logs).
	$(PY) -m devcluster down

##@ Helm chart

CHART := charts/tfdata-operator
# Resolved when a chart target runs; `binaries` builds them first if needed.
HELM = $(shell devcluster/k8s-binaries.sh --print)/helm

.PHONY: sync-crds
sync-crds: ## Copy crds/ (the source of truth) into the chart; tests/integration/test_chart.py fails on drift.
	rm -f $(CHART)/crds/*.yaml
	cp crds/*.yaml $(CHART)/crds/

.PHONY: helm-lint
helm-lint: binaries ## Lint the chart strictly (default and non-default values); fail if its CRDs drifted from crds/.
	@diff -r crds $(CHART)/crds >/dev/null || { echo "$(CHART)/crds differs from crds/: run 'make sync-crds'" >&2; exit 1; }
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) --set 'watchNamespaces={team-a,team-b}' \
	  --set metrics.enabled=true --set metrics.serviceMonitor.enabled=true \
	  --set egressNetworkPolicy.enabled=true --set 'egressNetworkPolicy.serverHealthPorts={8080,9000}'

##@ Images

.PHONY: images
images: ## Build the tfdata-operator and tfdata-server images, and for the kind tier tfdata-hostile (a hostile tenant) and tfdata-trainer (the server image plus tf-keras, for the multi-worker example's trainers) (starts Docker if none answers; a cold build downloads TensorFlow).
	images/images.sh

.PHONY: docker-down
docker-down: ## Stop the dockerd that `make images` started (its images and caches stay in ~/.cache/tfdata-operator/docker).
	images/docker-daemon.sh down

##@ kind (a real kubelet and container runtime)

.PHONY: kind-image
kind-image: ## kind node image for Kubernetes v1.34.4: the published one where it can be pulled, else built here from source (cache: ~/.cache/tfdata-operator/kind).
	@kind/node-image.sh >/dev/null

.PHONY: kind-up
kind-up: images ## kind cluster of KIND_NODES nodes (default 3: a control plane and 2 workers; flannel between them), our images loaded, CRD + operator installed by the chart (kubeconfig: .local/kind-kubeconfig).
	kind/cluster.sh up

.PHONY: kind-down
kind-down: ## Delete the kind cluster and its kubeconfig.
	kind/cluster.sh down

.PHONY: kueue-image
kueue-image: ## Kueue v0.19.2's manager image, built here from its Go module (kind/kueue.sh; cache: ~/.cache/tfdata-operator/kind): what the kind tests that need Kueue install.
	@kind/kueue.sh image >/dev/null

.PHONY: kind-kueue
kind-kueue: kueue-image ## Install Kueue (its own internal certificates, no cert-manager) into the kind cluster (make kind-up first; TFDATA_KIND_CLUSTER names another, KUEUE_CONFIG=file sets its Configuration), and wait until its webhooks answer.
	kind/kueue.sh install

.PHONY: test-kind
test-kind: venv ## Tests on the kind cluster (make kind-up first): pods Ready, journal claim bound and surviving a dispatcher deletion, NetworkPolicy enforced (and its egress rules: the servers reach each other and DNS, not an excepted address), held rescale, suspend, a trainer pod, CPU and TFData autoscaling, image-pull and crash-loop failures explained, services queued and admitted through Kueue (built here), PodsReady on the Workload following a lost worker (WaitForRecovery, then Recovered), and one evicted and resumed on its journal, a low-priority service preempted by a high-priority one (WorkloadPriorityClass) and resumed on its journal once that one goes, an unlabelled service beside a default LocalQueue left alone by Kueue and scaled, and one labelled for that queue admitted whole (one Workload, no pod queued alone), a service and a trainer on a user's TensorFlow 2.16 image (built here) and the stock image refusing its pipeline; examples/multi-worker/ as its README says (two trainer pods of an indexed Job, one tf-keras model under MultiWorkerMirroredStrategy, in lockstep); over 3 nodes: workers spread, a trainer and the NetworkPolicy across nodes, drains (DYNAMIC, static), a lost worker node recovered, a slow dispatcher node (frozen 90 s) losing nothing, a node tainted out-of-service replaced within seconds with its journal kept, a worker node frozen while a snapshot is written kept (KeptForSnapshot: no second writer) and the snapshot complete after the thaw; hostile tenants against the chart's operator (servers that drip, redirect to a metadata server, answer huge or garbled bodies; trainers that delete outside their directory, plant symlinks, flood the health port: refused or contained, nothing deleted, no secret written, no operator restart); last, no unexpected pod restart or logged error.
	TFDATA_TEST_KUBECONFIG=$(ROOT)/.local/kind-kubeconfig $(PYTEST) -q -m kind tests/kind

.PHONY: test-e2e-kind
test-e2e-kind: images venv ## On a kind cluster of its own (tfdata-test; `make kind-up`'s stays): the kind tests (the hostile tenants' cases among them, on the tfdata-hostile image `make images` builds), then the integration suite through TFDATA_TEST_KUBECONFIG (KIND_WITH_INTEGRATION=0 skips it); deletes it (logs in .local/kind-test-logs on failure).
	@set -e; export TFDATA_KIND_CLUSTER=$(KIND_TEST_CLUSTER); kc=$(ROOT)/.local/kind-$(KIND_TEST_CLUSTER)-kubeconfig; \
	  trap 'rc=$$?; [ $$rc -eq 0 ] || kind/cluster.sh logs $(ROOT)/.local/kind-test-logs || true; kind/cluster.sh down' EXIT; \
	  $(TIMED) kind_up kind/cluster.sh up; \
	  if [ -n "$${SETUP_STATUS:-}" ]; then \
	    until [ -s "$$SETUP_STATUS" ]; do sleep 1; done; \
	    [ "$$(cat "$$SETUP_STATUS")" = 0 ] || { echo "== make test's venvs were not made: no kind tests"; exit 1; }; \
	  fi; \
	  TFDATA_TEST_KUBECONFIG=$$kc $(PYTEST) -q -m kind tests/kind; \
	  if [ "$(KIND_WITH_INTEGRATION)" != 0 ]; then \
	    $(HELM) uninstall tfdata-operator -n tfdata-system --kubeconfig $$kc --wait; \
	    TFDATA_TEST_KUBECONFIG=$$kc $(PYTEST) -q tests/integration; \
	  fi

##@ Tests

# Each tier's pytest run writes its counts here (tests/fixtures/skips.py); `make test` prints them.
# Under CI=true a skip not allowed by tests/skip-allowlist.txt fails the tier that skipped.
TEST_RESULTS := $(ROOT)/.local/test-results
export TFDATA_TEST_RESULTS := $(TEST_RESULTS)

# Times a step that is not a pytest run; the tiers time themselves (tests/fixtures/skips.py).
TIMED := $(ROOT)/hack/timed.sh

.PHONY: test
test: ## The full suite (what CI runs), in three lanes side by side (the kind cluster's, the dev clusters' and the shared tiers'); on kind: readiness, storage, the fault case and NetworkPolicy. Ends with one line per step, its time and its budget (tests/budgets.toml); a step or the whole over budget fails it.
	@rm -rf $(TEST_RESULTS); rc=0; started=$$(date +%s); \
	  $(MAKE) --no-print-directory test-tiers || rc=$$?; \
	  py=$(PY); [ -x $$py ] || py=$(PYTHON_BOOTSTRAP); \
	  echo; $$py tests/fixtures/results.py $(TEST_RESULTS) --wall $$(( $$(date +%s) - started )) || { [ $$rc -ne 0 ] || rc=1; }; \
	  exit $$rc

# Most of the suite's time is waiting (servers starting, holds sampled over time, node loss), so
# `make test` runs three lanes side by side: the kind lane (its node image, its cluster, its tests: a
# kubelet per node, in Docker), the dev clusters' lane (integration, on two control planes at once,
# then e2e) and the shared lane (the tiers that need neither lane's cluster: the server tiers, real
# TensorFlow processes with no control plane, then the hostile and node agent tiers, which start dev
# clusters of their own). Warm, the CPUs were 40 to 60% idle with two lanes. The kind lane needs no
# venv until its tests (SETUP_STATUS: test-e2e-kind waits there for the venvs), so it starts first,
# its builds and cluster beside the venvs being made. The logs of the lanes in the background are
# printed when all are done; each lane stops at its own first failure, and `make test` waits for all.
#
# Cold (a fresh machine: nothing cached), builds are a third of the run; each starts as soon as what
# it needs is there, beside tiers that do not need it. The Kubernetes
# binaries (devcluster/k8s-binaries.sh) build in the background from the start, while the dev lane
# runs unit and the shared lane the server tiers; both then wait for the build (its lock; untimed:
# the total has it) before the tiers that need a control plane (and lint: helm lints the chart).
# The kind lane builds the images, then the node image's parts that share no compiled package with
# Kubernetes and metrics-server, beside that build, then waits for it and finishes the node
# image: kubelet, kubeadm and kube-proxy, and the parts built aligned with Kubernetes
# (devcluster/go-align.sh; one Go cache: the packages they share are compiled once, for all), while
# Kueue's image builds in the background for the kind tier's Kueue module. Warm, each build finds its
# outputs and takes seconds. The logs of the builds and of the two lanes in the background:
# $(BUILD_LOG), $(KIND_LANE_LOG), $(SHARED_LANE_LOG), $(KUEUE_LOG).
#
# A lane takes the SHARED_TIERS not yet taken, one at a time (a directory made atomically claims
# one): the shared lane all but the images tier (the kind lane builds the images it runs) from the
# start, the other two once their own tiers passed. A lane that failed takes none, so another one
# still runs them.
KIND_LANE_LOG := $(ROOT)/.local/test-kind-lane.log
SHARED_LANE_LOG := $(ROOT)/.local/test-shared-lane.log
BUILD_LOG := $(ROOT)/.local/test-binaries.log
SHARED_LANE_TIERS := test-server test-server-oldest test-hostile test-nodeagent
SHARED_TIERS := $(SHARED_LANE_TIERS) test-images

.PHONY: test-tiers
test-tiers:
	@claims=$$(mktemp -d); export TIER_CLAIMS=$$claims SETUP_STATUS=$$claims/.setup; mkdir -p $(ROOT)/.local; \
	  echo "== the Kubernetes binaries build beside the tiers that need none; its log: $(BUILD_LOG)"; \
	  $(TIMED) binaries $(MAKE) --no-print-directory binaries > $(BUILD_LOG) 2>&1 & bins=$$!; \
	  echo "== the kind lane runs beside the others; its log: $(KIND_LANE_LOG)"; \
	  ( $(TIMED) images_build $(MAKE) --no-print-directory images && \
	    $(TIMED) kind_image $(MAKE) --no-print-directory kind-image-after-binaries && \
	    $(MAKE) --no-print-directory -o images -o venv test-e2e-kind KIND_WITH_INTEGRATION=0 && \
	    $(MAKE) --no-print-directory test-shared-tiers LANE=kind ) > $(KIND_LANE_LOG) 2>&1 & kind=$$!; \
	  rc=0; $(TIMED) setup $(MAKE) --no-print-directory -j2 venv venv-oldest || rc=$$?; echo $$rc > $$SETUP_STATUS; \
	  shared=; if [ $$rc -eq 0 ]; then \
	    echo "== the shared lane runs beside the others; its log: $(SHARED_LANE_LOG)"; \
	    $(MAKE) --no-print-directory test-shared-tiers LANE=shared TIERS="$(SHARED_LANE_TIERS)" \
	      > $(SHARED_LANE_LOG) 2>&1 & shared=$$!; \
	    $(MAKE) --no-print-directory test-dev-lane || rc=$$?; \
	  fi; \
	  wait $$bins || { echo "== the Kubernetes binaries' build failed; its log:"; cat $(BUILD_LOG); [ $$rc -ne 0 ] || rc=1; }; \
	  echo "== the dev clusters' lane is done (exit $$rc); waiting for the other two"; \
	  if [ -n "$$shared" ]; then wait $$shared || rc=$$?; echo "== the shared lane's log"; cat $(SHARED_LANE_LOG); fi; \
	  wait $$kind || rc=$$?; echo "== the kind lane's log"; cat $(KIND_LANE_LOG); \
	  for t in $(SHARED_TIERS); do [ -d $$claims/$$t ] || { echo "== $$t ran in no lane"; [ $$rc -ne 0 ] || rc=1; }; done; \
	  rm -rf $$claims; exit $$rc

# The node image, its non-Kubernetes parts first, beside the binaries' build (see test-tiers), and
# metrics-server's image, which `kind/cluster.sh up` would otherwise build (cold: 7 minutes) with the
# cluster already made. Kueue's image, which only tests/kind/test_kueue.py installs (a module well
# into the tier), builds in the background from there on, beside the node image, the cluster and the
# tier's first modules (cold: 6 minutes, that were the kind lane's); kind/kueue.sh install waits for
# that build (its lock) and, had it failed, builds again and says why.
KUEUE_LOG := $(ROOT)/.local/test-kueue-image.log
.PHONY: kind-image-after-binaries
kind-image-after-binaries:
	@kind/node-image.sh --parts >/dev/null
	@kind/metrics-server.sh image >/dev/null
	@echo "== Kueue's image builds in the background (log: $(KUEUE_LOG))"; \
	  kind/kueue.sh image > $(KUEUE_LOG) 2>&1 &
	@$(MAKE) --no-print-directory binaries
	@kind/node-image.sh >/dev/null

.PHONY: test-dev-lane
test-dev-lane:
	@$(MAKE) --no-print-directory -o images test-unit
	@echo "== the tiers that need a control plane wait for the Kubernetes binaries (log: $(BUILD_LOG))"
	@$(MAKE) --no-print-directory binaries
	@$(TIMED) lint $(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory -o images test-integration test-e2e
	@$(MAKE) --no-print-directory test-shared-tiers LANE=dev

# Runs the SHARED_TIERS (or TIERS) that no other lane took (all of them without TIER_CLAIMS).
.PHONY: test-shared-tiers
test-shared-tiers:
	@for t in $(or $(TIERS),$(SHARED_TIERS)); do \
	  if [ -n "$$TIER_CLAIMS" ]; then mkdir "$$TIER_CLAIMS/$$t" 2>/dev/null || continue; fi; \
	  echo "== $$t (in the $(or $(LANE),only) lane)"; \
	  $(MAKE) --no-print-directory -o images $$t || exit $$?; \
	done

.PHONY: test-unit
test-unit: venv ## Unit tests: pure, fast, no cluster.
	$(PYTEST) -q tests/unit

# Every test that checks a golden file is marked `golden` (tests/fixtures/golden.py). A rewrite
# fails the test that made it, so the first run's failures are expected; a second run without
# TFDATA_UPDATE_GOLDEN must pass, which shows that rewrites were its only failures.
.PHONY: golden
golden: venv ## Rewrite tests/unit/golden/ (manifests, refusals, ranges, edges) after an intended change, then check they pass; review the diff and commit it with a `Golden: <reason>` line (make lint checks).
	@rc=0; TFDATA_UPDATE_GOLDEN=1 $(PYTEST) -q -m golden tests/unit || rc=$$?; \
	  if [ $$rc -gt 1 ]; then echo "make golden: the rewriting run stopped (exit $$rc)" >&2; exit $$rc; fi; \
	  echo "== again, without TFDATA_UPDATE_GOLDEN: every golden test must pass now"; \
	  $(PYTEST) -q -m golden tests/unit
	@git status --short -- tests/unit/golden

.PHONY: test-server
test-server: venv venv-oldest ## The tf.data server program as real processes with real TensorFlow; injected into a TensorFlow 2.16 image stand-in; which trainer TensorFlow reads through which server TensorFlow (docs/your-tensorflow.md's table).
	$(PYTEST) -q tests/server

# The tests that start real dispatchers and workers and read through them, on TensorFlow 2.16 (the
# oldest supported) with the server program injected; the rest of tests/server is about the
# client helper, which a 2.16 image does not have, or compares protos in the test's own TensorFlow.
# test_snapshots.py's trainer is the test process (2.21: 2.16 has no public distributed_save), its
# servers and their /v1/snapshots are 2.16's.
.PHONY: test-server-oldest
test-server-oldest: venv venv-oldest ## tests/server's servers and tf.data clients on TensorFlow 2.16 (.venv-tf2.16), the server program injected into it as into a user's image.
	TFDATA_TEST_SERVER_PYTHON=$(VENV_OLDEST)/bin/python $(PYTEST) -q tests/server/test_server_program.py tests/server/test_snapshots.py -k "not proto"

.PHONY: test-integration
test-integration: venv binaries ## Integration tests against a real control plane built from source (always the tier's own: a TFDATA_TEST_KUBECONFIG in the environment is ignored here; test-e2e-kind's KIND_WITH_INTEGRATION runs them on kind), on INTEGRATION_PROCESSES control planes at once, a module at a time each.
	env -u TFDATA_TEST_KUBECONFIG $(PYTEST) -q -n $(INTEGRATION_PROCESSES) --dist loadfile --no-loadscope-reorder tests/integration

.PHONY: test-nodeagent
test-nodeagent: venv binaries ## The dev cluster's node agent against a real control plane (needs root).
	$(PYTEST) -q tests/nodeagent

.PHONY: test-e2e
test-e2e: venv binaries ## End to end: operator, node, real tfdata-server pods and real tf.data clients (needs root).
	$(PYTEST) -q tests/e2e

.PHONY: test-hostile
test-hostile: venv binaries ## Hostile tenants on the dev cluster (needs root; the kind tier makes the same cases but the time-to-Ready comparison): server programs that drip, redirect, answer huge or garbled bodies; trainers that delete outside their snapshot directory, plant symlinks, flood the health port; a good service's time to Ready beside 10 dripping ones (JSON: .local/test-results/figures/hostile-ready.json).
	$(PYTEST) -q tests/hostile

.PHONY: test-images
test-images: venv binaries images ## Image tests with real Docker: tf.data through the server image; the operator image on a real control plane.
	$(PYTEST) -q tests/images

##@ Benchmarks (figures, not tests; never part of `make test`)

# `make mutation MODULES="scaling plan"` measures some; each module's last result is kept.
MODULES ?=
MUTATION_CHILDREN ?= 2

.PHONY: mutation
mutation: venv ## Mutants of the pure modules (spec diff builders scaling status plan serverconfig) the unit tests kill, per module, with and without the golden-file tests (mutmut; all take ~2.5 h on 2 cores, so MODULES=...; MUTATION_ARGS=--recheck tests only the last survivors again, in minutes; JSON: .local/mutation.json).
	nice -n 10 $(PY) hack/mutation.py $(foreach m,$(MODULES),--module $(m)) --max-children $(MUTATION_CHILDREN) $(MUTATION_ARGS)

.PHONY: bench
bench: venv binaries ## Benchmarks (figures, not tests; ~25 min): the operator at 200 and 1,000 services whose pods turn Ready on kwok nodes, beside the API server's ceiling (throughput, latency, RSS, idle requests by verb), then on a cluster with its node: apply -> Ready, idle static rescales, client throughput vs servers started by hand (JSON: .local/bench/last.json, node-last.json).
	PYTHONPATH=$(ROOT) $(PY) benchmarks/bench.py $(BENCH_ARGS)
	PYTHONPATH=$(ROOT) $(PY) benchmarks/bench_node.py $(BENCH_NODE_ARGS)

.PHONY: bench-autoscaling
bench-autoscaling: images venv ## Benchmark (figures, not a test; ~45 min, BENCH_AUTOSCALING_ARGS=--quick ~10 min): a CPU-heavy and an I/O-bound read under TFData and CPU (HPA + metrics-server), the same worker requests, runs interleaved, 3 of each, on `make kind-up`'s cluster (created if missing; TFDATA_KIND_CLUSTER names another): time to the needed workers, throughput, worker-seconds, elements lost, medians with min/max (JSON: .local/bench/autoscaling-last.json).
	kind/cluster.sh up
	PYTHONPATH=$(ROOT) $(PY) benchmarks/bench_autoscaling.py --kubectl "$$(devcluster/k8s-binaries.sh | tail -n 1)/kubectl" $(BENCH_AUTOSCALING_ARGS)

.PHONY: bench-dataplane
bench-dataplane: venv ## Benchmark (figures, not a test; ~16 min, QUICK=1: ~6; BENCH_DATAPLANE_ARGS='--parts trainers,cache': the new parts alone): tf.data's data plane, real dispatchers and workers on 127.0.0.1 (no Kubernetes), the trainer on CPU 0 and the servers on CPU 1: through one worker vs in process (100 B, 10 KB, 1 MB), scale-out over 1-8 workers (curve: docs/img/dataplane-scaleout.png), compression AUTO vs None, 1/2/4 trainers on one service (own jobs vs one shared job_name) against one alone, a 3-trial sweep's worker CPU with the cross-trainer cache vs without (JSON: .local/bench/dataplane-last.json).
	PYTHONPATH=$(ROOT) nice -n 10 $(PY) benchmarks/bench_dataplane.py $(if $(QUICK),--quick) $(BENCH_DATAPLANE_ARGS)

.PHONY: bench-snapshots
bench-snapshots: venv ## Benchmark (figures, not a test; ~3 min, QUICK=1: ~30 s): the preprocessing time a distributed snapshot saves, a real fault-tolerant dispatcher and 2 workers on 127.0.0.1 (no Kubernetes): a CPU-heavy pipeline read live through the service vs saved (distributed_save, a one-time cost) and read back with client.snapshots.load, in the trainer and through the service; 3 rounds, every read checked against the pipeline run in process (JSON: .local/bench/snapshots-last.json).
	PYTHONPATH=$(ROOT) nice -n 10 $(PY) benchmarks/bench_snapshots.py $(if $(QUICK),--quick) $(BENCH_SNAPSHOTS_ARGS)
