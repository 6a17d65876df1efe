"""Who a deciding person is, and that they belong to the tenant they decide in.

Two rules hold whatever the policies say, for DecideApproval and the console alike:

- with an identity provider (`approvers.oidc`), the person is the one their ID token
  proves, for a tenant the provider is bound to (toolauthz/identity/oidc.py);
- a principal the bundle declares in another tenant (a static entity under another
  `Tenant::"…"`) is never an approver here, whatever a token or the request says.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolauthz.bundle import BundleHolder
from toolauthz.display.escape import shown
from toolauthz.errors import ForbiddenError, RequestError
from toolauthz.identity.oidc import IdTokenRefused, IdTokenVerifier, ProvenPerson
from toolauthz.model import Principal, TrustedContext

CROSS_TENANT_APPROVER = "cross_tenant_approver"


class OtherTenantsPerson(ForbiddenError):
    """The approver is a principal the bundle declares in another tenant."""


@dataclass(frozen=True)
class ApproverProof:
    bundles: BundleHolder
    id_tokens: IdTokenVerifier | None = None

    def prove_person(self, id_token: str, tenant: str) -> ProvenPerson:
        """The person `id_token` proves for `tenant`, who must not be another tenant's
        principal. Raises IdTokenRefused or OtherTenantsPerson. May block for a key fetch
        (toolauthz/identity/jwks.py): call it off the event loop."""
        if self.id_tokens is None:
            raise IdTokenRefused("no identity provider is configured (approvers.oidc)")
        person = self.id_tokens.verify(id_token, tenant)
        self.check_home_tenant(person.principal, tenant)
        return person

    def check_home_tenant(self, principal: Principal, tenant: str) -> None:
        home = self.bundles.current.static_graph.tenant_of((principal.type, principal.id))
        if home not in (None, tenant):
            raise OtherTenantsPerson(f"`{principal}` is a user of another tenant: never an approver in "
                                     f"`{shown(tenant)}`")

    def from_token(self, approver: TrustedContext, id_token: str) -> ProvenPerson:
        """The person deciding as DecideApproval names them. The approval tool's own view
        of the approver is never trusted over the token: a principal it names must be the
        token's, and it supplies no entities (the groups are the token's)."""
        person = self.prove_person(id_token, approver.tenant)
        claimed = approver.principal
        if (claimed.type or claimed.id) and claimed != person.principal:
            raise ForbiddenError("the approver named in the request is not the person the ID token proves")
        if approver.entities_json:
            raise RequestError("with approvers proven by ID tokens, the approver's entities come from the token: "
                               "entities_json must be empty")
        return person
