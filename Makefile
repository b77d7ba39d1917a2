# The two set-up commands on a fresh machine (Python 3.10+ and make): `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TYPECHECK := build/typecheck

.PHONY: install demo test lint typecheck proto proto-check unit bench clean toolkit

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# System tools some tests use (the armhf ABI check, systemd unit checks): installed when running as
# root, else those tests skip and say why.
APT_INSTALL := apt-get update -qq && apt-get install -y -qq --no-install-recommends

install: $(STAMP)
	@command -v arm-linux-gnueabihf-gcc >/dev/null || [ "$$(id -u)" != 0 ] || ($(APT_INSTALL) gcc-arm-linux-gnueabihf) \
		|| echo "gcc-arm-linux-gnueabihf could not be installed; the armhf ABI test will skip"
	@command -v systemd-analyze >/dev/null || [ "$$(id -u)" != 0 ] || ($(APT_INSTALL) systemd) \
		|| echo "systemd could not be installed; the unit checks will skip"

demo: $(STAMP)
	$(PY) -m demo.run_demo

proto: $(STAMP)
	$(PY) tools/gen_proto.py

proto-check: $(STAMP)
	$(PY) tools/gen_proto.py --check

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy needs folders named like the packages: link them under build/typecheck.
typecheck: $(STAMP)
	@mkdir -p $(TYPECHECK)
	@ln -sfn ../../proto $(TYPECHECK)/rknn_proto
	@ln -sfn ../../server $(TYPECHECK)/rknn_server
	@ln -sfn ../../client $(TYPECHECK)/rknn_client
	cd $(TYPECHECK) && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml -p rknn_proto -p rknn_server -p rknn_client

# The real RKNN-Toolkit2 that tests/toolkit drive through the bridge: installed once into
# ~/.cache/rknn_client (kept between runs and clones), with the stand-in for torch (docs/toolkit-bridge.md).
toolkit: $(STAMP)
	@$(VENV)/bin/rknn-client toolkit status >/dev/null 2>&1 || $(VENV)/bin/rknn-client toolkit install --torch-stub \
		|| echo "RKNN-Toolkit2 could not be installed; tests/toolkit will skip"

unit: install toolkit
	$(PY) -m pytest -q

test: lint typecheck proto-check unit

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench.run

clean:
	rm -rf build demo-work bench-results .pytest_cache .mypy_cache .ruff_cache
