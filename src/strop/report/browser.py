"""Open an HTML file in headless Chromium: save a screenshot and return what the page logged to its console.

    from strop.report.browser import check_in_chromium
    messages = check_in_chromium("out/report.html", "out/report.png")
    assert not messages, messages        # a report has no script, so any console message is a fault

What Chromium prints (checked on Chromium 156, Debian, `--enable-logging=stderr --v=0`): every console
message, whatever its level, arrives on stderr as one INFO record whose tag carries the source line,

    [4319:4319:1129/160645.304613:INFO:CONSOLE:2] "x-console-error", source: file:///tmp/bad.html (2)
    [4319:4319:1129/160645.306406:INFO:CONSOLE:3] "Uncaught Error: boom", source: file:///tmp/bad.html (3)

console.log, console.warn and console.error look alike there (the level is not printed), and an uncaught
exception or rejected promise is a message that starts with "Uncaught". So this returns every console
message; for a page without script, as the reports are, each one is an error (a blocked load under the
report's Content-Security-Policy is one too). The quoted text may span lines. Older Chromium wrote the
tag as `CONSOLE(2)`; both forms are parsed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from strop.errors import StropError

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
_CONSOLE = re.compile(r'^\[[^\]\n]*:CONSOLE(?::(\d+)|\((\d+)\))\] "(.*?)", source: (.*?) \((\d+)\)$',
                      re.MULTILINE | re.DOTALL)


def find_chromium() -> str:
    """The path of the first of chromium, chromium-browser, google-chrome on PATH."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise StropError(f"no Chromium browser on PATH (looked for {', '.join(BROWSERS)}); install it with "
                     "`apt-get install chromium`")


def check_in_chromium(html_path, screenshot_path, *, timeout_s: float = 60) -> list[str]:
    """Load `html_path` in headless Chromium, save a 1400x3000 screenshot to `screenshot_path`, and return
    the console messages the page logged as "message (source:line)", in order; [] for a clean page."""
    html_path = Path(html_path).resolve()
    if not html_path.is_file():
        raise StropError(f"cannot check {html_path} in Chromium: no such file")
    screenshot_path = Path(screenshot_path).resolve()
    screenshot_path.parent.mkdir(parents=True, exist_ok=True)
    screenshot_path.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="strop-chromium-", ignore_cleanup_errors=True) as profile:
        command = [find_chromium(), "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                   f"--user-data-dir={profile}", f"--screenshot={screenshot_path}", "--window-size=1400,3000",
                   "--enable-logging=stderr", "--v=0"]
        if os.geteuid() == 0:
            command.append("--no-sandbox")   # Chromium refuses to start its sandbox as root
        stderr, returncode = _run(command + [html_path.as_uri()], timeout_s, html_path)
    if returncode != 0 or not screenshot_path.is_file():
        raise StropError(f"Chromium could not render {html_path} (exit status {returncode}); last lines of its "
                         f"log:\n{_tail(stderr)}")
    return console_messages(stderr)


def console_messages(stderr: str) -> list[str]:
    """The console messages in Chromium's stderr log, as "message (source:line)"."""
    return [f"{message} ({source}:{line})" for _, _, message, source, line in _CONSOLE.findall(stderr)]


def _run(command: list[str], timeout_s: float, html_path: Path) -> tuple[str, int]:
    # its own session, so a timeout can end Chromium's renderer and GPU children along with it
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               errors="replace", start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        raise StropError(f"Chromium did not finish loading {html_path} within {timeout_s:g} s; last lines of its "
                         f"log:\n{_tail(stderr)}") from None
    return stderr, process.returncode


def _tail(stderr: str, lines: int = 12) -> str:
    useful = [line for line in stderr.splitlines() if "dbus" not in line]   # D-Bus noise in containers
    return "\n".join(useful[-lines:]) or "(nothing)"
