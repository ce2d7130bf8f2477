"""Who may use the dashboard, and proof that a form was sent from its own pages.

Authentication is the host application's callable, basic auth or a token from
the environment, or nothing (then only a loopback bind is allowed: the CLI
refuses another address). Every state change is a POST carrying a CSRF token:
an HMAC of the actor and the time it was issued, under a secret that is
PGQUEUE_WEB_SECRET or random per process. All comparisons are constant-time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request

from pgqueue._errors import InvalidArgument

# A form is good for a working day; a token from yesterday's tab is refused.
CSRF_TTL_SECONDS = 8 * 3600
SESSION_TTL_SECONDS = 12 * 3600
SESSION_COOKIE = "pgqueue_session"
MIN_PASSWORD = 12
TOKEN_ACTOR = "token"  # the actor of requests and sessions proven by PGQUEUE_WEB_TOKEN

# The host's own authentication: the actor's name, or None to refuse.
AuthCallable = Callable[[Request], Awaitable[str | None] | str | None]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Signer:
    """HMAC-SHA256 signatures of short strings, with an issue time, under one secret."""

    key: bytes

    @classmethod
    def from_env(cls, secret: str | None = None) -> Signer:
        """The signer for `secret`, else $PGQUEUE_WEB_SECRET, else a random per-process key."""
        text = secret if secret is not None else os.environ.get("PGQUEUE_WEB_SECRET", "")
        if text and len(text) < 16:
            raise InvalidArgument(
                "PGQUEUE_WEB_SECRET is too short: use at least 16 random characters"
                " (python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return cls(text.encode() if text else secrets.token_bytes(32))

    def _mac(self, purpose: str, subject: str, issued: int) -> str:
        msg = f"{purpose}\x00{subject}\x00{issued}".encode()
        return _b64(hmac.new(self.key, msg, hashlib.sha256).digest())

    def sign(self, purpose: str, subject: str, now: float | None = None) -> str:
        """A token binding `subject` to `purpose` at the current time."""
        issued = int(time.time() if now is None else now)
        return f"{_b64(subject.encode())}.{issued}.{self._mac(purpose, subject, issued)}"

    def verify(self, purpose: str, token: str, ttl: int, now: float | None = None) -> str | None:
        """The subject of a token of `purpose` signed here less than ttl seconds ago; else None."""
        try:
            subject_b64, issued_text, mac = token.split(".")
            subject = _unb64(subject_b64).decode()
            issued = int(issued_text)
        except (ValueError, UnicodeDecodeError):
            return None
        now = time.time() if now is None else now
        if not 0 <= now - issued < ttl:
            return None
        if not hmac.compare_digest(mac, self._mac(purpose, subject, issued)):
            return None
        return subject


@dataclass(frozen=True)
class Credentials:
    """Who may log in: basic-auth users, a bearer token, or nobody configured (open)."""

    users: dict[str, str]
    token: str | None

    @classmethod
    def from_env(cls) -> Credentials:
        """$PGQUEUE_WEB_BASIC_AUTH ("alice:pw,bob:pw2") and $PGQUEUE_WEB_TOKEN."""
        users: dict[str, str] = {}
        for pair in filter(None, os.environ.get("PGQUEUE_WEB_BASIC_AUTH", "").split(",")):
            name, sep, password = pair.strip().partition(":")
            if not sep or not name or not password:
                raise InvalidArgument(
                    "PGQUEUE_WEB_BASIC_AUTH must be user:password pairs separated by commas,"
                    f" got an entry without both: {name or '(empty)'!r}"
                )
            if len(password) < MIN_PASSWORD:
                raise InvalidArgument(
                    f"PGQUEUE_WEB_BASIC_AUTH: the password of {name!r} is too short:"
                    f" use at least {MIN_PASSWORD} characters"
                )
            if name == TOKEN_ACTOR:
                raise InvalidArgument(
                    f"PGQUEUE_WEB_BASIC_AUTH: {TOKEN_ACTOR!r} names the token's sessions in the"
                    " logs; choose another user name"
                )
            users[name] = password
        token = os.environ.get("PGQUEUE_WEB_TOKEN") or None
        if token is not None and len(token) < 16:
            raise InvalidArgument(
                "PGQUEUE_WEB_TOKEN is too short: use at least 16 random characters"
            )
        return cls(users, token)

    @property
    def configured(self) -> bool:
        """Whether any login is required."""
        return bool(self.users) or self.token is not None

    def basic(self, header: str) -> str | None:
        """The user a Basic Authorization header proves, else None."""
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic" or not self.users:
            return None
        try:
            name, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        expected = self.users.get(name)
        # compare against something even for an unknown user: no timing hint
        ok = hmac.compare_digest(password.encode(), (expected or secrets.token_hex(16)).encode())
        return name if ok and expected is not None else None

    def session_subject(self) -> str:
        """What a session cookie signs: the token's fingerprint; a new token ends old sessions."""
        digest = hashlib.sha256((self.token or "").encode()).hexdigest()[:32]
        return f"{TOKEN_ACTOR}:{digest}"

    def bearer(self, value: str) -> bool:
        """Whether value is the configured token."""
        return self.token is not None and hmac.compare_digest(value.encode(), self.token.encode())


async def authenticate(
    request: Request, creds: Credentials, signer: Signer, auth: AuthCallable | None
) -> str | None:
    """The actor making this request, or None when a login is required and missing."""
    if auth is not None:
        result = auth(request)
        if isinstance(result, Awaitable):
            result = await result
        return result or None  # an empty name proves nobody
    if not creds.configured:
        return "local"
    header = request.headers.get("authorization", "")
    if header:
        user = creds.basic(header)
        if user is not None:
            return user
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and creds.bearer(value.strip()):
            return TOKEN_ACTOR
        return None
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie and creds.token is not None:
        subject = signer.verify("session", cookie, SESSION_TTL_SECONDS)
        if subject is not None and hmac.compare_digest(subject, creds.session_subject()):
            return TOKEN_ACTOR
    return None


def same_origin(request: Request) -> bool:
    """False for a request a browser says came from another site, or from another origin."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host


def is_loopback(host: str) -> bool:
    """Whether binding to host keeps the dashboard on this machine (an address, or localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere
