"""Options of the differential fuzzer (tests/fuzz/test_differential.py).

pytest tests/fuzz                     the quick profile: a fixed set of programs (derandomized)
pytest tests/fuzz --fuzz-minutes 30   the long profile: new random programs for 30 minutes
pytest tests/fuzz --fuzz-seed N       one seed of the long profile again (a failure names its seed)
"""

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("fuzz", "openreg differential fuzzing")
    group.addoption("--fuzz-minutes", type=float, default=0.0, help="run the long profile for this many minutes")
    group.addoption("--fuzz-seed", type=int, default=None, help="rerun one seed of the long profile")


def pytest_collection_modifyitems(config, items):
    """Runs one profile: the long one when its options are given, else the quick one. The other is
    deselected (not skipped): a run says which profile it ran and reports no skips."""
    long_profile = bool(config.getoption("--fuzz-minutes")) or config.getoption("--fuzz-seed") is not None
    unwanted = "test_quick_profile" if long_profile else "test_long_profile"
    deselected = [item for item in items if item.name == unwanted]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.name != unwanted]


@pytest.fixture
def fuzz_options(request):
    return request.config.getoption("--fuzz-minutes"), request.config.getoption("--fuzz-seed")
