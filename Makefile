# `make setup`: a controller, nothing else: .venv from the system python3 (>= 3.10) with the
# project and its runtime dependencies (pip runs again only when pyproject.toml is newer than
# the stamp). No apt, no lab packages, no dev tools.
# README's two lab commands (`make demo`, `make test`) set themselves up first, and a second call
# skips what is done:
#   1. the Debian/Ubuntu packages the lab needs (dpkg-query; apt-get only for missing ones),
#   2. .venv as above plus the dev extras (tests, ruff, the lab's parquet writer),
#   3. the job, with .venv's python.
# Every path is absolute, so `sudo make demo` works from any shell (sudo resets PATH, and a
# pyenv shim or an activated venv is never used).
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
SYSTEM_PYTHON ?= /usr/bin/python3
VENV := $(ROOT)/.venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.p40fleet-installed
DEV_STAMP := $(VENV)/.p40fleet-dev-installed
LAB_GPUS ?= 4xP40,8xP40,1xP100,2xH200

# The lab on the controller: mmdebstrap (base rootfs), iproute2 (netns, bridge), ssh-keygen/ssh,
# git (mirror remotes), xz/dpkg-dev/gcc (the installer doubles), kmod, curl, nftables (the lab's
# firewall fault, `python -m p40lab block`: nft in a host's netns); python3-venv and
# python3-pip for .venv (Debian's python3 refuses a system-wide pip install: PEP 668).
APT_PACKAGES := mmdebstrap iproute2 openssh-client git xz-utils dpkg-dev gcc libc6-dev kmod \
	curl ca-certificates nftables python3-venv python3-pip

.PHONY: demo test lint setup lab-setup system-packages bytecode lab-up lab-down bench

# .venv/bin first on PATH, as an activated venv has it: tools and tests that run `python3` by
# name (tests/test_conda.py, tests/test_verl.py) get the project's interpreter, not a system
# or pyenv one.

demo: lab-setup
	cd $(ROOT) && PATH="$(VENV)/bin:$$PATH" $(PY) -m p40lab.demo --gpus $(LAB_GPUS)

test: lab-setup
	cd $(ROOT) && $(PY) -m ruff check . && $(PY) -m ruff format --check .
	cd $(ROOT) && PATH="$(VENV)/bin:$$PATH" $(PY) tests/side_by_side.py

lint: lab-setup
	cd $(ROOT) && $(PY) -m ruff check . && $(PY) -m ruff format --check .

setup: $(STAMP) bytecode

lab-setup: system-packages setup $(DEV_STAMP)

system-packages:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${db:Status-Status}' $$p 2>/dev/null | grep -qx installed \
	    || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "make: missing Debian packages:$$missing; run as root (sudo make ...)" >&2; exit 1; \
	  fi; \
	  echo "make: installing$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# .venv is (re)made when missing or when its python does not run (made by an interpreter that
# has since gone); pyvenv.cfg is new then, so the install below runs again.
VENV_CFG := $(VENV)/pyvenv.cfg
ifneq ($(shell $(PY) -c 'print(1)' 2>/dev/null),1)
.PHONY: $(VENV_CFG)
endif
$(VENV_CFG):
	@$(SYSTEM_PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || { \
	  echo "make: $(SYSTEM_PYTHON) is not Python >= 3.10 ($$($(SYSTEM_PYTHON) -V 2>&1)): the controller needs 3.10 or newer; give one with SYSTEM_PYTHON=/path/to/python3.10 make setup (Ubuntu 20.04's python3 is 3.8: see README, step 1)" >&2; exit 1; }
	@echo "make: creating $(VENV) with $(SYSTEM_PYTHON)"
	rm -rf $(VENV) && $(SYSTEM_PYTHON) -m venv $(VENV)

$(STAMP): $(ROOT)/pyproject.toml $(VENV_CFG)
	$(PY) -m pip install -q --disable-pip-version-check -e '$(ROOT)'
	touch $@

# wheel: the lab's wheelhouse builds sdist-only projects with `pip wheel`.
$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '$(ROOT)[dev]' wheel
	touch $@

# The packages a pyinfra run imports, compiled: pyinfra turns writing bytecode off
# (sys.dont_write_bytecode), so without this every run compiles them from source again, 0.07 s
# of controller CPU per run (8-host lab, named no-op). An editable install compiles nothing;
# compileall skips what is up to date. Deploy and inventory files are exec'd: always source.
BYTECODE_DIRS := facts operations p40fleet p40lab
bytecode: $(STAMP)
	@cd $(ROOT) && $(PY) -m compileall -q $(BYTECODE_DIRS) >/dev/null

lab-up: lab-setup
	cd $(ROOT) && $(PY) -m p40lab up --gpus $(LAB_GPUS)

lab-down: lab-setup
	cd $(ROOT) && $(PY) -m p40lab down

bench: lab-setup
	cd $(ROOT) && $(PY) benchmarks/bench_lab.py
