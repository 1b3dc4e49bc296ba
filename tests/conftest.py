from __future__ import annotations

import os
import random
from collections.abc import Iterator

import pytest
from hypothesis import settings

from common.journal import Flusher, FlusherConfig

random.seed(1337)
settings.register_profile("default", deadline=None)
settings.register_profile("soak", deadline=None, max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def flusher() -> Iterator[Flusher]:
    """A running flusher with a short interval, stopped after the test."""
    with Flusher(FlusherConfig(interval=0.002)) as f:
        yield f


@pytest.fixture(autouse=True)
def _no_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients read SHARDMGR_TOKEN; a developer's own must not change what tests send."""
    monkeypatch.delenv("SHARDMGR_TOKEN", raising=False)
