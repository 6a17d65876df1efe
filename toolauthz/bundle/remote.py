"""One fetch of a bundle archive from a bundle server over HTTPS, treating the server as
untrusted until the signature says otherwise.

Each fetch has one total deadline (a server that trickles bytes cannot hold it longer),
a bounded body (Content-Length over the bound is refused unread; a body that grows past
it is cut off), a conditional request (If-None-Match with the last ETag), and
credentials: a bearer token read from a file at each fetch (so it rotates; never logged
or put in an error) and/or a client certificate (mTLS), with the server checked against
a CA file. A redirect is followed only within the same origin (scheme, host, port): a
redirect to another host is refused, so the token never leaves the configured server.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import threading
from dataclasses import dataclass

import httpx2

from toolauthz.display.escape import shown
from toolauthz.errors import ToolAuthzError
from toolauthz.files.bounded import FileRefused, read_bounded

MAX_TOKEN_FILE_BYTES = 8 * 1024
MAX_REDIRECTS = 3
# RFC 7232 entity-tag, ASCII only and bounded: anything else is not sent back.
_ETAG = re.compile(r'(?:W/)?"[\x21\x23-\x7e]{0,200}"')
# RFC 6750 b64token.
_BEARER = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


class BundleFetchError(ToolAuthzError):
    """A fetch that gave no archive; `reason` is a stable code for metrics."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason  # unreachable | tls | timeout | redirect | status | too_large | credentials | cancelled


@dataclass(frozen=True)
class FetchOptions:
    url: str
    timeout_seconds: float = 30.0
    max_bytes: int = 16 << 20
    ca_file: str | None = None  # None: the system's CAs
    client_cert_file: str | None = None
    client_key_file: str | None = None
    bearer_token_file: str | None = None


@dataclass(frozen=True)
class Fetched:
    """A fetch's answer: the archive (None when the server said 304 Not Modified) and
    the ETag to send next time ("" when the server gave none usable)."""

    body: bytes | None
    etag: str


class BundleFetcher:
    def __init__(self, options: FetchOptions):
        if not options.url.startswith("https://"):
            raise ToolAuthzError("a bundle server's URL must start with `https://`")
        self._options = options
        self._tls = tls_context(options)
        self._lock = threading.Lock()
        self._running: tuple[asyncio.AbstractEventLoop, asyncio.Task[Fetched]] | None = None
        self._cancelled = False  # for good: cancel() is for a sidecar that stops

    @property
    def url(self) -> str:
        return self._options.url

    def fetch(self, etag: str = "") -> Fetched:
        """The archive, or Fetched(None, etag) for a 304; BundleFetchError otherwise."""
        loop = asyncio.new_event_loop()
        try:
            task = loop.create_task(self._fetch_within_deadline(etag))
            with self._lock:
                self._running = (loop, task)
                if self._cancelled:  # cancel() came before this fetch began
                    task.cancel()
            return loop.run_until_complete(task)
        except BundleFetchError:
            raise
        except TimeoutError:
            raise BundleFetchError("timeout", f"the bundle server did not answer in full within "
                                              f"{self._options.timeout_seconds:g} s") from None
        except asyncio.CancelledError:
            raise BundleFetchError("cancelled", "the fetch was cancelled: the sidecar is stopping") from None
        finally:
            with self._lock:
                self._running = None
            loop.close()

    def cancel(self) -> None:
        """End a fetch in progress now (from another thread): a sidecar that stops does
        not wait for a slow server's deadline."""
        with self._lock:
            self._cancelled = True
            if self._running is not None:
                loop, task = self._running
                loop.call_soon_threadsafe(task.cancel)

    async def _fetch_within_deadline(self, etag: str) -> Fetched:
        # One deadline over connect, TLS, headers and body: per-read timeouts alone let a
        # server that sends a byte a second hold the poller for ever.
        async with asyncio.timeout(self._options.timeout_seconds):
            headers = {"Accept": "application/gzip", "Accept-Encoding": "identity"}
            token = self._bearer_token()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            if etag:
                headers["If-None-Match"] = etag
            async with httpx2.AsyncClient(verify=self._tls, follow_redirects=False, trust_env=False,
                                          timeout=self._options.timeout_seconds) as client:
                return await self._follow(client, headers, etag)

    async def _follow(self, client: httpx2.AsyncClient, headers: dict[str, str], etag: str) -> Fetched:
        url = httpx2.URL(self._options.url)
        for _hop in range(MAX_REDIRECTS + 1):
            try:
                async with client.stream("GET", url, headers=headers) as response:
                    if response.status_code == 304 and etag:
                        return Fetched(None, etag)
                    if response.has_redirect_location:
                        url = self._same_origin(url, response.headers.get("location", ""))
                        continue
                    if response.status_code != 200:
                        raise BundleFetchError("status", f"the bundle server answered HTTP {response.status_code}")
                    body = await self._body(response)
                    return Fetched(body, _usable_etag(response.headers.get("etag", "")))
            except (httpx2.HTTPError, httpx2.StreamError, ssl.SSLError, OSError) as exc:
                # An alert after the handshake (a client certificate refused) comes up
                # as a bare ssl.SSLError, not wrapped by the HTTP client.
                raise _transport_error(exc) from None
        raise BundleFetchError("redirect", f"the bundle server redirected more than {MAX_REDIRECTS} times")

    def _same_origin(self, current: httpx2.URL, location: str) -> httpx2.URL:
        try:
            target = current.join(location)
        except (httpx2.InvalidURL, ValueError):
            raise BundleFetchError("redirect", f"the bundle server redirected to `{shown(location)}`, which is "
                                               "not a URL") from None
        if (target.scheme, target.host, target.port) != (current.scheme, current.host, current.port):
            raise BundleFetchError("redirect", f"the bundle server redirected to another origin "
                                               f"`{shown(str(target.scheme))}://{shown(target.host)}`; refused")
        return target

    async def _body(self, response: httpx2.Response) -> bytes:
        limit = self._options.max_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise BundleFetchError("too_large", f"the bundle archive is larger than {limit} bytes "
                                                f"(Content-Length {declared})")
        received = bytearray()
        async for chunk in response.aiter_raw():  # raw: no transfer decompression behind our back
            received += chunk
            if len(received) > limit:
                raise BundleFetchError("too_large", f"the bundle archive is larger than {limit} bytes")
        return bytes(received)

    def _bearer_token(self) -> str:
        path = self._options.bearer_token_file
        if not path:
            return ""
        try:
            token = read_bounded(path, MAX_TOKEN_FILE_BYTES).decode("ascii").strip()
        except (OSError, FileRefused, UnicodeDecodeError):
            raise BundleFetchError("credentials", f"cannot read the bundle server's token file `{shown(path)}`") \
                from None
        if not _BEARER.fullmatch(token):  # the message never quotes the token
            raise BundleFetchError("credentials", f"the token file `{shown(path)}` does not hold one bearer token")
        return token


def tls_context(options: FetchOptions) -> ssl.SSLContext:
    """The server checked against `ca_file` (else the system's CAs); the client
    certificate presented when one is configured."""
    try:
        context = ssl.create_default_context(cafile=options.ca_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if options.client_cert_file:
            context.load_cert_chain(options.client_cert_file, options.client_key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ToolAuthzError(f"cannot set up TLS to the bundle server: {shown(str(exc))}") from None
    return context


def _usable_etag(value: str) -> str:
    return value if _ETAG.fullmatch(value) else ""


def _transport_error(exc: Exception) -> BundleFetchError:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            reason = getattr(cause, "reason", None) or type(cause).__name__
            return BundleFetchError("tls", f"TLS with the bundle server failed: {shown(str(reason))}")
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, httpx2.TimeoutException):
        return BundleFetchError("timeout", "the bundle server timed out")
    return BundleFetchError("unreachable", f"the bundle server is unreachable: {shown(type(exc).__name__)}")
