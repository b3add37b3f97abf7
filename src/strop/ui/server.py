"""`strop ui`'s HTTP server: the page and its scripts from this package, the JSON endpoints of `strop.ui.api`.

What it guards, as `strop serve` does (`strop.serve.guard`): bound to loopback it answers only a Host naming this
machine (a DNS-rebinding page is refused), a POST must come from no page or a page of this server and say
`Content-Type: application/json` (so another site cannot cancel a run through a visitor's browser). Bound to
anything else it needs a token on every request: `Authorization: Bearer T`, or the cookie that opening
`/?token=T` once sets. Every answer carries a Content-Security-Policy that allows only this server's own
scripts, so even a slip that put model text into markup could not run it.

    server = make_server(host="127.0.0.1", port=0)
    print(server.server_port); server.serve_forever()
"""

from __future__ import annotations

import hmac
import json
import socket
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qsl, quote, urlsplit

from strop.errors import StropError
from strop.serve.guard import content_type_problem, host_problem, is_loopback, origin_problem
from strop.ui.api import BadRequest, finite, handle

STATIC = {"app.js": "text/javascript", "charts.js": "text/javascript", "rollouts.js": "text/javascript",
          "evals.js": "text/javascript",
          "style.css": "text/css", "index.html": "text/html"}
COOKIE = "strop_ui_token"
MAX_BODY = 64 << 10    # the sample box's prompt is the largest body (cancel and resume send none)
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


class UIServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, handler, *, token: str | None):
        super().__init__(address, handler)
        self.bound_to, self.token = address[0], token


class UIServer6(UIServer):
    address_family = socket.AF_INET6


def make_server(host: str = "127.0.0.1", port: int = 8765, token: str | None = None) -> UIServer:
    if not is_loopback(host) and not token:
        raise StropError(f"strop ui bound to {host} would show every run to anyone who can reach it: give it a "
                         "token (--token T or the STROP_UI_TOKEN environment variable), or bind to 127.0.0.1")
    kind = UIServer6 if ":" in host else UIServer
    return kind((host.strip("[]"), port), Handler, token=token or None)


def _static(name: str) -> bytes:
    return resources.files("strop.ui").joinpath("static", name).read_bytes()


class Handler(BaseHTTPRequestHandler):
    server: UIServer
    protocol_version = "HTTP/1.1"
    timeout = 30

    def log_message(self, format, *args):   # quiet: a poll every two seconds is no news
        pass

    def do_GET(self):
        self._answer("GET")

    def do_POST(self):
        self._answer("POST")

    def _answer(self, method: str) -> None:
        problem = host_problem(self.headers.get("Host"), self.server.bound_to)
        if problem:
            return self._json(403, {"error": problem})
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        if self.server.token and not self._token_ok(query):
            return self._json(401, {"error": "this strop ui needs its token: open /?token=TOKEN once, or send "
                                             "Authorization: Bearer TOKEN"})
        if method == "POST":
            problem = origin_problem(self.headers.get("Origin"), self.headers.get("Host"), frozenset())
            if problem:
                return self._json(403, {"error": problem})
            problem = content_type_problem(self.headers.get("Content-Type"))
            if problem:
                return self._json(415, {"error": problem})
            body = self._body()
            if body is None:
                return self._json(413, {"error": f"a request body over {MAX_BODY} bytes is refused"})
        else:
            body = b""
        path = url.path
        if path.startswith("/api/"):
            return self._api(method, [p for p in path[5:].split("/") if p], query, body)
        if method == "GET" and "token" in query and self.server.token:
            return self._redirect_home()
        if method == "GET" and path == "/favicon.ico":    # browsers ask for one; a 404 would log a console error
            return self._send(204, b"", "image/x-icon")
        if method == "GET":
            name = "index.html" if path in ("/", "/index.html") else path.removeprefix("/static/")
            if name in STATIC and (path in ("/", "/index.html") or path.startswith("/static/")):
                return self._send(200, _static(name), STATIC[name] + "; charset=utf-8")
        return self._json(404, {"error": f"nothing at {path[:100]}"})

    def _token_ok(self, query: dict) -> bool:
        given = []
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            given.append(auth[7:].strip())
        for part in self.headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                given.append(value)
        if "token" in query:
            given.append(query["token"])
        expected = self.server.token.encode()
        return any(hmac.compare_digest(g.encode(), expected) for g in given)

    def _redirect_home(self) -> None:
        # the token leaves the address bar (and the history) for an HttpOnly cookie only this site is sent
        self.send_response(303)
        self.send_header("Location", "/")
        self.send_header("Set-Cookie", f"{COOKIE}={quote(self.server.token, safe='')}; HttpOnly; SameSite=Strict; "
                                       "Path=/")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _body(self) -> bytes | None:
        """The POST's body, or None (and the connection closed after the answer) when it is over MAX_BODY."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        if length > MAX_BODY or length < 0:
            self.close_connection = True
            return None
        return self.rfile.read(length) if length else b""

    def _api(self, method: str, parts: list[str], query: dict, body: bytes) -> None:
        try:
            status, payload = handle(method, parts, query, body)
        except BadRequest as exc:
            status, payload = 400, {"error": str(exc)}
        except StropError as exc:
            status, payload = (404 if str(exc).startswith("no ") else 409), {"error": str(exc)}
        except Exception as exc:     # a fault of ours: the page says so and keeps polling; the trace goes to stderr
            traceback.print_exc()
            status, payload = 500, {"error": f"strop ui failed on this request ({type(exc).__name__}: {exc}); "
                                             "the server's stderr has the details"}
        self._json(status, payload)

    def _json(self, status: int, payload) -> None:
        self._send(status, json.dumps(finite(payload), allow_nan=False).encode(), "application/json")

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)
