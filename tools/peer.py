"""What tools/bench_workq.py asks of each system it measures: the Peer interface.

A Peer starts its server on a free loopback port with a data directory under
``base`` and plays four client roles. Each role connects first, then calls
``begin()`` right before its timed loop, so the benchmark's clocks and CPU
readings leave connection set-up out:

* ``produce`` — one producer enqueues ``items`` tasks, ``batch`` per call
  (``batch == 1``: one plain call per item, no pipelining);
* ``work`` — run in a worker process: lease up to ``batch`` tasks, store a
  result per task and retire the task, until ``stop`` is set and nothing is
  left (``batch == 1``: one lease call per item, one completion per item);
* ``consume`` — collect results until ``items`` have arrived (always batched:
  the consumer is not what B measures);
* ``produce_single`` — enqueue one task per call, waiting for each reply,
  until ``seconds`` have passed; answers how many (the concurrent-producers
  mode runs many of these at once, each in its own process).

Each Peer also says how it is driven, so that tools/bench_workq.py pairs only
like with like (``pairing``): when an acknowledged write is durable
(``durability``), whether its producer keeps calls in flight (``pipelined``)
and how many round trips its worker spends per lease-and-complete cycle
(``worker_trips``).
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Called once a role is connected and ready; the measured part starts after it returns.
Begin = Callable[[], object]

JOB = "job"  # the one job/stream/tube/subject name every driver uses for tasks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, timeout: float = 30.0) -> None:
    """Return once something accepts connections on ``port``; RuntimeError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


#: ``durability`` values: the reply comes after the fsync that covers the write (Redis ``always``,
#: workq ``durable=True``), or before it, the write being fsynced within the system's interval
#: (Redis ``everysec``, workq's group commit, beanstalkd ``-f 5``, JetStream's periodic sync)
SYNCED = "ack after fsync"
LATER = "ack before fsync"

#: which of a Peer's properties must match for each phase's figure to be compared
PHASE_PAIRING = {"enqueue_per_s": ("durability", "pipelined"),
                 "work_per_s": ("durability", "worker_trips"),
                 "end_to_end_per_s": ("durability", "pipelined", "worker_trips")}


class Peer:
    """One system under test. Subclasses set ``name`` and implement the roles."""

    name = "peer"
    durability = LATER
    #: the producer sends its next call before the reply to the last (a pipeline, async calls)
    pipelined = False
    #: round trips per worker cycle: 2 = lease (read), then complete; 1 = the completion rides with the next lease
    worker_trips = 2
    proc: subprocess.Popen[Any]

    @classmethod
    def pairing(cls, phase: str) -> tuple[object, ...]:
        """What must be equal for this peer's ``phase`` figure to be compared with another's."""
        return tuple(getattr(cls, attribute) for attribute in PHASE_PAIRING[phase])

    @classmethod
    def driven(cls) -> str:
        """How it is driven, in words, for the tables."""
        producer = "pipelined" if cls.pipelined else "waits"
        return f"{cls.durability}, {producer}, {cls.worker_trips} trip{'s' if cls.worker_trips > 1 else ''}"

    @property
    def pid(self) -> int:
        """The server process: its CPU time and RSS are what the benchmark reads."""
        return self.proc.pid

    def start(self, base: Path) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Terminate the server we started (SIGTERM, then SIGKILL after 30 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def produce(self, items: int, batch: int, size: int, begin: Begin) -> None:
        raise NotImplementedError

    def work(self, index: int, batch: int, size: int, begin: Begin, stop: Any) -> None:
        raise NotImplementedError

    def consume(self, items: int, begin: Begin) -> None:
        raise NotImplementedError

    def produce_single(self, seconds: float, size: int, begin: Begin) -> int:
        raise NotImplementedError

    def leftover(self) -> int | None:
        """Tasks still in the input queue after the work phase (None: not checked).
        A correct run leaves 0: every worker retires what it completes."""
        return None
