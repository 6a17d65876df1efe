import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueryDecisionsRequest(_message.Message):
    __slots__ = ("tenant", "principal", "tool", "call_id", "request_id", "result", "kind", "time_from", "time_to", "limit", "page_token", "resource", "approver", "approval_id", "decision_id", "error_code", "policy_id", "policy_version", "caller")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIME_FROM_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    principal: str
    tool: str
    call_id: str
    request_id: str
    result: str
    kind: str
    time_from: _timestamp_pb2.Timestamp
    time_to: _timestamp_pb2.Timestamp
    limit: int
    page_token: str
    resource: str
    approver: str
    approval_id: str
    decision_id: str
    error_code: str
    policy_id: str
    policy_version: str
    caller: str
    def __init__(self, tenant: _Optional[str] = ..., principal: _Optional[str] = ..., tool: _Optional[str] = ..., call_id: _Optional[str] = ..., request_id: _Optional[str] = ..., result: _Optional[str] = ..., kind: _Optional[str] = ..., time_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., time_to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ..., resource: _Optional[str] = ..., approver: _Optional[str] = ..., approval_id: _Optional[str] = ..., decision_id: _Optional[str] = ..., error_code: _Optional[str] = ..., policy_id: _Optional[str] = ..., policy_version: _Optional[str] = ..., caller: _Optional[str] = ...) -> None: ...

class AuditRecord(_message.Message):
    __slots__ = ("seq", "time", "kind", "decision_id", "request_id", "call_id", "tenant", "principal", "tool", "resource", "result", "reasons", "error_codes", "digest", "policy_version", "jti", "approval_id", "approver", "fields_json", "detail_json", "hash", "caller")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    JTI_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    FIELDS_JSON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time: _timestamp_pb2.Timestamp
    kind: str
    decision_id: str
    request_id: str
    call_id: str
    tenant: str
    principal: str
    tool: str
    resource: str
    result: str
    reasons: _containers.RepeatedScalarFieldContainer[str]
    error_codes: _containers.RepeatedScalarFieldContainer[str]
    digest: str
    policy_version: str
    jti: str
    approval_id: str
    approver: str
    fields_json: str
    detail_json: str
    hash: str
    caller: str
    def __init__(self, seq: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., kind: _Optional[str] = ..., decision_id: _Optional[str] = ..., request_id: _Optional[str] = ..., call_id: _Optional[str] = ..., tenant: _Optional[str] = ..., principal: _Optional[str] = ..., tool: _Optional[str] = ..., resource: _Optional[str] = ..., result: _Optional[str] = ..., reasons: _Optional[_Iterable[str]] = ..., error_codes: _Optional[_Iterable[str]] = ..., digest: _Optional[str] = ..., policy_version: _Optional[str] = ..., jti: _Optional[str] = ..., approval_id: _Optional[str] = ..., approver: _Optional[str] = ..., fields_json: _Optional[str] = ..., detail_json: _Optional[str] = ..., hash: _Optional[str] = ..., caller: _Optional[str] = ...) -> None: ...
