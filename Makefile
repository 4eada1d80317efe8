# records-gateway: `make run` and `make test` work on a fresh machine with Python 3.11+.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8080

.PHONY: config-example swagger-ui console-screenshots docs docs-serve chromium run test test-aiohttp-latest lint rules bench bench-records bench-consistency redis-server promtool wrk lock clean lint-openapi openapi-examples

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Every install comes from the lock files in requirements/, each file checked against its
# hash (pip's hash-checking mode): build.txt (pip, and the build requirements of
# pyproject.toml), run.txt (the dependencies), otel.txt (those and the otel extra) and
# test.txt (those and the test extra); each pins what the one before it does at the same
# versions. The project itself then goes in editable, with no dependency of its own, built
# with the locked setuptools and Cython rather than whatever pip would fetch.
# `make lock` writes the files again (docs/install.md, "Upgrading dependencies").
INSTALL_LOCKED = $(BIN)/python -m pip install --quiet --require-hashes
INSTALL_PROJECT = $(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .

# the editable install compiles gateway/normalise/compiled.pyx where a C compiler is at hand
# (without one the pure-Python rules run; setup.py): an edit to it (or to the build, or to a
# lock) installs again, so that nothing runs against a stale compiled module or an old
# lock. Each install says whether it built the compiled canonicaliser
# (gateway.normalise.rules).
BUILT := pyproject.toml setup.py gateway/normalise/compiled.pyx requirements/build.txt
SAY_BUILT = $(BIN)/python -c 'import gateway.normalise.rules as r; print("records-gateway: compiled canonicaliser", "built" if r.compiled_available() else "NOT built: the pure-Python rules run")'

$(VENV)/.installed-run: $(BUILT) requirements/run.txt | $(BIN)/python
	$(INSTALL_LOCKED) -r requirements/build.txt
	$(INSTALL_LOCKED) -r requirements/run.txt
	$(INSTALL_PROJECT)
	$(SAY_BUILT)
	touch $@

# test.txt pins everything run.txt does at the same versions, so this install is also the
# one `make run` needs
# docs.txt pins what the site needs, at the versions test.txt pins them
$(VENV)/.installed-docs: $(BUILT) requirements/docs.txt | $(BIN)/python
	$(INSTALL_LOCKED) -r requirements/build.txt
	$(INSTALL_LOCKED) -r requirements/docs.txt
	$(INSTALL_PROJECT)
	touch $@

$(VENV)/.installed-test: $(BUILT) requirements/run.txt requirements/test.txt | $(BIN)/python
	$(INSTALL_LOCKED) -r requirements/build.txt
	$(INSTALL_LOCKED) -r requirements/test.txt
	$(INSTALL_PROJECT)
	$(SAY_BUILT)
	touch $@ $(VENV)/.installed-run $(VENV)/.installed-docs

## lock: resolve requirements/*.txt again from pyproject.toml with uv, once for every
## platform and Python 3.11 on, keeping the versions pinned now wherever pyproject still
## allows them; LOCK_ARGS=--upgrade takes the newest releases it allows,
## LOCK_ARGS='--upgrade-package NAME' one package's
UV_VERSION ?= 0.13.8
UV := $(BIN)/uv
LOCK_ARGS ?=
COMPILE = $(UV) pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--custom-compile-command 'make lock' $(LOCK_ARGS)
# what build.txt locks: pyproject.toml's build requirements, and pip
BUILD_REQUIRES = $(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], "pip", sep="\n")'

lock: | $(BIN)/python
	$(BIN)/python -m pip install --quiet uv==$(UV_VERSION)
	mkdir -p requirements
	requires="$$($(BUILD_REQUIRES))" && printf '%s\n' "$$requires" | $(COMPILE) - -o requirements/build.txt
	$(COMPILE) pyproject.toml -o requirements/run.txt
	$(COMPILE) pyproject.toml --extra otel -c requirements/run.txt -o requirements/otel.txt
	$(COMPILE) pyproject.toml --extra docs -c requirements/otel.txt -o requirements/docs.txt
	$(COMPILE) pyproject.toml --extra otel --extra test -c requirements/otel.txt -c requirements/docs.txt -o requirements/test.txt

## run: the gateway with the reference upstream in the same process, on $(HOST):$(PORT)
run: $(VENV)/.installed-run
	$(BIN)/records-gateway serve --demo --host $(HOST) --port $(PORT)

# $(call debian_tool,COMMAND,PACKAGE,WITHOUT): COMMAND on the PATH, or Debian's PACKAGE
# installed when we are root and have apt-get; otherwise WITHOUT says what is missing
# ("fail": the recipe fails, naming the package; "warn": one line on stderr, and on)
define debian_tool
	@if command -v $(1) >/dev/null 2>&1; then \
		echo "$(1): $$(command -v $(1))"; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's $(2)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(2) >/dev/null; \
	elif [ "$(3)" = "warn" ]; then \
		echo "$(1) is missing and cannot be installed here (not root): the tests that need it are skipped, saying so" >&2; \
	else \
		echo "$(1) is missing: install it (e.g. apt-get install $(2)) and retry" >&2; exit 1; \
	fi
endef

## redis-server: make sure a redis-server binary exists (Debian's package, as root)
redis-server:
	$(call debian_tool,redis-server,redis-server,fail)

## wrk: make sure wrk exists (the matrix's second load client is tested with it); as root,
## Debian's package
wrk:
	$(call debian_tool,wrk,wrk,fail)

## chromium: make sure a headless Chromium exists for the browser tests (tests/browser):
## Debian's package, as root; without one, and without root, those tests are skipped
chromium:
	$(call debian_tool,chromium,chromium,warn)

## promtool: make sure promtool exists. As root, Debian's prometheus package gives it: only
## promtool is taken out of the package (installing the package would start a Prometheus
## on port 9090, the reference upstream's, wherever no policy-rc.d forbids it)
PROMTOOL_DIR ?= /usr/local/bin
promtool:
	@if command -v promtool >/dev/null 2>&1; then \
		echo "promtool: $$(command -v promtool)"; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing promtool from Debian's prometheus package in $(PROMTOOL_DIR)"; \
		tmp="$$(mktemp -d)" && { chown _apt "$$tmp" 2>/dev/null || true; } && \
		apt-get update -qq && (cd "$$tmp" && apt-get download -qq prometheus) && \
		dpkg-deb --fsys-tarfile "$$tmp"/prometheus_*.deb | tar -x -C "$$tmp" ./usr/bin/promtool && \
		install -m 755 "$$tmp/usr/bin/promtool" "$(PROMTOOL_DIR)/promtool"; \
		status=$$?; rm -rf "$$tmp"; exit $$status; \
	else \
		echo "promtool is missing: install it (e.g. apt-get install prometheus, or promtool from a Prometheus release) and retry" >&2; exit 1; \
	fi

## rules: promtool checks the alerting rules of deploy/prometheus and runs their unit tests
rules: promtool
	promtool check rules deploy/prometheus/alerts.yml
	promtool test rules deploy/prometheus/alerts_test.yml

## lint: ruff check, ruff format --check, mypy --strict, the import-linter contracts
lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

## openapi-examples: record the OpenAPI document's examples again from real answers of
## the gateway in front of the reference upstream (after a change that alters an answer;
## tests/http/test_openapi_examples.py fails until then)
openapi-examples: $(VENV)/.installed-test
	$(BIN)/python -m tests.http.openapi_examples

## config-example: write config.example.toml again from the settings model (every key at
## its default, its description above it); tests/config/test_reference.py fails until then
config-example: $(VENV)/.installed-run
	$(BIN)/python -m gateway.config.reference example config.example.toml

## swagger-ui: fetch Swagger UI's files for GET /docs again from the npm registry, at the
## release gateway/http/api_docs.py pins (after changing SWAGGER_UI_VERSION and PINNED,
## which the tests compare the files with)
swagger-ui: $(VENV)/.installed-run
	version="$$($(BIN)/python -c 'from gateway.http.api_docs import SWAGGER_UI_VERSION as v; print(v)')" && \
	tmp="$$(mktemp -d)" && (cd "$$tmp" && npm pack --silent "swagger-ui-dist@$$version" >/dev/null && tar xzf swagger-ui-dist-*.tgz) && \
	cp "$$tmp"/package/swagger-ui-bundle.js "$$tmp"/package/swagger-ui.css "$$tmp"/package/LICENSE \
		"$$tmp"/package/NOTICE "$$tmp"/package/swagger-ui-bundle.js.LICENSE.txt gateway/http/swagger_ui/; \
	status=$$?; rm -rf "$$tmp"; [ $$status = 0 ] || exit $$status; \
	$(BIN)/python -c 'from gateway.http.api_docs import PINNED, pinned_asset; [pinned_asset(name) for name in PINNED]; print("swagger-ui: the pinned files")'

## console-screenshots: the admin console's views, as its browser test drives them,
## written again into docs/images/ for docs/console.md
console-screenshots: $(VENV)/.installed-test chromium
	RECORDS_GATEWAY_SCREENSHOTS=$(CURDIR)/docs/images $(BIN)/pytest -q -p no:randomly tests/browser/test_console.py

## lint-openapi: the served document (with its admin routes) through redocly's recommended
## rules (0 errors, 0 warnings) and spectral's spectral:oas (0 warnings). Needs npm and the
## network the first time (npx fetches the pinned versions), so it is not part of `make test`
OPENAPI_DOC ?= $(VENV)/openapi.json
REDOCLY   ?= @redocly/cli@2.77.0
SPECTRAL  ?= @stoplight/spectral-cli@6.16.3
lint-openapi: $(VENV)/.installed-run
	$(BIN)/python -c 'import sys; from gateway.config.settings import Settings; from gateway.http.openapi import openapi_bytes; sys.stdout.buffer.write(openapi_bytes(Settings.model_validate({"admin": {"token": "x" * 16}})))' > $(OPENAPI_DOC)
	npx --yes $(REDOCLY) lint --max-problems 50 $(OPENAPI_DOC)
	npx --yes $(SPECTRAL) lint --ruleset .spectral.yaml --fail-severity=hint $(OPENAPI_DOC)

## docs: the documentation site from docs/ into site/, with --strict (a broken link or
## anchor, a page left out of the nav, fails); the configuration reference and the API
## reference are written at build time (mkdocs_hooks.py)
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --clean --site-dir site

## docs-serve: the site on http://127.0.0.1:8000, built again on every change
docs-serve: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:8000

## test: lint, the alerting rules and the documentation site, then the whole suite against
## real sockets, a real redis-server, promtool and a headless Chromium
test: $(VENV)/.installed-test redis-server promtool wrk chromium lint rules docs
	$(BIN)/pytest

## test-aiohttp-latest: the suite against the newest aiohttp release the package index
## has (the locks pin one release; pyproject.toml takes a range), in a venv of its own:
## the locked install, then aiohttp upgraded alone. The fast path runs when its checks
## pass (gateway/fastpath/internals.py) and steps aside with one warning otherwise
LATEST_VENV := .venv-aiohttp-latest
test-aiohttp-latest: redis-server promtool wrk
	$(MAKE) --no-print-directory VENV=$(LATEST_VENV) $(LATEST_VENV)/.installed-test
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade aiohttp
	$(LATEST_VENV)/bin/python -c 'import aiohttp, gateway.fastpath.internals as i; print("aiohttp", aiohttp.__version__, "(the fast path was verified on", ", ".join(i.VERIFIED_ON) + ")")'
	$(LATEST_VENV)/bin/pytest -p no:cacheprovider

## bench: load every configuration (wrk, and bench/loadgen.c for the mix) on loopback,
## write bench/results/ (bench/README.md); BENCH_ARGS passes options (e.g. --only mix)
bench: $(VENV)/.installed-run redis-server
	@missing=""; \
	command -v wrk >/dev/null 2>&1 || missing="wrk"; \
	{ command -v nginx || test -x /usr/sbin/nginx; } >/dev/null 2>&1 || missing="$$missing nginx"; \
	{ command -v varnishd || test -x /usr/sbin/varnishd; } >/dev/null 2>&1 || missing="$$missing varnish"; \
	command -v gcc >/dev/null 2>&1 || missing="$$missing gcc libc6-dev"; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else \
		echo "missing:$$missing; install (e.g. apt-get install$$missing) and retry" >&2; exit 1; \
	fi
	@test -x $(BIN)/py-spy || $(BIN)/python -m pip install --quiet py-spy
	$(BIN)/python bench/run.py $(BENCH_ARGS)

## bench-records: what purging by record costs (bench/records.py): the store with and
## without the index, the index's bytes in Redis, a purge on a three-primary cluster
bench-records: $(VENV)/.installed-run redis-server
	$(BIN)/python bench/records.py

## bench-consistency: what cache.record_consistency costs and buys (bench/consistency.py):
## upstream calls and answers older than one served, off, caller and all
bench-consistency: $(VENV)/.installed-run redis-server
	$(BIN)/python bench/consistency.py

clean:
	rm -rf $(VENV) $(LATEST_VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
