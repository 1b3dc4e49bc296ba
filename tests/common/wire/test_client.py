"""RpcClient's own arguments: every number of seconds is checked when the
client is built (a NaN ``retry_for`` used to retry connecting forever)."""

from __future__ import annotations

import math

import pytest

from common.wire.client import MAX_CLIENT_SECONDS, RpcClient


@pytest.mark.parametrize("name", ["timeout", "connect_timeout", "retry_for"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, MAX_CLIENT_SECONDS * 2])
def test_seconds_outside_their_range_are_refused(name: str, bad: float) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a number of seconds in 0..86400"):
        RpcClient(("127.0.0.1", 1), **{name: bad})


def test_no_response_timeout_is_allowed() -> None:
    assert RpcClient(("127.0.0.1", 1), timeout=None).timeout is None


def test_a_command_that_is_not_a_string_is_refused_before_anything_is_sent() -> None:
    """Both builds raise TypeError (compiled: the typed parameter; pure: send's own check)."""
    client = RpcClient(("127.0.0.1", 9), retry_for=0.0)  # nothing listens there: a send would fail to connect
    with pytest.raises(TypeError):
        client.send(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.call(b"ping")  # type: ignore[arg-type]
