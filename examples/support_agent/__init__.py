"""A support agent's tool loop, guarded by toolauthz, end to end and offline.

Run it from the repository root:

    .venv/bin/python -m examples.support_agent
    .venv/bin/python examples/support_agent/run.py

It starts a sidecar on 127.0.0.1 (random port) with the example bundle `policies/` and a
temporary data directory, drives a scripted model (pre-written assistant turns in the
Messages API shape, no network) through the loop, plays a finance approver, and prints a
trace followed by each call's audit story.
"""
