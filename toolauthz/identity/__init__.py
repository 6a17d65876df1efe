"""Who a person or a caller is: an identity provider's keys (jwks), approvers' ID tokens
(oidc) and the proof that a deciding person belongs to the tenant (approvers)."""
