"""Adapters that put the sidecar's decisions into the tool loops of agent frameworks (see docs/frameworks.md)."""
