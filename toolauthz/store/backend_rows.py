"""What the row mixins of a backend's transaction (deliveries, usage charges) are written
over: its statements, which each backend's transaction class implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class BackendRows:
    """A transaction's statements, as the mixins over it see them."""

    def _rows(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _write(self, sql: str, params: Sequence[Any]) -> int:
        """Runs a statement and returns how many rows it wrote."""
        raise NotImplementedError

    def _send(self, sql: str, params: Sequence[Any]) -> None:
        """Runs a statement whose result is not needed (a backend may queue it)."""
        raise NotImplementedError
