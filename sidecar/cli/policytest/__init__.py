"""`toolauthz test`: policy test suites (`BUNDLE/tests/*.yaml`) run like a test runner."""

from sidecar.cli.policytest.run import add_test_command, main, run, run_case
from sidecar.cli.policytest.suite import Case, Result

__all__ = ["Case", "Result", "add_test_command", "main", "run", "run_case"]
