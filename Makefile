# sluice — developer and user entry points. Everything installs what it needs on first use;
# downloads and builds are cached under $(SLUICE_CACHE) (default ~/.cache/sluice), keyed by version.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export SLUICE_CACHE ?= $(HOME)/.cache/sluice

# The operator talks to $KUBECONFIG, else to the local cluster when one is up.
LOCAL_KUBECONFIG := $(CURDIR)/.local-cluster/kubeconfig
KUBECONFIG ?= $(if $(wildcard $(LOCAL_KUBECONFIG)),$(LOCAL_KUBECONFIG),$(HOME)/.kube/config)
export KUBECONFIG
# Where local-kafka listens: KAFKA_HOST=10.245.0.1 (the local cluster's node address) for apps in its pods.
KAFKA_HOST ?= 127.0.0.1

.PHONY: help venv demo test lint format docs bench bench-validate bench-delivery bench-source-fetch bench-join-floor bench-autoscaler bench-operator faults soak overload local-kafka local-kafka-down local-cluster local-cluster-down e2e-faults \
	operator crds clean

help:
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 22

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "sluice needs Python >= 3.11 (found " + sys.version.split()[0] + ")")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[operator,runner,cli,testbed,dev]'
	@# The test bed is not in the wheel (no test code in an image): the virtualenv finds it in e2e/.
	$(PY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "sluice-testbed.pth").write_text("$(CURDIR)/e2e\n")'
	@touch $@

venv: $(STAMP) ## create .venv with pinned dependencies

demo: $(STAMP) ## run the main job on embedded defaults (local Kafka + Spark), ends by itself
	$(PY) -m sluice.pipelines.demo

test: $(STAMP) ## install what is needed and run the whole test suite
	$(PY) -m sluice.testbed prefetch
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP) ## ruff (rules and format), the import contracts in pyproject.toml (product code never imports the test bed), mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(VENV)/bin/mypy

docs: $(STAMP) ## render docs/diagrams/*.dot to docs/*.svg (Graphviz, from Debian when missing), the word count's drawn by sluice graph
	@command -v dot >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz; }
	$(PY) -m sluice.pipelines.cli graph pipelines/examples/wordcount.yaml --to docs/diagrams/wordcount-pipeline.dot
	for f in docs/diagrams/*.dot; do dot -Tsvg "$$f" -o "docs/$$(basename "$${f%.dot}").svg"; done

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: $(STAMP) ## benchmarks: figures printed and written to .sluice/bench/ (SLUICE_BENCH_RECORDS, default 10M)
	$(PY) -m pytest -m bench -p no:cacheprovider -s $(PYTEST_ARGS) pipelines/bench operator/tests

bench-validate: $(STAMP) ## sluice validate --no-spark over every example, a new process each run (target < 2 s): .sluice/bench/validate.json
	$(PY) -m pytest -m bench -p no:cacheprovider -s $(PYTEST_ARGS) pipelines/bench/test_validate_cli.py

bench-delivery: $(STAMP) ## toKafka delivery exactlyOnce vs atLeastOnce: throughput, p50/p99 latency; .sluice/bench/delivery.json
	$(PY) -m pytest -m bench -p no:cacheprovider -s $(PYTEST_ARGS) pipelines/bench/test_delivery.py

faults: $(STAMP) ## the long fault runs (20 driver SIGKILLs, executor kills in commits, broker restarts, 1% malformed): .sluice/faults/
	$(PY) -m sluice.testbed prefetch
	$(PY) -m pytest -m faults -p no:cacheprovider -s $(PYTEST_ARGS) pipelines/tests/test_faults.py

bench-source-fetch: $(STAMP) ## a Kafka source's batch read time at a live topic's end, sluice's fetch wait vs Java's default: .sluice/bench/source-fetch.json
	$(PY) -m pytest -m bench -p no:cacheprovider -s $(PYTEST_ARGS) pipelines/bench/test_source_fetch.py

bench-join-floor: $(STAMP) ## a stream-stream join's per-batch floor (latency-correlation), join state in 1 vs 4 RocksDB stores: .sluice/bench/join-floor.json
	flock /tmp/sluice-bench.lock $(PY) -m pytest -m bench -p no:cacheprovider -s $(PYTEST_ARGS) pipelines/bench/test_join_floor.py

bench-peers: $(STAMP) ## sluice beside hand-written/hand-tuned PySpark, PyFlink, Quix Streams, Bytewax and raw consumers on 3 workloads: .sluice/bench/peers.json, peers.png, docs/benchmarks.md
	flock /tmp/sluice-bench.lock $(PY) -m pytest -m bench -p no:cacheprovider -s $(PYTEST_ARGS) pipelines/bench/test_peers.py

bench-autoscaler: $(STAMP) ## the autoscaler on a simulated plant: table, .sluice/bench/autoscaler.json and a PNG per scenario
	flock /tmp/sluice-bench.lock $(PY) operator/bench/bench_autoscaler.py

bench-operator: $(STAMP) ## the operator with SLUICE_BENCH_APPS apps (default 1000): apply latency, RSS, reconciles/s, API requests at rest; .sluice/bench/operator.json
	flock /tmp/sluice-bench.lock $(PY) -m pytest -m bench -p no:cacheprovider -s $(PYTEST_ARGS) operator/tests/test_operator_bench.py

local-kafka: $(STAMP) ## single-node KRaft broker on localhost (prints the bootstrap address)
	$(PY) -m sluice.pipelines.local kafka up --host $(KAFKA_HOST)

local-kafka-down: $(STAMP)
	$(PY) -m sluice.pipelines.local kafka down

local-cluster: $(STAMP) ## single-node Kubernetes cluster (root); kubeconfig in .local-cluster/kubeconfig, kubectl and helm in .local-cluster/bin
	$(PY) -m sluice.testbed prefetch
	$(PY) -m sluice.testbed cluster up

local-cluster-down: $(STAMP)
	$(PY) -m sluice.testbed cluster down

operator: $(STAMP) ## run the operator in the foreground against KUBECONFIG (default: the local cluster)
	$(PY) -m sluice.operator --all-namespaces --log-format plain

crds: $(STAMP) ## regenerate crds/ from the model (sluice.operator.model) and copy them into the chart
	$(PY) -m sluice.operator.crd --write
	cp crds/*.yaml charts/sluice/crds/

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache

# --- packaging: Helm chart, images, kind e2e ---------------------------------------------------------
.PHONY: chart-crds images e2e e2e-local e2e-upgrade local-images kind-cluster kind-cluster-down test-kind

chart-crds: crds

images: $(STAMP) ## build the operator and Spark images (docker, podman or buildah; tags = the sluice version)
	$(PY) images/build.py

e2e: $(STAMP) ## the e2e suite on a throwaway 4-node kind cluster on podman (root; no Docker, no registry): images, spark-operator, sluice, apps, data, Prometheus
	$(PY) -m sluice.testbed prefetch
	$(PY) -m pytest -p no:cacheprovider -m kind e2e/tests/test_e2e_kind.py $(PYTEST_ARGS)

local-images: $(STAMP) ## build the images with buildah for the local cluster (no Docker; base from debootstrap)
	$(PY) -m sluice.testbed prefetch
	$(PY) -m sluice.testbed images

UPGRADE_FROM ?= HEAD~1
e2e-upgrade: $(STAMP) ## helm upgrade from an earlier commit's chart and images (UPGRADE_FROM=<git ref>, default HEAD~1) to this tree's, the e2e app running: same driver, exact output
	$(PY) -m sluice.testbed prefetch
	SLUICE_E2E_UPGRADE_FROM=$(UPGRADE_FROM) $(PY) -m pytest -p no:cacheprovider -m e2e_local e2e/tests/test_e2e_local.py \
		$(PYTEST_ARGS) -k "install or kafka_ready or object_store or deploy_app or stream or operator_upgrade"

soak: $(STAMP) ## the word count for SLUICE_SOAK_MINUTES (default 180) on the local cluster: daily load, autoscaling, hot swaps, migrations, driver kills; memory, threads, files, checkpoint and Kafka sampled each minute: .sluice/soak/
	$(PY) -m sluice.testbed prefetch
	$(PY) -m pytest -p no:cacheprovider -m soak -s e2e/tests/test_soak.py $(PYTEST_ARGS)

overload: $(STAMP) ## an app fed 3x what its capped executors can do for SLUICE_OVERLOAD_MINUTES (default 10), then 1/5: nothing OOM-killed, batches bounded, caught up, exactly once: .sluice/overload/
	$(PY) -m sluice.testbed prefetch
	$(PY) -m pytest -p no:cacheprovider -m overload -s e2e/tests/test_overload.py $(PYTEST_ARGS)

e2e-faults: $(STAMP) ## the local cluster's long fault runs: the driver pod deleted 20 times under load, a change applied at 6 moments of a driver's start, a pod killed in each phase of each rollout strategy: .sluice/e2e/
	$(PY) -m sluice.testbed prefetch
	SLUICE_E2E_DRIVER_KILLS=20 SLUICE_E2E_START_CHANGES=6 SLUICE_E2E_ROLLOUT_FAULTS=all $(PY) -m pytest -p no:cacheprovider \
		-m e2e_local e2e/tests/test_e2e_local.py --timeout 3600 $(PYTEST_ARGS) \
		-k "install or kafka_ready or deploy_app or stream or driver_killed or change_while_driver_starts or rollout_faults"

kind-cluster: $(STAMP) ## a 3-node kind cluster on podman (root; no Docker, no registry): node image built once; kubeconfig in .sluice/kind-cluster/kubeconfig
	$(PY) -m sluice.testbed.kind up

kind-cluster-down: $(STAMP)
	$(PY) -m sluice.testbed.kind down

test-kind: $(STAMP) ## the kind cluster's own tests on a throwaway 3-node cluster: network, NetworkPolicy, storage, Pod Security, a lost worker (root)
	$(PY) -m pytest -p no:cacheprovider -m kind e2e/tests/test_kind_cluster.py $(PYTEST_ARGS)

e2e-local: $(STAMP) ## the e2e suite on a throwaway local cluster with real pods (no Docker; needs root): .sluice/e2e/*.json
	$(PY) -m sluice.testbed prefetch
	$(PY) -m pytest -p no:cacheprovider -m e2e_local e2e/tests/test_e2e_local.py $(PYTEST_ARGS)
