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
extra_locks=()
if [ "${1:-}" = "--dev" ]; then
  lock=requirements-dev.lock
  stamp=.venv/.toolauthz-dev-installed
  # The agent frameworks the adapters' tests drive (each lock includes the dev lock).
  extra_locks=(requirements-integrations-b.lock)
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stale=
for file in requirements.lock "$lock" "${extra_locks[@]}" pyproject.toml; do
  if [ ! -f "$stamp" ] || [ "$file" -nt "$stamp" ]; then stale=1; fi
done
if [ -n "$stale" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$lock"
  for extra in "${extra_locks[@]}"; do
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$extra"
  done
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
  touch "$stamp"
fi
