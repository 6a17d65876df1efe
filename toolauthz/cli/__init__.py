"""The `toolauthz` command: serve, check, schema, test, authorize, keys, approvals, audit."""
