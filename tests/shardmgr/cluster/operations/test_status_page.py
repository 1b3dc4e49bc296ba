"""The cluster page on the metrics port (shardmgr/server/metrics.py,
shardmgr/cluster/operations/page.py), rendered by headless Chromium (Debian's
``chromium``; skipped without it) and read back from its DOM after the
page's script ran.

- A real node with a published shard: the page shows the node, the
  collection, its writer, its shard count, where the shard is served and
  the writer's holder key; a collection created later is on the page
  loaded after it. ``/metrics`` still answers beside it.
- Values from etcd are shown as text (an address holding markup stays
  text), and a failed refresh shows the error banner.
- ``/cluster.json`` is the status (with the node's ``replicas``); the
  page names no other origin.
- Outside cluster mode the two paths are 404 and ``/metrics`` is as before.
- With a tokens file a browser sees only the login form (and its script's
  fetches are refused) until it logs in with a token; then the page, its
  session in an HttpOnly, SameSite=Strict cookie and no token in any URL
  (tests/shardmgr/cluster/browser.py drives Chromium). Over plain HTTP both
  pages refuse a request without a valid token, or with one in the query
  string, and ``/metrics`` too unless ``metrics_open``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.state.kv import Kv
from shardmgr.server.auth import Authenticator, add_token
from shardmgr.server.metrics import serve_metrics
from shardmgr.store.client import StoreClient
from tests.cluster_servers import free_ports
from tests.shardmgr.cluster.browser import Browser
from tests.shardmgr.cluster.nodes import DIM, batches, node, published, wait_for

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (Debian: apt-get install "
                                                               "chromium; .ci/run installs it when run as root)")


class Dom(HTMLParser):
    """What the rendered page shows: table rows (their data- attributes and
    text per data-field), the summary tiles, the banner and the header."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.html = html
        self.rows: list[tuple[dict[str, str], dict[str, str]]] = []
        self.tiles: dict[str, str] = {}
        self.ids: dict[str, str] = {}
        self.styles: dict[str, str] = {}
        self._row: tuple[dict[str, str], dict[str, str]] | None = None
        self._open: list[tuple[str, str]] = []  # (where text goes, its key), innermost last
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "tr" and any(k.startswith("data-") for k in a):
            self._row = ({k: v for k, v in a.items() if k.startswith("data-")}, {})
            self.rows.append(self._row)
        if "id" in a:
            self.styles[a["id"]] = a.get("style", "")
        target = ("cell", a["data-field"]) if tag == "td" and "data-field" in a else \
            ("tile", a["data-field"]) if "data-field" in a else ("id", a["id"]) if "id" in a else None
        self._open.append(target or ("", ""))

    def handle_endtag(self, tag: str) -> None:
        if self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for kind, key in reversed(self._open):
            if kind == "cell" and self._row is not None:
                self._row[1][key] = self._row[1].get(key, "") + data
            elif kind == "tile":
                self.tiles[key] = self.tiles.get(key, "") + data
            elif kind == "id":
                self.ids[key] = self.ids.get(key, "") + data
            if kind:
                return

    def row(self, **match: str) -> dict[str, str]:
        found = [cells for attrs, cells in self.rows if all(attrs.get(f"data-{k}") == v for k, v in match.items())
                 and len(attrs) == len(match)]
        assert len(found) == 1, (match, self.rows)
        return found[0]


def render(url: str, profile: Path) -> Dom:
    """``url`` loaded in headless Chromium (a profile of its own), its DOM after the script had its first answer."""
    assert CHROMIUM is not None
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=1500",
                           "--dump-dom", url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "</main>" in done.stdout, done.stderr[-2000:]
    return Dom(done.stdout)


def fetch(url: str, token: str | None = None) -> tuple[int, str, bytes]:
    """GET ``url`` (with ``token`` as a bearer token): status, content type, body."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


class NoStats:
    def stats(self) -> dict[str, dict[str, float]]:
        return {"test": {"requests_total": 3, "open": 1}}


@needs_chromium
def test_the_page_shows_a_live_node_its_collection_writer_and_shards_and_a_new_collection(
        cluster_config: ClusterConfig, tmp_path: Path) -> None:
    port = free_ports(1)[0]
    n1 = node(tmp_path, "n1", cluster_config, metrics_port=port).start()
    try:
        with StoreClient(n1.address) as client:
            client.create_collection("vectors.a", dim=DIM)
            for vectors, ids in batches(3):  # seals shard 1
                client.append("vectors.a", vectors, ids, durable=True)
            wait_for("shard 1 published", lambda: published(cluster_config, "vectors.a"))
            wait_for("shard 1 served", lambda: '"served_by": ["n1"]' in fetch(
                f"http://127.0.0.1:{port}/cluster.json")[2].decode())
            page = render(f"http://127.0.0.1:{port}/cluster", tmp_path / "profile1")
            assert page.ids["when"].startswith("updated ") and page.styles["banner"] == "display: none;"
            assert page.row(node="n1")["address"] == n1.address
            collection = page.row(collection="vectors.a")
            assert collection["writer"].startswith("n1 (token ") and collection["shards"] == "1"
            assert collection["served"] == "1/1 (n1 1)"
            assert page.row(collection="vectors.a", shard="1")["owners"] == "n1"
            assert page.row(collection="vectors.a", shard="1")["served_by"] == "n1"
            assert page.row(collection="vectors.a", node="n1")["state"] == "live"  # its holder key
            assert page.tiles["nodes"] == "1" and page.tiles["shards"] == "1"

            client.create_collection("vectors.b", dim=DIM)
            wait_for("vectors.b in cluster.json", lambda: "vectors.b" in fetch(
                f"http://127.0.0.1:{port}/cluster.json")[2].decode())
            page = render(f"http://127.0.0.1:{port}/cluster", tmp_path / "profile2")
            assert page.row(collection="vectors.b")["shards"] == "0"
            assert page.tiles["collections"] == "2"
        status, content_type, body = fetch(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and content_type.startswith("text/plain") and b"shardmgr_cluster_member 1.0" in body
    finally:
        n1.kill()


@needs_chromium
def test_values_are_shown_as_text_and_a_failed_refresh_shows_the_banner(etcd_config: ClusterConfig,
                                                                         tmp_path: Path) -> None:
    markup = '<img src=x onerror="document.title=1">10.0.0.1:7300'
    kv = Kv(etcd_config)
    kv.put(etcd_config.key("members", "n1"), json.dumps({"node": "n1", "address": markup}).encode())
    kv.close()
    http = serve_metrics(NoStats(), "127.0.0.1", 0, etcd_config)  # type: ignore[arg-type]
    down = serve_metrics(NoStats(), "127.0.0.1", 0, ClusterConfig(  # type: ignore[arg-type]
        etcd_host="127.0.0.1", etcd_port=free_ports(1)[0], key_prefix="/x", bucket="none", etcd_timeout_s=0.5))
    try:
        page = render(f"http://127.0.0.1:{http.server_address[1]}/cluster", tmp_path / "profile1")
        assert page.row(node="n1")["address"] == markup
        assert "<img" not in page.html and "&lt;img" in page.html
        page = render(f"http://127.0.0.1:{down.server_address[1]}/cluster", tmp_path / "profile2")
        assert page.styles["banner"] == "display: block;"
        assert page.ids["banner"].startswith("Refresh failed: etcd 127.0.0.1:")
        assert page.ids["when"] == "not refreshed yet"
    finally:
        http.shutdown()
        down.shutdown()


def test_outside_cluster_mode_the_pages_are_404_and_the_metrics_are_as_before() -> None:
    http = serve_metrics(NoStats(), "127.0.0.1", 0)  # type: ignore[arg-type]
    try:
        base = f"http://127.0.0.1:{http.server_address[1]}"
        for path in ("/cluster", "/cluster.json"):
            status, _, body = fetch(base + path)
            assert status == 404 and b"without --cluster" in body
        status, content_type, body = fetch(base + "/metrics")
        assert status == 200 and content_type.startswith("text/plain; version=")
        assert b"shardmgr_test_requests_total 3.0" in body and b"shardmgr_test_open 1.0" in body
    finally:
        http.shutdown()



def test_cluster_json_is_the_status_with_the_nodes_replicas_and_the_page_loads_nothing_else(
        etcd_config: ClusterConfig) -> None:
    kv = Kv(etcd_config)
    kv.put(etcd_config.key("members", "n1"), json.dumps({"node": "n1", "address": "10.0.0.1:7300"}).encode())
    kv.close()
    http = serve_metrics(NoStats(), "127.0.0.1", 0, etcd_config, replicas=2)  # type: ignore[arg-type]
    try:
        base = f"http://127.0.0.1:{http.server_address[1]}"
        status, content_type, body = fetch(base + "/cluster.json")
        found = json.loads(body)
        assert (status, content_type, found["replicas"]) == (200, "application/json", 2)
        assert [n["node_id"] for n in found["nodes"]] == ["n1"] and found["etcd"] == etcd_config.etcd_url
        with urllib.request.urlopen(base + "/cluster", timeout=10) as answer:
            assert answer.headers["Content-Type"] == "text/html; charset=utf-8"
            assert "default-src 'none'" in answer.headers["Content-Security-Policy"]
            page = answer.read().decode()
        assert "http://" not in page and "https://" not in page  # no external asset
    finally:
        http.shutdown()


@needs_chromium
def test_the_page_shows_failing_uploads_rows_not_yet_published_suspects_and_gone_nodes(
        etcd_config: ClusterConfig, tmp_path: Path) -> None:
    from tests.shardmgr.cluster.operations.test_status import populate, put_report

    populate(etcd_config, serving=True)  # n1 writes c: 3 published shards of 100 rows; holder "gone" of d
    put_report(etcd_config, "n1", unpublished={"c": {4: [100, 3, True], 5: [20, 0, False]}},
               failing=[("c", 4, "shard", 7, "ObjectStoreDenied: s3 http://10.0.0.9:8333: put c/4: denied")])
    put_report(etcd_config, "gone", unpublished={"d": {2: [30, 0, False]}}, age_s=120)
    put_report(etcd_config, "n2", unpublished={}, age_s=100)  # a member whose reporter is late
    http = serve_metrics(NoStats(), "127.0.0.1", 0, etcd_config)  # type: ignore[arg-type]
    try:
        page = render(f"http://127.0.0.1:{http.server_address[1]}/cluster", tmp_path / "profile")
    finally:
        http.shutdown()
    assert page.row(node="n2")["state"].startswith("suspect: its report is 10")  # 100 s and what the test took
    n1 = page.row(node="n1")
    assert (n1["state"], n1["unpublished"], n1["failing"]) == ("ok", "c 117", "1")
    assert n1["report"].endswith(" s ago")
    c = page.row(collection="c")
    assert (c["rows"], c["deleted"], c["published_rows"], c["unpublished_rows"], c["failing"]) == (
        "417", "3", "300", "117", "1")
    failing = page.row(node="n1", collection="c", shard="4")
    assert (failing["what"], failing["tries"]) == ("shard", "7") and failing["error"].startswith("ObjectStoreDenied")
    gone = page.row(node="gone")
    assert (gone["unpublished"], gone["holds"]) == ("d 30", "d") and gone["report"].startswith("12")
    assert "counted from its last report" in page.row(collection="d", missing="0")["missing"]
    assert page.row(collection="d")["rows"] == "30 (partial)"
    assert (page.tiles["unpublished"], page.tiles["failing"], page.tiles["gone"], page.tiles["rows"]) == (
        "147", "1", "1", "447")


@needs_chromium
def test_with_tokens_a_browser_sees_no_cluster_data_until_it_logs_in_and_then_the_page(
        cluster_config: ClusterConfig, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    reader, writer = add_token(tokens, "dashboard", ["read"]), add_token(tokens, "ingest", ["write"])
    port = free_ports(1)[0]
    n1 = node(tmp_path, "n1", cluster_config, metrics_port=port, extra=("--auth-file", str(tokens))).start()
    base = f"http://127.0.0.1:{port}"
    try:
        with StoreClient(n1.address, token=writer) as client:
            client.create_collection("private.vectors", dim=DIM)
        wait_for("the collection in cluster.json", lambda: b"private.vectors" in fetch(base + "/cluster.json",
                                                                                           reader)[2])
        with Browser(tmp_path / "profile") as browser:
            tab = browser.open(base + "/cluster")
            shown = tab.evaluate("document.documentElement.outerHTML")
            assert tab.evaluate("document.title") == "shardmgr: log in" and 'name="token"' in shown
            assert "private.vectors" not in shown and n1.address not in shown
            tab.navigate(base + "/cluster.json")  # the data itself, asked for by the browser
            refused = tab.evaluate("document.body.innerText")
            assert "needs a token" in refused and "private.vectors" not in refused and n1.address not in refused
            tab.navigate(base + "/cluster")

            tab.evaluate("document.getElementById('token').focus()")
            tab.type(reader)
            tab.evaluate("document.querySelector('button[type=submit]').click()")
            tab.wait_for("document.querySelector('[data-collection=\"private.vectors\"]') !== null")
            assert tab.evaluate("document.getElementById('where').textContent").startswith(cluster_config.etcd_url)
            assert tab.evaluate("document.querySelector('[data-node=\"n1\"] [data-field=address]').textContent") \
                == n1.address
            assert tab.evaluate("location.href") == base + "/cluster"  # the token is in no URL
            assert tab.evaluate("document.cookie") == ""  # HttpOnly: the page's script cannot read the session
            [cookie] = browser.cookies()
            assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"]) == \
                (f"shardmgr_session_{port}", True, "Strict")  # the port in the name: one cookie per node
            assert cookie["value"] != reader and reader not in cookie["value"]
        assert fetch(base + "/cluster.json")[0] == 401 and fetch(base + "/metrics")[0] == 401
        assert not [line for line in n1.log if reader in line or writer in line]
    finally:
        n1.kill()


def test_with_tokens_both_pages_refuse_a_request_without_a_valid_token(etcd_config: ClusterConfig,
                                                                      tmp_path: Path) -> None:
    kv = Kv(etcd_config)
    kv.put(etcd_config.key("members", "n1"), json.dumps({"node": "n1", "address": "10.9.8.7:7300"}).encode())
    kv.close()
    tokens = tmp_path / "tokens"
    reader, worker = add_token(tokens, "dashboard", ["read"]), add_token(tokens, "gpu", ["worker"])
    refusals: list[str] = []
    closed = serve_metrics(NoStats(), "127.0.0.1", 0, etcd_config, auth=Authenticator(tokens),  # type: ignore[arg-type]
                           count_error=refusals.append)
    scraped = serve_metrics(NoStats(), "127.0.0.1", 0, etcd_config, auth=Authenticator(tokens),  # type: ignore[arg-type]
                            metrics_open=True)
    try:
        base = f"http://127.0.0.1:{closed.server_address[1]}"
        for path in ("/cluster", "/cluster.json", "/metrics"):
            for url, token in ((base + path, None), (f"{base}{path}?token={reader}", None),
                               (base + path, "smt_" + "A" * 43)):
                status, _, body = fetch(url, token)
                assert status == 401 and b"10.9.8.7" not in body and b"shardmgr_test" not in body, (url, body)
            status, _, body = fetch(base + path, worker)
            assert status == 403 and b"token 'gpu' has worker; these pages need role 'read'" in body, body
            assert fetch(base + path, reader)[0] == 200
        status, content_type, body = fetch(base + "/cluster.json")
        assert content_type == "application/json" and "token" in json.loads(body)["error"]
        assert refusals == (["unauthenticated"] * 3 + ["forbidden"]) * 3 + ["unauthenticated"]

        base = f"http://127.0.0.1:{scraped.server_address[1]}"  # metrics_open: /metrics alone needs no token
        status, _, body = fetch(base + "/metrics")
        assert status == 200 and b"shardmgr_test_requests_total 3.0" in body
        assert fetch(base + "/cluster.json")[0] == 401 and fetch(base + "/cluster")[0] == 401
        assert fetch(base + "/other")[0] == 401
    finally:
        closed.shutdown()
        scraped.shutdown()
