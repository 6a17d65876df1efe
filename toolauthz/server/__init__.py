"""Serving: settings, the wiring of one sidecar (`build.py`, into `sidecar.py`), its web
side when configured (`web.py`), its decision pump, the bundle reloader, and the worker
processes that share one port."""
