"""gRPC handlers. The only place where errors become status codes:

    RequestError, InputError  -> INVALID_ARGUMENT (the runtime sent an unusable request)
    NotFoundError             -> NOT_FOUND
    ConflictError             -> ALREADY_EXISTS
    StoreUnavailable          -> UNAVAILABLE (and never a token or `valid`)
    deadline already passed   -> DEADLINE_EXCEEDED, before any work
    anything else             -> INTERNAL with a generic message; the detail goes to the log
A DENY is an answer, not an error: it travels in the response.
"""

from __future__ import annotations

import functools
import json
import logging

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from sidecar.authorizer import Authorizer
from sidecar.errors import ConflictError, InputError, NotFoundError, RequestError, StoreUnavailable
from sidecar.keys import KeyRing
from sidecar.model import Decision, Principal, ProposedCall, TrustedContext
from sidecar.proto.toolauthz.v1 import authorizer_pb2 as pb
from sidecar.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

log = logging.getLogger("toolauthz.service")

_DECISIONS = {Decision.ALLOW: pb.ALLOW, Decision.DENY: pb.DENY, Decision.APPROVAL_REQUIRED: pb.APPROVAL_REQUIRED}
_OUTCOMES = {pb.COMPLETED: "completed", pb.FAILED: "failed", pb.CANCELLED: "cancelled",
             pb.OUTCOME_UNKNOWN: "outcome_unknown"}


def status_mapped(handler):
    """Runs a handler with the error-to-status mapping above."""

    @functools.wraps(handler)
    def wrapper(self, request, context: grpc.ServicerContext):
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline expired before the request was handled")
        try:
            return handler(self, request, context)
        except (RequestError, InputError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc.message if isinstance(exc, InputError) else exc))
        except NotFoundError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except ConflictError as exc:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        except StoreUnavailable as exc:
            log.error("store unavailable in %s: %s", handler.__name__, exc)
            context.abort(grpc.StatusCode.UNAVAILABLE, "the sidecar's store is unavailable; no decision was made")
        except Exception:  # noqa: BLE001 - the boundary: log the detail, answer generically
            log.exception("internal error in %s", handler.__name__)
            context.abort(grpc.StatusCode.INTERNAL, "internal error")

    return wrapper


def trusted_context(msg: pb.TrustedContext) -> TrustedContext:
    return TrustedContext(msg.tenant, Principal(msg.principal.type, msg.principal.id), msg.request_id,
                          bytes(msg.entities_json))


def proposed_call(msg: pb.ToolCall) -> ProposedCall:
    return ProposedCall(msg.call_id, msg.name, bytes(msg.input_json))


def timestamp(epoch: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(epoch * 1e9))
    return ts


class ToolAuthorizerService(pb_grpc.ToolAuthorizerServicer):
    def __init__(self, authorizer: Authorizer, keyring: KeyRing, status):
        self._authorizer = authorizer
        self._keyring = keyring
        self._status = status  # callable -> (version, loaded_at, last_error, bundle_dir)

    @status_mapped
    def Authorize(self, request: pb.AuthorizeRequest, context) -> pb.AuthorizeResponse:
        result = self._authorizer.authorize(trusted_context(request.context), proposed_call(request.call))
        response = pb.AuthorizeResponse(
            decision=_DECISIONS[result.decision], decision_id=result.decision_id, reasons=list(result.reasons),
            errors=[pb.DecisionError(code=e.code, message=e.message) for e in result.errors],
            policy_version=result.policy_version, digest=result.digest, approval_id=result.approval_id,
            replayed=result.replayed)
        if result.token is not None:
            response.token = result.token.token
            response.expires_at.CopyFrom(timestamp(result.token.expires_at))
        return response

    @status_mapped
    def Verify(self, request: pb.VerifyRequest, context) -> pb.VerifyResponse:
        result = self._authorizer.verify(request.token, trusted_context(request.context), proposed_call(request.call))
        return pb.VerifyResponse(valid=result.valid, code=result.code, decision_id=result.decision_id)

    @status_mapped
    def GetKeys(self, request, context) -> pb.GetKeysResponse:
        keys = self._keyring.public_keys(self._authorizer.clock.now())
        return pb.GetKeysResponse(keys=[
            pb.PublicKey(kid=k.kid, paserk=k.paserk, jwk_json=json.dumps(k.jwk, sort_keys=True), state=k.state)
            for k in keys])

    @status_mapped
    def ReportOutcome(self, request: pb.ReportOutcomeRequest, context) -> pb.ReportOutcomeResponse:
        status = _OUTCOMES.get(request.status)
        if status is None:
            raise RequestError("status must be COMPLETED, FAILED, CANCELLED or OUTCOME_UNKNOWN")
        result = self._authorizer.report_outcome(trusted_context(request.context), request.call_id, status,
                                                 request.error_code, request.output_digest)
        return pb.ReportOutcomeResponse(decision_id=result.decision_id, unverified=result.unverified)

    @status_mapped
    def GetStatus(self, request, context) -> pb.GetStatusResponse:
        version, loaded_at, last_error, bundle_dir = self._status()
        return pb.GetStatusResponse(policy_version=version, loaded_at=timestamp(loaded_at),
                                    last_reload_error=last_error, bundle_dir=bundle_dir)
