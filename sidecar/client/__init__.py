"""The runtime side of toolauthz: clients for the sidecar's services and the Guard that
runs a model's tool calls only as the sidecar allows (see docs/sdk.md).

    from sidecar.client import AuthzClient, Guard, Principal, ToolSet, TrustedContext
"""

from sidecar.client.aguard import AsyncGuard
from sidecar.client.aio import AsyncAuthzClient
from sidecar.client.assembly import AssembledCall, RefusedCall
from sidecar.client.context import EntitiesProvider, Principal, ProposedCall, TrustedContext
from sidecar.client.guard import Guard, GuardEvent, GuardStateError, UnknownCallError
from sidecar.client.offline import OfflineVerifier
from sidecar.client.results import APPROVAL_PENDING, CANCELLED, COMPLETED, FAILED, OUTCOME_UNKNOWN, REJECTED, CallResult
from sidecar.client.retry import NO_RETRY, RetryPolicy
from sidecar.client.schemas import input_limits, load_output_schemas, load_side_effects
from sidecar.client.streaming import AnthropicToolStream, ChatCompletionsToolStream, ResponsesToolStream
from sidecar.client.sync import AuthzClient, OutcomeReport
from sidecar.client.tools import Tool, ToolError, ToolInvocation, ToolSet
from sidecar.client.transport import ClientTls

__all__ = [
    "AuthzClient", "AsyncAuthzClient", "ClientTls", "OutcomeReport", "RetryPolicy", "NO_RETRY",
    "Guard", "AsyncGuard", "GuardEvent", "GuardStateError", "UnknownCallError",
    "Principal", "TrustedContext", "ProposedCall", "EntitiesProvider",
    "CallResult", "COMPLETED", "FAILED", "CANCELLED", "OUTCOME_UNKNOWN", "APPROVAL_PENDING", "REJECTED",
    "Tool", "ToolSet", "ToolInvocation", "ToolError", "load_output_schemas", "OfflineVerifier",
    "AnthropicToolStream", "ChatCompletionsToolStream", "ResponsesToolStream", "input_limits", "load_side_effects",
    "AssembledCall", "RefusedCall",
]
