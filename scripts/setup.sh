#!/usr/bin/env bash
# Creates .venv with the exact pinned dependencies and the package in editable mode:
# the runtime (requirements.lock) only, or with --dev the test and development tools too
# (requirements-dev.lock, which includes the runtime lock).
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
if [ ! -f "$stamp" ] || [ requirements.lock -nt "$stamp" ] || [ "$lock" -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$lock"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
  touch "$stamp"
fi
# --dev: the TypeScript SDK's pinned dependencies (clients/typescript/package-lock.json), for
# its tests (tests/test_typescript_sdk.py); only when npm is installed (.ci/run installs it).
ts=clients/typescript
if [ "${1:-}" = "--dev" ] && command -v npm >/dev/null \
  && { [ ! -f "$ts/node_modules/.package-lock.json" ] || [ "$ts/package-lock.json" -nt "$ts/node_modules/.package-lock.json" ]; }; then
  (cd "$ts" && npm ci --no-audit --no-fund --loglevel=error)
fi
