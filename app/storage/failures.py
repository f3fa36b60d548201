"""FetchError, and the one-line reason it gives for what a store client raised.

pyarrow raises OSError with the AWS or Google SDK's multi-line text, fsspec wraps every aiohttp failure in a bare
FileNotFoundError (the real one is its cause): `reason` walks the chain and says what happened in a few words, "not
found", "access denied", "no credentials: ...", "unreachable: ...", so that a replica's failed start reads as one line.
"""

from __future__ import annotations

import os
import re
import ssl
from pathlib import Path

__all__ = ["FetchError", "reason"]

MAX_REASON = 160
AWS_ERROR = re.compile(r"AWS Error ([A-Z_]+)")
GOOGLE_STATUS = re.compile(r"\b(NOT_FOUND|PERMISSION_DENIED|UNAUTHENTICATED|UNAVAILABLE|DEADLINE_EXCEEDED)\b")
CURL = re.compile(r"curlCode: \d+, ([^;\n]+)")
AWS_NOT_FOUND = {"NO_SUCH_KEY", "NO_SUCH_BUCKET", "RESOURCE_NOT_FOUND"}
AWS_DENIED = {"ACCESS_DENIED"}
AWS_BAD_CREDENTIALS = {
    "INVALID_ACCESS_KEY_ID",
    "SIGNATURE_DOES_NOT_MATCH",
    "INVALID_CLIENT_TOKEN_ID",
    "UNRECOGNIZED_CLIENT",
    "EXPIRED_TOKEN",
    "INVALID_SIGNATURE",
    "MISSING_AUTHENTICATION_TOKEN",
}
AWS_UNREACHABLE = {"NETWORK_CONNECTION", "REQUEST_TIMEOUT", "SERVICE_UNAVAILABLE", "SLOW_DOWN", "THROTTLING"}


class FetchError(Exception):
    """A model file that could not be fetched: str() is one line, `<uri>: <reason>`."""

    def __init__(self, uri: str, reason: str) -> None:
        super().__init__(f"{uri}: {reason}")
        self.uri = uri
        self.reason = reason

    def __reduce__(self) -> tuple[type[FetchError], tuple[str, str]]:
        return (type(self), (self.uri, self.reason))  # survives pickling (process pools, Ray)


def first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 1] + "…"


def chain(exc: BaseException) -> list[BaseException]:
    """The exception, then what caused it, outermost first."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def aws_credentials_absent() -> bool:
    """Whether the AWS SDK's credential chain can have found nothing: no keys, profile files, web identity or container
    credentials, and instance metadata switched off. Then a 403 is an unsigned request's, not a refusal of a signed
    one; with instance metadata on there is no telling, and the 403 is reported as access denied."""
    env = os.environ
    named = ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
    if any(env.get(k) for k in (*named, "AWS_CONTAINER_CREDENTIALS_FULL_URI")):
        return False
    home = Path.home() / ".aws"
    files = (
        env.get("AWS_SHARED_CREDENTIALS_FILE") or home / "credentials",
        env.get("AWS_CONFIG_FILE") or home / "config",
    )
    if any(Path(f).expanduser().is_file() for f in files):
        return False
    return env.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() == "true"


def http_reason(status: int, message: str | None) -> str:
    if status in (404, 410):
        return "not found"
    if status == 403:
        return "access denied"
    if status == 401:
        return "access denied: HTTP 401 (the server wants credentials)"
    text = f"HTTP {status}" + (f" {message}" if message else "")
    return f"unreachable: {text}" if status >= 500 or status == 429 else text


def network_reason(exc: BaseException) -> str | None:
    """A reason for a TLS, connection or HTTP status failure; None for anything else."""
    import aiohttp

    if isinstance(exc, (ssl.SSLCertVerificationError, aiohttp.ClientConnectorCertificateError)):
        cert = getattr(exc, "certificate_error", exc)  # aiohttp's wraps the ssl module's
        detail = getattr(cert, "verify_message", None) or first_line(str(cert))
        return f"unreachable: certificate verify failed: {detail}"
    if isinstance(exc, ssl.SSLError):
        return f"unreachable: TLS: {exc.reason or first_line(str(exc))}"
    if isinstance(exc, aiohttp.ClientResponseError):
        return http_reason(exc.status, exc.message)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"unreachable: cannot connect to {exc.host}:{exc.port}: {first_line(exc.strerror or str(exc.os_error))}"
    if isinstance(exc, (aiohttp.ClientError, ConnectionError, TimeoutError)):
        return f"unreachable: {type(exc).__name__}" + (f": {first_line(str(exc))}" if str(exc) else "")
    return None


def sdk_reason(text: str) -> str | None:
    """A reason for the AWS or Google SDK's error text (pyarrow's OSError); None when it is neither's."""
    if m := AWS_ERROR.search(text):
        code = m.group(1)
        if code in AWS_NOT_FOUND:
            return "not found"
        if code in AWS_DENIED:
            if aws_credentials_absent():
                return "no credentials: the request went unsigned (no AWS keys, profile, web identity; IMDS off)"
            return "access denied"
        if code in AWS_BAD_CREDENTIALS:
            return f"access denied: {code.lower().replace('_', ' ')}"
        curl = CURL.search(text)
        if curl or code in AWS_UNREACHABLE:
            return f"unreachable: {first_line(curl.group(1) if curl else code.lower().replace('_', ' '))}"
        return first_line(text[m.start() :])
    if m := GOOGLE_STATUS.search(text):
        return {
            "NOT_FOUND": "not found",
            "PERMISSION_DENIED": "access denied",
            "UNAUTHENTICATED": "no credentials: not authenticated",
        }.get(m.group(1), f"unreachable: {m.group(1).lower().replace('_', ' ')}")
    return None


def reason(exc: BaseException) -> str:
    """What went wrong, in a few words on one line (never a traceback nor an SDK's paragraph)."""
    causes = chain(exc)
    for e in causes:
        if found := network_reason(e):
            return found
    for e in causes:
        if isinstance(e, OSError) and (found := sdk_reason(str(e))):
            return found
    if isinstance(exc, FileNotFoundError):
        return "not found"
    if isinstance(exc, PermissionError):
        return "access denied"
    if isinstance(exc, IsADirectoryError):
        return "not a file"
    text = first_line(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
