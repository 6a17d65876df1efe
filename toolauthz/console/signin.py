"""Who is using the console: the pluggable authenticators of `console.sign_in`.

- `proxy`: a reverse proxy that has authenticated the person sends their id, groups and
  tenant in headers. Those headers are believed only on connections from the configured
  proxy addresses (`console.proxy.trusted`, CIDRs); from any other peer they are refused,
  since anyone can send a header.
- `oidc`: an ID token of the approvers' identity provider, proven for the console's
  tenant exactly as gRPC `DecideApproval` proves it (`ApproverProof.prove_person`, toolauthz/identity/approvers.py: the
  provider must be bound to the tenant, and a user the bundle declares in another tenant
  is refused whatever the token says), posted on the sign-in page
  or sent by an auth proxy as `Authorization: Bearer`. The session keeps the token and
  verifies it again on every request (an expired token signs the person out), and a
  decision hands it to the desk, which verifies it once more, as over gRPC.
- `dev`: anyone signs in as anyone: allowed only when the console listens on loopback
  (the settings refuse it elsewhere, and the app refuses it on a non-loopback listener
  as well), and every page says so in a banner.

Groups do two things. `console.auditor_groups` makes a person an auditor. Who may
approve what is decided as on the gRPC path: by `Action::"approve"` policies, with the
groups of the bundle's entities, or with an ID token's groups when approvers sign in
with OIDC (the approval desk reads them from the token itself).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from toolauthz.display.escape import shown
from toolauthz.errors import ForbiddenError
from toolauthz.identity.oidc import ProvenPerson
from toolauthz.model import PRINCIPAL_ID, PRINCIPAL_TYPE, TENANT, Principal

MAX_GROUPS = 64
# The session cookie keeps the ID token, and browsers drop a cookie over 4 KB.
MAX_SESSION_ID_TOKEN = 3000
_GROUP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}\Z")
_UID = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*)::"(.*)"\Z', re.DOTALL)


class SignInRefused(Exception):
    """The sign-in (or the proof a request carries) is refused; the message is safe to show."""


@dataclass(frozen=True)
class Person:
    principal: Principal
    tenant: str
    groups: tuple[str, ...]
    via: str  # the authenticator: dev, proxy or oidc
    id_token: str = ""  # oidc: what DecideApproval verifies again

    @property
    def uid(self) -> str:
        return str(self.principal)

    def in_any(self, groups: Sequence[str]) -> bool:
        return any(g in self.groups for g in groups)


class Authenticator(Protocol):
    kind: str
    has_form: bool  # a sign-in page with a form (dev, oidc); proxy has none

    def person(self, headers: Mapping[str, str], peer: str, session: Mapping[str, Any]) -> Person | None:
        """The person a request proves (its headers, its peer's address, its session), or
        None; SignInRefused when it carries a proof that is refused."""

    def sign_in(self, form: Mapping[str, str]) -> dict[str, Any]:
        """What the session keeps of a sign-in form; SignInRefused."""


def parse_principal(text: str, default_type: str = "User") -> Principal:
    """`bob` (of `default_type`) or `User::"bob"`; SignInRefused otherwise."""
    text = text.strip()
    match = _UID.fullmatch(text)
    kind, ident = (match.group(1), match.group(2)) if match else (default_type, text)
    if not PRINCIPAL_TYPE.fullmatch(kind) or not PRINCIPAL_ID.fullmatch(ident):
        raise SignInRefused(f"`{shown(text)}` is not a principal id (letters, digits and ._:@+-) "
                            'or a Cedar uid such as User::"bob"')
    return Principal(kind, ident)


def parse_tenant(text: str) -> str:
    text = text.strip()
    if not TENANT.fullmatch(text):
        raise SignInRefused(f"`{shown(text)}` is not a tenant id")
    return text


def parse_groups(text: str) -> tuple[str, ...]:
    groups = tuple(dict.fromkeys(g.strip() for g in text.split(",") if g.strip()))
    if len(groups) > MAX_GROUPS:
        raise SignInRefused(f"at most {MAX_GROUPS} groups")
    for group in groups:
        if not _GROUP.fullmatch(group):
            raise SignInRefused(f"`{shown(group)}` is not a group name")
    return groups


def _stored_person(session: Mapping[str, Any], via: str) -> Person | None:
    stored = session.get("person")
    if not isinstance(stored, dict) or stored.get("via") != via:
        return None
    try:
        return Person(Principal(str(stored["type"]), str(stored["id"])), str(stored["tenant"]),
                      tuple(str(g) for g in stored["groups"]), via)
    except (KeyError, TypeError):
        return None


class DevSignIn:
    """Pick any principal, groups and tenant: for a developer's own machine only."""

    kind = "dev"
    has_form = True

    def __init__(self, *, loopback: bool):
        if not loopback:
            raise SignInRefused("the development sign-in is allowed only on a loopback console listener")

    def person(self, headers: Mapping[str, str], peer: str, session: Mapping[str, Any]) -> Person | None:
        return _stored_person(session, self.kind)

    def sign_in(self, form: Mapping[str, str]) -> dict[str, Any]:
        principal = parse_principal(form.get("principal", ""))
        tenant = parse_tenant(form.get("tenant", ""))
        groups = parse_groups(form.get("groups", ""))
        return {"person": {"via": self.kind, "type": principal.type, "id": principal.id, "tenant": tenant,
                           "groups": list(groups)}}


class ProxySignIn:
    """The person a trusted reverse proxy names in its headers."""

    kind = "proxy"
    has_form = False

    def __init__(self, trusted: Sequence[str], *, user_header: str, groups_header: str, tenant_header: str,
                 principal_type: str = "User", tenant: str = ""):
        """`tenant`: everyone's tenant, the tenant header then unread (a proxy that cannot
        set it may pass a client's through)."""
        self._trusted = tuple(ipaddress.ip_network(cidr, strict=False) for cidr in trusted)
        self._user, self._groups, self._tenant = user_header.lower(), groups_header.lower(), tenant_header.lower()
        self._principal_type = principal_type
        self._fixed_tenant = tenant

    def trusts(self, peer: str) -> bool:
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # an IPv4 proxy as a dual-stack socket names it
        return any(address in network for network in self._trusted)

    def person(self, headers: Mapping[str, str], peer: str, session: Mapping[str, Any]) -> Person | None:
        named = any(h in headers for h in (self._user, self._groups, self._tenant))
        if not self.trusts(peer):
            if named:
                raise SignInRefused("sign-in headers are accepted only from the configured proxy addresses")
            return None
        if not headers.get(self._user):
            return None
        tenant = self._fixed_tenant or parse_tenant(headers.get(self._tenant, ""))
        return Person(parse_principal(headers[self._user], self._principal_type), tenant,
                      parse_groups(headers.get(self._groups, "")), self.kind)

    def sign_in(self, form: Mapping[str, str]) -> dict[str, Any]:
        raise SignInRefused("this console signs people in through its reverse proxy")


class OidcSignIn:
    """An ID token of the approvers' identity provider, for the console's tenant.
    `prove(id_token, tenant)`: the approval desk's `proof.prove_person`. It may block for a key
    fetch: the console calls authenticators off its event loop."""

    kind = "oidc"
    has_form = True

    def __init__(self, prove: Callable[[str, str], ProvenPerson], tenant: str):
        self._prove = prove
        self._tenant = tenant

    def _person(self, id_token: str) -> Person:
        try:
            proven = self._prove(id_token, self._tenant)
        except ForbiddenError as exc:
            raise SignInRefused(str(exc)) from None
        return Person(proven.principal, self._tenant, proven.groups, self.kind, id_token)

    def person(self, headers: Mapping[str, str], peer: str, session: Mapping[str, Any]) -> Person | None:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return self._person(token.strip())
        stored = session.get("id_token")
        if not isinstance(stored, str) or not stored:
            return None
        try:
            return self._person(stored)
        except SignInRefused:
            return None  # expired since: signed out

    def sign_in(self, form: Mapping[str, str]) -> dict[str, Any]:
        id_token = form.get("id_token", "").strip()
        self._person(id_token)
        if len(id_token) > MAX_SESSION_ID_TOKEN:
            raise SignInRefused(f"this ID token is longer than {MAX_SESSION_ID_TOKEN} characters, more than a "
                                "session cookie can hold: sign in through an auth proxy that sends it as "
                                "`Authorization: Bearer`")
        return {"id_token": id_token}
