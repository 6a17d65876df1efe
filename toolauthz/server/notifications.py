"""The approval notifier as the configuration asks for it (`notifications:`)."""

from __future__ import annotations

import pathlib
from collections.abc import Callable

from toolauthz.bundle import BundleHolder
from toolauthz.clock import Clock
from toolauthz.display.hints import labelled
from toolauthz.errors import KeyFileError
from toolauthz.notify import Notifier, NotifierOptions, SlackSink, WebhookSink
from toolauthz.notify.sinks import Sink
from toolauthz.server.config import NotificationSettings
from toolauthz.store.approvals import ApprovalRecord
from toolauthz.store.deliveries import DEAD, Delivery
from toolauthz.store.rules import Store


def read_secret(path: pathlib.Path) -> str:
    """A webhook secret file: refused when others may read it, empty or malformed."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise KeyFileError(f"webhook secret file `{path}` cannot be read: {exc.strerror}") from None
    if mode & 0o077:
        raise KeyFileError(f"webhook secret file `{path}` is readable by others (chmod 600)")
    if not text.startswith("whsec_") or len(text) < 20:
        raise KeyFileError(f"webhook secret file `{path}` must hold a `whsec_<base64>` secret")
    return text


def sinks_of(settings: NotificationSettings) -> list[Sink]:
    sinks: list[Sink] = []
    for s in settings.sinks:
        ca = str(s.ca_file) if s.ca_file else None
        if s.kind == "webhook":
            assert s.secret_file is not None  # checked by the settings
            sinks.append(WebhookSink(s.name, s.url, read_secret(s.secret_file), timeout=s.timeout_seconds, ca_file=ca))
        else:
            sinks.append(SlackSink(s.name, s.url, timeout=s.timeout_seconds, ca_file=ca))
    return sinks


def notifier_of(settings: NotificationSettings | None, store: Store, bundles: BundleHolder,
                clock: Clock) -> Notifier | None:
    """The notifier, not started; None when notifications are not configured. Raises
    ValueError or KeyFileError for a sink it cannot use: the sidecar refuses to start."""
    if settings is None:
        return None

    def fields_of(record: ApprovalRecord) -> dict[str, str]:
        return labelled(record.fields, bundles.current.display_of(record.tool))

    options = NotifierOptions(console_url=settings.console_url, warning_seconds=settings.expiry_warning_seconds,
                              poll_seconds=settings.poll_seconds, max_attempts=settings.max_attempts,
                              keep_dead=settings.keep_dead)
    return Notifier(store.unit, sinks_of(settings), clock, fields_of, options)


def dead_letters_of(store: Store, settings: NotificationSettings | None) -> Callable[[], list[Delivery]]:
    """The console's view of undelivered notifications: the newest dead letters."""
    if settings is None:
        return lambda: []
    limit = settings.keep_dead

    def read() -> list[Delivery]:
        with store.unit.reading() as reads:
            return reads.list_deliveries(DEAD, limit)

    return read
