"""The framework examples run as a user runs them (`python -m examples.<name>` from the
repository root, offline: scripted models, a sidecar of their own)."""

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


@pytest.mark.parametrize(("module", "expected"), [
    ("examples.pydantic_ai_agent", "executed: {'issue_refund': 2, 'lookup_order': 1}"),
    ("examples.claude_agent", "every call ran at most once, and only as the sidecar allowed"),
])
def test_the_example_runs_with_one_command(module, expected):
    done = subprocess.run([sys.executable, "-m", module], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert expected in done.stdout and "Traceback" not in done.stderr, done.stdout + done.stderr
