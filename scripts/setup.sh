#!/usr/bin/env bash
# Creates .venv with the exact pinned dependencies and the package in editable mode:
# the runtime (requirements.lock) only, or with --dev the test and development tools too
# (requirements-dev.lock, which includes the runtime lock), the agent frameworks of the
# adapters (requirements-integrations.lock), and a wheelhouse of the SDK's own lock
# (requirements-client.lock) from which tests/test_client_install.py installs the SDK
# alone into a fresh venv, offline.
# Idempotent: a second run only re-checks what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
lock=requirements.lock
stamp=.venv/.toolauthz-installed
if [ "${1:-}" = "--dev" ]; then
  lock=requirements-dev.lock
  stamp=.venv/.toolauthz-dev-installed
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
extra_locks=()
if [ "$lock" = requirements-dev.lock ]; then
  extra_locks=(requirements-integrations.lock requirements-integrations-b.lock requirements-client.lock)
fi
stale=0
for file in requirements.lock "$lock" pyproject.toml "${extra_locks[@]}"; do
  if [ ! -f "$stamp" ] || [ "$file" -nt "$stamp" ]; then stale=1; fi
done
if [ "$lock" = requirements-dev.lock ] && [ ! -d .venv/wheelhouse-client ]; then stale=1; fi
if [ "$stale" = 1 ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$lock"
  if [ "$lock" = requirements-dev.lock ]; then
    # The agent frameworks the adapters' tests drive, each lock on top of the dev lock.
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-integrations.lock
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-integrations-b.lock
    .venv/bin/python -m pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps \
      -r requirements-client.lock -d .venv/wheelhouse-client
  fi
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
  touch "$stamp"
fi
# --dev: the MCP conformance suite and its reference server (tests/test_mcp_conformance.py),
# exactly as tests/conformance/package-lock.json pins them (Node.js 22 among them).
conformance=tests/conformance
if [ "${1:-}" = "--dev" ] && { [ ! -f "$conformance/node_modules/.package-lock.json" ] \
    || [ "$conformance/package-lock.json" -nt "$conformance/node_modules/.package-lock.json" ]; }; then
  if ! command -v npm >/dev/null; then
    echo "scripts/setup.sh --dev: npm is needed for $conformance (Debian: apt-get install npm)" >&2
    exit 1
  fi
  npm ci --prefix "$conformance" --no-audit --no-fund --loglevel=error
fi
# --dev: the TypeScript SDK's pinned dependencies (clients/typescript/package-lock.json), for
# its tests (tests/test_typescript_sdk.py); only when npm is installed (.ci/run installs it).
ts=clients/typescript
if [ "${1:-}" = "--dev" ] && command -v npm >/dev/null \
  && { [ ! -f "$ts/node_modules/.package-lock.json" ] || [ "$ts/package-lock.json" -nt "$ts/node_modules/.package-lock.json" ]; }; then
  (cd "$ts" && npm ci --no-audit --no-fund --loglevel=error)
fi
