"""Tokens on the metrics port (shardmgr/server/http_auth.py) through a real
server with a tokens file, over plain HTTP: bearer tokens, the login form
and its session cookie (ended by logout and by revoking the token; found
among other apps' cookies whatever their values; one per server, so two
servers on one host keep their sessions in one cookie jar), what a refusal
says, counts and logs (never the token), and ``metrics_open``.
The cluster pages and a real browser: tests/shardmgr/cluster/operations/test_status_page.py."""

from __future__ import annotations

import contextlib
import http.client
import http.cookiejar
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from shardmgr.server.auth import add_token
from shardmgr.server.config import ServerConfig
from shardmgr.server.http_auth import MAX_LOGIN_BYTES, SESSION_S
from shardmgr.server.server import Server

Answer = tuple[int, dict[str, str], str]


def serving(tmp_path: Path, data: str = "data", **settings: object) -> Generator[Server, None, None]:
    server = Server(ServerConfig(data_dir=tmp_path / data, port=0, auth_file=tmp_path / "tokens", metrics_port=0,
                                 **settings))  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def tokens(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "tokens"
    return {name: add_token(path, name, roles) for name, roles in
            (("dashboard", ["read"]), ("gpu", ["worker"]), ("ops", ["admin"]))}


@pytest.fixture
def server(tmp_path: Path, tokens: dict[str, str]) -> Iterator[Server]:
    yield from serving(tmp_path)


def request(server: Server, method: str, path: str, headers: dict[str, str] | None = None,
            body: bytes | None = None) -> Answer:
    """One HTTP request to the server's metrics port (redirects not followed): status, headers, body."""
    host, port = server._metrics.server_address[:2]
    connection = http.client.HTTPConnection(host, port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read().decode()
    finally:
        connection.close()


def login(server: Server, token: str, next_path: str = "/metrics") -> Answer:
    form = urllib.parse.urlencode({"token": token, "next": next_path}).encode()
    return request(server, "POST", "/login", {"Content-Type": "application/x-www-form-urlencoded"}, form)


def counted(server: Server) -> tuple[int, int]:
    counters = server.stats()["server"]
    return counters["errors_unauthenticated_total"], counters["errors_forbidden_total"]


def test_a_login_opens_the_pages_with_a_session_cookie_until_logout_or_the_token_is_revoked(
        server: Server, tokens: dict[str, str], tmp_path: Path) -> None:
    status, headers, body = request(server, "GET", "/metrics", {"Accept": "text/html,*/*"})
    assert status == 401 and 'name="token"' in body and "shardmgr_server" not in body  # the form, no counters
    assert "form-action 'self'" in headers["Content-Security-Policy"]

    status, headers, _ = login(server, tokens["dashboard"])
    assert (status, headers["Location"]) == (303, "/metrics")
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"shardmgr_session_{server._metrics.server_address[1]}=")
    assert f"; Path=/; Max-Age={SESSION_S}; HttpOnly; SameSite=Strict" in cookie
    assert tokens["dashboard"] not in cookie
    session = {"Cookie": cookie.split(";")[0]}
    status, _, body = request(server, "GET", "/metrics", session)
    assert status == 200 and "shardmgr_server_errors_unauthenticated_total 1.0" in body  # the form's request

    status, headers, _ = request(server, "POST", "/logout", session)
    assert status == 303 and "Max-Age=0" in headers["Set-Cookie"]
    assert request(server, "GET", "/metrics", session)[0] == 401

    session = {"Cookie": login(server, tokens["dashboard"])[1]["Set-Cookie"].split(";")[0]}
    assert request(server, "GET", "/metrics", session)[0] == 200
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("".join(line + "\n" for line in tokens_file.read_text().splitlines()
                                   if not line.startswith("dashboard ")))  # revoked: its sessions end at once
    assert request(server, "GET", "/metrics", session)[0] == 401
    assert login(server, tokens["dashboard"])[0] == 401
    assert request(server, "GET", "/metrics", {"Authorization": f"Bearer {tokens['ops']}"})[0] == 200  # admin


def test_a_refused_login_says_why_is_counted_and_logs_no_token(server: Server, tokens: dict[str, str],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    wrong = "smt_" + "B" * 43
    with caplog.at_level(logging.DEBUG):
        status, headers, body = login(server, wrong)
        assert status == 401 and "That token is not valid on this server." in body and wrong not in body
        assert "Set-Cookie" not in headers
        status, headers, body = login(server, tokens["gpu"])
        assert status == 403 and "token &#x27;gpu&#x27; has worker; these pages need role" in body
        assert "Set-Cookie" not in headers
        status, _, body = request(server, "GET", "/metrics", {"Authorization": f"Bearer {wrong}"})
        assert status == 401 and "the bearer token is not valid here" in body and wrong not in body
        assert request(server, "GET", "/metrics", {"Authorization": f"Basic {wrong}"})[0] == 401
        assert request(server, "GET", f"/metrics?token={tokens['dashboard']}")[0] == 401  # never from the URL
        assert login(server, "")[0] == 401
        too_big = request(server, "POST", "/login", {}, b"token=" + b"x" * MAX_LOGIN_BYTES)
        assert too_big[0] == 413
    assert counted(server) == (5, 1)  # (the oversized form is no attempt)
    refusals = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(refusals) == 3 and all("from 127.0.0.1" in line for line in refusals), refusals
    assert not [r for r in caplog.records if wrong in r.getMessage() or tokens["gpu"] in r.getMessage()]


def test_a_login_goes_back_only_to_a_path_of_this_server(server: Server, tokens: dict[str, str]) -> None:
    for asked, went in (("/metrics", "/metrics"), ("//evil.example/x", "/cluster"), ("http://evil.example", "/cluster"),
                        ("/login", "/cluster"), ("/metrics?x=1", "/cluster")):
        status, headers, _ = login(server, tokens["dashboard"], asked)
        assert (status, headers["Location"]) == (303, went), asked


def test_metrics_open_serves_metrics_alone_without_a_token(tmp_path: Path, tokens: dict[str, str]) -> None:
    for server in serving(tmp_path, metrics_open=True):
        status, _, body = request(server, "GET", "/metrics")
        assert status == 200 and "shardmgr_server_requests_total" in body
        assert request(server, "GET", "/cluster.json")[0] == 401  # outside cluster mode: 404 only with a token
        assert request(server, "GET", "/cluster.json", {"Authorization": f"Bearer {tokens['dashboard']}"})[0] == 404
        assert request(server, "GET", "/metrics/")[0] == 401  # the scrape path alone
        assert counted(server) == (2, 0)


def session_of(answer: Answer) -> tuple[str, str]:
    """The name and value of the session cookie a login's answer set."""
    name, _, value = answer[1]["Set-Cookie"].split(";")[0].partition("=")
    return name, value


def test_the_session_is_found_among_cookies_other_apps_of_the_host_set_however_they_look(
        server: Server, tokens: dict[str, str]) -> None:
    name, value = session_of(login(server, tokens["dashboard"]))
    for header in (f'theme=dark mode; prefs={{"a":1}}; {name}={value}',  # values http.cookies gives up on
                   f'{name}={value}; theme=dark mode',
                   f'{name}="{value}"; x="unterminated',
                   f'{name}=ended-or-another-paths; {name}={value}',  # several of that name: each is tried
                   f'{name}={value}; {name}=ended-or-another-paths'):
        assert request(server, "GET", "/metrics", {"Cookie": header})[0] == 200, header
    assert request(server, "GET", "/metrics", {"Cookie": f'theme=dark mode; {name}=not-a-session'})[0] == 401
    assert request(server, "GET", "/metrics", {"Cookie": f'other_{name}={value}'})[0] == 401  # the name exactly


def test_two_metrics_servers_on_one_host_keep_their_own_sessions_in_one_browsers_cookie_jar(
        tmp_path: Path, tokens: dict[str, str]) -> None:
    """As docs/cluster.md's quick start runs them: several nodes on 127.0.0.1, one browser logged into each
    (cookies are scoped by host, not port: with one name for all, each login replaced the other's)."""
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with contextlib.ExitStack() as stack:
        servers = [next(stack.enter_context(contextlib.closing(serving(tmp_path, name))))
                   for name in ("n1", "n2")]
        bases = [f"http://127.0.0.1:{server._metrics.server_address[1]}" for server in servers]
        for base in bases:  # the login form posts, the 303 goes back to /metrics with the cookie
            form = urllib.parse.urlencode({"token": tokens["dashboard"], "next": "/metrics"}).encode()
            with browser.open(base + "/login", form, timeout=10) as page:
                assert page.status == 200 and "shardmgr_server_requests_total" in page.read().decode()
        for base in bases:  # each still logged in, though each gets the other's cookie too (same host)
            with browser.open(base + "/metrics", timeout=10) as page:
                assert page.status == 200
        assert sorted(c.name for c in jar) == sorted(f"shardmgr_session_{b.rsplit(':', 1)[1]}" for b in bases)
        with browser.open(urllib.request.Request(bases[0] + "/logout", b"", method="POST"), timeout=10):
            pass  # (ends on the login form)
        with pytest.raises(urllib.error.HTTPError) as refused:
            browser.open(bases[0] + "/metrics", timeout=10)
        assert refused.value.code == 401
        with browser.open(bases[1] + "/metrics", timeout=10) as page:
            assert page.status == 200  # a logout from one node ends no session of the other
        assert [c.name for c in jar] == [f"shardmgr_session_{bases[1].rsplit(':', 1)[1]}"]  # (n1's cookie dropped)
