#!/usr/bin/env bash
# Creates .venv with the exact pinned dependencies and the package in editable mode.
# Idempotent: a second run only re-checks what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.toolauthz-installed
if [ ! -f "$stamp" ] || [ requirements.lock -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
  touch "$stamp"
fi
