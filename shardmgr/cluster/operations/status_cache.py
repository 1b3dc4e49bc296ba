"""One read of the cluster's status shared among callers: the metrics
port's ``/cluster`` page and ``/cluster.json``, refreshed by many browsers,
cost etcd one read per ``max_age_s``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import ClusterError
from shardmgr.cluster.operations.status import ClusterStatus, read_status
from shardmgr.cluster.state.kv import Kv


class StatusCache:
    """The cluster's status at most ``max_age_s`` old (a failed read too:
    its error is raised again until then). One read at a time: callers
    that arrive during a read wait for it and share it. Thread-safe."""

    def __init__(self, config: ClusterConfig, *, max_age_s: float = 1.0, replicas: int = 1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.max_age_s = max_age_s
        self.replicas = replicas
        self._clock = clock
        self._lock = threading.Lock()
        self._kv: Kv | None = None
        self._at = -float("inf")
        self._last: ClusterStatus | ClusterError | None = None

    def get(self) -> ClusterStatus:
        """The cached status, or a new read if it is older than ``max_age_s``
        (ClusterError if that read, or the cached one, failed)."""
        with self._lock:
            if self._last is None or self._clock() - self._at >= self.max_age_s:
                if self._kv is None:
                    self._kv = Kv(self.config)
                try:
                    self._last = read_status(self.config, kv=self._kv, replicas=self.replicas)
                except ClusterError as e:
                    self._last = e
                self._at = self._clock()
            last = self._last
        if isinstance(last, ClusterError):
            raise last.with_traceback(None)  # not a traceback that grows at every raise
        return last

    def close(self) -> None:
        with self._lock:
            if self._kv is not None:
                self._kv.close()
                self._kv = None
