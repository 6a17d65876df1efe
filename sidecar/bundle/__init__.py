"""The policy bundle: tool catalog, Cedar schema and policies, loaded and checked once."""

from sidecar.bundle.loader import Bundle, load_bundle

__all__ = ["Bundle", "load_bundle"]
