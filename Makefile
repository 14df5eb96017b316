# hma developer entry points. `make test` and `make demo` set everything up themselves.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# mypy and import-linter read the package as it installs: probes/ as hma/probes (scripts/lint-view)
LINT_VIEW := build/lint

.PHONY: all setup test unit integration lint compat demo bench clean deb rpm vendor install-test \
	release-check spank

all: test

setup:
	scripts/bootstrap $(VENV)

lint: setup
	$(VENV)/bin/ruff check hma probes tests bench scripts packaging
	$(VENV)/bin/ruff format --check hma probes tests bench
	scripts/lint-view $(LINT_VIEW)
	cd $(LINT_VIEW) && $(CURDIR)/$(VENV)/bin/mypy --config-file $(CURDIR)/pyproject.toml hma
	cd $(LINT_VIEW) && PYTHONPATH=. $(CURDIR)/$(VENV)/bin/lint-imports --no-logo --config $(CURDIR)/setup.cfg

unit: setup
	$(PY) -m pytest -q tests/unit

integration: setup
	$(PY) -m pytest -q tests/integration

# Unit tests under the oldest supported Pythons (RHEL 9 / Ubuntu 22.04 ship 3.9 / 3.10). A
# missing interpreter fails the target (scripts/find-python says how to get one).
COMPAT_PYTHONS := 3.9 3.10

compat:
	@missing=; for v in $(COMPAT_PYTHONS); do scripts/find-python $$v >/dev/null || missing+=" $$v"; done; \
	  if [[ -n "$$missing" ]]; then echo "make compat: Python$$missing missing" >&2; exit 1; fi
	for v in $(COMPAT_PYTHONS); do \
	  scripts/bootstrap .venv$${v//./} "$$(scripts/find-python $$v)" test-min || exit 1; \
	done
	for v in $(COMPAT_PYTHONS); do \
	  .venv$${v//./}/bin/python -m pytest -q -p no:cacheprovider tests/unit || exit 1; \
	done

test: setup lint
	$(PY) -m pytest -q tests
	$(MAKE) compat
	$(MAKE) install-test

# Packages (docs/packaging.md) and their install tests (chroots cached in /var/cache/hma-test).
vendor: setup
	PIP_PYTHON=$(PY) packaging/build vendor

deb: setup
	PIP_PYTHON=$(PY) packaging/build deb

rpm: setup
	PIP_PYTHON=$(PY) packaging/build rpm

# The srun plugin alone (docs/auto-resume.md, "The srun plugin"): build/spank/hma_auto_resume.so;
# `make deb rpm` build it into hma-slurm-plugin. setup installs libslurm-dev (its headers).
spank: setup
	$(MAKE) -C contrib/spank OUT=$(CURDIR)/build/spank

# A release (CONTRIBUTING.md, "Releasing"): one version in the tree, CHANGELOG.md's top section
# and the tag (when on one); the packages built now from this tree carry it and the licence.
release-check: deb rpm
	$(PY) packaging/release.py --dist dist

install-test: setup
	HMA_INSTALL_TESTS=1 $(PY) -m pytest -q -p no:cacheprovider tests/install

demo: setup
	$(PY) scripts/demo.py

bench: setup
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .venv39 .venv310 build dist *.egg-info
