"""What `strop serve` checks of a request's headers before it reads the body, so that a web page cannot use a
server on the user's own machine.

A page on any site can make the browser POST a `text/plain` body to http://127.0.0.1:8000 (no preflight asked),
or rebind its own name to 127.0.0.1 and then read the answers (DNS rebinding). So:

- a server bound to loopback answers only a `Host` that names this machine (localhost, 127.x.x.x, ::1, any port):
  a rebound name is refused (403);
- a request from a browser page (an `Origin` header) is refused (403) unless the page is on this machine, on the
  server's own address, or in the server's allowed origins (`--allow-origin`);
- a POST must say `Content-Type: application/json` (415): what a browser sends without asking first is never that.

    host_problem("evil.example:8000", bound_to="127.0.0.1")     # "Host 'evil.example:8000' is not ..."
    origin_problem("http://localhost:3000", host="127.0.0.1:8000", allowed=frozenset())   # None
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a server on this machine ('localhost', 127.x.x.x, ::1)."""
    name = host.strip().lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):    # RFC 6761: never sent to DNS
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(host: str) -> str | None:
    """The name in a Host header's `name[:port]` ('[::1]:8000' -> '::1'), or None when it is not of that shape."""
    match = re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^\[\]:/@\s]+)(?::[0-9]{1,5})?", host.strip())
    return match.group(1).strip("[]") if match else None


def host_problem(host: str | None, bound_to: str) -> str | None:
    """Why a request's Host header is refused by a server bound to `bound_to`, or None. Only a loopback server
    checks it (one bound wider is reached by names this one cannot know); a request without one (HTTP/1.0) passes:
    browsers always send it."""
    if host is None or not is_loopback(bound_to):
        return None
    name = _host_name(host)
    if name is not None and is_loopback(name):
        return None
    return (f"Host {host[:100]!r} is not this machine: a server bound to {bound_to} answers only requests addressed "
            "to localhost, 127.0.0.1 or [::1] (another name here is what a DNS-rebinding web page sends); use "
            f"http://127.0.0.1:PORT, or bind the server to an address others can reach")


def origin_problem(origin: str | None, host: str | None, allowed: frozenset[str]) -> str | None:
    """Why a request from a web page at `origin` is refused, or None (no Origin: not from a browser page)."""
    if origin is None or origin.strip().rstrip("/") in allowed:
        return None
    try:
        parts = urlsplit(origin.strip())
        name, netloc = parts.hostname, parts.netloc
    except ValueError:              # a malformed port or bracket
        return _refused(origin)
    if parts.scheme in ("http", "https") and name is not None:
        if is_loopback(name) or (host is not None and netloc.lower() == host.strip().lower()):
            return None
    return _refused(origin)


def _refused(origin: str) -> str:
    return (f"requests from web pages at {origin[:100]!r} are refused: a page on another site must not use this "
            "server through a visitor's browser; start the server with --allow-origin ORIGIN to let that page in")


def content_type_problem(content_type: str | None) -> str | None:
    """Why a POST's Content-Type is refused (anything but application/json), or None."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind == "application/json":
        return None
    shown = repr(content_type[:100]) if content_type else "none"
    return (f"a POST must send Content-Type: application/json (this one sent {shown}); send the request body as "
            "JSON with that header")
