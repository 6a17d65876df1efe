#!/usr/bin/env bash
# Sets up .venv, runs the checkers (ruff, then mypy, configured in pyproject.toml),
# then the whole test suite; any finding fails the run. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
