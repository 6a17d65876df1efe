"""`toolauthz test`: policy test suites (`BUNDLE/tests/*.yaml`) run like a test runner."""

from toolauthz.cli.policytest.run import add_test_command, main, run, run_case
from toolauthz.cli.policytest.suite import Case, Result

__all__ = ["Case", "Result", "add_test_command", "main", "run", "run_case"]
