"""How many examples a slow property test runs, by Hypothesis settings profile.

tests/conftest.py registers two profiles and loads the one named by
``HYPOTHESIS_PROFILE``:

* ``default`` (the default run, ``pytest``): Hypothesis's own 100 examples
  per property test, and no deadline (a loaded machine is slow, not wrong);
* ``soak`` (``HYPOTHESIS_PROFILE=soak pytest ...``, see README): 2,000
  examples per property test.

A property test whose every example is slow (it damages and verifies a
real directory, restarts a broker, talks to a live server) asks
:func:`examples` for its count, so the default run stays within its time
budget while the soak profile runs many more: nothing is dropped, only
moved to the soak run.
"""

from __future__ import annotations

from hypothesis import settings


def soaking() -> bool:
    """True under a profile that asks for more examples than the default one (the soak profile)."""
    return settings().max_examples > settings.get_profile("default").max_examples


def examples(default: int, soak: int | None = None) -> int:
    """``default`` examples in the default run; under the soak profile
    ``soak`` (for tests whose examples take seconds), else the profile's own
    count."""
    if not soaking():
        return default
    return soak if soak is not None else settings().max_examples
