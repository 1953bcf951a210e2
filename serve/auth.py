"""Who is calling: the admin, a team (by its API key), or an anonymous caller when keys are
optional (the local profile)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from fastapi import Request

from serve.config import GatewayConfig
from serve.errors import APIError
from serve.keys import KeyStore


@dataclass(frozen=True)
class Caller:
    team: str
    key_id: str | None
    admin: bool = False
    anonymous: bool = False
    scopes: frozenset[str] = frozenset({"inference"})

    def may(self, scope: str) -> bool:
        """Whether this caller's key has ``scope`` (the admin, and the keyless local caller, have all)."""
        return self.admin or self.anonymous or scope in self.scopes


def require_scope(caller: Caller, scope: str) -> None:
    """Refuse a key that was not given ``scope`` (``flywheel keys create --scope``)."""
    if not caller.may(scope):
        raise APIError(
            403,
            f"this API key has no {scope!r} scope (it has: {', '.join(sorted(caller.scopes))}); "
            f"create one with `flywheel keys create --team {caller.team} --scope {scope}`",
            type="permission_error",
            code="insufficient_scope",
        )


def bearer(request: Request) -> str | None:
    return bearer_of(request.headers)


def bearer_of(headers: Mapping[str, str]) -> str | None:
    """The key in an ``Authorization: Bearer`` header (``headers`` with lower-case names)."""
    auth = headers.get("authorization", "")
    return auth[7:].strip() or None if auth[:7].lower() == "bearer " else None


def _invalid_key(message: str) -> APIError:
    return APIError(401, message, type="invalid_request_error", code="invalid_api_key")


def is_admin_key(key: str | None, config: GatewayConfig) -> bool:
    """Constant-time comparison with the admin key (no timing oracle on its prefix)."""
    return bool(key and config.admin_key and hmac.compare_digest(key.encode(), config.admin_key.encode()))


def require_admin(request: Request, config: GatewayConfig) -> None:
    """The one check every admin route makes."""
    if not config.admin_key:
        raise APIError(403, "admin routes are disabled: set gateway.admin_key", type="permission_error")
    if not is_admin_key(bearer(request), config):
        raise _invalid_key("a valid admin key is required")


def caller_for_key(key: str | None, config: GatewayConfig, keys: KeyStore | None) -> Caller | None:
    """The admin or the team ``key`` belongs to; None for no key or an unknown one."""
    if is_admin_key(key, config):
        return Caller(team="admin", key_id="admin", admin=True)
    record = keys.lookup(key) if (key and keys) else None
    if record is None:
        return None
    if record.revoked:
        raise _invalid_key(f"The API key {record.id} has been revoked.")
    return Caller(team=record.team, key_id=record.id, scopes=frozenset(record.scopes))


def authenticate(request: Request, config: GatewayConfig, keys: KeyStore | None) -> Caller:
    return authenticate_headers(request.headers, config, keys)


def authenticate_headers(headers: Mapping[str, str], config: GatewayConfig, keys: KeyStore | None) -> Caller:
    key = bearer_of(headers) or headers.get("x-api-key")  # the second is how Anthropic's clients send it
    caller = caller_for_key(key, config, keys)
    if caller is not None:
        return caller
    if config.require_api_key:
        raise _invalid_key(
            "Incorrect API key provided." if key else "You didn't provide an API key (Authorization: Bearer <key>)."
        )
    return Caller(team="default", key_id=None, anonymous=True)
