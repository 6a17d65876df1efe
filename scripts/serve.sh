#!/usr/bin/env bash
# Sets up .venv, then serves the example bundle on 127.0.0.1:50051 with data in .toolauthz/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/toolauthz serve "$@"
