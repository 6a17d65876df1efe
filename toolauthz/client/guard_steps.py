"""The steps of a guarded call that a driver performs: the protocol between the Guard's
algorithm (`toolauthz.client.guard_core`) and its two drivers (Guard: threads and
blocking calls; AsyncGuard: asyncio).

The algorithm is a generator that yields each piece of I/O it needs as a step (`Await`,
`Rpc`, `WatchApproval`, `Execute`); a driver performs the step and sends its reply back,
or throws the step's exception in (`Stepper`). `Attempt` is what one run of a call has
got to, `End` how it ended and what to report for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc

from toolauthz.client.results import CallResult
from toolauthz.client.tools import Tool, ToolInvocation
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

__all__ = ["Attempt", "End", "Await", "Rpc", "WatchApproval", "Execute", "Step", "Authorized", "Ran", "Stepper"]

T = TypeVar("T")


@dataclass
class Attempt:
    """What one run of a call has got to (read when it is cut short)."""

    authorize_sent: bool = False
    decision: str = ""
    decision_id: str = ""
    approval_id: str = ""
    started: bool = False  # the implementation was entered (set by the driver that enters it)


@dataclass(frozen=True)
class End:
    """A result plus what to report for it (None: do not report)."""

    result: CallResult
    report: tuple[str, str, str] | None = None  # (status, error_code, output_digest)


# -- the steps a driver performs ----------------------------------------------------------


@dataclass(frozen=True)
class Await:
    """Reply: the value of an awaitable the runtime's entities provider returned."""

    awaitable: Awaitable[Any]


@dataclass(frozen=True)
class Rpc:
    """Reply: the response of one sidecar RPC. `send(client)` makes it; the sync and
    async clients have the same methods, the async ones return awaitables."""

    name: str
    send: Callable[[Any], Any]


@dataclass(frozen=True)
class WatchApproval:
    """Reply: the first approval on the watch stream for which `settles` is true, or
    None when the stream ended without one (its deadline, `seconds`, passed)."""

    approval_id: str
    viewer: pb.TrustedContext
    seconds: float
    settles: Callable[[apb.Approval], bool]


@dataclass(frozen=True)
class Execute:
    """Reply: a Ran. The driver runs `tool.fn(arguments, invocation)` until the
    invocation's deadline and sets `attempt.started` as it enters the implementation."""

    tool: Tool
    arguments: Any
    invocation: ToolInvocation
    attempt: Attempt


Step = Await | Rpc | WatchApproval | Execute
# A call's context and its Authorize answer (or the status it failed with), when a turn's
# AuthorizeBatch asked for it (client/turn.py).
Authorized = tuple[pb.TrustedContext, "pb.AuthorizeResponse | grpc.RpcError"]


@dataclass(frozen=True)
class Ran:
    """How an execution ended: an output, an exception, or cut short."""

    output: Any = None
    error: BaseException | None = None
    cut: str = ""  # the tool had started: "timeout" or "cancelled_after_start"
    started: bool = True  # False: cancelled before the implementation was entered

    @classmethod
    def never_started(cls) -> Ran:
        return cls(started=False)


class Stepper(Generic[T]):
    """Runs a step generator for a driver: `step` is the I/O to perform next, None once
    the generator has returned `result`. Answer each step with `reply` or `fail`."""

    def __init__(self, steps: Generator[Step, Any, T]):
        self._steps = steps
        self.step: Step | None = None
        self.result: T | None = None
        self._resume(lambda: next(steps))

    def reply(self, value: Any) -> None:
        self._resume(lambda: self._steps.send(value))

    def fail(self, error: Exception) -> None:
        self._resume(lambda: self._steps.throw(error))

    def _resume(self, advance: Callable[[], Step]) -> None:
        try:
            self.step = advance()
        except StopIteration as done:
            self.step = None
            self.result = done.value
