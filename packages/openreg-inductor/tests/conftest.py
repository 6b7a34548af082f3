"""Shared helpers for openreg-inductor's tests.

Compiles dominate the suite's time, so every test process shares one Inductor cache: the
nox session sets TORCHINDUCTOR_CACHE_DIR to a per-session folder; run by hand, a temporary
folder is made once per pytest run, and removed at its end.
"""

import os
import shutil
import tempfile
import threading

_own_cache = None  # the folder this process made (xdist's workers inherit the variable: they make none)
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _own_cache = os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="openreg-inductor-cache-")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch_openreg.utils.testing import run_python as _run_python  # noqa: E402

# A kernel that keeps its stream busy until `release` is set (at most 60 s): a compiled call made
# meanwhile that returns before it was set did not wait for the device; captured into a graph, it
# holds every replay of it.
release = threading.Event()


@torch.library.custom_op("openreg_inductor_test::hold_stream", mutates_args=(), device_types="cpu")
def hold_stream(x: torch.Tensor) -> torch.Tensor:
    release.wait(60)
    return x.clone()


@hold_stream.register_fake
def _(x):
    return torch.empty_like(x)


def run_python(code: str, env=None, timeout: float = 300):
    """A fresh interpreter sharing this run's compile cache."""
    return _run_python(code, env=env, timeout=timeout, cwd=os.path.dirname(__file__))


# The longest tests (cold, 2 cores: 60 to 15 s) run first. Collected in file order, the GPT training
# step came last and one test process ran it alone while the other sat idle.
LONGEST_FIRST = (
    "test_training.py::TestGPT::test_compiled_training_step",
    "test_opinfo_sweep.py::TestOpInfoSweep::test_pointwise_and_reductions_match_cpu_inductor",
    "test_cpp_wrapper.py::TestCppWrapper::test_matches_cpu_cpp_wrapper",
    "test_plugin.py::TestPluginLoading::test_direct_import_loads_core_first",
    "test_cpp_wrapper.py::TestCppWrapper::test_call_is_asynchronous_on_the_current_stream_without_copies",
    "test_reduce_overhead.py::TestReplay::test_training_step",
    "test_cpp_wrapper.py::TestCppWrapper::test_second_device_and_a_synchronize_between_kernels",
    "test_cpp_wrapper.py::TestCppWrapper::test_cpu_kernels_of_the_library_share_the_division_flag_safely",
    "test_codegen.py::TestPointwise::test_dtypes",
    "test_plugin.py::TestPluginLoading::test_register_called_before_inductor_is_imported",
)


def pytest_unconfigure(config):
    if _own_cache is not None:
        shutil.rmtree(_own_cache, ignore_errors=True)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.rsplit("/", 1)[-1], len(rank)))  # stable: others keep their order


@pytest.fixture(autouse=True)
def _idle_device():
    """Every test starts on device 0 and leaves no queued work behind."""
    torch.openreg.set_device(0)
    yield
    for i in range(torch.openreg.device_count()):
        torch.openreg.synchronize(i)
    torch.openreg.set_device(0)
