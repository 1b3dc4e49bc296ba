"""Headless Chromium driven as a user would drive it, for the cluster page's tests.

Debian's ``chromium`` is started with ``--remote-debugging-pipe``: it reads
DevTools protocol commands on file descriptor 3 and writes answers and
events on 4, each a JSON object ended by a NUL byte. No debugging port is
opened and nothing but the standard library is needed. A :class:`Tab` is
one page: it navigates, types (``Input.insertText``, as a keyboard would),
and evaluates expressions in the page (promises awaited).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--remote-debugging-pipe")


class BrowserError(AssertionError):
    """The browser answered an error, ended, or did not answer in time."""


class Browser:
    """One headless Chromium process with a profile of its own; a context manager that always ends it."""

    def __init__(self, profile: Path) -> None:
        assert CHROMIUM is not None, "no chromium binary on PATH"
        self.profile = profile
        self._ids = 0
        self._buffer = b""
        to_browser, self._to = _high_pipe()
        self._from, from_browser = _high_pipe()
        # fds 3 and 4 in the child, set by bash (dash takes only one-digit fds; a preexec_fn is unsafe beside threads)
        plumbing = f"exec 3<&{to_browser} 4>&{from_browser} {to_browser}<&- {from_browser}>&-; exec \"$@\""
        self._log = open(profile.with_name(profile.name + ".log"), "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(["bash", "-c", plumbing, "bash", CHROMIUM, *FLAGS, f"--user-data-dir={profile}",
                                      "about:blank"], pass_fds=(to_browser, from_browser),
                                     stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        os.close(to_browser)
        os.close(from_browser)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Ask the browser to close, then kill it (by its PID) if it has not ended within 10 s."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self._send({"id": self._next_id(), "method": "Browser.close"})
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for fd in (self._to, self._from):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        """Send one command and return its result (events meanwhile are dropped); BrowserError on an error."""
        request_id = self._next_id()
        message: dict[str, Any] = {"id": request_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self._send(message)
        deadline = time.monotonic() + timeout
        while True:
            answer = self._receive(deadline)
            if answer.get("id") == request_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                result: dict[str, Any] = answer.get("result", {})
                return result

    def open(self, url: str) -> Tab:
        """A new tab showing ``url``."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        tab = Tab(self, session)
        tab.navigate(url)
        return tab

    def cookies(self) -> list[dict[str, Any]]:
        """Every cookie the browser holds, with its attributes (httpOnly, sameSite, ...)."""
        cookies: list[dict[str, Any]] = self.call("Storage.getCookies")["cookies"]
        return cookies

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def _send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._to, data):]

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from], [], [], left)[0]:
                raise BrowserError("the browser did not answer in time")
            chunk = os.read(self._from, 1 << 16)
            if not chunk:
                raise BrowserError(f"the browser ended (status {self.proc.poll()})")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        found: dict[str, Any] = json.loads(message)
        return found


class Tab:
    """One page of a :class:`Browser`."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def navigate(self, url: str) -> None:
        """Go to ``url`` and wait until its document has loaded."""
        self.browser.call("Page.navigate", {"url": url}, self.session)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` in the page (a promise is awaited); BrowserError if it throws."""
        answer = self.browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                        "awaitPromise": True}, self.session)
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression!r} threw: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 15.0) -> Any:
        """The first truthy value of ``expression``, polled every 50 ms (an error while the page loads counts as
        not yet); BrowserError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except BrowserError:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out after {timeout} s waiting for {expression!r} on "
                                   f"{self.evaluate('location.href')}")
            time.sleep(0.05)

    def type(self, text: str) -> None:
        """Type ``text`` into the focused element, as a keyboard would."""
        self.browser.call("Input.insertText", {"text": text}, self.session)


def _high_pipe() -> tuple[int, int]:
    """A pipe whose two ends are above 9 (so the shell's ``3<&N 4>&M`` cannot overwrite one with the other)."""
    read, write = os.pipe()
    try:
        return fcntl.fcntl(read, fcntl.F_DUPFD_CLOEXEC, 10), fcntl.fcntl(write, fcntl.F_DUPFD_CLOEXEC, 10)
    finally:
        os.close(read)
        os.close(write)
