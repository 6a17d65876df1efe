"""Metrics and traces of the decision path: what every layer from audit up records.

It sits just above the core values and imports nothing else of sidecar, so the audit
writer, the store, the authorizer, the pump and the service can all record into it; the
engine stays pure and never does. Serving the metrics and choosing an exporter are the
server's business (toolauthz/server/observability.py)."""
