"""A search sent to any node of the cluster: fan out, merge, say what is missing.

The node that receives ``shardmgr.search`` coordinates it:

1. It checks the queries, k and params exactly as a single store does
   (the collection exists on every node: the catalog).
2. It takes the collection's plan (routing.py) for its current cluster
   state, made once per state change, and the rows this node acknowledged
   as deleted that are not published yet (acked_deletes.py).
3. It asks every node of the plan at once (``shardmgr.search_shards``; itself
   directly, on the calling thread, while the others answer), each to skip
   those of them in the shards asked of it as it skips its own deleted ones.
4. A node that cannot be reached or fails, and each shard a node says it no
   longer has, is asked of the shard's next alternate, round after round,
   until every shard is answered or has no alternate left. A holder that
   fails is missing (nobody else has its unpublished rows).
5. The parts are merged with the single store's merge. The result is
   ``partial`` when anything is missing, and ``missing`` names it.

So with every shard served and every holder alive, a search returns what
one store holding all the rows returns (the same per-shard faiss searches
and the same merge): tested against one.

Threads: connection threads call :meth:`FanOut.search` concurrently; the
peer calls run on a shared pool of ``fanout`` threads (also a count's
report requests: :meth:`FanOut.at_once`, query.py).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from shardmgr.cluster.peers import Peers
from shardmgr.cluster.published.acked_deletes import AckedDeletes, asked
from shardmgr.cluster.published.mirror import ClusterMirror, ClusterState
from shardmgr.cluster.query.routing import Ask, Plan, holder_missing, plan, shard_missing
from shardmgr.cluster.query.shard_search import ShardSearch
from shardmgr.store import (
    SEARCH_SECONDS_PER_VALUE,  # a peer search's allowance, as a client's
    Hits,
    SearchResult,
    Store,
    check_params,
    inputs,
    merge,
)

log = logging.getLogger(__name__)

THREADS = 16
T = TypeVar("T")

Answer = tuple[Hits, list[int]]


class FanOut:
    """Coordinates searches from this node (module docstring)."""

    def __init__(self, node_id: str, store: Store, mirror: ClusterMirror, local: ShardSearch, peers: Peers,
                 acked: AckedDeletes | None = None) -> None:
        self.node_id = node_id
        self.acked = acked if acked is not None else AckedDeletes()
        self.store = store
        self.mirror = mirror
        self.local = local
        self.peers = peers
        self._plans: tuple[ClusterState | None, dict[str, Plan]] = (None, {})
        self._pool = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="fanout")
        self.counters = {"searches_total": 0, "partial_searches_total": 0, "peer_failures_total": 0}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def search(self, name: str, queries: Any, k: int, params: dict[str, int] | None) -> SearchResult:
        collection = self.store.collection(name)
        checked = inputs.vectors(queries, collection.dim, "queries", max_rows=self.store.config.max_queries)
        k = inputs.k(k, self.store.config.max_k)
        chosen = check_params(params)
        self.counters["searches_total"] += 1
        if not len(checked):
            return SearchResult(np.zeros((0, k), np.float32), np.zeros((0, k), np.int64), np.zeros((0, k), np.int64))
        state, deleted = self.acked.refs(name, self.mirror.state)
        the_plan = self.plan(name, state)
        parts, missing = self._gather(the_plan, lambda node, ask: self._ask(node, name, checked, k, chosen, ask,
                                                                            the_plan.published, deleted))
        if missing:
            self.counters["partial_searches_total"] += 1
        hits = merge([(h.scores, h.ids, h.refs) for h in parts], len(checked), k, collection.metric)
        return SearchResult(hits.scores, hits.ids, hits.refs, missing)

    def plan(self, name: str, state: ClusterState | None = None) -> Plan:
        """The collection's plan at ``state`` (default: this node's current
        cluster state; made once per state)."""
        state = state if state is not None else self.mirror.state()
        cached_state, plans = self._plans
        if cached_state is not state:
            plans = {}
            self._plans = (state, plans)
        found = plans.get(name)
        if found is None:
            found = plans[name] = plan(state, name)
        return found

    def _gather(self, the_plan: Plan, ask: Callable[[str, Ask], Answer]) -> tuple[list[Hits], list[str]]:
        """Every part of the plan's answer, with the rounds of step 4."""
        parts: list[Hits] = []
        missing = list(the_plan.missing)
        tried: dict[int, int] = {}  # shard -> alternates used
        asks = dict(the_plan.asks)
        while asks:
            retry: list[int] = []
            for node, (answer, error) in self._round(asks, ask).items():
                if answer is not None:
                    parts.append(answer[0])
                    retry.extend(answer[1])
                    continue
                self.counters["peer_failures_total"] += 1
                log.warning("search of %s: node %s failed (%s); asking others", the_plan.collection, node, error)
                retry.extend(asks[node].shards)
                if asks[node].unpublished:
                    missing.append(holder_missing(node) if node != self.node_id else f"rows held here: {error}")
            asks = {}
            for shard_id in retry:
                used = tried.get(shard_id, 0)
                alternates = the_plan.alternates.get(shard_id, ())
                if used >= len(alternates):
                    missing.append(shard_missing(shard_id))
                    continue
                tried[shard_id] = used + 1
                node = alternates[used]
                asks[node] = Ask((*asks[node].shards, shard_id) if node in asks else (shard_id,), False)
        return parts, missing

    def _round(self, asks: dict[str, Ask],
               ask: Callable[[str, Ask], Answer]) -> dict[str, tuple[Answer | None, BaseException | None]]:
        """Ask every node at once."""
        return self.at_once({node: functools.partial(ask, node, a) for node, a in asks.items()})

    def at_once(self, calls: Mapping[str, Callable[[], T]]) -> dict[str, tuple[T | None, BaseException | None]]:
        """Each node's call at once: the others' on the pool, this node's on
        the calling thread; per node, its answer or its error."""
        futures = {node: self._pool.submit(call) for node, call in calls.items() if node != self.node_id}
        results: dict[str, tuple[T | None, BaseException | None]] = {}
        if self.node_id in calls:
            results[self.node_id] = _outcome(calls[self.node_id])
        for node, future in futures.items():
            results[node] = _outcome(future.result)
        return results

    def _ask(self, node: str, name: str, queries: np.ndarray, k: int, params: dict[str, int], ask: Ask,
             published: np.ndarray, deleted: np.ndarray | None) -> Answer:
        deleted = asked(deleted, ask.shards, ask.unpublished, published)
        if node == self.node_id:
            return self.local.search(name, queries, k, params, ask.shards, ask.unpublished, published, deleted)
        address = self.mirror.state().members.get(node)
        if not address:
            raise ConnectionError(f"node {node} is not a member now")
        args: dict[str, Any] = {"name": name, "k": k, "shards": list(ask.shards), "unpublished": ask.unpublished}
        if params:
            args["params"] = params
        parts = {"queries": queries, "exclude": published if ask.unpublished else published[:0]}
        if deleted is not None:  # (only then: a node of an earlier version never sees the part)
            parts["deleted"] = deleted
        timeout = self.peers.options["timeout"] + queries.size * SEARCH_SECONDS_PER_VALUE
        with self.peers.client(address) as client:
            reply = client.call("shardmgr.search_shards", args, parts, timeout=timeout)
        found = reply.parts
        return Hits(found["scores"], found["ids"], found["refs"]), [int(i) for i in reply.result["not_here"]]


def _outcome(call: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    try:
        return call(), None
    except Exception as e:  # any failure of one node is that node's: the others' answers still count
        return None, e
