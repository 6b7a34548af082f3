"""Runs the C++ tests of libopenreg (tests/runtime_tests.cpp), one pytest case per C++ case.

The test program is built with CMake + Ninja into ``<repo>/build/runtime-tests[-<sanitizer>]``.

Environment:
  OPENREG_SANITIZER=address|thread   build and run with that sanitizer
  OPENREG_RUNTIME_TESTS_BIN=PATH     use a prebuilt openreg_runtime_tests instead of building
  OPENREG_TEST_SCALE=F               scale the stress case's iterations (read by the C++ side)

Each case runs in its own process: the runtime is process-wide state, some cases need their
own configuration (see CASE_ENV), and one case must die by SIGSEGV.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

LIB_DIR = Path(__file__).resolve().parent.parent  # packages/openreg-core/libopenreg
sys.path.insert(0, str(LIB_DIR))
from build_programs import build_program  # noqa: E402

SANITIZER = os.environ.get("OPENREG_SANITIZER", "").strip()
SKIP_EXIT_CODE = 77  # a C++ case that lacks its environment skips with this code

# Environment a case needs; every other OPENREG_* variable is removed from the case's env.
CASE_ENV: dict[str, dict[str, str]] = {
    "capacity_out_of_memory": {"OPENREG_DEVICE_MEMORY": "64M"},
    "device_count_from_env": {"OPENREG_DEVICE_COUNT": "3"},
    "stream_wakeups_without_spinning": {"OPENREG_SPIN_US": "0", "OPENREG_WAIT_SPIN_US": "0"},
    "stream_waiter_spins_while_cpus_are_free": {"OPENREG_WAIT_SPIN_US": "1000000"},
    "config_invalid_environment": {"OPENREG_DEVICE_MEMORY": "12X"},
    "config_device_memory_overflow": {"OPENREG_DEVICE_MEMORY": "17179869184G"},
    "config_invalid_spin": {"OPENREG_SPIN_US": "abc"},
    "config_invalid_wait_spin": {"OPENREG_WAIT_SPIN_US": "-1"},
    "config_invalid_faults": {"OPENREG_FAULTS": "alloc:zero"},
    "config_invalid_launch_blocking": {"OPENREG_LAUNCH_BLOCKING": "2"},
    "launch_blocking_reports_at_the_launch": {"OPENREG_LAUNCH_BLOCKING": "1"},
    "faults_from_environment": {"OPENREG_FAULTS": "alloc@0:1,kernel:test::from_env"},
}

# Cases that pass only by dying with a signal.
EXPECTED_SIGNAL: dict[str, int] = {
    "host_read_of_device_pointer_faults": getattr(signal, "SIGSEGV", 11),
}

TIMEOUT_S = {"": 60, "address": 120, "thread": 300}.get(SANITIZER, 300)


def _repo_root() -> Path:
    for parent in LIB_DIR.parents:
        if (parent / ".git").exists():
            return parent
    return LIB_DIR.parents[2]


def _build_dir() -> Path:
    return _repo_root() / "build" / ("runtime-tests" + (f"-{SANITIZER}" if SANITIZER else ""))


@functools.lru_cache(maxsize=None)
def _test_binary() -> Path:
    """Builds (incrementally) or locates the test program. Cached for the session."""
    return build_program("openreg_runtime_tests", _build_dir(), SANITIZER, prebuilt_env="OPENREG_RUNTIME_TESTS_BIN")


@functools.lru_cache(maxsize=None)
def _case_names() -> tuple[str, ...]:
    proc = subprocess.run([str(_test_binary()), "--list"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"--list failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return tuple(line.strip() for line in proc.stdout.splitlines() if line.strip())


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        metafunc.parametrize("case", _case_names())


@pytest.fixture(scope="session")
def runtime_tests_bin() -> Path:
    return _test_binary()


def _sanitizer_env(case: str) -> dict[str, str]:
    """ASAN_OPTIONS / TSAN_OPTIONS for a case; the user's own options come last and win."""
    if not SANITIZER:
        return {}
    ours = ["halt_on_error=1"]
    if SANITIZER == "address":
        ours += ["abort_on_error=0", "detect_leaks=1"]
        var = "ASAN_OPTIONS"
    else:
        # atexit_sleep_ms: TSan sleeps 1 s at every exit by default, to give threads still running
        # time to race with exit; a tenth of that still does, and the suite was mostly that sleep.
        ours += ["second_deadlock_stack=1", "atexit_sleep_ms=100"]
        var = "TSAN_OPTIONS"
    if case in EXPECTED_SIGNAL:
        # The sanitizer's SEGV handler would report and exit(1); let the signal kill the process.
        ours.append("handle_segv=0")
    user = os.environ.get(var, "")
    return {var: ":".join(ours + ([user] if user else []))}


def _case_env(case: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENREG_") or k == "OPENREG_TEST_SCALE"}
    env.update(CASE_ENV.get(case, {}))
    env.update(_sanitizer_env(case))
    return env


def died_by_signal(returncode: int, sig: int) -> bool:
    """True when a subprocess's return code says it was killed by `sig`. A memory fault (SIGSEGV) is
    SIGBUS too on macOS, which may deliver either for a protection fault (mprotect(2))."""
    segv = getattr(signal, "SIGSEGV", 11)
    if sys.platform == "win32":
        # No POSIX signals: an access violation ends the process with 0xC0000005.
        return sig == segv and (returncode & 0xFFFFFFFF) == 0xC0000005
    if sig == segv and sys.platform == "darwin":
        return returncode in (-segv, -signal.SIGBUS)
    return returncode == -sig


def test_runtime_case(runtime_tests_bin: Path, case: str):
    cmd = [str(runtime_tests_bin), "--run", case]
    try:
        proc = subprocess.run(cmd, env=_case_env(case), capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"{case} timed out after {TIMEOUT_S} s\n--- stdout ---\n{out}\n--- stderr ---\n{err}")
    report = (
        f"{' '.join(cmd)} -> returncode {proc.returncode}\n"
        f"env: {CASE_ENV.get(case, {})} {_sanitizer_env(case)}\n"
        f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    )
    if case in EXPECTED_SIGNAL:
        sig = EXPECTED_SIGNAL[case]
        assert died_by_signal(proc.returncode, sig), f"{case} must die by signal {sig}\n{report}"
        return
    if proc.returncode == SKIP_EXIT_CODE:
        pytest.skip(proc.stdout.strip() or f"{case} skipped")
    assert proc.returncode == 0, f"{case} failed\n{report}"


def test_list_is_complete(runtime_tests_bin: Path):
    """The wrapper's per-case tables only name cases that exist."""
    names = set(_case_names())
    assert len(names) >= 30, names
    for table in (CASE_ENV, EXPECTED_SIGNAL):
        missing = set(table) - names
        assert not missing, f"unknown case names in test_runtime.py: {sorted(missing)}"
