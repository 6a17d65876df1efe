"""Serving: settings, the wiring of one sidecar (`build.py`), its decision pump, the
bundle reloader, and the worker processes that share one port."""
