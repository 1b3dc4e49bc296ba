"""The cluster's status as one self-contained HTML page (``/cluster`` on a
node's metrics port; shardmgr/server/metrics.py serves it).

The page has no external assets (no CDN, fonts or images: it must work
offline) and no data in its HTML: its script fetches ``cluster.json`` (the
same directory: ``/cluster.json``, :meth:`ClusterStatus.as_dict`) at once
and every ``REFRESH_MS``, and renders nodes (their health, report age,
rows not yet published, failing uploads), collections with their writers
and whole counts (live, deleted, published, not yet published), failing
uploads, nodes gone without a clean stop, shards with their owners and
where they are served, holders and bytes. Every value from etcd is put into the page as text
(``textContent``, never ``innerHTML``), so an address or key holding markup
shows as what it is. A failed fetch (or one taking over 10 s) shows a red
banner saying what failed and since when, and keeps the last data shown;
the header says when the last refresh succeeded. Elements carry
``data-node``, ``data-collection`` and ``data-field`` attributes for tests
and scripts.
"""

from __future__ import annotations

REFRESH_MS = 2000
#: at most this many shard rows are drawn (the rest are counted); the JSON has them all
MAX_SHARD_ROWS = 500

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>shardmgr cluster</title>
<style>
  :root { --fg: #1d2330; --muted: #667085; --line: #e4e7ec; --bg: #f7f8fa; --ok: #12805c; --bad: #c4320a; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
         background: var(--bg); }
  header { display: flex; align-items: baseline; gap: 16px; padding: 14px 24px; background: #fff;
           border-bottom: 1px solid var(--line); flex-wrap: wrap; }
  header h1 { font-size: 18px; margin: 0; }
  header .where { color: var(--muted); font-family: ui-monospace, monospace; }
  header .when { margin-left: auto; color: var(--muted); }
  #banner { display: none; margin: 12px 24px 0; padding: 10px 14px; border-radius: 6px; background: #fee4e2;
            color: var(--bad); border: 1px solid #fda29b; font-weight: 600; }
  main { padding: 8px 24px 24px; }
  .tiles { display: flex; gap: 12px; flex-wrap: wrap; margin: 12px 0; }
  .tile { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 10px 16px; min-width: 130px; }
  .tile .n { font-size: 22px; font-weight: 650; }
  .tile .l { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
  h2 { font-size: 15px; margin: 20px 0 8px; }
  table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid var(--line);
          border-radius: 8px; overflow: hidden; }
  th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: middle; }
  th { background: #f2f4f7; font-size: 12px; color: var(--muted); font-weight: 600; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .mono { font-family: ui-monospace, monospace; font-size: 13px; }
  .ok { color: var(--ok); } .bad { color: var(--bad); font-weight: 600; } .muted { color: var(--muted); }
  .empty { color: var(--muted); padding: 8px 0; }
</style>
</head>
<body>
<header>
  <h1>shardmgr cluster</h1>
  <span class="where" id="where">loading&hellip;</span>
  <span class="when" id="when">not refreshed yet</span>
</header>
<div id="banner" role="alert"></div>
<main id="main"></main>
<script>
"use strict";
const REFRESH_MS = @REFRESH_MS@, FETCH_TIMEOUT_MS = 10000, MAX_SHARD_ROWS = @MAX_SHARD_ROWS@;
let lastOk = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
function num(n) { return n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US"); }
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0, v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i ? v.toFixed(1) : String(v)) + " " + units[i];
}
function cell(field, value, cls) { return el("td", {"data-field": field, class: cls || ""}, value); }
function table(headers, rows, empty) {
  if (!rows.length) return el("div", {class: "empty"}, empty);
  return el("table", {}, el("thead", {}, el("tr", {}, ...headers.map(h => el("th", {}, h)))),
            el("tbody", {}, ...rows));
}
function counts(list) {
  const by = {};
  for (const n of list) by[n] = (by[n] || 0) + 1;
  return Object.keys(by).sort().map(n => n + " " + by[n]).join(", ");
}
function tile(label, value, field) {
  return el("div", {class: "tile"}, el("div", {class: "n", "data-field": field}, value),
            el("div", {class: "l"}, label));
}

function ago(seconds) { return seconds === null || seconds === undefined ? "-" : seconds.toFixed(1) + " s ago"; }
function rowsBy(m) {
  if (m === null || m === undefined) return el("span", {class: "muted"}, "not reported");
  return Object.keys(m).sort().map(c => c + " " + num(m[c])).join(", ") || "0";
}
function nodeRows(s) {
  return s.nodes.map(n => {
    const ttl = n.ttl_s === null ? "-" : (n.ttl_s < 0 ? "expired" : n.ttl_s + " / " + n.granted_ttl_s + " s");
    const serving = n.serving === null ? el("span", {class: "muted"}, "not reported")
      : (Object.keys(n.serving).sort().map(c => c + " " + n.serving[c].length).join(", ") || "nothing");
    return el("tr", {"data-node": n.node_id}, cell("node", n.node_id, "mono"), cell("address", n.address, "mono"),
              cell("lease", n.lease, "mono"), cell("ttl", ttl, n.ttl_s !== null && n.ttl_s < 0 ? "bad" : ""),
              n.suspect ? cell("state", "suspect: " + n.suspect, "bad") : cell("state", "ok", "ok"),
              cell("report", n.report_age_s === null ? "not reported" : ago(n.report_age_s)),
              cell("writes", n.writes.join(", ")), cell("serving", serving),
              cell("unpublished", rowsBy(n.unpublished_rows)),
              cell("failing", n.failing.length, "num" + (n.failing.length ? " bad" : "")));
  });
}
function failingRows(s) {
  const rows = [];
  for (const n of s.nodes.concat(s.gone)) for (const f of n.failing) {
    rows.push(el("tr", {"data-node": n.node_id, "data-collection": f.collection, "data-shard": f.shard_id},
                 cell("node", n.node_id, "mono"), cell("collection", f.collection, "mono"),
                 cell("shard", f.shard_id, "num"), cell("what", f.what), cell("tries", f.tries, "num"),
                 cell("since", ago(s.read_at - f.since)), cell("error", f.error, "mono bad")));
  }
  return rows;
}
function goneRows(s) {
  return s.gone.map(g => el("tr", {"data-node": g.node_id}, cell("node", g.node_id, "mono"),
    cell("address", g.address, "mono"), cell("report", ago(g.report_age_s)),
    cell("unpublished", rowsBy(g.unpublished_rows)),
    cell("holds", g.holds.join(", ") || "-", g.holds.length ? "bad" : "")));
}
function writerCell(c) {
  if (!c.writer) return cell("writer", el("span", {class: "muted"}, "none"));
  const text = c.writer.node_id + " (token " + c.writer.revision + ")";
  return c.writer.live ? cell("writer", text, "mono")
    : cell("writer", el("span", {class: "bad"}, text + ", not a member"), "mono");
}
function collectionRows(s) {
  return s.collections.map(c => {
    const served = c.served === null ? el("span", {class: "muted"}, "not reported")
      : c.served + "/" + c.shards.length + (c.served ? " (" + counts(c.shards.flatMap(x => x.served_by)) + ")" : "");
    const params = c.dim === null ? el("span", {class: "bad"}, "not in the catalog")
      : c.dim + "-d, " + c.metric + ", " + c.index;
    return el("tr", {"data-collection": c.name}, cell("collection", c.name, "mono"), cell("params", params),
              writerCell(c), cell("shards", c.shards.length, "num"),
              cell("rows", num(c.rows) + (c.missing.length ? " (partial)" : ""),
                   "num" + (c.missing.length ? " bad" : "")),
              cell("deleted", num(c.deleted), "num"), cell("published_rows", num(c.published_rows), "num"),
              cell("unpublished_rows", num(c.unpublished_rows), "num"),
              cell("deletes_unpublished", num(c.deletes_unpublished), "num"),
              cell("failing", num(c.failing), "num" + (c.failing ? " bad" : "")),
              el("td", {"data-field": "bytes", class: "num", title: num(c.bytes) + " bytes"}, bytes(c.bytes)),
              cell("owners", counts(c.shards.flatMap(x => x.owners))), cell("served", served));
  });
}
function shardRows(s) {
  const rows = [];
  for (const c of s.collections) for (const x of c.shards) {
    if (rows.length >= MAX_SHARD_ROWS) break;
    const served = x.served_by === null ? el("span", {class: "muted"}, "not reported")
      : (x.served_by.length ? x.served_by.join(", ") : el("span", {class: "bad"}, "nowhere"));
    rows.push(el("tr", {"data-collection": c.name, "data-shard": x.shard_id}, cell("collection", c.name, "mono"),
                 cell("shard", x.shard_id, "num"), cell("rows", num(x.rows), "num"),
                 cell("deleted", x.deleted === null ? "unknown" : num(x.deleted), "num"),
                 el("td", {"data-field": "bytes", class: "num", title: num(x.bytes) + " bytes"}, bytes(x.bytes)),
                 cell("published", x.writer + " (token " + x.writer_revision + ")", "mono"),
                 cell("owners", x.owners.join(", ") || "-", "mono"), cell("served_by", served, "mono")));
  }
  return rows;
}
function holderRows(s) {
  return s.holders.map(h => el("tr", {"data-collection": h.collection, "data-node": h.node_id},
    cell("collection", h.collection, "mono"), cell("node", h.node_id, "mono"),
    h.unavailable ? cell("state", "not a member: rows unavailable until node returns", "bad")
      : cell("state", (h.live ? "live" : "not a member") + (h.clean ? ", clean" : ""), h.live ? "ok" : "")));
}

function render(s) {
  document.getElementById("where").textContent = s.etcd + " @ revision " + s.revision;
  const main = document.getElementById("main");
  const unpublished = s.collections.reduce((sum, c) => sum + c.unpublished_rows, 0);
  const failing = failingRows(s);
  const parts = [
    el("div", {class: "tiles"}, tile("nodes", s.nodes.length, "nodes"), tile("collections", s.collections.length,
       "collections"), tile("published shards", num(s.shards), "shards"), tile("live rows", num(s.rows), "rows"),
       tile("not yet published", num(unpublished), "unpublished"), tile("failing uploads", failing.length, "failing"),
       tile("gone nodes", s.gone.length, "gone"), tile("in object storage", bytes(s.bytes), "bytes")),
    el("h2", {}, "Nodes"),
    table(["node", "address", "lease", "ttl", "state", "report", "writes", "serving", "not yet published",
           "failing uploads"], nodeRows(s), "no live nodes"),
    el("h2", {}, "Collections"),
    table(["collection", "parameters", "writer", "shards", "live rows", "deleted", "published", "not yet published",
           "deletes not yet published", "failing uploads", "bytes",
           "owners (rendezvous, " + s.replicas + " per shard)", "served"], collectionRows(s), "no collections"),
  ];
  const partial = s.collections.flatMap(c => c.missing.map((m, i) =>
    el("tr", {"data-collection": c.name, "data-missing": i}, cell("collection", c.name, "mono"),
       cell("missing", m, "bad"))));
  if (partial.length) parts.push(el("h2", {}, "Counts that are not whole"), table(["collection", "not counted"],
                                 partial, ""));
  parts.push(el("h2", {}, "Failing uploads (retried)"),
             table(["node", "collection", "shard", "what", "tries", "since", "last error"], failing, "none"),
             el("h2", {}, "Gone: not members, did not stop cleanly"),
             table(["node", "address", "last report", "not yet published", "holds unpublished rows of"], goneRows(s),
                   "none"),
             el("h2", {}, "Published shards"),
             table(["collection", "shard", "rows", "deleted", "bytes", "published by", "owners", "served by"],
                   shardRows(s), "no published shards"));
  if (s.shards > MAX_SHARD_ROWS) parts.push(el("div", {class: "empty"}, "first " + MAX_SHARD_ROWS + " of " +
                                                num(s.shards) + " shards shown; cluster.json has them all"));
  parts.push(el("h2", {}, "Holders of unpublished rows"),
             table(["collection", "node", "state"], holderRows(s), "none"));
  if (s.problems.length) parts.push(el("h2", {}, "Keys that did not decode"),
    table(["key", "problem"], s.problems.map(p => el("tr", {}, cell("key", p.key, "mono"), cell("problem", p.error))),
          ""));
  main.replaceChildren(...parts);
}

function banner(text) {
  const b = document.getElementById("banner");
  b.textContent = text;
  b.style.display = text ? "block" : "none";
}

async function refresh() {
  try {
    const answer = await fetch("cluster.json", {cache: "no-store", signal: AbortSignal.timeout(FETCH_TIMEOUT_MS)});
    const body = await answer.json();
    if (!answer.ok) throw new Error(body.error || ("HTTP " + answer.status));
    render(body);
    lastOk = new Date();
    banner("");
    document.getElementById("when").textContent = "updated " + lastOk.toLocaleTimeString("en-GB");
  } catch (e) {
    banner("Refresh failed: " + e.message + (lastOk ? " (showing the status of " +
           lastOk.toLocaleTimeString("en-GB") + ")" : ""));
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}
refresh();
</script>
</body>
</html>
""".replace("@REFRESH_MS@", str(REFRESH_MS)).replace("@MAX_SHARD_ROWS@", str(MAX_SHARD_ROWS))
