"""The contract between the service and the components it hosts.

A component (the work queue, the vector store, the server's own control
commands) names the commands it serves and handles each request. The server
owns sockets and threads for I/O; components own their state.

Threads: the server calls :meth:`Component.handle` on the connection's own
reader thread. A component either answers there (only for work that is
quick and thread-safe) or hands the request to its owner thread and answers
from it later. Every request must be answered exactly once, by
:meth:`Request.reply` or :meth:`Request.fail` (an exception escaping
``handle`` counts as ``fail``), from any thread.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Final, Protocol, TypeVar, overload

import numpy as np
from mypy_extensions import mypyc_attr

from .errors import BadRequest, ServiceError
from .framing import Body, dtype_code
from .part_views import PartViews, array_bytes

T = TypeVar("T")
D = TypeVar("D")
_MISSING: Any = object()
_CLAIMS: Final = threading.Lock()
"""Makes a request's answer one-shot (shared: a lock per request costs more, and claims are short)."""

OnSent = Callable[[], None]
"""Called once the response carrying a reply has been written to the socket."""


class Responder(Protocol):
    """Where a request's answer goes (the server's connection)."""

    def respond(self, header: dict[str, Any], parts: Body | None,
                on_sent: OnSent | None) -> None: ...


class Request:
    """One decoded request, with typed argument access and a one-shot reply."""

    __slots__ = ("id", "cmd", "args", "parts", "_responder", "_answered")

    def __init__(self, request_id: int, cmd: str, args: dict[str, Any], parts: Mapping[str, np.ndarray],
                 responder: Responder) -> None:
        self.id = request_id
        self.cmd = cmd
        self.args = args
        self.parts = parts
        self._responder = responder
        self._answered = False

    @overload
    def arg(self, name: str, kind: type[T] | tuple[type, ...]) -> T: ...

    @overload
    def arg(self, name: str, kind: type[T] | tuple[type, ...], default: D) -> T | D: ...

    def arg(self, name: str, kind: type[T] | tuple[type, ...], default: Any = _MISSING) -> Any:
        """The argument ``name``, checked to be of ``kind``; BadRequest otherwise.

        ``bool`` is not accepted where ``int`` is asked for, and ``int`` is
        accepted where ``float`` is.
        """
        if name not in self.args:
            if default is _MISSING:
                raise BadRequest(f"{self.cmd}: missing argument '{name}'")
            return default
        value = self.args[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise BadRequest(f"{self.cmd}: argument '{name}' must be {names}, got {type(value).__name__}")
        return value

    def part(self, name: str, dtype: str | Iterable[str] | None = None, ndim: int | None = None) -> np.ndarray:
        """The binary part ``name``, checked for dtype and rank; BadRequest otherwise."""
        array = self.parts.get(name)
        if array is None:
            raise BadRequest(f"{self.cmd}: missing binary part '{name}'")
        self._check(name, dtype_code(array.dtype), array.shape, dtype, ndim)
        return array

    def part_ints(self, name: str, dtype: str | tuple[str, ...], ndim: int = 1) -> list[int]:
        """:meth:`part` (an integer one) as Python ints, flattened: from a
        received frame, a few of them are read without making an array."""
        parts = self.parts
        if isinstance(parts, PartViews) and name in parts:
            self._check(name, parts.code(name), parts.shape(name), dtype, ndim)
            return parts.ints(name)
        return list(self.part(name, dtype, ndim).ravel().tolist())

    def part_view(self, name: str) -> memoryview:
        """A one-dimensional ``|u1`` part's bytes (BadRequest as :meth:`part`), without an array."""
        parts = self.parts
        if isinstance(parts, PartViews) and name in parts:
            self._check(name, parts.code(name), parts.shape(name), "|u1", 1)
            return parts.view(name)
        return array_bytes(self.part(name, "|u1", 1))

    def _check(self, name: str, code: str, shape: tuple[int, ...], dtype: str | Iterable[str] | None,
               ndim: int | None) -> None:
        """BadRequest unless a part of wire dtype ``code`` and ``shape`` is one of ``dtype`` with ``ndim`` dims."""
        allowed = (dtype,) if isinstance(dtype, str) else tuple(dtype or ())
        if allowed and code not in allowed:
            raise BadRequest(f"{self.cmd}: part '{name}' must have dtype {' or '.join(sorted(set(allowed)))}, "
                             f"got {code}")
        if ndim is not None and len(shape) != ndim:
            raise BadRequest(f"{self.cmd}: part '{name}' must have {ndim} dimensions, got shape {shape}")

    def reply(self, result: dict[str, Any] | None = None, parts: Body | None = None,
              on_sent: OnSent | None = None) -> None:
        """Answer with success. ``on_sent`` runs after the bytes reached the socket."""
        if self._claim():
            self._responder.respond({"id": self.id, "ok": result or {}}, parts, on_sent)

    def fail(self, error: ServiceError) -> None:
        """Answer with an error frame carrying the error's code and message."""
        if self._claim():
            self._responder.respond({"id": self.id, "error": {"code": error.code, "message": error.message}},
                                    None, None)

    @property
    def answered(self) -> bool:
        return self._answered

    @property
    def connection_open(self) -> bool:
        """False once the connection the request came on has closed."""
        return not getattr(self._responder, "closed", False)

    @property
    def connection_id(self) -> int:
        """Identifies the connection the request came on (see Component.connection_closed)."""
        return id(self._responder)

    def _claim(self) -> bool:
        with _CLAIMS:
            if self._answered:
                return False
            self._answered = True
            return True


@mypyc_attr(allow_interpreted_subclasses=True)  # the store's service and tests' components
class Component(abc.ABC):
    """A unit of state the server hosts. Subclasses document their commands."""

    #: Short name, used in logs, stats and metrics.
    name: ClassVar[str] = "component"  # a class attribute (compiled: one that subclasses override)

    @abc.abstractmethod
    def commands(self) -> Iterable[str]:
        """The command names this component serves (unique across the server)."""

    @abc.abstractmethod
    def handle(self, request: Request) -> None:
        """Serve one request (see the module docstring for threading rules)."""

    def recover(self) -> None:
        """Open files and recover state; runs before the server accepts
        connections. Should log what it is doing on long runs."""

    def start(self) -> None:
        """Start owner threads; runs after every component recovered."""

    def quiesce(self) -> None:
        """The server is stopping: answer waiting calls now (a long-poll
        answers what it has, perhaps nothing) instead of at their deadline.
        The server applies no new request from now on, but calls already
        made (and the ``on_sent`` callbacks of replies still being written)
        must keep working until :meth:`stop`."""

    def stop(self) -> None:
        """Flush and close. Idempotent. The connections are closed by now:
        a request answered only here reaches nobody (answer in quiesce)."""

    def connection_closed(self, connection_id: int) -> None:
        """A client connection ended (called on that connection's thread);
        release whatever it held. ``connection_id`` matches Request.connection_id."""

    def stats(self) -> dict[str, float | int]:
        """Counters and gauges, flat, for ``stats`` and metrics."""
        return {}
