import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_UNSPECIFIED: _ClassVar[Decision]
    ALLOW: _ClassVar[Decision]
    DENY: _ClassVar[Decision]
    APPROVAL_REQUIRED: _ClassVar[Decision]

class OutcomeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_STATUS_UNSPECIFIED: _ClassVar[OutcomeStatus]
    COMPLETED: _ClassVar[OutcomeStatus]
    FAILED: _ClassVar[OutcomeStatus]
    CANCELLED: _ClassVar[OutcomeStatus]
    OUTCOME_UNKNOWN: _ClassVar[OutcomeStatus]
DECISION_UNSPECIFIED: Decision
ALLOW: Decision
DENY: Decision
APPROVAL_REQUIRED: Decision
OUTCOME_STATUS_UNSPECIFIED: OutcomeStatus
COMPLETED: OutcomeStatus
FAILED: OutcomeStatus
CANCELLED: OutcomeStatus
OUTCOME_UNKNOWN: OutcomeStatus

class Principal(_message.Message):
    __slots__ = ("type", "id")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    type: str
    id: str
    def __init__(self, type: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class TrustedContext(_message.Message):
    __slots__ = ("tenant", "principal", "request_id", "entities_json")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENTITIES_JSON_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    principal: Principal
    request_id: str
    entities_json: bytes
    def __init__(self, tenant: _Optional[str] = ..., principal: _Optional[_Union[Principal, _Mapping]] = ..., request_id: _Optional[str] = ..., entities_json: _Optional[bytes] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("call_id", "name", "input_json")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    input_json: bytes
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., input_json: _Optional[bytes] = ...) -> None: ...

class DecisionError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class AuthorizeRequest(_message.Message):
    __slots__ = ("context", "call")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    context: TrustedContext
    call: ToolCall
    def __init__(self, context: _Optional[_Union[TrustedContext, _Mapping]] = ..., call: _Optional[_Union[ToolCall, _Mapping]] = ...) -> None: ...

class AuthorizeResponse(_message.Message):
    __slots__ = ("decision", "decision_id", "reasons", "errors", "policy_version", "token", "expires_at", "digest", "approval_id", "replayed", "approval_expires_at")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    decision_id: str
    reasons: _containers.RepeatedScalarFieldContainer[str]
    errors: _containers.RepeatedCompositeFieldContainer[DecisionError]
    policy_version: str
    token: str
    expires_at: _timestamp_pb2.Timestamp
    digest: str
    approval_id: str
    replayed: bool
    approval_expires_at: _timestamp_pb2.Timestamp
    def __init__(self, decision: _Optional[_Union[Decision, str]] = ..., decision_id: _Optional[str] = ..., reasons: _Optional[_Iterable[str]] = ..., errors: _Optional[_Iterable[_Union[DecisionError, _Mapping]]] = ..., policy_version: _Optional[str] = ..., token: _Optional[str] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., digest: _Optional[str] = ..., approval_id: _Optional[str] = ..., replayed: _Optional[bool] = ..., approval_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AuthorizeBatchRequest(_message.Message):
    __slots__ = ("context", "calls")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    context: TrustedContext
    calls: _containers.RepeatedCompositeFieldContainer[BatchCall]
    def __init__(self, context: _Optional[_Union[TrustedContext, _Mapping]] = ..., calls: _Optional[_Iterable[_Union[BatchCall, _Mapping]]] = ...) -> None: ...

class BatchCall(_message.Message):
    __slots__ = ("call", "entities_json")
    CALL_FIELD_NUMBER: _ClassVar[int]
    ENTITIES_JSON_FIELD_NUMBER: _ClassVar[int]
    call: ToolCall
    entities_json: bytes
    def __init__(self, call: _Optional[_Union[ToolCall, _Mapping]] = ..., entities_json: _Optional[bytes] = ...) -> None: ...

class AuthorizeBatchResponse(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[BatchAnswer]
    def __init__(self, answers: _Optional[_Iterable[_Union[BatchAnswer, _Mapping]]] = ...) -> None: ...

class BatchAnswer(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: AuthorizeResponse
    error: CallError
    def __init__(self, response: _Optional[_Union[AuthorizeResponse, _Mapping]] = ..., error: _Optional[_Union[CallError, _Mapping]] = ...) -> None: ...

class CallError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("token", "context", "call")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    token: str
    context: TrustedContext
    call: ToolCall
    def __init__(self, token: _Optional[str] = ..., context: _Optional[_Union[TrustedContext, _Mapping]] = ..., call: _Optional[_Union[ToolCall, _Mapping]] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("valid", "code", "decision_id")
    VALID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    valid: bool
    code: str
    decision_id: str
    def __init__(self, valid: _Optional[bool] = ..., code: _Optional[str] = ..., decision_id: _Optional[str] = ...) -> None: ...

class GetKeysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PublicKey(_message.Message):
    __slots__ = ("kid", "paserk", "jwk_json", "state")
    KID_FIELD_NUMBER: _ClassVar[int]
    PASERK_FIELD_NUMBER: _ClassVar[int]
    JWK_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    kid: str
    paserk: str
    jwk_json: str
    state: str
    def __init__(self, kid: _Optional[str] = ..., paserk: _Optional[str] = ..., jwk_json: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class GetKeysResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[PublicKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[PublicKey, _Mapping]]] = ...) -> None: ...

class ReportOutcomeRequest(_message.Message):
    __slots__ = ("context", "call_id", "status", "error_code", "output_digest")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    context: TrustedContext
    call_id: str
    status: OutcomeStatus
    error_code: str
    output_digest: str
    def __init__(self, context: _Optional[_Union[TrustedContext, _Mapping]] = ..., call_id: _Optional[str] = ..., status: _Optional[_Union[OutcomeStatus, str]] = ..., error_code: _Optional[str] = ..., output_digest: _Optional[str] = ...) -> None: ...

class ReportOutcomeResponse(_message.Message):
    __slots__ = ("decision_id", "unverified")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    UNVERIFIED_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    unverified: bool
    def __init__(self, decision_id: _Optional[str] = ..., unverified: _Optional[bool] = ...) -> None: ...

class ReportRefusalRequest(_message.Message):
    __slots__ = ("context", "call_id", "tool", "code", "detail")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    context: TrustedContext
    call_id: str
    tool: str
    code: str
    detail: str
    def __init__(self, context: _Optional[_Union[TrustedContext, _Mapping]] = ..., call_id: _Optional[str] = ..., tool: _Optional[str] = ..., code: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class ReportRefusalResponse(_message.Message):
    __slots__ = ("decision_id",)
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    def __init__(self, decision_id: _Optional[str] = ...) -> None: ...

class ListVisibleRequest(_message.Message):
    __slots__ = ("context", "tools")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    context: TrustedContext
    tools: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, context: _Optional[_Union[TrustedContext, _Mapping]] = ..., tools: _Optional[_Iterable[str]] = ...) -> None: ...

class ListVisibleResponse(_message.Message):
    __slots__ = ("visible", "policy_version")
    VISIBLE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    visible: _containers.RepeatedScalarFieldContainer[str]
    policy_version: str
    def __init__(self, visible: _Optional[_Iterable[str]] = ..., policy_version: _Optional[str] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("policy_version", "loaded_at", "last_reload_error", "bundle_dir", "shadow_effects", "reloads", "decisions", "decision_batches", "decisions_waiting", "workers", "answered_by_pid", "bundle_revision", "bundle_digest", "bundle_signer", "notices")
    class ShadowEffectsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_RELOAD_ERROR_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_DIR_FIELD_NUMBER: _ClassVar[int]
    SHADOW_EFFECTS_FIELD_NUMBER: _ClassVar[int]
    RELOADS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    DECISION_BATCHES_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_WAITING_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_PID_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_REVISION_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_SIGNER_FIELD_NUMBER: _ClassVar[int]
    NOTICES_FIELD_NUMBER: _ClassVar[int]
    policy_version: str
    loaded_at: _timestamp_pb2.Timestamp
    last_reload_error: str
    bundle_dir: str
    shadow_effects: _containers.ScalarMap[str, int]
    reloads: int
    decisions: int
    decision_batches: int
    decisions_waiting: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    answered_by_pid: int
    bundle_revision: int
    bundle_digest: str
    bundle_signer: str
    notices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, policy_version: _Optional[str] = ..., loaded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_reload_error: _Optional[str] = ..., bundle_dir: _Optional[str] = ..., shadow_effects: _Optional[_Mapping[str, int]] = ..., reloads: _Optional[int] = ..., decisions: _Optional[int] = ..., decision_batches: _Optional[int] = ..., decisions_waiting: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., answered_by_pid: _Optional[int] = ..., bundle_revision: _Optional[int] = ..., bundle_digest: _Optional[str] = ..., bundle_signer: _Optional[str] = ..., notices: _Optional[_Iterable[str]] = ...) -> None: ...

class GetCatalogRequest(_message.Message):
    __slots__ = ("known_digest",)
    KNOWN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    known_digest: str
    def __init__(self, known_digest: _Optional[str] = ...) -> None: ...

class CatalogFile(_message.Message):
    __slots__ = ("name", "content")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    content: bytes
    def __init__(self, name: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class GetCatalogResponse(_message.Message):
    __slots__ = ("bundle_digest", "policy_version", "revision", "unchanged", "files")
    BUNDLE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    bundle_digest: str
    policy_version: str
    revision: int
    unchanged: bool
    files: _containers.RepeatedCompositeFieldContainer[CatalogFile]
    def __init__(self, bundle_digest: _Optional[str] = ..., policy_version: _Optional[str] = ..., revision: _Optional[int] = ..., unchanged: _Optional[bool] = ..., files: _Optional[_Iterable[_Union[CatalogFile, _Mapping]]] = ...) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("index", "pid", "policy_version", "loaded_at", "reloads", "last_reload_error", "decisions", "decision_batches", "decisions_waiting", "shadow_effects")
    class ShadowEffectsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_FIELD_NUMBER: _ClassVar[int]
    RELOADS_FIELD_NUMBER: _ClassVar[int]
    LAST_RELOAD_ERROR_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    DECISION_BATCHES_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_WAITING_FIELD_NUMBER: _ClassVar[int]
    SHADOW_EFFECTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    pid: int
    policy_version: str
    loaded_at: _timestamp_pb2.Timestamp
    reloads: int
    last_reload_error: str
    decisions: int
    decision_batches: int
    decisions_waiting: int
    shadow_effects: _containers.ScalarMap[str, int]
    def __init__(self, index: _Optional[int] = ..., pid: _Optional[int] = ..., policy_version: _Optional[str] = ..., loaded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reloads: _Optional[int] = ..., last_reload_error: _Optional[str] = ..., decisions: _Optional[int] = ..., decision_batches: _Optional[int] = ..., decisions_waiting: _Optional[int] = ..., shadow_effects: _Optional[_Mapping[str, int]] = ...) -> None: ...
