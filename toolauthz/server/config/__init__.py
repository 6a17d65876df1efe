"""Settings: one YAML file plus TOOLAUTHZ_* environment overrides, validated at load.

With no file at all, the defaults are the development setup: the example bundle, data in
`.toolauthz/`, and keys generated on first start. A config file must opt in to key
generation explicitly, so a production sidecar refuses to start without its keys.

Every key, its type, default and meaning: docs/configuration.md, generated from these
models by `toolauthz config reference` (reference.py); `toolauthz config schema` prints
their JSON Schema.
"""

from __future__ import annotations

from toolauthz.server.config.bundle_server import BundleServerSettings
from toolauthz.server.config.listening import SERVICES, ListenerSettings, Service, TlsSettings
from toolauthz.server.config.loading import ENVIRONMENT, load_settings
from toolauthz.server.config.notifications import NotificationSettings, NotificationSinkSettings
from toolauthz.server.config.observing import DecisionLogHttpSettings, DecisionLogSettings, TracingSettings
from toolauthz.server.config.people import (
    ApproverSettings,
    CallerSettings,
    ConsoleOidcSettings,
    ConsoleProxySettings,
    ConsoleSettings,
    OidcApproverSettings,
    Role,
)
from toolauthz.server.config.sections import (
    ApprovalSettings,
    AuditSettings,
    BatchSettings,
    BundleKeySettings,
    BundleVerificationSettings,
    TokenSettings,
)
from toolauthz.server.config.settings import DATABASE_FILE, Settings

__all__ = ["SERVICES", "DATABASE_FILE", "ENVIRONMENT", "ApprovalSettings", "ApproverSettings", "AuditSettings",
           "BatchSettings", "BundleKeySettings", "BundleServerSettings", "BundleVerificationSettings",
           "CallerSettings", "ConsoleOidcSettings", "ConsoleProxySettings", "ConsoleSettings",
           "DecisionLogHttpSettings", "DecisionLogSettings", "ListenerSettings", "NotificationSettings",
           "NotificationSinkSettings", "OidcApproverSettings", "Role", "Service", "Settings", "TlsSettings",
           "TokenSettings", "TracingSettings", "load_settings"]
