"""Keeping the inputs of decided calls whose tool opts in (`audit.retain_input`), sealed
(audit/retention.py) in the retained inputs table (store/retained.py), for
`toolauthz policy impact`. Retention is beside the decision, never part of it: a call is
decided, recorded and answered alike whether or not its input could be kept, and a
failure to keep it is logged and counted, never a refusal."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from toolauthz.audit.retention import RetainedCall, seal
from toolauthz.bundle.catalog import Tool
from toolauthz.clock import Clock
from toolauthz.digest import canonical_json
from toolauthz.engine import PreparedCall, RunCounts
from toolauthz.errors import StoreUnavailable
from toolauthz.model import TrustedContext
from toolauthz.store.retained import RetainedInputs, RetainedRow
from toolauthz.telemetry import metrics

log = logging.getLogger("toolauthz.retention")
PURGE_EVERY_SECONDS = 60.0


@dataclass
class Retainer:
    store: RetainedInputs
    key: bytes = field(repr=False)
    clock: Clock
    _purged_at: float = 0.0
    _purge_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def retain(self, ctx: TrustedContext, call_id: str, prepared: PreparedCall, run: RunCounts,
               policy_version: str, usage: Mapping[str, int] | None = None) -> None:
        tool: Tool = prepared.slice.tool
        if tool.retain_input_seconds is None:
            return
        now = self.clock.now()
        call = RetainedCall(ctx.tenant, call_id, tool.name, ctx.principal.type, ctx.principal.id, ctx.request_id,
                            canonical_json(prepared.input), ctx.entities_json, run.calls, run.tool_calls,
                            dict(usage or {}))
        sealed = seal(self.key, call)
        if sealed is None:
            metrics.RETAINED_INPUTS.labels("too_large").inc()
            return
        try:
            self.store.put(RetainedRow(ctx.tenant, call_id, tool.name, now, now + tool.retain_input_seconds,
                                       policy_version, sealed))
            metrics.RETAINED_INPUTS.labels("kept").inc()
            self._purge(now)
        except StoreUnavailable as exc:
            metrics.RETAINED_INPUTS.labels("failed").inc()
            log.error("the input of a call of `%s` could not be retained: %s", tool.name, exc)

    def _purge(self, now: float) -> None:
        """Delete what has expired, at most once a minute per process."""
        with self._purge_lock:
            if now - self._purged_at < PURGE_EVERY_SECONDS:
                return
            self._purged_at = now
        self.store.purge(now)
