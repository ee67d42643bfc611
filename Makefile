# The two commands a new user needs (see README.md):
#   make workbook   set up .venv if needed, build the embedded dataset, run the workbook, print the report path
#   make test       the same set-up if needed, then every test
#   make test-fast  the unit tests only (no notebook, browser, torchrun or other process-heavy test): about 90 s
#
# Variables: PYTHON (interpreter used to create .venv), ARGS (extra options for `python -m helpers run`,
# e.g. ARGS="--device cuda --profile full"), PYTEST_ARGS (extra options for pytest), TORCH_INDEX (a pip
# index URL to install torch from before everything else, e.g. PyTorch's CPU-only or CUDA wheel index;
# empty = let pip resolve torch==2.13.0 from its configured indexes).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.workbook-installed
ARGS ?=
PYTEST_ARGS ?=
# `make test` runs the tests in this many pytest-xdist worker processes, a test file per worker at a time (1: one
# process, no xdist). Two on the 2-core developer machine: 13 min 24 s to 15 min 42 s over three quiet runs within
# 80 minutes, the dataset already built (801-939 s in pytest, 2,532 tests; 23.8-28.1 CPU-minutes, the two cores
# busy about 89% of the time; every test slower in the slow run: the machine's speed varies that much). Beside
# other work it takes longer. Earlier, quiet, 1,965 tests: 11.8-13.2 min with two,
# 21.7 min in one process, 13.9 min with three (more workers than cores only add contention). tests/conftest.py
# makes the session's shared notebook runs once for all the workers and starts the longest files first;
# conftest.py gives each worker one torch thread.
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
TORCH_INDEX ?=

.PHONY: workbook test test-fast lab setup data clean-runs help browser device-check npu-wheel

help:
	@echo "make setup      set up only: create .venv and install the pinned dependencies (make workbook does it too)"
	@echo "make workbook   run the workbook (quick profile, default device); ARGS='--profile smoke --only 00 01'"
	@echo "make test       run every test"
	@echo "make test-fast  the unit tests only (no notebook, browser or subprocess-heavy test), about 90 s"
	@echo "make lab        open a working copy of the notebooks (lab/) in JupyterLab; reset: rm -rf lab"
	@echo "make browser    install Chromium (system package, needs root) for the report's browser test"
	@echo "make device-check  on a CUDA/NPU machine: device notebooks + bench, one JSON (DEVICE=cuda|npu)"
	@echo "make npu-wheel  download the torch_npu 2.13.0 wheel (read, never installed) for the NPU format tests"

$(PY):
	$(PYTHON) -m venv $(VENV)

# Re-install when the dependency list changes. A torch build already in .venv that satisfies
# the pin (e.g. 2.13.0+cu128 installed by hand for CUDA) is kept.
$(STAMP): pyproject.toml | $(PY)
	$(if $(TORCH_INDEX),$(PY) -m pip install --disable-pip-version-check -q torch==2.13.0 --index-url $(TORCH_INDEX))
	$(PY) -m pip install --disable-pip-version-check -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

data: setup
	$(PY) -m helpers data build

workbook: data
	$(PY) -m helpers run $(ARGS)

# Where the environment sets PYTHONDONTWRITEBYTECODE=1 (this project's developer machines and CI do), every Python
# process a test starts (notebook kernels, torchrun ranks, DataLoader workers, the command line) would compile the
# project's modules again; compileall writes their bytecode once (whatever that variable says) and recompiles only
# what changed since, and Python checks each file's source stamp before it trusts it.
BYTECODE = $(PY) -m compileall -q helpers tests examples

test: data
	$(BYTECODE)
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The markers are declared in pyproject.toml; tests/conftest.py marks the seconds-long tests that carry no marker.
FAST := not notebook and not slow and not browser and not subprocess
# In TEST_WORKERS processes as `make test`: 68 s on the quiet 2-core developer machine with the public traces of
# ../shared/public_traces present (2,360 tests; 65 s in pytest), 129 s in one process (2,191 tests, earlier).
test-fast: data
	$(BYTECODE)
	$(PY) -m pytest $(XDIST) -m "$(FAST)" $(PYTEST_ARGS)

# On a borrowed accelerator: notebooks 02, 04-07 and 10, bench input-pipeline and the link bandwidth, in one JSON
# summary (runs/device-check-*/device_check.json). DEVICE=cuda by default; ARGS="--profile smoke" for a faster pass.
DEVICE ?= cuda
device-check: data
	$(PY) -m helpers device-check --device $(DEVICE) $(ARGS)

# A working copy of the notebooks (git-ignored, made from notebooks/ when missing), so that a learner's edits never
# change the tracked files; reset it with `rm -rf lab && make lab`. As root (containers, NPU machines) JupyterLab
# needs --allow-root; its news pop-up and update check are off, and widget state is saved with the notebook
# (lab-settings/overrides.json5), so a reopened notebook shows its panels' last output.
LAB_DIR ?= lab
lab: data
	@test -d $(LAB_DIR) || $(PY) -m helpers notebooks $(LAB_DIR)
	$(PY) -m jupyter lab $(LAB_DIR) $(if $(filter 0,$(shell id -u)),--allow-root) \
		--LabApp.app_settings_dir=$(CURDIR)/lab-settings \
		--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
		--LabApp.news_url=None $(LAB_ARGS)

# Chromium renders report.html in tests/test_report_browser.py; without it that test is skipped
# (or fails, when WORKBOOK_REQUIRE_BROWSER=1 as in .ci/run). Installs the Debian package when run
# as root where apt-get exists; otherwise says what to run.
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then \
		echo "Chromium: $$(command -v chromium || command -v chromium-browser)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	else \
		echo "Chromium is not installed and cannot be installed here (needs root and apt-get)."; \
		echo "Install it with: sudo apt-get install -y --no-install-recommends chromium"; \
		echo "Without it the report's browser test is skipped."; \
	fi

clean-runs:
	rm -rf runs/

# The torch_npu wheel whose source tests/test_ascend_format.py and tests/test_npu_names.py read (never installed:
# it needs CANN to import). Downloaded once into a git-ignored folder; the same command as tests/npu_wheel.py, with
# the platform pinned so that every machine reads the same file.
NPU_WHEEL_DIR ?= .cache/npu-wheel
npu-wheel: | $(PY)
	@ls $(NPU_WHEEL_DIR)/torch_npu-2.13.0-*.whl >/dev/null 2>&1 || $(PY) -m pip download --disable-pip-version-check \
		--no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 --python-version 3.11 torch-npu==2.13.0 \
		-d $(NPU_WHEEL_DIR)
	@ls $(NPU_WHEEL_DIR)/torch_npu-2.13.0-*.whl
