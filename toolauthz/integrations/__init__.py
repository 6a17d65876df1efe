"""Adapters that put toolauthz inside the tool loop of an agent framework.

One module per framework (``openai_agents``, ``langgraph``, ...), each importing its
framework lazily so that ``toolauthz.integrations`` itself needs nothing beyond the
client. Every adapter builds on :class:`toolauthz.client.Guard` and keeps the same
rules: identity comes from the runtime's session, never from the model's arguments;
the provider's tool-use id is the call id and the idempotency key; the parallel calls
of one turn are authorized in one ``AuthorizeBatch``; every call is verified
immediately before it runs and its outcome is reported; a framework's own "approved"
flag never replaces an approval granted by an approver through the sidecar.
"""
