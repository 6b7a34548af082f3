"""Sessions that build, test and lint the openreg monorepo.

    nox -s tests        everything: builds openreg-core once, then every test session
    nox -s core         core's PyTorch tests (packages/openreg-core/tests)
    nox -s amp          openreg-amp's tests (packages/openreg-amp/tests)
    nox -s distributed  openreg-distributed's tests (occl, 2-rank process groups; packages/openreg-distributed/tests)
    nox -s inductor     openreg-inductor's tests (packages/openreg-inductor/tests)
    nox -s quant        openreg-quant's tests (packages/openreg-quant/tests)
    nox -s onnx         openreg-onnx's tests (packages/openreg-onnx/tests)
    nox -s runtime      libopenreg's own tests (no torch); runtime_asan / runtime_tsan under a sanitizer
    nox -s core_asan    all of core built with AddressSanitizer: its runtime, memory and concurrency tests
                        and the short soak
    nox -s soak         the full soak (long; not part of `tests`; the quick one is in `core`)
    nox -s packaging    what the wheels and sdists contain; `openreg-core[extras]` into a fresh venv
    nox -s scenarios    cross-package scenarios (tests/scenarios) with every plugin installed
    nox -s lint         ruff and clang-format (not part of `tests`)
    nox -s docs         the integration guide (docs/): Sphinx build (warnings are errors) and its link test
    nox -s bench        benchmark smoke run (tools/bench, --quick; asserts nothing about speed)
    nox -s fuzz         differential fuzzing, openreg vs the CPU (tests/fuzz): the quick profile, part of `tests`;
                        `nox -s fuzz -- --minutes N` the long profile for release checks, `-- --seed N` one seed again

Session graph (`requires=`): build <- core, amp, ..., packaging, bench, scenarios <- tests; runtime, runtime_asan,
runtime_tsan, core_asan (a build of its own) and docs need no build and are required by tests too. Nox runs a
required session once per invocation, so `nox -s tests` builds core once and every session installs that one wheel.

Torch and the test tools are installed once per machine, into .nox/_layer-torch-2.13.0-tools1, which every
session's venv sees through a .pth file (`_install_torch`). Most suites run in two processes (pytest-xdist;
`-- -n 0`: one). `nox -r` reuses the session venvs (the wheel is reinstalled). To rerun one session
against the wheel already in dist/ without rebuilding: `nox -r -s core --no-dependencies`.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import time
from pathlib import Path

import nox
from nox.command import CommandFailed

ROOT = Path(__file__).resolve().parent
DIST = ROOT / "dist"
CORE = ROOT / "packages" / "openreg-core"
PYTHON = "3.11"

# Exactly pinned: pip takes this from the machine's local wheel. An unpinned torch may resolve to
# a multi-GB CUDA build of another release.
TORCH = "torch==2.13.0"
# A fresh venv seeds an old setuptools that cannot build core (`invalid command 'bdist_wheel'`).
BASE = ("setuptools>=77", "wheel")
# torch.testing._internal.common_utils (TestCase, run_tests) imports expecttest and numpy.
# psutil: the soak test's thread, file-descriptor and resident-size counts, on every OS.
CORE_TEST_DEPS = ("expecttest", "numpy", "psutil==7.2.2")
# The suites that are most of a run's time and whose tests are independent run in two processes
# (one per core of CI's machine) with pytest-xdist. `nox -s core -- -n 0` runs them in one process.
XDIST = "pytest-xdist==3.8.0"
TWO_PROCESSES = ("-n", "2")
# The same for suites of multi-process classes (ranks spawned once per class): a class stays in one
# test process, so its ranks are spawned once. Their processes mostly wait on each other: two classes
# at a time took openreg-distributed's tests from 81 to 63 s on 2 cores, the scenarios from 71 to 58 s.
TWO_PROCESSES_BY_CLASS = (*TWO_PROCESSES, "--dist", "loadscope")
LINT_TOOLS = ("ruff==0.17.6", "clang-format==23.1.5")
# Pure-Python and torch-free (their dependency trees hold no torch); pinned like the lint tools.
DOCS_TOOLS = ("sphinx==9.0.4", "myst-parser==5.2.0")
CXX_SUFFIXES = {".h", ".hpp", ".c", ".cc", ".cpp", ".cu"}
# Plugin packages built by `build` (folder -> distribution file prefix), largest build first: the
# order in which _build_plugins hands them out.
PLUGINS = {
    "openreg-quant": "openreg_quant",
    "openreg-distributed": "openreg_distributed",
    "openreg-amp": "openreg_amp",
    "openreg-onnx": "openreg_onnx",
    "openreg-inductor": "openreg_inductor",
}

nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_missing_interpreters = True
nox.options.error_on_external_run = True
nox.options.sessions = ["tests"]


def _env(**extra: str) -> dict[str, str]:
    # OPENREG_SANITIZER empty unless a session asks for one: a sanitizer chosen in the caller's shell
    # must not instrument the wheels every session installs.
    env = {"MAX_JOBS": os.environ.get("MAX_JOBS", "2"), "OPENREG_SANITIZER": ""}
    env.update(extra)
    return env


def _one(pattern: str, session: nox.Session) -> Path:
    found = sorted(DIST.glob(pattern))
    if len(found) != 1:
        session.error(f"expected exactly one dist/{pattern}, found {[p.name for p in found]}: run `nox -s build`")
    return found[0]


# Torch and its dependencies (about 900 MB unpacked) are installed once per machine into a shared
# folder that every session's venv sees through a .pth file: unpacking them into each of the dozen
# venvs cost about 25 s apiece, 5 minutes of a 2-core CI run. Each venv still installs its own
# packages; pip sees what the layer holds as installed (it is on sys.path) and leaves it alone.
# The test tools every torch session needs are in the layer too: installing them into each venv
# cost 5 to 8 s a session (numpy most of it). pytest's script is then not in the venv's bin:
# sessions run `python -m pytest` (_pytest), and install only what they need beyond the layer. The
# folder's name changes with its contents.
LAYER = (TORCH, "pytest", XDIST, *CORE_TEST_DEPS)
TORCH_LAYER = ROOT / ".nox" / ("_layer-" + TORCH.replace("==", "-") + "-tools1")


def _install_torch(session: nox.Session, *extra: str) -> None:
    """Makes the shared layer (once) visible in the session's venv, then installs `extra`
    (with BASE, in one pip call: each call costs seconds, times a dozen sessions)."""
    if not (TORCH_LAYER / ".complete").exists():
        partial = TORCH_LAYER.with_name(TORCH_LAYER.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        session.run("python", "-m", "pip", "install", "--quiet", "--target", str(partial), *LAYER)
        (partial / ".complete").touch()
        shutil.rmtree(TORCH_LAYER, ignore_errors=True)
        partial.rename(TORCH_LAYER)
    site = session.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True).strip()
    Path(site, "_openreg_torch_layer.pth").write_text(f"{TORCH_LAYER}\n")
    # --no-compile: Python compiles what a session imports when it imports it, instead of pip
    # compiling every module of every package up front (2 to 3 s a session).
    session.install("--no-compile", *BASE, *LAYER, *extra)  # the layer's: already satisfied


def _pytest(session: nox.Session, *args: str, **kwargs) -> None:
    """pytest from the layer, in the session's interpreter."""
    session.run("python", "-m", "pytest", *args, **kwargs)


def _install_core(
    session: nox.Session, *extra: str, plugins: tuple[str, ...] = (), no_deps: tuple[str, ...] = ()
) -> None:
    """Installs torch and the wheels that the `build` session left in dist/: openreg-core and
    the named plugins (distribution file prefixes, e.g. "openreg_amp"); `no_deps`: requirements
    installed without their dependencies, with the wheels."""
    _install_torch(session, *extra)
    wheels = [_one(f"{name}-*.whl", session) for name in ("openreg_core", *plugins)]
    # --force-reinstall: a rebuilt wheel keeps its version, and a reused venv must take it anyway.
    session.install("--no-compile", "--no-deps", "--force-reinstall", *map(str, wheels), *no_deps)


def _staged_copy(session: nox.Session, package: Path) -> Path:
    """A copy of `package` in the session's tmp folder without build products, so that build/ and
    *.egg-info/ in the developer's tree can't leak into what is built, and the tree is left as it was."""
    staging = Path(session.create_tmp()) / f"{package.name}-src"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(
        package, staging, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.so", "*.o", "*.pyc")
    )
    return staging


def _sdist_then_wheel(session: nox.Session, package: Path, dist_name: str, run=None) -> None:
    """Builds `package`'s sdist into dist/, then a wheel from that sdist (proving the sdist builds).
    `run(*cmd)` runs a command (default: session.run with _env())."""
    run = run or (lambda *cmd: session.run(*cmd, env=_env()))
    for old in [*DIST.glob(f"{dist_name}-*.tar.gz"), *DIST.glob(f"{dist_name}-*.whl")]:
        old.unlink()
    staging = _staged_copy(session, package)
    run("python", "-m", "build", "--sdist", "--no-isolation", "--outdir", str(DIST), str(staging))
    sdist = _one(f"{dist_name}-*.tar.gz", session)
    run("pip", "wheel", "--no-build-isolation", "--no-deps", "--no-cache-dir", str(sdist), "-w", str(DIST))
    _one(f"{dist_name}-*.whl", session)


# The plugins build two at a time, with one compile job each (MAX_JOBS / 2): a plugin's sources are
# one unit (OpenRegExtension(unity=True)), so one plugin cannot use a second core, and two at a time
# keep both cores busy without more jobs than cores. Largest first, each free slot taking the next
# plugin, so that the two slots finish close together. Sdist and wheel, one core each (2026-12-03):
# quant 65 s, distributed 63 s, amp 35 s, onnx and inductor 3 s each. Two fixed lanes (quant; the
# rest) took 107 s, the second lane finishing 40 s after the first.
PLUGIN_BUILD_SLOTS = 2


def _build_plugins(session: nox.Session) -> None:
    """_sdist_then_wheel for every plugin, PLUGIN_BUILD_SLOTS at a time in PLUGINS' order; each
    plugin's output is logged, with each step's wall time, once all are done."""
    jobs = str(max(1, int(os.environ.get("MAX_JOBS", "2")) // PLUGIN_BUILD_SLOTS))
    env = {
        **os.environ,
        **_env(MAX_JOBS=jobs),
        "PATH": f"{session.bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": session.virtualenv.location,
    }
    outputs: dict[str, list[str]] = {name: [] for name in PLUGINS}

    def build_one(name: str) -> None:
        def run(*cmd: str) -> None:
            start = time.monotonic()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            outputs[name].append(f"$ {' '.join(cmd)}  ({time.monotonic() - start:.0f} s)")
            outputs[name].append(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                raise CommandFailed(f"{cmd[0]} exited {proc.returncode}")

        _sdist_then_wheel(session, ROOT / "packages" / name, PLUGINS[name], run)

    # The executor hands out its queue in submission order: PLUGINS', largest first.
    with concurrent.futures.ThreadPoolExecutor(PLUGIN_BUILD_SLOTS) as pool:
        futures = [pool.submit(build_one, name) for name in PLUGINS]
    for name in PLUGINS:
        session.log(f"{name}:\n" + "\n".join(outputs[name])[-8000:])
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        session.error(f"a plugin build failed: {failed[0]}")


@nox.session(python=PYTHON, default=False)
def build(session: nox.Session) -> None:
    """Builds every C++ package once per run: openreg-core, then the plugins against that core
    (sdists into dist/, and a wheel from each sdist)."""
    # nlohmann-json: the JSON header openreg-distributed's flight recorder needs (torch ships none).
    _install_torch(session, "cmake", "ninja", "build", "nlohmann-json==3.12.0")
    DIST.mkdir(exist_ok=True)
    _sdist_then_wheel(session, CORE, "openreg_core")
    # Plugins compile against the installed core's headers and link its libraries.
    session.install("--no-deps", "--force-reinstall", str(_one("openreg_core-*.whl", session)))
    _build_plugins(session)


@nox.session(python=PYTHON, requires=["build"])
def core(session: nox.Session) -> None:
    """openreg-core's PyTorch tests, against the built wheel."""
    _install_core(session, "ninja")
    tests = CORE / "tests"
    # An empty test folder fails loudly here (pytest itself would exit with 5, "no tests ran").
    if not any(tests.rglob("test_*.py")):
        session.error(f"{tests.relative_to(ROOT)} has no test_*.py files: core's tests are missing")
    _pytest(session, *TWO_PROCESSES, str(tests), *session.posargs)


def _runtime(session: nox.Session, sanitizer: str) -> None:
    session.install("--no-compile", *BASE, "pytest", XDIST, "cmake", "ninja")
    env = _env(OPENREG_SANITIZER=sanitizer)
    # Each case is a process of its own: two at a time (the build is locked, the first worker builds).
    session.run("pytest", *TWO_PROCESSES, str(CORE / "libopenreg" / "tests"), *session.posargs, env=env)


@nox.session(python=PYTHON)
def runtime(session: nox.Session) -> None:
    """libopenreg's tests (C++, no torch): builds its own test program into build/runtime-tests."""
    _runtime(session, "")


@nox.session(python=PYTHON)
def runtime_asan(session: nox.Session) -> None:
    """libopenreg's tests under AddressSanitizer (and LeakSanitizer)."""
    _runtime(session, "address")


@nox.session(python=PYTHON)
def runtime_tsan(session: nox.Session) -> None:
    """libopenreg's tests under ThreadSanitizer."""
    _runtime(session, "thread")


# core's tests that exercise its runtime, threads and memory; run under AddressSanitizer by core_asan
# (the OpInfo sweep and the operator tests would take it from 2 to over 6 minutes).
ASAN_CORE_TESTS = (
    "test_soak.py",
    "test_streams.py",
    "test_memory.py",
    "test_concurrency.py",
    "test_faults.py",
    "test_graphs.py",
    "test_ipc.py",
    "test_generators.py",
    "test_accelerator.py",
)


def _compiler_file(name: str, session: nox.Session) -> str:
    """The path of one of the C++ compiler's runtime libraries (`c++ -print-file-name=NAME`)."""
    proc = subprocess.run(["c++", f"-print-file-name={name}"], capture_output=True, text=True)
    path = proc.stdout.strip()
    if proc.returncode != 0 or not os.path.isabs(path) or not os.path.exists(path):
        session.error(f"the C++ compiler has no {name} (`c++ -print-file-name={name}` gave {path!r})")
    return path


@nox.session(python=PYTHON, default=False)
def core_asan(session: nox.Session) -> None:
    """All of core (runtime, PyTorch layer, binding) built with AddressSanitizer, then its runtime,
    memory and concurrency tests and the short soak (ASAN_CORE_TESTS) in an uninstrumented Python
    and libtorch: docs/mechanisms/reliability.md."""
    _install_torch(session, "cmake", "ninja")
    # Built from a copy, into a build directory of its own, so neither the tree nor dist/ sees it.
    staging = _staged_copy(session, CORE)
    build_dir = Path(session.create_tmp()) / "core-asan-build"
    env = _env(OPENREG_SANITIZER="address", OPENREG_BUILD_DIR=str(build_dir))
    session.run("python", "-m", "pip", "install", "--no-build-isolation", "--no-deps", str(staging), env=env)
    # The ASan runtime must come first in the process; libstdc++ with it, or ASan's interceptor of
    # C++ throws finds no real __cxa_throw (Python itself does not link libstdc++) and aborts.
    preload = " ".join(_compiler_file(name, session) for name in ("libasan.so", "libstdc++.so.6"))
    # Leaks: Python and libtorch keep what they allocate until exit (libopenreg's leaks are checked in
    # runtime_asan). handle_segv=0: a host read of device memory must die by SIGSEGV, as tested.
    options = ":".join(filter(None, ["detect_leaks=0:handle_segv=0", os.environ.get("ASAN_OPTIONS", "")]))
    tests = [str(CORE / "tests" / name) for name in ASAN_CORE_TESTS]
    _pytest(session, *TWO_PROCESSES, *tests, *session.posargs, env={"LD_PRELOAD": preload, "ASAN_OPTIONS": options})


@nox.session(python=PYTHON, requires=["build"], default=False)
def soak(session: nox.Session) -> None:
    """The full soak, not part of `tests` (docs/mechanisms/reliability.md): 10,000 random operators and
    1,000 training steps on 2 devices and 4 streams, then the runtime's soak under faults at 10 times
    its size. `nox -s core` runs the quick profile of the first."""
    _install_core(session)
    _pytest(session, str(CORE / "tests" / "test_soak.py"), *session.posargs, env=_env(OPENREG_SOAK_SCALE="10"))
    session.install("cmake", "ninja")
    env = _env(OPENREG_TEST_SCALE="10")
    _pytest(session, str(CORE / "libopenreg" / "tests"), "-k", "soak", *session.posargs, env=env)


@nox.session(python=PYTHON, requires=["build"])
def amp(session: nox.Session) -> None:
    """openreg-amp's tests (autocast policies, GradScaler kernels, plugin loading), against the
    built core and amp wheels."""
    _install_core(session, plugins=("openreg_amp",))
    _pytest(session, str(ROOT / "packages" / "openreg-amp" / "tests"), *session.posargs)


# The torchao minor version openreg-quant is tested with (its metadata names no torch: --no-deps).
TORCHAO = "torchao==0.18.0"


@nox.session(python=PYTHON, requires=["build"])
def quant(session: nox.Session) -> None:
    """openreg-quant's tests (decomposed q/dq kernels, fused int8 ops, PT2E lowering, plugin loading),
    against the built core and quant wheels."""
    _install_core(session, plugins=("openreg_quant",), no_deps=(TORCHAO,))
    _pytest(session, str(ROOT / "packages" / "openreg-quant" / "tests"), *session.posargs)


# openreg-inductor's runtime dependencies beyond core and torch, as in its pyproject (its wheel installs
# with --no-deps).
INDUCTOR_DEPS = ("pyyaml>=6,<7",)


@nox.session(python=PYTHON, requires=["build"])
def inductor(session: nox.Session) -> None:
    """openreg-inductor's tests (torch.compile on openreg vs CPU Inductor), against the built core and
    inductor wheels. One Inductor cache per run, shared by the test processes (compiles dominate)."""
    # openreg-amp too: tests/test_autocast.py compiles autocast regions under its policies.
    _install_core(session, *INDUCTOR_DEPS, plugins=("openreg_inductor", "openreg_amp"))
    cache = Path(session.create_tmp()) / "inductor-cache"
    shutil.rmtree(cache, ignore_errors=True)  # cold: a stale cache would hide compile errors
    env = _env(TORCHINDUCTOR_CACHE_DIR=str(cache))
    tests = ROOT / "packages" / "openreg-inductor" / "tests"
    _pytest(session, *TWO_PROCESSES, str(tests), *session.posargs, env=env)
    # PyTorch's dynamo-wrapped test mode over a curated part of core's suite: the device API and
    # registration tests (the generated backend-type methods, autograd's device threads). The whole
    # suite under it takes well over an hour on 2 cores: see docs/mechanisms/compiler.md.
    wrapped = [str(CORE / "tests" / name) for name in ("test_device.py", "test_registration.py")]
    _pytest(session, *TWO_PROCESSES, *wrapped, env={**env, "PYTORCH_TEST_WITH_DYNAMO": "1"})


@nox.session(python=PYTHON, requires=["build"])
def distributed(session: nox.Session) -> None:
    """openreg-distributed's tests (occl collectives, DDP, plugin loading), against the built core and
    distributed wheels. Multi-process classes spawn their ranks once per class."""
    _install_core(session, plugins=("openreg_distributed",))
    tests = ROOT / "packages" / "openreg-distributed" / "tests"
    _pytest(session, *TWO_PROCESSES_BY_CLASS, str(tests), *session.posargs)


# openreg-onnx's runtime dependencies and its `kernels` extra, the ranges of its pyproject (its wheel
# installs with --no-deps).
ONNX_DEPS = (
    "onnx>=1.23,<1.24",
    "onnxscript>=0.7,<0.8",
    "onnxruntime>=1.32,<1.33",
    "onnxruntime-extensions>=0.15,<0.16",
)


@nox.session(python=PYTHON, requires=["build"])
def onnx(session: nox.Session) -> None:
    """openreg-onnx's tests (lazy export hooks, translation table in both modes, models verified in
    onnxruntime, export checks, CLI), against the built core and onnx wheels."""
    _install_core(session, *ONNX_DEPS, plugins=("openreg_onnx",))
    _pytest(session, *TWO_PROCESSES, str(ROOT / "packages" / "openreg-onnx" / "tests"), *session.posargs)


@nox.session(python=PYTHON, requires=["build"])
def packaging(session: nox.Session) -> None:
    """Checks what the wheels and sdists in dist/ contain and that the installed wheel imports; installs
    `openreg-core[EXTRA]` from dist/ into a fresh venv for every extra (tests/packaging/test_extras.py)."""
    _install_core(session, plugins=tuple(PLUGINS.values()))
    env = {"OPENREG_DIST": str(DIST), "OPENREG_TORCH_LAYER": str(TORCH_LAYER)}  # the fresh venv's torch: the layer
    # Two processes: the extras' tests are pip installs into fresh venvs, one core's worth of work each.
    _pytest(session, *TWO_PROCESSES, str(ROOT / "tests" / "packaging"), *session.posargs, env=env)


@nox.session(python=PYTHON, requires=["build"])
def scenarios(session: nox.Session) -> None:
    """The cross-package scenarios in tests/scenarios, with core and every plugin installed as a user
    would (`openreg-core[all]`): each compares a workload on openreg with the same on the CPU and
    prints a result line (pytest's summary, "openreg scenarios"). One Inductor cache per run."""
    _install_core(
        session,
        *ONNX_DEPS,
        *INDUCTOR_DEPS,
        plugins=tuple(PLUGINS.values()),
        no_deps=(TORCHAO,),
    )
    cache = Path(session.create_tmp()) / "inductor-cache"
    shutil.rmtree(cache, ignore_errors=True)  # cold, as in `inductor`
    env = _env(TORCHINDUCTOR_CACHE_DIR=str(cache))
    _pytest(session, *TWO_PROCESSES_BY_CLASS, str(ROOT / "tests" / "scenarios"), *session.posargs, env=env)


# The differential fuzzer's one dependency, pinned: a derandomized hypothesis draws the same programs
# only as long as its version stays the same.
HYPOTHESIS = "hypothesis==6.155.2"


@nox.session(python=PYTHON, requires=["build"], default=False)
def fuzz(session: nox.Session) -> None:
    """Differential fuzzing (tests/fuzz): random programs run on openreg and on the CPU must agree.
    Without arguments the quick profile (a fixed set of programs; `nox -s tests` runs it);
    `nox -s fuzz -- --minutes N` draws new programs for N minutes (release checks); `-- --seed N` reruns
    the seed a long-profile failure names. Other arguments go to pytest."""
    _install_core(session, HYPOTHESIS)
    args = list(session.posargs)
    for ours, pytest_option in (("--minutes", "--fuzz-minutes"), ("--seed", "--fuzz-seed")):
        args = [pytest_option if a == ours else a for a in args]
    _pytest(session, str(ROOT / "tests" / "fuzz"), "-p", "no:cacheprovider", *args)


@nox.session(
    python=False,
    requires=[
        "core",
        "amp",
        "distributed",
        "inductor",
        "quant",
        "onnx",
        "runtime",
        "runtime_asan",
        "runtime_tsan",
        "core_asan",
        "packaging",
        "docs",
        "bench",
        "scenarios",
        "fuzz",
    ],
)
def tests(session: nox.Session) -> None:
    """Everything: the sessions it requires, the cross-package scenarios last (no venv of its own)."""
    session.log("every session passed")


@nox.session(python=PYTHON, requires=["build"], default=False)
def bench(session: nox.Session) -> None:
    """Benchmark smoke run against the built wheel: the CLI's tests, then `run.py --quick` (writes
    bench-results/bench.json; asserts nothing about speed). For real numbers run tools/bench/run.py
    without --quick on a quiet machine. `nox -s bench -- --plot bench-results/bench.png` adds a chart."""
    _install_core(
        session,
        *("cmake", "ninja", "matplotlib", *ONNX_DEPS, *INDUCTOR_DEPS),
        plugins=tuple(PLUGINS.values()),
        no_deps=(TORCHAO,),  # the quant group's PT2E measure
    )
    bench = ROOT / "tools" / "bench"
    # Two processes: its tests mostly wait on the benchmark processes they start (24 -> 18 s).
    _pytest(session, *TWO_PROCESSES, str(bench / "test_bench_cli.py"))
    session.run(
        "python",
        str(bench / "run.py"),
        "--quick",
        "--json",
        str(ROOT / "bench-results" / "bench.json"),
        *session.posargs,
    )


@nox.session(python=PYTHON, default=False)
def docs(session: nox.Session) -> None:
    """The integration guide in docs/: builds it with Sphinx (MyST Markdown, warnings are errors, no
    network), then runs tests/docs, which checks that every path and `path::symbol` it names exists."""
    session.install(*DOCS_TOOLS, "pytest")
    docs_dir = ROOT / "docs"
    # -E: read every page on every run, so that warnings of unchanged pages still fail the build.
    session.run(
        "sphinx-build", "-W", "--keep-going", "-E", "-b", "html", str(docs_dir), str(docs_dir / "_build" / "html")
    )
    session.run("pytest", str(ROOT / "tests" / "docs"), *session.posargs)


@nox.session(python=PYTHON, default=False)
def lint(session: nox.Session) -> None:
    """ruff (check and format) on Python files; clang-format on C++ under packages/*/{csrc,libopenreg}."""
    session.install(*LINT_TOOLS)
    sources = sorted(
        str(p.relative_to(ROOT))
        for top in ("csrc", "libopenreg")
        for d in ROOT.glob(f"packages/*/{top}")
        for p in d.rglob("*")
        if p.suffix in CXX_SUFFIXES and p.is_file()
    )
    if not sources:
        session.error("no C++ sources found under packages/*/csrc or packages/*/libopenreg")
    checks = {
        "ruff check": ["ruff", "check", "."],
        "ruff format": ["ruff", "format", "--check", "--diff", "."],
        "clang-format": ["clang-format", "--dry-run", "--Werror", *sources],
    }
    failed = []
    for name, cmd in checks.items():  # every check runs, so one report shows all findings
        try:
            session.run(*cmd)
        except CommandFailed:
            failed.append(name)
    if failed:
        session.error(f"failed: {', '.join(failed)} (fix with `ruff check --fix`, `ruff format`, `clang-format -i`)")
