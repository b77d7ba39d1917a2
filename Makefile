# The two set-up commands on a fresh machine (Python 3.10+ and make): `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two installs, each with its stamp: the demo's (daemon, host runtime, client) and the rest for tests.
DEMO_STAMP := $(VENV)/.installed-demo
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: wheel install demo test lint typecheck proto proto-check unit bench clean toolkit tritonclient labgrid board-test

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

# The real RKNN-Toolkit2 that tests/toolkit drive through the bridge and tests/legacy through adb:
# installed once into ~/.cache/rknn_client (kept between runs and clones), with the stand-in for torch
# (docs/toolkit-bridge.md). 2.3.2 beside it (about a minute, a 40 MB wheel) for the legacy tests that
# run with each release; `install` returns at once for a release already there.
TOOLKIT_RELEASES := 2.5.0 2.3.2
toolkit: $(DEV_STAMP)
	@for version in $(TOOLKIT_RELEASES); do \
		$(VENV)/bin/rknn-client toolkit install --version $$version --torch-stub \
			|| echo "RKNN-Toolkit2 $$version could not be installed; the tests that need it will skip"; \
	done

# The real tritonclient and perf_analyzer that tests/kserve drive the daemon with (KServe v2): venvs of
# their own in ~/.cache/rknn_client, as tritonclient pins its own protobuf and grpcio; made once, then
# found by their stamps. perf_analyzer links libb64 (apt-get, when running as root).
tritonclient: $(DEV_STAMP)
	@ldconfig -p | grep -q 'libb64\.so\.0d' || [ "$$(id -u)" != 0 ] || ($(APT_INSTALL) libb64-0d) \
		|| echo "libb64-0d could not be installed; the perf_analyzer test will skip"
	@$(PY) -m tests.kserve.tritonclient_venv

# The real labgrid (coordinator, exporter, client) that tests/farm/test_labgrid.py schedules boards with:
# a venv of its own in ~/.cache/rknn_client, made once.
labgrid: $(DEV_STAMP)
	@$(PY) -m tests.farm.labgrid_lab || echo "labgrid could not be installed; the labgrid tests will skip"

# pytest on two workers (xdist), each test file on one worker so that the daemons a module or the session
# shares start once per worker. `make test ARGS="-k doctor -x"` passes ARGS on to pytest;
# PYTEST_WORKERS=0 runs in this process.
PYTEST_WORKERS ?= 2
unit: install toolkit tritonclient labgrid
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(ARGS)

test: lint typecheck proto-check unit

bench: $(DEV_STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench.run

# Emulated boards (tests/board, docs/deploy.md): Debian images of other architectures under qemu-user-static,
# cached in ~/.cache/rknn_client/board; the wheel, the daemon, adb and deploy tested inside them. Root
# installs the tools with apt-get; elsewhere it skips with the reason. BOARDS="arm64 armhf bullseye" adds the others.
BOARDS ?= arm64
BOARD_PACKAGES := qemu-user-static mmdebstrap gcc-aarch64-linux-gnu libc6-dev-arm64-cross gcc-arm-linux-gnueabihf libc6-dev-armhf-cross

board-test: $(DEV_STAMP) wheel
	@missing=$$(for p in $(BOARD_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || printf ' %s' $$p; done); \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
		echo "make: running as root, so installing$$missing with apt-get (for the emulated boards)"; \
		$(APT_INSTALL) $$missing || echo "apt-get could not install$$missing; board-test says what it lacks"; fi
	$(PY) -m tests.board $(BOARDS)

# The project's wheel for a board (docs/deploy.md: installing without PyPI), into dist/.
wheel:
	$(PYTHON) -m pip wheel --no-deps --wheel-dir dist .

clean:
	rm -rf build demo-work bench-results .pytest_cache .mypy_cache .ruff_cache
