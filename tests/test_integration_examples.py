"""The framework examples run as a user runs them: one command each, from the repository
root, offline (scripted models, a sidecar in the example's own process)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.parametrize(("module", "expected"), [
    ("examples.pydantic_ai_agent", "executed: {'issue_refund': 2, 'lookup_order': 1}"),
    ("examples.claude_agent", "every call ran at most once, and only as the sidecar allowed"),
])
def test_the_example_runs_with_one_command(module, expected):
    done = subprocess.run([sys.executable, "-m", module], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert expected in done.stdout and "Traceback" not in done.stderr, done.stdout + done.stderr
