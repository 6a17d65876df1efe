"""Tells the client when its lists may have changed: `notifications/tools/list_changed`,
`resources/list_changed` and `prompts/list_changed`.

What a user sees depends on the sidecar's bundle (ListVisible), the catalog's tool files
(which come from the same verified bundle, GetCatalog) and what each upstream offers.
The gateway checks the first two every `list_watch_seconds` (the sidecar's
`policy_version` and `bundle_digest` through GetStatus) and hears the third from the
upstreams' own list_changed notifications; any change is announced, to the stdio client
and to each 2025-11-25 session over HTTP that sent a request (on its standalone stream;
an announcement carries no data, so every session may hear it). The 2026-07-28 era
announces through `subscriptions/listen`, which the gateway does not serve: such clients
re-list when they choose.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio

__all__ = ["ListWatch"]

log = logging.getLogger("toolauthz.mcp_proxy")


class ListWatch:
    def __init__(self, authz: Any, sessions_of: Any, *, rpc_timeout: float | None):
        self.authz = authz
        self.sessions_of = sessions_of  # () -> the sessions to tell
        self.rpc_timeout = rpc_timeout
        self._seen: tuple[str, Any] | None = None
        self.first_checked = anyio.Event()  # what later checks compare with is known (tests await it)

    async def run(self, interval: float) -> None:
        """Checks forever, every `interval` seconds (the gateway cancels it)."""
        while True:
            await self.check()
            self.first_checked.set()
            await anyio.sleep(interval)

    async def check(self) -> None:
        try:
            status = await self.authz.get_status(timeout=self.rpc_timeout)
        except Exception:  # logged; checked again next time, the lists are decided per request anyway
            log.debug("could not read the sidecar's policy version", exc_info=True)
            return
        now = (status.policy_version, status.bundle_digest)
        changed = self._seen is not None and now != self._seen
        self._seen = now
        if changed:
            await self.announce()

    async def announce(self) -> None:
        for session in self.sessions_of():
            try:
                await session.send_tool_list_changed()
                await session.send_resource_list_changed()
                await session.send_prompt_list_changed()
            except Exception:  # logged; an announcement is a courtesy, the next list is right anyway
                log.debug("could not announce changed lists", exc_info=True)
