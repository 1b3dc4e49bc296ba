"""The loop of a node's background threads (the node's and the cache's):
one pass each time the thread is woken, and at least every interval.

A pass that raises does not end the thread: a ClusterError (etcd or S3
unreachable, say) is logged as a warning, anything else with its traceback,
and the thread pauses ``ERROR_PAUSE_S`` before it looks again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from shardmgr.cluster.errors import ClusterError

log = logging.getLogger(__name__)

ERROR_PAUSE_S = 1.0
"""The pause after a pass failed."""


def run_passes(stop: threading.Event, wake: threading.Event, every_s: float, one_pass: Callable[[], None],
               what: str) -> None:
    """Call ``one_pass()`` when ``wake`` is set or ``every_s`` passed, until ``stop`` is set."""
    while not stop.is_set():
        wake.wait(every_s)
        wake.clear()
        if stop.is_set():
            return
        try:
            one_pass()
        except ClusterError as e:
            log.warning("%s: %s (retried)", what, e)
            stop.wait(ERROR_PAUSE_S)
        except Exception:
            log.exception("%s: a pass failed (retried)", what)
            stop.wait(ERROR_PAUSE_S)
