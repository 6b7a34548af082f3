"""Test helpers shared by core's and the plugins' test suites."""

import os
import subprocess
import sys
import textwrap
import threading
from typing import Any, Callable, Dict, Optional


def run_python(
    code: str, env: Optional[Dict[str, str]] = None, timeout: float = 120, cwd: Optional[str] = None
) -> subprocess.CompletedProcess:
    """Runs ``code`` (dedented) in a fresh interpreter and returns the finished process: for what is
    fixed at import time (autoload, plugin selection, environment variables), fork and crashes."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )


def died_of_memory_fault(returncode: int) -> bool:
    """Whether a child process's return code says it died of a memory access fault: SIGSEGV (or
    SIGBUS, which macOS may deliver for a protection fault), an access violation on Windows."""
    import signal

    if sys.platform == "win32":
        return (returncode & 0xFFFFFFFF) == 0xC0000005
    return returncode in (-signal.SIGSEGV, -getattr(signal, "SIGBUS", signal.SIGSEGV))


def raw_kernel_team_size() -> int:
    """The intra-op thread count that a kernel launched with ``orLaunchKernel`` itself (as compiled
    code launches, counting no tensor) runs with on the current stream's worker: the host's count,
    unless a launch site left a count of tensor bytes behind (the small-kernel rule, core's
    OpenRegStream.h)."""
    import ctypes

    import torch

    import torch_openreg

    lib = ctypes.CDLL(torch_openreg.library_file("openreg"))
    kernel_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
    seen = []

    def kernel(_):
        seen.append(torch.get_num_threads())
        return 0

    fn = kernel_type(kernel)
    lib.orLaunchKernel.argtypes = [ctypes.c_void_p, ctypes.c_char_p, kernel_type, ctypes.c_void_p, ctypes.c_void_p]
    assert lib.orLaunchKernel(torch.openreg.current_raw_stream(), b"team_size_probe", fn, None, None) == 0
    torch.openreg.synchronize()
    return seen[0]


def compile_probe(name: str, source: str, folder: str) -> Any:
    """Compiles the C++ ``source`` in ``folder`` as a shared library built the way a plugin is
    (``torch_openreg.utils.cpp_extension.OpenRegExtension``'s flags, core's headers and libraries)
    and loads it with ctypes: for tests that check what a vendor's launch site or kernel sees."""
    import ctypes
    from pathlib import Path

    from torch.utils.cpp_extension import load

    from .cpp_extension import OpenRegExtension, link_flag

    ext = OpenRegExtension(f"{name}._C", [f"{name}.cpp"])
    path = Path(folder, f"{name}.cpp")
    path.write_text(source)
    library = load(
        name,
        [str(path)],
        extra_cflags=ext.extra_compile_args,
        extra_include_paths=ext.include_dirs,
        extra_ldflags=[
            *ext.extra_link_args,
            *(f"-L{d}" for d in ext.library_dirs if sys.platform != "win32"),
            *(link_flag(lib) for lib in ext.libraries),
        ],
        build_directory=folder,
        is_python_module=False,
    )
    return ctypes.CDLL(library)


class StreamHold:
    """Keeps an openreg stream busy until released, to prove that host calls do not wait for the
    device: a call made while the stream is held that returns at all did not wait (a waiting one
    would block until the hold times out, and the stream would then be idle). ::

        with StreamHold() as held:     # the current stream of the current device is busy from here
            y = x + 1                  # queued behind the held kernel
            assert not held.stream.query()
        # leaving releases the stream

    ``held.output`` is a tensor the held kernel writes (ops that read it are ordered after it).
    The hold is a Python kernel (a ``torch.library`` custom op) that waits on an event.
    """

    _release = None
    _op = None

    def __init__(self, device=None, timeout: float = 30.0):
        import torch

        self.device = torch.device("openreg", torch.openreg.current_device() if device is None else device)
        self.timeout = timeout
        self.stream = None
        self.output = None

    @classmethod
    def _hold_op(cls):
        import threading

        import torch

        if cls._op is None:
            cls._release = threading.Event()

            @torch.library.custom_op("openreg_testing::hold", mutates_args=(), device_types="cpu")
            def hold(x: torch.Tensor, timeout: float) -> torch.Tensor:
                cls._release.wait(timeout)
                return x.clone()

            @hold.register_fake
            def _(x, timeout):
                return torch.empty_like(x)

            cls._op = hold
        return cls._op

    def __enter__(self) -> "StreamHold":
        import torch

        hold = self._hold_op()
        x = torch.zeros(4, device=self.device)
        StreamHold._release.set()
        hold(x, self.timeout) + 1  # a signature's first call runs synchronously: later ones are queued
        torch.openreg.synchronize(self.device)
        StreamHold._release.clear()
        self.stream = torch.openreg.current_stream(self.device)
        self.output = hold(x, self.timeout)
        return self

    def release(self) -> None:
        """Lets the held kernel finish (the stream then runs what was queued behind it)."""
        StreamHold._release.set()

    def __exit__(self, *exc) -> None:
        self.release()


def first_use_calls(device: str) -> Dict[str, Callable[[], object]]:
    """Issue #15's common operators (factories, random, reductions, indexing, normalisation,
    attention), one call each on ``device``: what core's first-use test runs in a fresh process
    (none may import a heavy module) and what ``tools/bench/first_use.py`` times."""
    import torch
    import torch.nn.functional as F

    dev = device
    return {
        "arange": lambda: torch.arange(10, device=dev),
        "randn": lambda: torch.randn(3, device=dev),
        "rand": lambda: torch.rand(3, device=dev),
        "randint": lambda: torch.randint(0, 5, (3,), device=dev),
        "normal_": lambda: torch.empty(3, device=dev).normal_(),
        "uniform_": lambda: torch.empty(3, device=dev).uniform_(),
        "bernoulli": lambda: torch.bernoulli(torch.full((3,), 0.5, device=dev)),
        "dropout": lambda: F.dropout(torch.ones(8, device=dev), 0.5, training=True),
        "linspace": lambda: torch.linspace(0, 1, 5, device=dev),
        "full": lambda: torch.full((2, 2), 3.0, device=dev),
        "eye": lambda: torch.eye(3, device=dev),
        "zeros_like": lambda: torch.zeros_like(torch.ones(2, device=dev)),
        "sum": lambda: torch.ones(4, device=dev).sum(),
        "argmax": lambda: torch.ones(4, device=dev).argmax(),
        "nonzero": lambda: torch.ones(4, device=dev).nonzero(),
        "cat": lambda: torch.cat([torch.ones(2, device=dev)] * 2),
        "index_select": lambda: torch.ones(4, device=dev).index_select(0, torch.tensor([0, 2], device=dev)),
        "embedding": lambda: F.embedding(torch.tensor([1, 2], device=dev), torch.ones(4, 3, device=dev)),
        "layer_norm": lambda: F.layer_norm(torch.ones(2, 4, device=dev), (4,)),
        "softmax": lambda: torch.ones(2, 4, device=dev).softmax(-1),
        "cross_entropy": lambda: F.cross_entropy(torch.ones(2, 4, device=dev), torch.tensor([0, 1], device=dev)),
        "sdpa": lambda: F.scaled_dot_product_attention(*(torch.ones(1, 2, 4, 8, device=dev),) * 3),
    }


def assert_same_quantization(test, got, want, msg=None) -> None:
    """Checks with ``test`` (a TestCase) that quantized tensors ``got`` and ``want`` are quantized
    alike: dtype, scheme, quantization parameters (those of ``got`` on its own device, with
    ``want``'s dtypes and values), shape and strides. The integer values are the caller's to compare:
    without openreg-quant an openreg tensor's can only be read through ``.cpu()``."""
    import torch

    test.assertTrue(got.is_quantized, msg)
    test.assertEqual(got.dtype, want.dtype, msg=msg)
    test.assertEqual(got.qscheme(), want.qscheme(), msg=msg)
    test.assertEqual(got.shape, want.shape, msg=msg)
    test.assertEqual(got.stride(), want.stride(), msg=msg)
    if want.qscheme() == torch.per_tensor_affine:
        test.assertEqual((got.q_scale(), got.q_zero_point()), (want.q_scale(), want.q_zero_point()), msg=msg)
        return
    test.assertEqual(got.q_per_channel_axis(), want.q_per_channel_axis(), msg=msg)
    for a, b in (
        (got.q_per_channel_scales(), want.q_per_channel_scales()),
        (got.q_per_channel_zero_points(), want.q_per_channel_zero_points()),
    ):
        test.assertEqual(a.device, got.device, msg=msg)  # the parameters live with the tensor
        test.assertEqual(a.dtype, b.dtype, msg=msg)
        test.assertTrue(torch.equal(a.cpu(), b.cpu()), msg)


def run_threads(body: Callable[[int], None], count: int, timeout: float = 300) -> None:
    """Runs body(t) for t in range(count) on that many threads at once. Raises AssertionError if a
    thread is still running after `timeout` seconds, or with every (t, exception) the threads raised."""
    errors = []

    def guarded(t):
        try:
            body(t)
        except BaseException as e:
            errors.append((t, e))

    threads = [threading.Thread(target=guarded, args=(t,)) for t in range(count)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=timeout)
    if any(th.is_alive() for th in threads):
        raise AssertionError("a thread hung")
    if errors:
        raise AssertionError(f"threads raised: {errors}")


def _extract_test_fn_by_frames() -> Optional[Callable]:
    """What ``torch.testing._internal.common_utils.extract_test_fn`` returns (the running test's
    function, found by the first frame whose ``self`` is the TestCase running it), found by walking
    the frames instead of ``inspect.stack()``, which reads every frame's source and searches
    sys.modules for its module: 20 to 60 ms per call, two calls per ``OpInfo.sample_inputs``."""
    import unittest

    try:
        frame = sys._getframe(1)
        while frame is not None:
            self_val = frame.f_locals.get("self")
            if isinstance(self_val, unittest.TestCase):
                *_, cls_name, test_name = self_val.id().rsplit(".", 2)
                if cls_name == type(self_val).__name__ and test_name.startswith("test"):
                    return getattr(self_val, test_name).__func__
            frame = frame.f_back
    except Exception:
        pass
    return None


def fast_opinfo_samples() -> None:
    """Makes OpInfo sample generation skip its stack inspection: the same test function is found
    (so the same per-test seeds and the same samples), without reading source files. In core's
    OpInfo suite it was most of the time spent making samples. Call once, at a test module's import."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core as opinfo_core

    global _extract_test_fn_by_stack
    if common_utils.extract_test_fn is not _extract_test_fn_by_frames:
        _extract_test_fn_by_stack = common_utils.extract_test_fn  # kept for the test that compares them
    common_utils.extract_test_fn = _extract_test_fn_by_frames
    opinfo_core.extract_test_fn = _extract_test_fn_by_frames


_extract_test_fn_by_stack: Optional[Callable] = None
