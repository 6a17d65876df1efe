import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from toolauthz.v1 import authorizer_pb2 as _authorizer_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApprovalStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_STATUS_UNSPECIFIED: _ClassVar[ApprovalStatus]
    PENDING: _ClassVar[ApprovalStatus]
    APPROVED: _ClassVar[ApprovalStatus]
    REJECTED: _ClassVar[ApprovalStatus]
    EXPIRED: _ClassVar[ApprovalStatus]

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    APPROVE: _ClassVar[Verdict]
    REJECT: _ClassVar[Verdict]
APPROVAL_STATUS_UNSPECIFIED: ApprovalStatus
PENDING: ApprovalStatus
APPROVED: ApprovalStatus
REJECTED: ApprovalStatus
EXPIRED: ApprovalStatus
VERDICT_UNSPECIFIED: Verdict
APPROVE: Verdict
REJECT: Verdict

class Approval(_message.Message):
    __slots__ = ("approval_id", "status", "tenant", "requester", "tool", "resource", "group", "policy_id", "call_id", "request_id", "digest", "short_code", "arguments_json", "created_at", "expires_at", "decided_at", "approver", "reason", "token", "token_expires_at", "shown_fields", "usage")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUESTER_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SHORT_CODE_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    SHOWN_FIELDS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    status: ApprovalStatus
    tenant: str
    requester: _authorizer_pb2.Principal
    tool: str
    resource: str
    group: str
    policy_id: str
    call_id: str
    request_id: str
    digest: str
    short_code: str
    arguments_json: str
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    decided_at: _timestamp_pb2.Timestamp
    approver: _authorizer_pb2.Principal
    reason: str
    token: str
    token_expires_at: _timestamp_pb2.Timestamp
    shown_fields: _containers.RepeatedCompositeFieldContainer[ShownField]
    usage: _containers.RepeatedCompositeFieldContainer[ShownField]
    def __init__(self, approval_id: _Optional[str] = ..., status: _Optional[_Union[ApprovalStatus, str]] = ..., tenant: _Optional[str] = ..., requester: _Optional[_Union[_authorizer_pb2.Principal, _Mapping]] = ..., tool: _Optional[str] = ..., resource: _Optional[str] = ..., group: _Optional[str] = ..., policy_id: _Optional[str] = ..., call_id: _Optional[str] = ..., request_id: _Optional[str] = ..., digest: _Optional[str] = ..., short_code: _Optional[str] = ..., arguments_json: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., approver: _Optional[_Union[_authorizer_pb2.Principal, _Mapping]] = ..., reason: _Optional[str] = ..., token: _Optional[str] = ..., token_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., shown_fields: _Optional[_Iterable[_Union[ShownField, _Mapping]]] = ..., usage: _Optional[_Iterable[_Union[ShownField, _Mapping]]] = ...) -> None: ...

class ShownField(_message.Message):
    __slots__ = ("label", "value")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    label: str
    value: str
    def __init__(self, label: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("tenant", "status", "group", "limit")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    status: ApprovalStatus
    group: str
    limit: int
    def __init__(self, tenant: _Optional[str] = ..., status: _Optional[_Union[ApprovalStatus, str]] = ..., group: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals",)
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[Approval]
    def __init__(self, approvals: _Optional[_Iterable[_Union[Approval, _Mapping]]] = ...) -> None: ...

class GetApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "context")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    context: _authorizer_pb2.TrustedContext
    def __init__(self, approval_id: _Optional[str] = ..., context: _Optional[_Union[_authorizer_pb2.TrustedContext, _Mapping]] = ...) -> None: ...

class DecideApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "approver", "verdict", "reason", "id_token")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ID_TOKEN_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    approver: _authorizer_pb2.TrustedContext
    verdict: Verdict
    reason: str
    id_token: str
    def __init__(self, approval_id: _Optional[str] = ..., approver: _Optional[_Union[_authorizer_pb2.TrustedContext, _Mapping]] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., reason: _Optional[str] = ..., id_token: _Optional[str] = ...) -> None: ...
