"""Shared by the scenarios: each test reports one short result line (`report`), printed together in
pytest's terminal summary under "openreg scenarios" (rank processes and subprocesses append to the
same file, named by SCENARIO_RESULTS in the environment they inherit)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# What this process made, removed at the end of the run (xdist's workers inherit the variables and
# make none).
_own_results = _own_cache = None
if "SCENARIO_RESULTS" not in os.environ:
    fd, _own_results = tempfile.mkstemp(prefix="openreg-scenarios-", suffix=".txt")
    os.close(fd)
    os.environ["SCENARIO_RESULTS"] = _own_results
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:  # one compile cache for the run and its rank processes
    _own_cache = os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="openreg-scenarios-inductor-")
os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")  # torchao's CUDA-only libraries
# A hang guard for the 2-rank classes (torch's default is 300 s per test): two ranks compiling at once
# on 2 loaded cores can take longer than that.
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "900")


def pytest_terminal_summary(terminalreporter):
    path = Path(os.environ["SCENARIO_RESULTS"])
    lines = path.read_text().splitlines() if path.exists() else []
    if lines:
        terminalreporter.write_sep("-", "openreg scenarios")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_unconfigure(config):
    if _own_results is not None:
        Path(_own_results).unlink(missing_ok=True)
    if _own_cache is not None:
        shutil.rmtree(_own_cache, ignore_errors=True)
