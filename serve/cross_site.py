"""What a web page on another site may make a browser do to the gateway: nothing.

A browser adds its user's ambient reach to any page's requests: the loopback gateway of the
``local`` profile (no keys), and the trace browser's session cookie. So a request that comes
from a browser (it says so with ``Origin`` or ``Sec-Fetch-Site``, which every current browser
sends and no page can forge) is refused with a 403 when

- its ``Host`` is not a name the gateway answers to (DNS rebinding: a page's own name made to
  point at 127.0.0.1, so that its requests are "same-origin"), or
- it would change something (not GET/HEAD/OPTIONS) and was sent from another origin.

This holds on every route while keys are off, and on the trace browser's routes always (its
cookie is the one ambient credential once keys are on; bearer keys are not sent by a browser on
its own). SDKs, curl and other programs send neither header and are not affected.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from serve.config import GatewayConfig
from serve.errors import APIError

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class CrossSite:
    def __init__(self, config: GatewayConfig):
        self.keys_off = not config.require_api_key
        self.hosts = {*LOOPBACK_NAMES, config.host.lower(), *(h.lower() for h in config.allowed_hosts)}

    def refusal(self, scope: dict) -> APIError | None:
        """Why this request must not be served, or None."""
        if not (self.keys_off or scope["path"].startswith("/ui")):
            return None
        origin = fetch_site = host = None
        for name, value in scope["headers"]:
            if name == b"origin":
                origin = value.decode("latin-1")
            elif name == b"sec-fetch-site":
                fetch_site = value.decode("latin-1")
            elif name == b"host":
                host = value.decode("latin-1")
        if origin is None and fetch_site is None:
            return None  # not a browser
        if _name(host) not in self.hosts:
            return _refused(
                f"this gateway does not answer to the host {host!r} from a browser "
                "(gateway.allowed_hosts lists the names it does)"
            )
        if scope["method"] in SAFE_METHODS:
            return None
        if fetch_site == "cross-site" or (origin is not None and _origin_host(origin) != (host or "").lower()):
            return _refused(f"a page from {origin or 'another site'} may not send this request")
        return None


def _name(host: str | None) -> str:
    """The host name of a Host header, without its port ('[::1]:8000' -> '::1')."""
    if not host:
        return ""
    return (urlsplit(f"//{host}").hostname or "").lower()


def _origin_host(origin: str) -> str | None:
    """``scheme://host:port`` -> ``host:port`` as a Host header would say it; None for 'null'."""
    parts = urlsplit(origin)
    return parts.netloc.lower() if parts.scheme in ("http", "https") and parts.netloc else None


def _refused(message: str) -> APIError:
    return APIError(403, message, type="permission_error", code="cross_site_refused")
