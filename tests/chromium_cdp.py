"""Headless Chromium driven over the DevTools protocol (a websocket; `websockets` is already a dependency), for
the `strop ui` browser tests: open a page, run script in it, wait for something to show, move the mouse, take a
screenshot, and collect every console message and uncaught exception.

    with Chromium() as browser:
        page = browser.page("http://127.0.0.1:8765/")
        page.wait_for("document.querySelectorAll('tr[data-run]').length > 0")
        page.screenshot("runs.png"); assert page.problems() == []

It finds the browser as the report's check does (strop.report.browser.find_chromium).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import queue
import re
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from websockets.sync.client import connect

from strop.report.browser import find_chromium

_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")


class Chromium:
    def __init__(self, *, timeout_s: float = 30):
        self.profile = tempfile.TemporaryDirectory(prefix="strop-cdp-", ignore_cleanup_errors=True)
        command = [find_chromium(), "--headless", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
                   "--remote-debugging-port=0", f"--user-data-dir={self.profile.name}", "--window-size=1400,1000",
                   "about:blank"]
        if os.geteuid() == 0:
            command.append("--no-sandbox")
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        errors="replace", start_new_session=True)
        found: queue.Queue = queue.Queue()
        threading.Thread(target=self._drain, args=(found,), daemon=True).start()
        try:
            url = found.get(timeout=timeout_s)
        except queue.Empty:
            self.close()
            raise RuntimeError(f"Chromium did not open its DevTools port within {timeout_s} s") from None
        self.stack = contextlib.ExitStack()
        self.socket = self.stack.enter_context(connect(url, max_size=None, open_timeout=timeout_s))
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def _drain(self, found: queue.Queue) -> None:
        for line in self.process.stderr:     # read to the end, so a chatty browser never blocks on a full pipe
            match = _LISTENING.search(line)
            if match:
                found.put(match.group(1))

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout_s: float = 30):
        ident = next(self.ids)
        message = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.socket.send(json.dumps(message))
        deadline = time.monotonic() + timeout_s
        while True:
            reply = json.loads(self.socket.recv(timeout=max(0.01, deadline - time.monotonic())))
            if reply.get("id") == ident:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def page(self, url: str) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.send(f"{domain}.enable", session=session)
        page = Page(self, session)
        page.goto(url)
        return page

    def close(self) -> None:
        if getattr(self, "stack", None) is not None:
            self.stack.close()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.profile.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Page:
    def __init__(self, browser: Chromium, session: str):
        self.browser, self.session = browser, session

    def goto(self, url: str) -> None:
        self.browser.send("Page.navigate", {"url": url}, self.session)
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str):
        result = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                        "awaitPromise": True}, self.session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 15) -> object:
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"still false after {timeout_s} s: {expression}")
            time.sleep(0.1)

    def mouse_move(self, x: float, y: float) -> None:
        self.browser.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y}, self.session)

    def screenshot(self, path: str | Path) -> Path:
        data = self.browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                                 self.session)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def problems(self) -> list[str]:
        """Every console message, uncaught exception and browser log error of this page so far."""
        self.evaluate("1")    # lets events that arrived meanwhile be read
        found = []
        for event in self.browser.events:
            if event.get("sessionId") != self.session:
                continue
            params = event["params"]
            if event["method"] == "Runtime.consoleAPICalled":
                found.append(f"console.{params['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                                     for a in params.get("args", [])))
            elif event["method"] == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append("uncaught: " + str(details.get("exception", {}).get("description") or details.get("text")))
            elif event["method"] == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                found.append(f"log {params['entry']['level']}: {params['entry']['text']} {params['entry'].get('url', '')}")
        return found
