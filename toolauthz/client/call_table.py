"""The Guard's call table: every call id it has seen, and its one terminal outcome.

Running the same id again returns the recorded result (`replayed=True`) and executes
nothing; the same id with different arguments is `rejected/call_id_reused`; an id that
is running is `rejected/call_in_progress`. `_finish` is the one place a call's state
changes. The table also sends the Guard's events to its observer.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from toolauthz.client import results as r
from toolauthz.client.context import ProposedCall, check_call_id
from toolauthz.client.results import CallResult

__all__ = ["CallTable", "GuardEvent", "GuardStateError", "UnknownCallError"]

log = logging.getLogger("toolauthz.client")


class GuardStateError(RuntimeError):
    """A result for a call that is not pending, or a second terminal result."""


class UnknownCallError(GuardStateError, KeyError):
    """The Guard has no pending call with this id."""


@dataclass(frozen=True)
class GuardEvent:
    """One step of a guarded call, for traces and metrics (never shown to the model)."""

    kind: str  # authorize, approval_wait, approval, verify, execute, outcome
    call_id: str
    name: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class _CallState:
    name: str
    signature: Any
    running: bool = True
    result: CallResult | None = None



def _signature(call: ProposedCall) -> Any:
    # The same call is the same tool with the same arguments (as parsed, so that a
    # re-serialization with other whitespace is still the same call).
    return (call.name, json.dumps(call.arguments, sort_keys=True) if call.arguments is not None else call.input_json)


class CallTable:
    """Call ids -> their state, behind one lock (the Guard is thread-safe)."""

    def __init__(self, observer: Callable[[GuardEvent], None] | None = None):
        self._observer = observer
        self._calls: dict[str, _CallState] = {}
        self._lock = threading.Lock()


    def result(self, call_id: str) -> CallResult | None:
        """The last result of a call id (terminal, or approval pending), or None."""
        with self._lock:
            state = self._calls.get(call_id)
            return state.result if state else None

    def pending(self) -> list[str]:
        """Call ids without a terminal outcome: running now or waiting for approval."""
        with self._lock:
            return [cid for cid, s in self._calls.items() if s.running or not (s.result and s.result.terminal)]

    def finished(self) -> dict[str, CallResult]:
        with self._lock:
            return {cid: s.result for cid, s in self._calls.items() if s.result and s.result.terminal}

    def _admit(self, call: ProposedCall) -> CallResult | None:
        """Registers the call as running, or answers at once without running anything."""
        signature = _signature(call)
        with self._lock:
            state = self._calls.get(call.call_id)
            if state is None:
                self._calls[call.call_id] = _CallState(call.name, signature)
                return None
            if state.signature != signature:
                return self._rejected(call, "call_id_reused")
            if state.running:
                return self._rejected(call, "call_in_progress")
            if state.result is not None and state.result.terminal:
                return replace(state.result, replayed=True)
            state.running = True  # waiting for approval: run it again (resume)
            return None

    def _open(self, call_id: str, name: str, input_json: bytes | str) -> ProposedCall | CallResult:
        """Admission: the call to run, or the result that ends it before any RPC (an
        invalid call id, a replay, a call already running)."""
        try:
            check_call_id(call_id)
        except ValueError:
            return CallResult(call_id, name, r.REJECTED, "invalid_call_id", r.MESSAGES["invalid_call_id"])
        call = ProposedCall.of(call_id, name, input_json)
        early = self._admit(call)
        if early is None:
            return call
        self._emit("outcome", early, status=early.status, code=early.code, replayed=True, executed=False,
                   reported=early.reported)
        return early

    def refuse(self, call_id: str, name: str, code: str, content: str) -> CallResult:
        """Ends, with no RPC, a call the runtime refused before authorization (a malformed
        stream, see client/streaming.py): `failed` with `code`, never reported (the sidecar
        never saw it), and kept like any outcome, so the same call id never runs later."""
        opened = self._open(call_id, name, b"")
        if isinstance(opened, CallResult):
            return opened
        return self._finish(call_id, CallResult(call_id, name, r.FAILED, code, content))

    def _finish(self, call_id: str, result: CallResult) -> CallResult:
        """Records the result of a pending call: the one place a call's state changes."""
        with self._lock:
            state = self._calls.get(call_id)
            if state is None or not state.running:
                raise UnknownCallError(f"no pending call `{call_id}`")
            if state.result is not None and state.result.terminal:
                raise GuardStateError(f"call `{call_id}` already has the outcome `{state.result.status}`")
            if state.name != result.name:
                raise GuardStateError(f"a result for `{result.name}` does not belong to call `{call_id}`")
            state.result = result
            state.running = False
        self._emit("outcome", result, status=result.status, code=result.code, reported=result.reported,
                   executed=result.executed, replayed=result.replayed)
        return result

    # -- events ------------------------------------------------------------------------

    def _emit(self, kind: str, call: ProposedCall | CallResult, **data: Any) -> None:
        if self._observer is None:
            return
        try:
            self._observer(GuardEvent(kind, call.call_id, call.name, data))
        except Exception:
            log.exception("guard observer failed on %s", kind)

    @staticmethod
    def _rejected(call: ProposedCall, code: str) -> CallResult:
        return CallResult(call.call_id, call.name, r.REJECTED, code, r.MESSAGES[code], replayed=True)
