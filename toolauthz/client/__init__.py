"""The runtime side of toolauthz: clients for the sidecar's services and the Guard that
runs a model's tool calls only as the sidecar allows (see docs/sdk.md).

    from toolauthz.client import AuthzClient, Guard, Principal, ToolSet, TrustedContext
"""

from toolauthz.client.aguard import AsyncGuard
from toolauthz.client.aio import AsyncAuthzClient
from toolauthz.client.assembly import AssembledCall, RefusedCall
from toolauthz.client.context import EntitiesProvider, Principal, ProposedCall, TrustedContext
from toolauthz.client.guard import Guard, GuardEvent, GuardStateError, UnknownCallError
from toolauthz.client.offline import OfflineVerifier
from toolauthz.client.results import (
    APPROVAL_PENDING,
    CANCELLED,
    COMPLETED,
    FAILED,
    OUTCOME_UNKNOWN,
    REJECTED,
    CallResult,
)
from toolauthz.client.retry import NO_RETRY, RetryPolicy
from toolauthz.client.schemas import input_limits, load_output_schemas, load_side_effects
from toolauthz.client.streaming import AnthropicToolStream, ChatCompletionsToolStream, ResponsesToolStream
from toolauthz.client.sync import AuthzClient, OutcomeReport
from toolauthz.client.throttle import Throttled, ThrottlePolicy
from toolauthz.client.tools import Tool, ToolError, ToolInvocation, ToolOutcomeUnknown, ToolSet
from toolauthz.client.transport import ClientTls

__all__ = [
    "AuthzClient", "AsyncAuthzClient", "ClientTls", "OutcomeReport", "RetryPolicy", "NO_RETRY", "ThrottlePolicy",
    "Throttled",
    "Guard", "AsyncGuard", "GuardEvent", "GuardStateError", "UnknownCallError",
    "Principal", "TrustedContext", "ProposedCall", "EntitiesProvider",
    "CallResult", "COMPLETED", "FAILED", "CANCELLED", "OUTCOME_UNKNOWN", "APPROVAL_PENDING", "REJECTED",
    "Tool", "ToolSet", "ToolInvocation", "ToolError", "ToolOutcomeUnknown", "load_output_schemas", "OfflineVerifier",
    "AnthropicToolStream", "ChatCompletionsToolStream", "ResponsesToolStream", "input_limits", "load_side_effects",
    "AssembledCall", "RefusedCall",
]
