"""One client surface over both transports, so one suite runs every decision test on
gRPC and on the HTTP/JSON API: `Transport.authorize(...)` answers a `Decided` on either,
and a failure is a `Refused` carrying the gRPC status name on both.

The HTTP side also checks every request it sends and every answer it gets against
docs/openapi.yaml, so the document is held to what the API does."""

from __future__ import annotations

import http.client
import json
import pathlib
from dataclasses import dataclass, field
from typing import Any

import grpc
import jsonschema
import referencing
import yaml

from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.service.failures import Status

OPENAPI_FILE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "openapi.yaml"
_OPENAPI_URI = "urn:toolauthz:openapi"


def openapi() -> dict[str, Any]:
    return yaml.safe_load(OPENAPI_FILE.read_text(encoding="utf-8"))


class OpenApiSchemas:
    """Validators for the request and response schemas docs/openapi.yaml gives each route."""

    def __init__(self, document: dict[str, Any]):
        self._document = document
        resource = referencing.Resource.from_contents(document, referencing.jsonschema.DRAFT202012)
        self._registry = referencing.Registry().with_resource(_OPENAPI_URI, resource)

    def _validator(self, pointer: str) -> jsonschema.Draft202012Validator:
        schema = {"$ref": f"{_OPENAPI_URI}#{pointer}"}
        return jsonschema.Draft202012Validator(schema, registry=self._registry,
                                               format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)

    def request_is_valid(self, method: str, path: str, body: object) -> bool:
        return self._validator(
            f"/paths/{_escape(path)}/{method.lower()}/requestBody/content/application~1json/schema").is_valid(body)

    def check_response(self, method: str, path: str, status: int, body: object) -> None:
        responses = self._document["paths"][path][method.lower()]["responses"]
        key = str(status)
        assert key in responses, f"{method} {path} answered {status}, which the document does not list"
        reference = responses[key].get("$ref")  # a shared answer: #/components/responses/...
        where = (reference.removeprefix("#") if reference is not None
                 else f"/paths/{_escape(path)}/{method.lower()}/responses/{key}")
        self._validator(f"{where}/content/application~1json/schema").validate(body)


def _escape(path: str) -> str:
    return path.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True)
class Context:
    tenant: str = "acme"
    principal: str = "alice"
    request_id: str = "run-1"
    entities: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "principal": {"type": "User", "id": self.principal},
                "request_id": self.request_id, "entities": self.entities}

    def as_proto(self) -> pb.TrustedContext:
        return pb.TrustedContext(tenant=self.tenant, principal=pb.Principal(type="User", id=self.principal),
                                 request_id=self.request_id, entities_json=json.dumps(self.entities).encode())


@dataclass(frozen=True)
class Call:
    call_id: str
    name: str
    input: bytes  # the arguments exactly as the model wrote them


@dataclass(frozen=True)
class Decided:
    decision: str
    decision_id: str
    reasons: list[str]
    errors: list[tuple[str, str]]
    policy_version: str
    digest: str
    token: str | None
    expires_at: str | None
    approval_id: str | None
    approval_expires_at: str | None
    replayed: bool

    @property
    def error_codes(self) -> list[str]:
        return [code for code, _message in self.errors]


@dataclass(frozen=True)
class Verified:
    valid: bool
    code: str
    decision_id: str


@dataclass(frozen=True)
class Outcome:
    decision_id: str
    unverified: bool


class Refused(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


class GrpcTransport:
    name = "grpc"

    def __init__(self, channel: grpc.Channel):
        self._stub = pb_grpc.ToolAuthorizerStub(channel)
        self._channel = channel

    def _ask(self, method: Any, request: Any) -> Any:
        try:
            return method(request)
        except grpc.RpcError as exc:
            raise Refused(exc.code().name, exc.details()) from None

    def authorize(self, ctx: Context, call: Call) -> Decided:
        r = self._ask(self._stub.Authorize, pb.AuthorizeRequest(context=ctx.as_proto(), call=_call_proto(call)))
        return Decided(
            decision=pb.Decision.Name(r.decision), decision_id=r.decision_id, reasons=list(r.reasons),
            errors=[(e.code, e.message) for e in r.errors], policy_version=r.policy_version, digest=r.digest,
            token=r.token or None, expires_at=_rfc3339(r.expires_at) if r.HasField("expires_at") else None,
            approval_id=r.approval_id or None,
            approval_expires_at=_rfc3339(r.approval_expires_at) if r.HasField("approval_expires_at") else None,
            replayed=r.replayed)

    def verify(self, token: str, ctx: Context, call: Call) -> Verified:
        r = self._ask(self._stub.Verify, pb.VerifyRequest(token=token, context=ctx.as_proto(),
                                                          call=_call_proto(call)))
        return Verified(r.valid, r.code, r.decision_id)

    def outcome(self, ctx: Context, call_id: str, status: str) -> Outcome:
        r = self._ask(self._stub.ReportOutcome, pb.ReportOutcomeRequest(
            context=ctx.as_proto(), call_id=call_id, status=pb.OutcomeStatus.Value(status.upper())))
        return Outcome(r.decision_id, r.unverified)

    def keys(self) -> list[str]:
        return [k.kid for k in self._ask(self._stub.GetKeys, pb.GetKeysRequest()).keys]

    def send_malformed(self) -> None:
        """Bytes that are not an AuthorizeRequest."""
        raw = self._channel.unary_unary("/toolauthz.v1.ToolAuthorizer/Authorize",
                                        request_serializer=lambda b: b, response_deserializer=lambda b: b)
        self._ask(raw, b"\xff\xff\xff")


def exchange(connection: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None, *,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """One request on `connection`, which is then closed: (status, parsed JSON body)."""
    try:
        sent = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, path, body=body, headers={**sent, **(headers or {})})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _call_proto(call: Call) -> pb.ToolCall:
    return pb.ToolCall(call_id=call.call_id, name=call.name, input_json=call.input)


def _rfc3339(ts: Any) -> str:
    return ts.ToDatetime().isoformat() + "Z"


class HttpTransport:
    name = "http"

    def __init__(self, port: int, schemas: OpenApiSchemas):
        self.port = port
        self._schemas = schemas

    def exchange(self, method: str, path: str, body: bytes | None, *,
                 headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """One request on a fresh connection: (status, parsed JSON body)."""
        return exchange(http.client.HTTPConnection("127.0.0.1", self.port, timeout=30), method, path, body,
                        headers=headers)

    def _post(self, path: str, body: bytes) -> Any:
        # A request the document calls invalid must be refused, whatever else is true.
        valid = self._schemas.request_is_valid("POST", path, json.loads(body))
        status, answer = self.exchange("POST", path, body)
        self._schemas.check_response("POST", path, status, answer)
        assert valid or status == 400, (status, answer)
        if status != 200:
            code = answer["error"]["code"]
            assert Status[code].http_status == status or (code, status) == ("RESOURCE_EXHAUSTED", 413)
            raise Refused(code, answer["error"]["message"])
        return answer

    def authorize(self, ctx: Context, call: Call) -> Decided:
        r = self._post("/v1/authorize", _body(ctx=ctx, call=call))
        return Decided(decision=r["decision"], decision_id=r["decision_id"], reasons=r["reasons"],
                       errors=[(e["code"], e["message"]) for e in r["errors"]], policy_version=r["policy_version"],
                       digest=r["digest"], token=r["token"], expires_at=r["expires_at"],
                       approval_id=r["approval_id"], approval_expires_at=r["approval_expires_at"],
                       replayed=r["replayed"])

    def verify(self, token: str, ctx: Context, call: Call) -> Verified:
        r = self._post("/v1/verify", _body(token=token, ctx=ctx, call=call))
        return Verified(r["valid"], r["code"], r["decision_id"])

    def outcome(self, ctx: Context, call_id: str, status: str) -> Outcome:
        body = json.dumps({"context": ctx.as_json(), "call_id": call_id, "status": status}).encode()
        r = self._post("/v1/outcome", body)
        return Outcome(r["decision_id"], r["unverified"])

    def keys(self) -> list[str]:
        status, answer = self.exchange("GET", "/v1/keys", None)
        self._schemas.check_response("GET", "/v1/keys", status, answer)
        return [k["kid"] for k in answer["keys"]]

    def send_malformed(self) -> None:
        status, answer = self.exchange("POST", "/v1/authorize", b'{"context": {"tenant": "acme"')
        self._schemas.check_response("POST", "/v1/authorize", status, answer)
        raise Refused(answer["error"]["code"], answer["error"]["message"])


def _body(*, ctx: Context, call: Call, token: str | None = None) -> bytes:
    """The request body with the call's input spliced in as the bytes the model wrote."""
    head = {"token": token} if token is not None else {}
    prefix = json.dumps({**head, "context": ctx.as_json()})[:-1]
    call_head = json.dumps({"call_id": call.call_id, "name": call.name})[:-1]
    return f'{prefix}, "call": {call_head}, "input": '.encode() + call.input + b"}}"
