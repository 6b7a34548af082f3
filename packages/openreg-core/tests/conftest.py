"""Shared helpers for openreg-core's tests."""

import collections
import inspect
import os
import sys
from typing import Optional

import pytest
import torch
from torch_openreg.utils.testing import run_python as _run_python


def run_python(code: str, env: Optional[dict] = None, timeout: float = 120):
    """Runs `code` in a fresh interpreter (for autoload, fork, faults and env-dependent behaviour)."""
    return _run_python(code, env=env, timeout=timeout, cwd=os.path.dirname(__file__))


def pytest_collection_modifyitems(config, items):
    """In PyTorch's dynamo-wrapped mode (PYTORCH_TEST_WITH_DYNAMO=1, `nox -s inductor`) the tests
    that start a fresh interpreter (run_python) are deselected: the child runs plain Python, without
    the wrapping, so it would repeat what `nox -s core` checked (ten tests, about 25 s of CI)."""
    if os.environ.get("PYTORCH_TEST_WITH_DYNAMO") != "1":
        return
    spawns = {item: _starts_an_interpreter(item) for item in items}  # reads each test's source once
    if any(spawns.values()):
        config.hook.pytest_deselected(items=[item for item in items if spawns[item]])
        items[:] = [item for item in items if not spawns[item]]


def _starts_an_interpreter(item) -> bool:
    try:
        return "run_python(" in inspect.getsource(item.function)
    except (AttributeError, OSError, TypeError):
        return False


@pytest.fixture(autouse=True)
def _sync_and_reset_device():
    """Every test starts on device 0 and leaves no queued work behind."""
    torch.openreg.set_device(0)
    yield
    for i in range(torch.openreg.device_count()):
        torch.openreg.synchronize(i)
    torch.openreg.set_device(0)


# ---- the OpInfo suite's report: test_opinfo.py records each operator's checks; the count of all of
# them is printed at the end of the run, summed over pytest-xdist's processes when there are several.

_opinfo_total: collections.Counter = collections.Counter()


def _opinfo_counts() -> Optional[dict]:
    module = sys.modules.get("test_opinfo")
    if module is None or not module.RESULTS:
        return None
    counts = {f"kind:{k}": module.KINDS[k] for k in ("all", *module.CHECK_KINDS)}
    counts["operators"] = len(module.RESULTS)
    counts["passed"] = sum(p for p, _ in module.RESULTS.values())
    counts["failed"] = sum(f for _, f in module.RESULTS.values())
    return counts


def pytest_sessionfinish(session):
    counts = _opinfo_counts()
    if counts is None:
        return
    if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller reports
        session.config.workeroutput["opinfo"] = counts
    else:
        _opinfo_total.update(counts)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # xdist's controller: a worker's counts
    _opinfo_total.update(getattr(node, "workeroutput", {}).get("opinfo", {}))


def pytest_terminal_summary(terminalreporter):
    t = _opinfo_total
    if t["operators"]:
        kinds = {k[len("kind:") :]: v for k, v in t.items() if k.startswith("kind:")}
        terminalreporter.write_line(
            f"opinfo: {t['operators']} operators, {t['passed']} of {t['passed'] + t['failed']} checks passed; "
            f"checks by kind: {kinds}"
        )
