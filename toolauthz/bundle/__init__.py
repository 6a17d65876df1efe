"""The policy bundle: tool catalog, Cedar schema and policies, loaded and checked once."""

from toolauthz.bundle.holder import BundleHolder
from toolauthz.bundle.loader import Bundle, load_bundle

__all__ = ["Bundle", "BundleHolder", "load_bundle"]
