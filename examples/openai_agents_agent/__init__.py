"""A support agent on the OpenAI Agents SDK, guarded by toolauthz, offline.

    .venv/bin/python -m examples.openai_agents_agent

The SDK's own scripted model (`agents.testing.ScriptedModel`) proposes a lookup, then a
refund above 50.00; the sidecar allows the first, holds the second for finance: the run
stops with the SDK's interruption, bob approves in the sidecar, and the RunState (through
its string, as another process would) resumes and runs the refund once.
"""
