"""The openreg-core wheel and sdist contain what belongs in them, and nothing else.

Run with `nox -s packaging`: the `build` session writes dist/openreg_core-*.tar.gz and a wheel
built from that sdist, and the packaging session sets OPENREG_DIST to that folder and installs the
wheel. Without OPENREG_DIST these tests fail (they never skip).
"""

from __future__ import annotations

import configparser
import fnmatch
import os
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "packages" / "openreg-core"
CXX_SUFFIXES = {".h", ".hpp", ".c", ".cc", ".cpp"}
# Leftovers of a build or a checkout that must not ship in either distribution.
FORBIDDEN_DIRS = {"build", "CMakeFiles", "__pycache__", ".git"}
FORBIDDEN_FILES = {"CMakeCache.txt", "build.ninja", "cmake_install.cmake", "install_manifest.txt"}
# A Python extension's and a shared library's file names on this platform.
EXTENSION = ".pyd" if sys.platform == "win32" else ".so"


def shared_library(name: str) -> str:
    return {"win32": f"{name}.dll", "darwin": f"lib{name}.dylib"}.get(sys.platform, f"lib{name}.so")


@pytest.fixture(scope="module")
def dist_dir() -> Path:
    value = os.environ.get("OPENREG_DIST")
    if not value:
        pytest.fail(
            "OPENREG_DIST is not set. These tests check the wheel and sdist that `nox -s build` writes "
            "to dist/: run them with `nox -s packaging` (or set OPENREG_DIST to a folder holding "
            "exactly one openreg_core-*.whl and one openreg_core-*.tar.gz).",
            pytrace=False,
        )
    path = Path(value)
    if not path.is_dir():
        pytest.fail(f"OPENREG_DIST={value} is not a directory: run `nox -s packaging`", pytrace=False)
    return path


def _one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, f"expected exactly one {pattern} in {dist}, found {[p.name for p in found]}"
    return found[0]


@pytest.fixture(scope="module")
def wheel(dist_dir: Path) -> Path:
    return _one(dist_dir, "openreg_core-*.whl")


@pytest.fixture(scope="module")
def wheel_files(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return [n for n in zf.namelist() if not n.endswith("/")]


@pytest.fixture(scope="module")
def sdist_files(dist_dir: Path) -> list[str]:
    """Paths inside the sdist, relative to its top folder (openreg_core-<version>/)."""
    with tarfile.open(_one(dist_dir, "openreg_core-*.tar.gz")) as tf:
        names = [m.name for m in tf.getmembers() if m.isfile()]
    tops = {n.split("/", 1)[0] for n in names}
    assert len(tops) == 1, f"the sdist must have one top folder, has {sorted(tops)}"
    return [n.split("/", 1)[1] for n in names if "/" in n]


def _source_files(top: Path, suffixes: set[str]) -> list[str]:
    """Files under `top` with those suffixes, as paths relative to packages/openreg-core."""
    return sorted(
        p.relative_to(CORE).as_posix()
        for p in top.rglob("*")
        if p.is_file() and p.suffix in suffixes and "__pycache__" not in p.parts
    )


def _leftovers(files: list[str], bad_suffixes: set[str]) -> list[str]:
    bad = []
    for name in files:
        path = PurePosixPath(name)
        if (
            path.suffix in bad_suffixes
            or path.name in FORBIDDEN_FILES
            or FORBIDDEN_DIRS.intersection(path.parts[:-1])
            or path.suffix == ".pyc"
        ):
            bad.append(name)
    return bad


# --- wheel -------------------------------------------------------------------------------------


def test_wheel_has_the_python_package(wheel_files: list[str]):
    assert "torch_openreg/__init__.py" in wheel_files
    assert fnmatch.filter(wheel_files, "torch_openreg/openreg/*.py"), "no torch_openreg/openreg/*.py in the wheel"
    # Every module of the source tree ships (a subpackage missing from setup's package list would not).
    missing = sorted(set(_source_files(CORE / "torch_openreg", {".py"})) - set(wheel_files))
    assert not missing, f"Python files of packages/openreg-core missing from the wheel: {missing}"


def test_wheel_has_the_binaries(wheel_files: list[str]):
    extensions = fnmatch.filter(wheel_files, f"torch_openreg/_C*{EXTENSION}")
    assert len(extensions) == 1, f"expected one torch_openreg/_C*{EXTENSION}, wheel has {extensions}"
    for lib in (f"torch_openreg/lib/{shared_library(name)}" for name in ("openreg", "torch_openreg")):
        assert lib in wheel_files, f"{lib} missing from the wheel"


def test_wheel_has_the_public_headers(wheel_files: list[str]):
    """Plugins build against these: the runtime's C API and core's C++ headers."""
    assert "torch_openreg/include/openreg/runtime.h" in wheel_files
    headers = _source_files(CORE / "libopenreg" / "include", CXX_SUFFIXES)
    expected = {"torch_openreg/include/" + h.removeprefix("libopenreg/include/") for h in headers}
    missing = sorted(expected - set(wheel_files))
    assert not missing, f"runtime headers missing from the wheel: {missing}"
    assert fnmatch.filter(wheel_files, "torch_openreg/include/torch_openreg/*/*.h"), "core's csrc headers missing"


def test_wheel_registers_the_torch_backend(wheel: Path, wheel_files: list[str]):
    [entry_points] = fnmatch.filter(wheel_files, "openreg_core-*.dist-info/entry_points.txt")
    parser = configparser.ConfigParser()
    with zipfile.ZipFile(wheel) as zf:
        parser.read_string(zf.read(entry_points).decode())
    assert parser.has_section("torch.backends"), f"no [torch.backends] in {entry_points}"
    assert parser.get("torch.backends", "openreg", fallback=None) == "torch_openreg:_autoload", dict(
        parser["torch.backends"]
    )


def test_wheel_has_no_sources_build_leftovers_or_tests(wheel_files: list[str]):
    bad = _leftovers(wheel_files, CXX_SUFFIXES - {".h", ".hpp"} | {".o", ".a", ".obj"})
    assert not bad, f"the wheel holds sources or build leftovers: {bad}"
    tests = [n for n in wheel_files if {"tests", "test"} & set(n.split("/")) or fnmatch.fnmatch(n, "*/test_*.py")]
    assert not tests, f"the wheel holds tests: {tests}"
    tops = {n.split("/", 1)[0] for n in wheel_files}
    assert tops <= {"torch_openreg"} | set(fnmatch.filter(tops, "openreg_core-*.dist-info")), (
        f"unexpected top-level entries in the wheel: {sorted(tops)}"
    )


# --- sdist -------------------------------------------------------------------------------------


def test_sdist_has_what_builds_the_wheel(sdist_files: list[str]):
    for name in (
        "CMakeLists.txt",
        "setup.py",
        "pyproject.toml",
        "README.md",
        "MANIFEST.in",
        "torch_openreg/__init__.py",
        "libopenreg/CMakeLists.txt",
        "libopenreg/include/openreg/runtime.h",
    ):
        assert name in sdist_files, f"{name} missing from the sdist"
    assert fnmatch.filter(sdist_files, "csrc/*.cpp") or fnmatch.filter(sdist_files, "csrc/*/*.cpp")
    assert fnmatch.filter(sdist_files, "libopenreg/src/*.cpp")
    wanted = (
        _source_files(CORE / "csrc", CXX_SUFFIXES)
        + _source_files(CORE / "libopenreg" / "src", CXX_SUFFIXES)
        + _source_files(CORE / "libopenreg" / "include", CXX_SUFFIXES)
        + _source_files(CORE / "torch_openreg", {".py"})
    )
    missing = sorted(set(wanted) - set(sdist_files))
    assert not missing, f"sources of packages/openreg-core missing from the sdist (see its MANIFEST.in): {missing}"


def test_sdist_has_no_build_leftovers(sdist_files: list[str]):
    bad = _leftovers(sdist_files, {".so", ".o", ".a", ".obj", ".dylib", ".dll", ".pyd"})
    assert not bad, f"the sdist holds build leftovers: {bad}"


# --- the installed wheel -----------------------------------------------------------------------


def test_installed_wheel_imports(wheel: Path, tmp_path: Path):
    """`import torch` autoloads the installed torch_openreg (not the source tree), and the device works."""
    version = metadata.version("openreg-core")
    assert wheel.name.startswith(f"openreg_core-{version}-"), f"installed openreg-core {version} is not {wheel.name}"
    code = (
        "import torch, sys\n"
        "assert torch.openreg.is_available(), 'torch.openreg.is_available() is False'\n"
        "import torch_openreg\n"
        "print(torch_openreg.__file__)\n"
        "print(torch.openreg.device_count())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENREG_")}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"importing the installed wheel failed:\n{proc.stdout}\n{proc.stderr}"
    location, count = proc.stdout.split()[-2:]
    assert Path(location).resolve().is_relative_to(Path(sys.prefix).resolve()), (
        f"torch_openreg came from {location}, not from this environment ({sys.prefix})"
    )
    assert int(count) >= 1


# --- plugins -----------------------------------------------------------------------------------

AMP = ROOT / "packages" / "openreg-amp"


def _zip_names(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as zf:
        return [n for n in zf.namelist() if not n.endswith("/")]


def test_amp_wheel(dist_dir: Path):
    """openreg-amp ships its Python package and one extension, registers in core's plugin group,
    and holds no sources or tests."""
    wheel = _one(dist_dir, "openreg_amp-*.whl")
    files = _zip_names(wheel)
    assert "openreg_amp/__init__.py" in files
    assert len(fnmatch.filter(files, f"openreg_amp/_C*{EXTENSION}")) == 1, files
    [entry_points] = fnmatch.filter(files, "openreg_amp-*.dist-info/entry_points.txt")
    parser = configparser.ConfigParser()
    with zipfile.ZipFile(wheel) as zf:
        parser.read_string(zf.read(entry_points).decode())
    assert dict(parser["torch_openreg.plugins"]) == {"amp": "openreg_amp:_load"}
    assert not parser.has_section("torch.backends"), "only core may register in torch.backends"
    bad = _leftovers(files, CXX_SUFFIXES | {".o", ".a", ".obj"})
    assert not bad, f"the amp wheel holds sources or build leftovers: {bad}"
    tops = {n.split("/", 1)[0] for n in files}
    assert tops <= {"openreg_amp"} | set(fnmatch.filter(tops, "openreg_amp-*.dist-info")), sorted(tops)


def test_amp_sdist(dist_dir: Path):
    with tarfile.open(_one(dist_dir, "openreg_amp-*.tar.gz")) as tf:
        names = [m.name.split("/", 1)[1] for m in tf.getmembers() if m.isfile() and "/" in m.name]
    wanted = sorted(
        p.relative_to(AMP).as_posix()
        for p in AMP.rglob("*")
        if p.is_file() and p.suffix in CXX_SUFFIXES | {".py"} and not {"build", "__pycache__"} & set(p.parts)
    )
    missing = sorted(set(wanted) - set(names))
    assert not missing, f"sources of packages/openreg-amp missing from its sdist (see its MANIFEST.in): {missing}"
    assert not _leftovers(names, {".so", ".o", ".a", ".obj", ".dylib", ".dll", ".pyd"}), names


ONNX = ROOT / "packages" / "openreg-onnx"


def test_onnx_wheel(dist_dir: Path):
    """openreg-onnx is pure Python: its package only, the plugin entry point, pinned ONNX
    dependencies; installed without them (this session), it still loads, lazily."""
    wheel = _one(dist_dir, "openreg_onnx-*-py3-none-any.whl")
    files = _zip_names(wheel)
    assert "openreg_onnx/__init__.py" in files and "openreg_onnx/_hooks.py" in files
    tops = {n.split("/", 1)[0] for n in files}
    assert tops <= {"openreg_onnx"} | set(fnmatch.filter(tops, "openreg_onnx-*.dist-info")), sorted(tops)
    assert not [n for n in files if not n.endswith(".py") and ".dist-info/" not in n], files
    with zipfile.ZipFile(wheel) as zf:
        parser = configparser.ConfigParser()
        parser.read_string(zf.read(fnmatch.filter(files, "openreg_onnx-*.dist-info/entry_points.txt")[0]).decode())
        meta = zf.read(fnmatch.filter(files, "openreg_onnx-*.dist-info/METADATA")[0]).decode()
    assert dict(parser["torch_openreg.plugins"]) == {"onnx": "openreg_onnx:_load"}
    for pin in ("onnx<1.24,>=1.23", "onnxscript<0.8,>=0.7", "onnxruntime<1.33,>=1.32"):
        assert f"Requires-Dist: {pin}" in meta, meta
    probe = "import torch; p = torch.openreg.plugins()['onnx']; print(p['loaded'], p['error'])"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["True", "None"], r.stdout + r.stderr


def test_onnx_sdist(dist_dir: Path):
    with tarfile.open(_one(dist_dir, "openreg_onnx-*.tar.gz")) as tf:
        names = [m.name.split("/", 1)[1] for m in tf.getmembers() if m.isfile() and "/" in m.name]
    wanted = sorted(
        p.relative_to(ONNX).as_posix()
        for p in ONNX.rglob("*")
        if p.is_file()
        and (p.suffix == ".py" or p.name in ("README.md", "pyproject.toml", "MANIFEST.in"))
        and not any(part in ("build", "__pycache__") or part.startswith(".") for part in p.relative_to(ONNX).parts)
    )
    missing = sorted(set(wanted) - set(names))
    assert not missing, f"files of packages/openreg-onnx missing from its sdist (see its MANIFEST.in): {missing}"
