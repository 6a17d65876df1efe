"""The framework examples run as a user runs them (`python -m examples.<name>` from the
repository root, offline, a sidecar of their own) and end with every tool run once."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.parametrize("example", ["openai_agents_agent", "langgraph_agent"])
def test_the_framework_example_runs_each_tool_once_after_bobs_approval(example):
    done = subprocess.run([sys.executable, "-m", f"examples.{example}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any("interrupted for" in line and "call_2" in line for line in lines)
    assert any(line.startswith("bob approved ") for line in lines)
    assert "'lookup_order': 1, 'issue_refund': 1" in lines[-1]
