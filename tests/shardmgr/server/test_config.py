"""Every number of seconds in the configuration must be finite (NaN and inf
used to pass the "positive" checks); ServerConfig validates the queue's and
the store's tables too."""

from __future__ import annotations

import dataclasses
import math

import pytest

from shardmgr.server.config import ServerConfig
from shardmgr.store.config import StoreConfig
from workq.config import WorkqConfig

SECONDS = [("server", name) for name in ("send_timeout_s", "handshake_timeout_s", "shutdown_timeout_s")] + \
    [("workq", name) for name in ("idle_seal_s", "lease_s", "disconnect_grace_s", "reconnect_window_s")] + \
    [("store", "idle_seal_s")]


def configured(table: str, name: str, value: float) -> ServerConfig:
    if table == "server":
        return dataclasses.replace(ServerConfig(), **{name: value})
    if table == "workq":
        return ServerConfig(workq=dataclasses.replace(WorkqConfig(), **{name: value}))
    return ServerConfig(store=dataclasses.replace(StoreConfig(), **{name: value}))


@pytest.mark.parametrize("table, name", SECONDS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_seconds_settings_must_be_finite_numbers(table: str, name: str, bad: float) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a .*finite number of seconds"):
        configured(table, name, bad).validate()
    configured(table, name, 1.5).validate()
