"""Browser sessions for the trace browser: a signed cookie that names a key id, never the key.

The cookie is ``base64(json payload).HMAC-SHA256`` under a secret the gateway keeps (a file
shared by replicas, or one per process). It is HttpOnly and SameSite=Strict, so page scripts
cannot read it and other sites cannot send it. Each request checks the signature, the expiry,
and that the key is still valid (a revoked key ends its sessions at once). Forms carry a CSRF
token derived from the session's nonce.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from serve.auth import Caller
from serve.keys import KeyStore
from serve.secret_files import write_private
from traces.files import temp_beside

COOKIE = "fw_session"


@dataclass(frozen=True)
class UISession:
    caller: Caller
    nonce: str
    expires: float


def load_secret(path: str | None) -> bytes:
    """The signing secret: from ``path`` (created once, 0600, by whichever replica comes first;
    the others read the winner's), or a fresh one for this process."""
    if path is None:
        return secrets.token_bytes(32)
    target = Path(path)
    if not target.exists():
        tmp = temp_beside(target, ".new")
        write_private(tmp, secrets.token_hex(32))
        try:
            os.link(tmp, target)  # fails if another replica made it first: theirs stands
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    return bytes.fromhex(target.read_text().strip())


class Sessions:
    def __init__(self, secret: bytes, ttl_s: float, keys: KeyStore | None, admin_key: str | None = None):
        self.secret, self.ttl_s, self.keys = secret, ttl_s, keys
        # an admin session names the admin key it was opened with: a new admin key ends it, as
        # revoking a team key ends that key's sessions
        self.admin_mark = self._sign(b"admin:" + (admin_key or "").encode())[:16]

    def _sign(self, data: bytes) -> str:
        return base64.urlsafe_b64encode(hmac.new(self.secret, data, hashlib.sha256).digest()).decode().rstrip("=")

    def issue(self, caller: Caller) -> str:
        payload = {
            "team": caller.team,
            "kid": caller.key_id,
            "admin": caller.admin,
            "nonce": secrets.token_urlsafe(16),
            "exp": time.time() + self.ttl_s,
        }
        if caller.admin:
            payload["akm"] = self.admin_mark
        body = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
        return f"{body}.{self._sign(body.encode())}"

    def read(self, token: str | None) -> UISession | None:
        """The session a cookie stands for, or None (missing, forged, expired, key revoked)."""
        if not token or token.count(".") != 1:
            return None
        body, signature = token.split(".")
        # bytes: compare_digest refuses str with characters beyond ASCII (a 500, once)
        if not hmac.compare_digest(signature.encode(), self._sign(body.encode()).encode()):
            return None
        try:
            payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except ValueError:
            return None
        if payload["exp"] < time.time():
            return None
        if payload["admin"] and payload.get("akm") != self.admin_mark:
            return None
        if not payload["admin"]:
            record = self.keys.by_id(payload["kid"]) if self.keys else None
            if record is None or record.revoked or record.team != payload["team"]:
                return None
        return UISession(
            Caller(team=payload["team"], key_id=payload["kid"], admin=payload["admin"]), payload["nonce"], payload["exp"]
        )

    def csrf(self, session: UISession) -> str:
        return self._sign(b"csrf:" + session.nonce.encode())

    def csrf_ok(self, session: UISession, token: str | None) -> bool:
        return isinstance(token, str) and bool(token) and hmac.compare_digest(token.encode(), self.csrf(session).encode())
