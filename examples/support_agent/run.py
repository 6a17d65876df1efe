"""`.venv/bin/python examples/support_agent/run.py` (same as `-m examples.support_agent`)."""

import pathlib
import sys

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from examples.support_agent.scenario import main

if __name__ == "__main__":
    sys.exit(main())
