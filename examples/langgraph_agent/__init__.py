"""A support agent on LangGraph, guarded by toolauthz, offline.

    .venv/bin/python -m examples.langgraph_agent

langchain-core's scripted chat model proposes a lookup and a refund above 50.00 in one
turn; the tool node authorizes both in one AuthorizeBatch, runs the lookup and keeps the
refund, which the sidecar holds for finance, in the checkpoint; the graph interrupts. bob
approves in the sidecar, the graph resumes (`Command(resume=...)`), the approval node asks
the sidecar again and runs the refund once.
"""
