"""The toolauthz benchmark: `python -m bench` (see bench/run.py and docs/performance.md)."""
