# The two set-up commands on a fresh machine (Python 3.10+ and make): `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two installs, each with its stamp: the demo's (daemon, host runtime, client) and the rest for tests.
DEMO_STAMP := $(VENV)/.installed-demo
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: wheel install demo test lint typecheck proto proto-check unit bench clean toolkit tritonclient

$(DEMO_STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install --progress-bar on -e '.[demo]'
	@touch $(DEMO_STAMP)

# Everything else the tests and checks use, on top of the demo's install.
$(DEV_STAMP): $(DEMO_STAMP)
	$(PY) -m pip install --progress-bar on -e '.[dev]'
	@touch $(DEV_STAMP)

# System tools some tests use (the armhf ABI check, systemd unit checks, the farm report in a headless
# browser): installed when running as root, else those tests skip and say why.
APT_INSTALL := apt-get update -qq && apt-get install -y -qq --no-install-recommends

install: $(DEV_STAMP)
	@if [ "$$(id -u)" = 0 ] && ! { command -v arm-linux-gnueabihf-gcc && command -v systemd-analyze; } >/dev/null; then \
		echo "make: running as root, so installing with apt-get what is missing of gcc-arm-linux-gnueabihf (the armhf ABI test), systemd (the unit checks), chromium (the farm report's browser test) and, for make tritonclient, libb64-0d (perf_analyzer)"; fi
	@command -v arm-linux-gnueabihf-gcc >/dev/null || [ "$$(id -u)" != 0 ] || ($(APT_INSTALL) gcc-arm-linux-gnueabihf) \
		|| echo "gcc-arm-linux-gnueabihf could not be installed; the armhf ABI test will skip"
	@command -v systemd-analyze >/dev/null || [ "$$(id -u)" != 0 ] || ($(APT_INSTALL) systemd) \
		|| echo "systemd could not be installed; the unit checks will skip"
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] \
		|| (echo "installing chromium with apt-get (the farm report's headless-browser test)" && $(APT_INSTALL) chromium) \
		|| echo "chromium could not be installed; the farm report's browser test will skip"

demo: $(DEMO_STAMP)
	$(PY) -m demo.run_demo

proto: $(DEV_STAMP)
	$(PY) tools/gen_proto.py

proto-check: $(DEV_STAMP)
	$(PY) tools/gen_proto.py --check

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy reads the packages under their import names: src/ links them.
typecheck: $(DEV_STAMP)
	cd src && ../$(VENV)/bin/mypy --config-file ../pyproject.toml --cache-dir ../.mypy_cache -p rknn_proto -p rknn_server -p rknn_client

# The real RKNN-Toolkit2 that tests/toolkit drive through the bridge: installed once into
# ~/.cache/rknn_client (kept between runs and clones), with the stand-in for torch (docs/toolkit-bridge.md).
toolkit: $(DEV_STAMP)
	@$(VENV)/bin/rknn-client toolkit status >/dev/null 2>&1 || $(VENV)/bin/rknn-client toolkit install --torch-stub \
		|| echo "RKNN-Toolkit2 could not be installed; tests/toolkit will skip"

# The real tritonclient and perf_analyzer that tests/kserve drive the daemon with (KServe v2): venvs of
# their own in ~/.cache/rknn_client, as tritonclient pins its own protobuf and grpcio; made once, then
# found by their stamps. perf_analyzer links libb64 (apt-get, when running as root).
tritonclient: $(DEV_STAMP)
	@ldconfig -p | grep -q 'libb64\.so\.0d' || [ "$$(id -u)" != 0 ] || ($(APT_INSTALL) libb64-0d) \
		|| echo "libb64-0d could not be installed; the perf_analyzer test will skip"
	@$(PY) -m tests.kserve.tritonclient_venv

unit: install toolkit tritonclient
	$(PY) -m pytest -q

test: lint typecheck proto-check unit

bench: $(DEV_STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench.run

# The project's wheel for a board (docs/deploy.md: installing without PyPI), into dist/.
wheel:
	$(PYTHON) -m pip wheel --no-deps --wheel-dir dist .

clean:
	rm -rf build demo-work bench-results .pytest_cache .mypy_cache .ruff_cache
