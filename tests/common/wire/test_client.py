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
