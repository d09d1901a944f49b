# Entry points. `make demo` and `make test` are the two commands README.md opens with; both start from a fresh
# Debian/Ubuntu machine as root and install what they need.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
LAB := lab/lab
NODES ?= 2
# bench-loader: runs per loader and page-cache state.
RUNS ?= 3
# Host packages the lab and the toolchain need (Debian/Ubuntu names); haproxy, nftables and openssl for the
# router and firewall tests (tests/local: real haproxy on loopback, nft in throwaway network namespaces); apt-utils
# (apt-ftparchive) and gnupg for the air-gapped bundle's signed apt repository (tests/local/test_bundle_apt.py).
HOST_PACKAGES := debootstrap systemd-container dpkg-dev zstd iptables iproute2 openssh-client git curl gcc \
	python3 python3-venv ca-certificates haproxy nftables openssl apt-utils gnupg
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# Ansible's and Molecule's state stays in the clone (.ansible/), never in ~/.ansible.
export ANSIBLE_HOME := $(CURDIR)/.ansible
export PATH := $(CURDIR)/$(BIN):$(PATH)

# Where each run's timings land (tests/timings.py sums them up at the end of make test and make test-all): a JUnit
# XML per pytest layer, layers.tsv, molecule.tsv, and playbooks.jsonl (the kimi_task_times callback of every
# playbook a test runs through tests/ansible_run.py or Molecule).
TEST_TIMES := $(CURDIR)/artifacts/test-times
export KIMI_TEST_TIMES_DIR := $(TEST_TIMES)
JUNIT = --junitxml=$(TEST_TIMES)/$@.xml

.PHONY: help host-deps venv promtool lint unit local lab-build lab-up lab-down lab-status lab-test molecule gpu-facts
.PHONY: collection-links
.PHONY: test test-all test-group lab-airgap-test demo bench bench-converge bundle clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

host-deps: ## Install the host packages the lab needs (apt, as root)
	@missing=$$(for p in $(HOST_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
		| grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing host packages:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

$(VENV)/.stamp: requirements-dev.txt
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@

venv: $(VENV)/.stamp ## Create .venv with the pinned toolchain (requirements-dev.txt)

# promtool checks and tests the monitoring role's alert rules (tests/local/test_monitoring_rules.py). It comes from
# the very Debian 12 package the role installs on the monitoring hosts, downloaded (apt verifies it against the
# signed archive) and unpacked into .cache/: installing the package here would start a Prometheus daemon.
PROMTOOL_DEB_VERSION := 2.42.0+ds-5+deb12u1
PROMTOOL_CACHE := .cache/promtool
PROMTOOL := $(PROMTOOL_CACHE)/usr/bin/promtool

$(PROMTOOL):
	@mkdir -p $(PROMTOOL_CACHE).deb
	@# apt-get download needs the package lists; a fresh machine has none until apt-get update (root).
	cd $(PROMTOOL_CACHE).deb && { apt-get download -q prometheus=$(PROMTOOL_DEB_VERSION) \
		|| { apt-get update -qq && apt-get download -q prometheus=$(PROMTOOL_DEB_VERSION); }; }
	rm -rf $(PROMTOOL_CACHE).unpacked && dpkg-deb -x $(PROMTOOL_CACHE).deb/prometheus_*.deb $(PROMTOOL_CACHE).unpacked
	@# Only promtool is kept: the rest of the package (prometheus itself, example YAML) has no use here.
	install -D -m 0755 $(PROMTOOL_CACHE).unpacked/usr/bin/promtool $@
	rm -rf $(PROMTOOL_CACHE).unpacked $(PROMTOOL_CACHE).deb
	$@ --version | sed -n 1p

promtool: $(PROMTOOL) ## promtool from Debian's prometheus package, unpacked into .cache/ (nothing installed)

lint: venv ## yamllint, ansible-lint (production profile), ruff, every module's DOCUMENTATION vs its spec
	$(BIN)/yamllint -s .
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/ansible-lint --profile production -q
	$(PY) tests/sanity/module_docs.py

unit: venv ## Unit tests (seconds; no root, no lab), in two processes like tests/local
	$(BIN)/pytest -q --durations=5 -n 2 --dist loadfile $(JUNIT) tests/unit

# Tier 1 only: the tests marked tier2 run in their groups (tests/tiers.py; make test-all).
local: venv promtool ## Roles and playbooks run on this host through ansible-runner (minutes; root, no lab)
	$(BIN)/pytest -q --durations=15 -n 2 --dist loadfile -m "not tier2" $(JUNIT) tests/local

lab-build: host-deps venv ## Build (or reuse) the lab's cached base rootfs and mirrors
	$(PY) $(LAB) build all

lab-up: host-deps venv ## Boot the lab with NODES nodes (default 2)
	$(PY) $(LAB) up $(NODES)

lab-down: ## Tear the lab down, leaving nothing behind
	$(PY) $(LAB) down

lab-status: ## Show the lab's nodes and mirrors
	$(PY) $(LAB) status

lab-test: lab-build ## Tier 1's tests against the real lab (boots and tears down its own nodes)
	$(BIN)/pytest -q --durations=0 -m "lab and not tier2" $(JUNIT) tests/lab

# One tier-2 group (tests/tiers.py list names them), its time recorded in tests/tier2-record.json.
GROUP ?=
test-group: lab-build ## One tier-2 group: make test-group GROUP=lab-drift (tests/tiers.py list)
	@[ -n "$(GROUP)" ] || { echo "make test-group: name a group: GROUP=<name> (tests/tiers.py list)" >&2; exit 2; }
	$(PY) tests/tiers.py run $(GROUP)

lab-airgap-test: ## The lab converged air-gapped from node1's offline mirror (the tier-2 group lab-airgap)
	$(MAKE) --no-print-directory test-group GROUP=lab-airgap

# Every scenario runs on one lab booted once (the largest scenario has 2 platforms); each scenario's own
# create uses it, --destroy never keeps it for the next, and the lab goes down at the end, also on failure.
# Order matters on shared nodes: preflight (which must find /data untouched) first, then the stack roles,
# the checkpoint, and serving last (its prepare finds the stack and the checkpoint already there).
# The tier-2 groups molecule-stack and molecule-services (tests/tiers.py) each run a part of this list; every
# scenario is in one of them (tests/unit/test_tiers.py). Tier 1 runs the verify.yml of each scenario whose converge
# site.yml repeats against the lab layer's own converge (tests/lab/test_molecule_verify.py).
MOLECULE_NODES := 2
MOLECULE_SCENARIOS ?= preflight cuda nccl nvidia_driver vllm checkpoint vllm_serve monitoring router offline_mirror \
	firewall

molecule: lab-build ## Molecule scenarios (all, or MOLECULE_SCENARIOS=...) on one lab booted once for all of them
	@# Each scenario's state (created, prepared) belongs to the lab of an earlier run: a stale "prepared" would skip
	@# vllm_serve's prepare on these fresh nodes.
	@rm -rf $(CURDIR)/.ansible/molecule
	@mkdir -p $(TEST_TIMES)
	@$(PY) $(LAB) down >/dev/null; $(PY) $(LAB) up $(MOLECULE_NODES); status=0; \
	for scenario in $(MOLECULE_SCENARIOS); do \
		echo "== molecule test -s $$scenario"; started=$$(date +%s); \
		MOLECULE_EPHEMERAL_DIRECTORY=$(CURDIR)/.ansible/molecule/$$scenario ANSIBLE_CALLBACKS_ENABLED=kimi_task_times \
			KIMI_TASK_TIMES_FILE=$(TEST_TIMES)/playbooks.jsonl \
			$(BIN)/molecule test -s $$scenario --destroy never || { status=$$?; break; }; \
		echo "== molecule $$scenario: $$(( $$(date +%s) - started )) s"; \
		echo "$$scenario $$(( $$(date +%s) - started ))" >> $(TEST_TIMES)/molecule.tsv; \
	done; \
	$(PY) $(LAB) down || status=$$?; \
	$(MAKE) --no-print-directory collection-links || status=$$?; \
	exit $$status

# Molecule's prerun (ansible-compat) installs the checkout as a collection into the first collections path, this
# clone's collections/: the links below become a copy, and later edits of plugins/ would not reach an FQCN until
# it was removed. Put the links back (make molecule does after its scenarios).
collection-links:
	@rm -rf collections/ansible_collections/kimi/k2
	@mkdir -p collections/ansible_collections/kimi/k2
	@ln -s ../../../../meta collections/ansible_collections/kimi/k2/meta
	@ln -s ../../../../plugins collections/ansible_collections/kimi/k2/plugins

# Tier 1, the layers `make test` runs, in order (at most 40 minutes on a clean clone on 2 cores: CONTRIBUTING.md,
# "Test time"); each one's wall time and the slowest tests are printed at the end. lab-build comes before unit and
# local: their tests of the mirrors and of the checkpoint role against the lab's Hugging Face mirror would
# otherwise skip on a machine whose lab cache is cold. Tier 2 (tests/tiers.py) is `make test-all`.
TEST_LAYERS := lint lab-build unit local lab-test

test: host-deps venv ## Tier 1 (what CI always runs), then each layer's wall time and the slowest tests
	@rm -rf $(TEST_TIMES); mkdir -p $(TEST_TIMES); status=0; \
	for layer in $(TEST_LAYERS); do \
		started=$$(date +%s); \
		$(MAKE) --no-print-directory $$layer || status=$$?; \
		echo "$$layer $$(( $$(date +%s) - started ))" >> $(TEST_TIMES)/layers.tsv; \
		[ $$status -eq 0 ] || { echo "make test: layer $$layer failed (exit $$status)" >&2; break; }; \
	done; \
	$(PY) tests/timings.py $(TEST_TIMES); exit $$status

test-all: ## Tier 1 and every tier-2 group; a full pass is recorded in tests/tier2-record.json (commit it)
	KIMI_LAB_KEEP=1 $(MAKE) --no-print-directory test
	@status=0; $(PY) tests/tiers.py all || status=$$?; $(PY) tests/timings.py $(TEST_TIMES); exit $$status

demo: host-deps venv lab-build ## Lab up (NODES=2) and site.yml against it
	$(PY) $(LAB) up $(NODES)
	$(BIN)/ansible-playbook site.yml -i inventories/lab

bench: venv ## Print the benchmark figures
	@for b in bench/bench_*.py; do [ -e "$$b" ] && $(PY) $$b; done

bench-converge: host-deps venv lab-build ## Time a converge that changes nothing on NODES lab nodes (boots its own lab)
	$(PY) bench/bench_converge.py --measure $(NODES)

bench-loader: host-deps venv lab-build ## Time vLLM's weight load (auto, runai_streamer) of a generated GiB checkpoint
	$(PY) bench/bench_loader.py --measure --runs $(RUNS)

# The air-gapped lab's bundle (inventories/lab with inventories/lab-offline, whose node1 serves it; docs/air-gapped.md),
# built from the lab's cached mirrors (make lab-build): its apt repositories (flat and unsigned, so trusted=yes) and
# its wheelhouse, found by labctl as lab/lab finds them, and the checkpoint from the running lab's olah (make lab-up:
# without a running lab there is neither the olah nor the generated inventory that names the checkpoint). The key in
# BUNDLE_GNUPG is made on the first build and kept, so the fingerprint receivers pin stays the same.
BUNDLE_OUT ?= .cache/bundle/lab
BUNDLE_GNUPG ?= .cache/bundle-gnupg
define LAB_BUNDLE_SOURCES
import sys
sys.path.insert(0, "lab")
from labctl import mirrors_apt, mirrors_wheels, settings
lab_settings = settings.load_settings()
cache = lab_settings.cache
apt, wheels = mirrors_apt.existing(cache), mirrors_wheels.existing(cache)
if not (apt and wheels):
    sys.exit(f"make bundle: the lab's mirrors are not built under {cache}: run make lab-build first")
for name in ("nvidia", "debian"):
    print(f"--apt-source=[trusted=yes] file:{apt[name]} ./")
print(f"--pip-find-links={wheels['wheelhouse']}")
from labctl import serve, state
olah_runs = serve.server_pids(state.StatePaths(lab_settings.state))["hf"] is not None
# The checkpoint (inventories/lab-offline carries it) from the running lab's olah; without it, a closed loopback
# port, so that a checkpoint build fails at once instead of reaching for the Hub.
print(f"--hf-endpoint={serve.mirror_urls(lab_settings)['hf_endpoint'] if olah_runs else 'http://127.0.0.1:9'}")
endef
export LAB_BUNDLE_SOURCES

bundle: venv ## Build the lab's signed offline bundle (checkpoint included; the lab up) into BUNDLE_OUT
	@if [ ! -f inventories/lab/hosts.yml ]; then \
		echo "make bundle: the lab is not up (no inventories/lab/hosts.yml): its bundle carries the lab's checkpoint," \
			"which its olah serves and its generated inventory names: make lab-up first" >&2; exit 2; \
	fi; \
	sources=$$($(PY) -c "$$LAB_BUNDLE_SOURCES"); readarray -t flags <<< "$$sources"; \
	$(PY) bin/kimi-bundle build -i inventories/lab -i inventories/lab-offline -o $(BUNDLE_OUT) \
		--gnupg-home $(BUNDLE_GNUPG) "$${flags[@]}"

# Run on a machine with an NVIDIA GPU (docs/gpu-facts.md): any python3 >= 3.10 (stdlib only, so no `make venv`),
# no vLLM, no network, at most 8 minutes. PIP_VENV names the venv whose python runs the torch and NCCL probes.
GPU_FACTS_OUT ?= gpu-facts
PIP_VENV ?=

gpu-facts: ## Record this GPU machine's nvidia-smi, torch and NCCL facts as fixtures into GPU_FACTS_OUT
	python3 bin/kimi-gpu-facts --out $(GPU_FACTS_OUT)$(if $(PIP_VENV), --pip-venv $(PIP_VENV))

clean: lab-down ## Tear down the lab and remove the venv and local Ansible state
	rm -rf $(VENV) .ansible .pytest_cache .ruff_cache
