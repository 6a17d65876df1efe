"""toolauthz: a policy-as-code authorization sidecar for the tool calls of LLM agents."""

__version__ = "0.1.0"
