"""Builds libopenreg's own C++ programs (the runtime tests and the runtime benchmark) with CMake +
Ninja, incrementally, into a directory of the caller's choice. Used by tests/test_runtime.py and
tools/bench/runtime_bench.py; needs no torch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

LIB_DIR = Path(__file__).resolve().parent


class BuildError(RuntimeError):
    """A program could not be built; the message carries the failing command's output."""


@contextlib.contextmanager
def _lock(build: Path):
    """Serialises concurrent builds into one directory (parallel sessions, pytest-xdist workers)."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock
        yield
        return
    with open(build / ".build.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd: list[str]) -> str | None:
    """Runs one build command; None on success, else a report of the failure."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    return f"$ {' '.join(cmd)} -> {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


def _configure_and_build(build: Path, target: str, sanitizer: str) -> str | None:
    configure = [
        "cmake", "-G", "Ninja", "-S", str(LIB_DIR), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
        "-DOPENREG_BUILD_RUNTIME_TESTS=ON", f"-DOPENREG_SANITIZER={sanitizer}",
    ]  # fmt: skip
    steps = [] if (build / "build.ninja").is_file() else [configure]  # a configured build is reused
    steps.append(["ninja", "-C", str(build), target])
    for cmd in steps:
        failure = _run(cmd)
        if failure:
            return failure
    return None


def build_program(target: str, build: Path, sanitizer: str = "", prebuilt_env: str | None = None) -> Path:
    """Builds `target` (openreg_runtime_tests or openreg_runtime_bench) into `build`; returns its path.

    If the environment variable named `prebuilt_env` is set, it names a prebuilt program to use instead.
    """
    prebuilt = os.environ.get(prebuilt_env) if prebuilt_env else None
    if prebuilt:
        path = Path(prebuilt).resolve()
        if not path.is_file():
            raise BuildError(f"{prebuilt_env}={prebuilt} does not exist")
        return path
    if sanitizer not in ("", "address", "thread"):
        raise BuildError(f"the sanitizer must be 'address' or 'thread', not {sanitizer!r}")
    missing = [tool for tool in ("cmake", "ninja") if shutil.which(tool) is None]
    if missing:
        raise BuildError(f"{' and '.join(missing)} needed to build {target} (pip install cmake ninja)")
    build.mkdir(parents=True, exist_ok=True)
    with _lock(build):
        failure = _configure_and_build(build, target, sanitizer)
        if failure and (build / "CMakeCache.txt").is_file():
            # A directory configured by another cmake or ninja (a deleted venv's) cannot regenerate
            # itself: start once from scratch before calling it a build error.
            shutil.rmtree(build)
            build.mkdir(parents=True)
            failure = _configure_and_build(build, target, sanitizer)
    if failure:
        raise BuildError(f"building {target} failed:\n{failure}")
    exe = build / (target + (".exe" if sys.platform == "win32" else ""))
    if not exe.is_file():
        raise BuildError(f"the build succeeded but {exe} is missing")
    return exe
