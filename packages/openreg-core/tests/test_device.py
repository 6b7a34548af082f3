"""Device registration, torch.openreg's device API and torch.accelerator."""

import sys
import threading

import pytest
import torch
from conftest import run_python
from torch.testing._internal.common_utils import TestCase


class TestRegistration(TestCase):
    def test_autoload_quickstart(self):
        r = run_python(
            """
            import torch
            device = torch.device("openreg")
            x = torch.tensor([[1., 2.], [3., 4.]], device=device)
            y = x + 2
            print(y.device, y.cpu().tolist(), torch.openreg.is_available())
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "openreg:0 [[3.0, 4.0], [5.0, 6.0]] True")

    def test_autoload_can_be_disabled(self):
        r = run_python(
            "import torch; print(hasattr(torch, 'openreg'), torch._C._get_privateuse1_backend_name())",
            env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "False privateuseone")

    def test_importing_the_package_before_torch(self):
        # torch's autoload then meets the package half-imported; both orders must work.
        for first in ("import torch_openreg, torch", "import torch, torch_openreg"):
            r = run_python(f"{first}; print(torch.ones(2, device='openreg').add(1).cpu().tolist())")
            self.assertEqual(r.returncode, 0, f"{first}: {r.stderr}")
            self.assertEqual(r.stdout.strip(), "[2.0, 2.0]")
        r = run_python(
            "import torch_openreg; print(torch_openreg.torch.ones(1, device='openreg').device)",
            env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "openreg:0")

    def test_plugin_build_paths(self):
        import os

        import torch_openreg

        (include,) = torch_openreg.include_paths()
        self.assertTrue(os.path.isfile(os.path.join(include, "openreg", "runtime.h")))
        self.assertTrue(os.path.isfile(os.path.join(include, "torch_openreg", "runtime", "OpenRegStream.h")))
        (lib,) = torch_openreg.library_paths()
        for name in ("openreg", "torch_openreg"):  # under the platform's file name, in that folder
            self.assertEqual(os.path.dirname(torch_openreg.library_file(name)), lib)
            self.assertTrue(os.path.isfile(torch_openreg.library_file(name)), os.listdir(lib))

    def test_imports_without_fork(self):
        # Windows has no os.register_at_fork: the package's fork handlers are POSIX's only.
        r = run_python(
            """
            import os
            import torch
            del os.register_at_fork
            import torch_openreg
            print(torch.ones(2, device="openreg").add(1).cpu().tolist())
            """,
            env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "[2.0, 2.0]")

    def test_plugin_extension_flags(self):
        """OpenRegExtension: core's headers and libraries, no debug information by default (Python's
        CFLAGS carry -g), and a plugin's own flags after that, so that its "-g" wins."""
        import torch_openreg
        from torch_openreg.utils.cpp_extension import OpenRegExtension, openmp_flags

        ext = OpenRegExtension("p._C", ["a.cpp"])
        omp = ["-fopenmp"] if sys.platform.startswith("linux") else []
        self.assertEqual(openmp_flags(), omp)
        self.assertEqual(ext.extra_compile_args, ["-g0", *omp, "-O2", "-Wall", "-Wno-unused-parameter"])
        self.assertEqual(ext.extra_link_args[:-1], omp)
        self.assertTrue({"torch_openreg", "openreg"} <= set(ext.libraries), ext.libraries)
        self.assertTrue(set(torch_openreg.include_paths()) <= set(ext.include_dirs))
        self.assertTrue(set(torch_openreg.library_paths()) <= set(ext.library_dirs))
        ext = OpenRegExtension("p._C", ["a.cpp"], extra_compile_args=["-O3", "-g"])
        self.assertEqual(ext.extra_compile_args, ["-g0", *omp, "-O3", "-g"])
        self.assertFalse(ext.openreg_unity)

    def test_plugin_extension_unity_source(self):
        """OpenRegExtension(unity=True): build_ext compiles one generated unit that includes the
        sources in order (absolute paths); an unchanged unit is not rewritten (incremental builds)."""
        import os
        import tempfile
        from pathlib import Path

        from torch_openreg.utils.cpp_extension import OpenRegExtension, unity_source

        self.assertTrue(OpenRegExtension("p._C", ["a.cpp", "b.cpp"], unity=True).openreg_unity)
        with tempfile.TemporaryDirectory() as tmp:
            sources = [str(Path(tmp, "src", name)) for name in ("b.cpp", "a.cpp")]
            path = Path(unity_source("p._C", sources, tmp))
            self.assertEqual(path, Path(tmp, "unity", "p__C.cpp"))
            includes = [line for line in path.read_text().splitlines() if line.startswith("#include")]
            self.assertEqual(includes, [f'#include "{Path(s).resolve().as_posix()}"' for s in sources])
            os.utime(path, (0, 0))
            unity_source("p._C", sources, tmp)
            self.assertEqual(path.stat().st_mtime, 0)  # same sources: left alone
            unity_source("p._C", sources[:1], tmp)
            self.assertNotEqual(path.stat().st_mtime, 0)
            self.assertEqual(path.read_text().count("#include"), 1)

    def test_plugin_extension_parallel_for_uses_torchs_team(self):
        """A unit built with OpenRegExtension's flags runs at::parallel_for on torch's OpenMP team:
        torch.set_num_threads sizes it, beyond the core count too (a second OpenMP runtime would
        ignore it). Without the flags the header template runs serially (team of 1)."""
        import ctypes
        import tempfile

        from torch_openreg.utils.cpp_extension import openmp_flags
        from torch_openreg.utils.testing import compile_probe

        probe = """
            #include <ATen/Parallel.h>
            #include <atomic>
            #include <cstdint>
            // How many threads ran a chunk of at::parallel_for over n one-element chunks.
            extern "C" int team_size(int64_t n) {
              std::atomic<uint64_t> seen{0};
              at::parallel_for(0, n, 1, [&](int64_t, int64_t) { seen |= uint64_t{1} << at::get_thread_num(); });
              int count = 0;
              for (uint64_t m = seen.load(); m; m &= m - 1) ++count;
              return count;
            }
        """
        before = torch.get_num_threads()
        with tempfile.TemporaryDirectory() as tmp:
            team_size = compile_probe("openreg_team_probe", probe, tmp).team_size
            team_size.argtypes = [ctypes.c_int64]
            try:
                for n in (1, 2, 3):
                    torch.set_num_threads(n)
                    self.assertEqual(team_size(64), n if openmp_flags() else 1)
            finally:
                torch.set_num_threads(before)

    def test_backend_name_and_module(self):
        self.assertEqual(torch._C._get_privateuse1_backend_name(), "openreg")
        self.assertIs(torch.openreg, torch.get_device_module("openreg"))

    def test_generated_methods(self):
        t = torch.ones(3)
        self.assertFalse(t.is_openreg)
        d = t.openreg()
        self.assertTrue(d.is_openreg)
        self.assertEqual(d.device, torch.device("openreg:0"))
        self.assertEqual(t.openreg(1).device, torch.device("openreg:1"))
        m = torch.nn.Linear(2, 2).openreg()
        self.assertEqual(m.weight.device, torch.device("openreg:0"))
        s = torch.ones(4).untyped_storage().openreg()
        self.assertTrue(s.is_openreg)
        self.assertEqual(s.device.type, "openreg")

    def test_legacy_type_string(self):
        self.assertEqual(torch.ones(2, device="openreg").type(), "torch.openreg.FloatTensor")


class TestDeviceModule(TestCase):
    def test_count_and_current(self):
        self.assertTrue(torch.openreg.is_available())
        self.assertEqual(torch.openreg.device_count(), 2)
        self.assertEqual(torch.openreg.current_device(), 0)
        torch.openreg.set_device(1)
        self.assertEqual(torch.openreg.current_device(), 1)
        self.assertEqual(torch.ones(1, device="openreg").device, torch.device("openreg:1"))
        torch.openreg.set_device("openreg:0")
        self.assertEqual(torch.openreg.current_device(), 0)

    def test_device_count_env(self):
        r = run_python("import torch; print(torch.openreg.device_count())", env={"OPENREG_DEVICE_COUNT": "3"})
        self.assertEqual(r.stdout.strip(), "3", r.stderr)

    def test_malformed_environment_is_named(self):
        # The error used to say "check OPENREG_DEVICE_COUNT" whatever the variable at fault.
        for var, value, says in (
            ("OPENREG_DEVICE_MEMORY", "lots", "is not a size such as 512M or 8G"),
            ("OPENREG_DEVICE_MEMORY", "17179869184G", "is not a size such as 512M or 8G"),  # wrapped to 0
            # strtoull's sign and a size beyond the address space: the first call failed to map the
            # device ("Invalid argument", naming nothing), and the process aborted at exit
            ("OPENREG_DEVICE_MEMORY", "-1", "is not a size such as 512M or 8G (at most 512G)"),
            ("OPENREG_DEVICE_MEMORY", "18446744073709551615", "is not a size such as 512M or 8G"),
            ("OPENREG_DEVICE_MEMORY", "200000G", "is not a size such as 512M or 8G"),
            ("OPENREG_SPIN_US", "abc", "is not a whole number of microseconds"),  # was read as 0
            ("OPENREG_SPIN_US", "+5", "is not a whole number of microseconds"),  # strtol's sign
            ("OPENREG_WAIT_SPIN_US", "2000000", "is not a whole number of microseconds"),
            ("OPENREG_DEVICE_COUNT", "0", "is not a whole number from 1 to 64"),
        ):
            r = run_python(
                """
                import torch
                try:
                    torch.ones(1, device="openreg")
                except RuntimeError as e:
                    print(e)
                """,
                env={var: value},
            )
            self.assertIn(f"No openreg device is available: orErrorInitialization: {var}='{value}' {says}", r.stdout)
            self.assertEqual(r.returncode, 0, r.stderr)

    def test_negative_index_leaves_the_device_alone(self):
        # As torch.cuda: a CPU tensor's get_device() is -1, and code passes it on.
        torch.openreg.set_device(1)
        torch.openreg.set_device(-1)
        self.assertEqual(torch.openreg.current_device(), 1)
        with torch.openreg.device(torch.ones(1).get_device()):
            self.assertEqual(torch.openreg.current_device(), 1)
        self.assertEqual(torch.openreg.current_device(), 1)
        with self.assertRaisesRegex(RuntimeError, "Invalid openreg device index 5"):
            torch.openreg.set_device(5)
        # No index names no device to set: refused, as torch.cuda.set_device refuses it (it did nothing).
        for unindexed in (None, "openreg", torch.device("openreg")):
            with self.assertRaisesRegex(ValueError, "Expected an openreg device with a specified index, got: "):
                torch.openreg.set_device(unindexed)
        self.assertEqual(torch.openreg.current_device(), 1)
        self.assertTrue(torch.openreg.is_bf16_supported())

    def test_negative_index_means_the_current_device_for_streams_and_synchronize(self):
        # As torch.cuda's current_stream/default_stream/synchronize (getCurrentCUDAStream(-1)); the
        # memory and RNG functions still refuse it, as CUDA's do.
        o = torch.openreg
        o.set_device(1)
        self.assertEqual(o.current_stream(-1), o.current_stream(1))
        self.assertEqual(o.default_stream(-1), o.default_stream(1))
        self.assertEqual(o.current_raw_stream(-1), o.current_raw_stream(1))
        self.assertEqual(o.Stream(device=-1).device, torch.device("openreg:1"))  # as torch.cuda.Stream (it raised)
        x = torch.ones(4, device="openreg:1") * 3
        o.synchronize(torch.ones(1).get_device())
        self.assertEqual(x.cpu().tolist(), [3.0] * 4)
        self.assertEqual(o.current_device(), 1)
        with self.assertRaisesRegex(ValueError, "Invalid openreg device index -1: indices start at 0"):
            o.memory_allocated(-1)

    def test_device_context(self):
        with torch.openreg.device(1):
            self.assertEqual(torch.openreg.current_device(), 1)
            with torch.openreg.device(0):
                self.assertEqual(torch.openreg.current_device(), 0)
            self.assertEqual(torch.openreg.current_device(), 1)
        self.assertEqual(torch.openreg.current_device(), 0)

    def test_device_guard_for_compiled_code(self):
        # torch.openreg._DeviceGuard: what openreg-inductor's wrappers enter (a valid index).
        with torch.openreg._DeviceGuard(1):
            self.assertEqual(torch.openreg.current_device(), 1)
            with torch.openreg._DeviceGuard(0):
                self.assertEqual(torch.openreg.current_device(), 0)
            self.assertEqual(torch.openreg.current_device(), 1)
        self.assertEqual(torch.openreg.current_device(), 0)
        with self.assertRaisesRegex(RuntimeError, "Invalid openreg device index 5"):
            with torch.openreg._DeviceGuard(5):
                pass
        self.assertEqual(torch.openreg.current_device(), 0)
        with self.assertRaisesRegex(KeyError, "raised inside"):
            with torch.openreg._DeviceGuard(1):
                raise KeyError("raised inside")
        self.assertEqual(torch.openreg.current_device(), 0)
        with torch.openreg._DeviceGuard(1):  # a negative index leaves the device alone
            with torch.openreg._DeviceGuard(-1):
                self.assertEqual(torch.openreg.current_device(), 1)
            self.assertEqual(torch.openreg.current_device(), 1)
        with self.assertRaisesRegex(TypeError, "_DeviceGuard: the device index must be an int"):
            torch.openreg._DeviceGuard("openreg:1")
        with self.assertRaisesRegex(TypeError, r"_DeviceGuard\(index\) takes 1 positional argument"):
            torch.openreg._DeviceGuard(index=1)
        self.assertEqual(torch.openreg.current_device(), 0)

    def test_empty_strided_for_compiled_code(self):
        # torch_openreg._C._empty_strided(size, stride, dtype, index): openreg-inductor's buffers.
        from torch_openreg import _C

        t = _C._empty_strided((2, 3), (1, 2), torch.float16, 1)
        self.assertEqual(
            (t.device, t.dtype, t.shape, t.stride()), (torch.device("openreg:1"), torch.float16, (2, 3), (1, 2))
        )
        self.assertEqual(torch.openreg.current_device(), 0)  # the index was only guarded
        self.assertEqual(t.copy_(torch.arange(6.0).view(2, 3)).cpu(), torch.arange(6.0).view(2, 3).half())
        with torch.openreg.device(1):
            self.assertEqual(_C._empty_strided([4], [1], torch.int64, -1).device, torch.device("openreg:1"))
        self.assertEqual(_C._empty_strided((), (), torch.bool, 0).shape, ())

        def allocated_while_held():
            # A function of its own: under PYTORCH_TEST_WITH_DYNAMO a graph break keeps the values
            # it passes on alive until the compiled function returns, past a `del`.
            before = torch.openreg.memory_allocated(0)
            held = _C._empty_strided((256, 1024), (1024, 1), torch.float32, 0)  # noqa: F841
            return torch.openreg.memory_allocated(0) - before

        before = torch.openreg.memory_allocated(0)
        self.assertEqual(allocated_while_held(), 1 << 20)  # the caching allocator's block
        self.assertEqual(torch.openreg.memory_allocated(0), before)  # and freed with the tensor
        with self.assertRaisesRegex(ValueError, "2 sizes but 1 strides"):
            _C._empty_strided((2, 3), (1,), torch.float32, 0)
        with self.assertRaisesRegex(RuntimeError, "Invalid openreg device index 257"):
            _C._empty_strided((2,), (1,), torch.float32, 257)  # not 1 after narrowing
        with self.assertRaisesRegex(RuntimeError, "Invalid openreg device index -2"):
            _C._empty_strided((2,), (1,), torch.float32, -2)  # -1 alone means the current device
        with self.assertRaisesRegex(TypeError, "size must be a tuple of ints"):
            _C._empty_strided((2, "3"), (3, 1), torch.float32, 0)
        with self.assertRaisesRegex(TypeError, "dtype must be a torch.dtype"):
            _C._empty_strided((2,), (1,), "float32", 0)
        with self.assertRaisesRegex(TypeError, "takes 4 arguments, got 3"):
            _C._empty_strided((2,), (1,), torch.float32)
        with self.assertRaisesRegex(RuntimeError, "negative dimension"):
            _C._empty_strided((-1,), (1,), torch.float32, 0)
        with self.assertRaisesRegex(RuntimeError, "out of memory|overflow"):
            _C._empty_strided((1 << 40,), (1,), torch.float32, 0)

    def test_empty_strided_for_compiled_code_releases_the_gil(self):
        # Another thread holds the allocator's lock while it waits for the device (empty_cache behind
        # an event of a stream whose queued Python kernel needs the GIL): an allocation that kept
        # the GIL while it waited for that lock hung all three for good.
        r = run_python(
            """
            import faulthandler, threading, time, torch
            from torch_openreg import _C
            from torch_openreg.utils.testing import StreamHold

            faulthandler.dump_traceback_later(30, exit=True)
            s = torch.openreg.Stream()
            with torch.openreg.stream(s):
                hold = StreamHold(timeout=20).__enter__()  # s runs a Python kernel that waits
            block = torch.empty(1 << 20, device="openreg")
            block.record_stream(s)
            del block  # its reuse waits for an event on s
            emptier = threading.Thread(target=torch.openreg.empty_cache)
            emptier.start()
            time.sleep(0.5)  # it now holds the allocator's lock, waiting for s
            hold.release()  # the kernel returns once it gets the GIL
            z = _C._empty_strided((4,), (1,), torch.float32, 0)
            emptier.join(20)
            print("done", z.device, emptier.is_alive())
            """,
            timeout=60,
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "done openreg:0 False")

    def test_invalid_device_index(self):
        with self.assertRaisesRegex(RuntimeError, "Invalid openreg device index 5: there are 2 openreg devices"):
            torch.openreg.set_device(5)
        with self.assertRaisesRegex(ValueError, "Invalid openreg device index -1"):
            torch.openreg.get_device_properties(-1)  # (set_device(-1) does nothing, as in torch.cuda)
        with self.assertRaisesRegex(RuntimeError, "index 2"):
            torch.ones(1, device="openreg:2")
        self.assertEqual(torch.openreg.current_device(), 0)
        self.assertEqual(torch.ones(1, device="openreg").add(1).cpu().item(), 2.0)

    def test_indices_past_the_8_bit_range_are_refused(self):
        # A device index is 8 bits in C++: checked after the cast, 257 became 1 and passed.
        o = torch.openreg
        calls = {
            "set_device": lambda d: o.set_device(d),
            "Stream": lambda d: o.Stream(d),
            "current_stream": lambda d: o.current_stream(d),
            "default_stream": lambda d: o.default_stream(d),
            "synchronize": lambda d: o.synchronize(d),
            "memory_allocated": lambda d: o.memory_allocated(d),
            "memory_stats": lambda d: o.memory_stats(d),
            "reset_peak_memory_stats": lambda d: o.reset_peak_memory_stats(d),
            "mem_get_info": lambda d: o.mem_get_info(d),
            "get_rng_state": lambda d: o.get_rng_state(d),
            "device": lambda d: o.device(d).__enter__(),
        }
        for index in (255, 256, 257, 2**31, 2**40):  # beyond C int too: the same error, not pybind11's
            for name, call in calls.items():
                with self.subTest(call=name, index=index):
                    with self.assertRaisesRegex(
                        RuntimeError, f"Invalid openreg device index {index}: there are 2 openreg devices"
                    ):
                        call(index)
                    self.assertEqual(o.current_device(), 0)
        self.assertEqual(torch.ones(1, device="openreg").add(1).cpu().item(), 2.0)

    def test_wrong_device_type(self):
        with self.assertRaisesRegex(ValueError, "Expected an openreg device"):
            torch.openreg.set_device(torch.device("cpu"))

    def test_current_device_is_per_thread(self):
        seen = {}
        barrier = threading.Barrier(2)

        def worker(index):
            torch.openreg.set_device(index)
            barrier.wait()
            seen[index] = (torch.openreg.current_device(), torch.ones(1, device="openreg").device.index)

        threads = [threading.Thread(target=worker, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(seen, {0: (0, 0), 1: (1, 1)})
        self.assertEqual(torch.openreg.current_device(), 0)

    def test_properties(self):
        p = torch.openreg.get_device_properties(0)
        self.assertEqual(p.name, "OpenReg Emulated Device")
        self.assertEqual(torch.openreg.get_device_name(1), "OpenReg Emulated Device")
        self.assertEqual(p.total_memory, 8 << 30)
        self.assertGreaterEqual(p.multi_processor_count, 1)
        self.assertEqual(torch.openreg.get_device_capability(), (1, 0))
        free, total = torch.openreg.mem_get_info(0)
        self.assertEqual(total, 8 << 30)
        self.assertLessEqual(free, total)

    def test_init(self):
        torch.openreg.init()
        self.assertTrue(torch.openreg.is_initialized())

    def test_amp_dtypes(self):
        self.assertEqual(torch.openreg.get_amp_supported_dtype(), [torch.float16, torch.bfloat16])


class TestDefaultDevice(TestCase):
    """openreg as the default device (``with torch.device(...)``, ``torch.set_default_device``):
    factories and module construction land on it, with the CPU's values."""

    def test_factories_and_modules_under_a_device_context(self):
        factories = {
            "zeros": lambda: torch.zeros(2, 3),
            "full": lambda: torch.full((2,), 7.0),
            "arange": lambda: torch.arange(5),
            "linspace": lambda: torch.linspace(0, 1, 5),
            "eye": lambda: torch.eye(3),
            "tensor": lambda: torch.tensor([[1.0, 2.0]]),
            "as_tensor": lambda: torch.as_tensor([1, 2, 3]),
            "kaiser_window": lambda: torch.kaiser_window(6),
        }
        with torch.device("openreg:1"):
            self.assertEqual(torch.get_default_device(), torch.device("openreg", 1))
            made = {name: make() for name, make in factories.items()}
            randn = torch.randn(4)
            linear = torch.nn.Linear(3, 2)
            norm = torch.nn.LayerNorm(2)
        self.assertEqual(torch.get_default_device(), torch.device("cpu"))  # the context ended
        for name, t in made.items():
            self.assertEqual(t.device, torch.device("openreg", 1), msg=name)
            self.assertEqual(t.cpu(), factories[name](), msg=name)
        self.assertEqual(randn.device, torch.device("openreg", 1))
        params = [*linear.parameters(), *norm.parameters()]
        self.assertEqual({p.device for p in params}, {torch.device("openreg", 1)})
        reference = torch.nn.Linear(3, 2)
        reference.load_state_dict({k: v.cpu() for k, v in linear.state_dict().items()})
        x = torch.randn(4, 3)
        self.assertEqual(norm(linear(x.to("openreg:1"))).cpu(), torch.nn.LayerNorm(2)(reference(x)))

    def test_set_default_device_and_meta_initialisation(self):
        import numpy as np

        torch.set_default_device("openreg")
        try:
            self.assertEqual(torch.ones(2).device, torch.device("openreg", 0))
            self.assertEqual(torch.from_numpy(np.ones(2)).device.type, "cpu")  # data that is already on the host
            inits = []
            for _ in range(2):
                with torch.device("meta"):
                    model = torch.nn.Linear(8, 4)
                model.to_empty(device="openreg")
                torch.manual_seed(0)
                model.reset_parameters()
                inits.append(model.weight.detach().cpu())
            self.assertEqual(inits[0], inits[1])  # initialised on openreg, reproducibly
            self.assertEqual(model.weight.device, torch.device("openreg", 0))
        finally:
            torch.set_default_device(None)
        self.assertEqual(torch.ones(1).device, torch.device("cpu"))

    def test_the_first_send_under_an_openreg_default_device(self):
        # The shared slab in which receivers count themselves is made at a process's first send: it was
        # made on the default device, so with openreg as the default the send failed ("_ipc_add_slab: a
        # slab is a contiguous 1-D int64 CPU tensor"). A fresh process: the slab is made once.
        r = run_python(
            """
            import pickle
            from multiprocessing.reduction import ForkingPickler
            import torch
            x = torch.arange(4.0, device="openreg")
            with torch.device("openreg"):
                back = pickle.loads(ForkingPickler.dumps(x))
            print(back.device, back.cpu().tolist())
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "openreg:0 [0.0, 1.0, 2.0, 3.0]")


class TestAccelerator(TestCase):
    def test_accelerator_api(self):
        self.assertEqual(torch.accelerator.current_accelerator(), torch.device("openreg"))
        self.assertTrue(torch.accelerator.is_available())
        self.assertEqual(torch.accelerator.device_count(), 2)
        torch.accelerator.set_device_index(1)
        self.assertEqual(torch.accelerator.current_device_index(), 1)
        torch.accelerator.set_device_index(0)
        s = torch.accelerator.current_stream()
        self.assertEqual(s.device, torch.device("openreg:0"))
        x = torch.ones(1000, device="openreg") * 3
        torch.accelerator.synchronize()
        self.assertEqual(x.sum().item(), 3000.0)

    def test_generic_stream_and_event(self):
        s = torch.Stream(device="openreg")
        e = torch.Event(device="openreg", enable_timing=True)
        with torch.accelerator.stream(s) if hasattr(torch.accelerator, "stream") else torch.openreg.stream(s):
            y = torch.ones(4, device="openreg") * 2
            e.record(s)
        e.synchronize()
        self.assertTrue(e.query())
        self.assertEqual(y.cpu().tolist(), [2.0] * 4)


class TestFork(TestCase):
    def test_fork_after_init_is_poisoned(self):
        r = run_python(
            """
            import os, torch
            torch.ones(1, device="openreg").cpu()
            pid = os.fork()
            if pid == 0:
                try:
                    torch.ones(1, device="openreg").cpu()
                    os._exit(3)
                except RuntimeError as e:
                    # torch's lazy initialisation asks torch.openreg again, as for CUDA (the
                    # runtime's own guard answered before: orErrorForkedProcess)
                    os._exit(0 if str(e).startswith("Cannot re-initialize openreg in forked subprocess") else 4)
            _, status = os.waitpid(pid, 0)
            print(os.waitstatus_to_exitcode(status))
            """
        )
        self.assertEqual(r.stdout.strip(), "0", r.stderr)

    def test_a_child_frees_inherited_tensors_used_on_other_streams(self):
        # Freeing a block used on another stream (record_stream) records events, which the runtime
        # refuses in the child: that threw inside the tensor's deleter and aborted the child at its
        # exit. The child cannot use the device, so the block is dropped.
        r = run_python(
            """
            import os, sys, torch
            y, z = torch.ones(1000, device="openreg"), torch.ones(1000, device="openreg")
            s = torch.openreg.Stream()
            with torch.openreg.stream(s):
                y.add_(1)
                z.add_(1)
            y.record_stream(s)
            z.record_stream(s)
            torch.openreg.synchronize()
            pid = os.fork()
            if pid == 0:
                del y  # freed by hand, then z at the interpreter's exit
                sys.exit(0)
            _, status = os.waitpid(pid, 0)
            print(os.waitstatus_to_exitcode(status), y.cpu()[:2].tolist(), z.cpu()[:2].tolist())
            """
        )
        self.assertEqual(r.stdout.strip(), "0 [2.0, 2.0] [2.0, 2.0]", r.stderr)
        self.assertNotIn("openreg allocator", r.stderr)  # the child's drop is silent

    def test_a_child_forked_while_another_thread_holds_openreg_locks_frees_and_exits(self):
        # A thread of the parent may hold the device cache's, the pinned cache's or the generic
        # path's lock at the fork (it allocates, frees, runs an operator); in the child no thread
        # ever releases it. The child froze freeing an inherited tensor (about 1 fork in 25 while
        # threads used openreg), or at its exit, where every operator is removed and the generic
        # path forgot each under its locks. Here the forking thread holds them, as such a thread
        # would: the child's frees and operator removals must leave them alone.
        r = run_python(
            """
            import os, sys, torch, torch_openreg
            x = torch.ones(4, device="openreg")
            kept = [x + 1, torch.ones(4).pin_memory()]  # a device tensor and a pinned one
            torch.special.erfcx(x)  # the generic path (not a native kernel) has run
            assert torch.openreg.fallback_op_counts().get("aten::special_erfcx") == 1
            torch_openreg._C._hold_locks_for_fork_test(True)
            pid = os.fork()
            if pid == 0:
                # what a child may still ask answers without those locks (nothing ran here) ...
                assert torch.openreg.memory_snapshot() == [] and torch.openreg.fallback_op_counts() == {}
                torch.openreg.reset_fallback_op_counts()
                assert torch._C._accelerator_getDeviceStats(0)["allocated_bytes"]["all"]["current"] == 0
                # ... and what uses the device meets the runtime's refusal before them
                for use in (lambda: x + 1, lambda: torch.special.erfcx(x), lambda: torch.ones(2).pin_memory()):
                    try:
                        use()
                        sys.exit(3)
                    except RuntimeError as e:
                        if "'spawn'" not in str(e):
                            sys.exit(4)
                del kept[:]  # frees both inherited tensors
                lib = torch.library.Library("fork_child", "FRAGMENT")
                lib.define("f(Tensor x) -> Tensor")
                del lib  # removes an operator, as the interpreter's exit removes them all
                sys.exit(0)  # static destructors, as a child's normal exit runs them
            torch_openreg._C._hold_locks_for_fork_test(False)
            deadline = __import__("time").time() + 60
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    print(os.waitstatus_to_exitcode(status), kept[0].cpu().tolist(), kept[1].tolist())
                    break
                if __import__("time").time() > deadline:
                    os.kill(pid, 9)
                    print("child hung")
                    break
                __import__("time").sleep(0.01)
            """
        )
        self.assertEqual(r.stdout.strip(), "0 [2.0, 2.0, 2.0, 2.0] [1.0, 1.0, 1.0, 1.0]", r.stderr)

    def test_seeding_and_emptying_caches_in_a_child_of_an_initialised_parent_do_nothing(self):
        # A DataLoader worker's worker_init_fn seeds, clean-up code empties the caches: in a child
        # forked after initialisation torch.cuda's do nothing; openreg's manual_seed and seed raised
        # the runtime's refusal, and empty_cache (torch.openreg's and torch.accelerator's) raised it
        # once and then succeeded, having dropped the inherited blocks.
        r = run_python(
            """
            import os, torch
            x = torch.ones(1000, device="openreg") + 1
            del x  # a cached block the child inherits
            torch.ones(4).pin_memory()  # and a cached pinned one
            pid = os.fork()
            if pid == 0:
                try:
                    torch.openreg.manual_seed(1)
                    torch.openreg.seed()
                    torch.manual_seed(1)
                    assert hasattr(torch.openreg, "default_generators")  # no initialisation to try
                    for _ in range(2):
                        torch.openreg.empty_cache()
                        torch.accelerator.empty_cache()
                    print("child: no error", flush=True)
                    os._exit(0)
                except Exception as e:
                    print("child:", type(e).__name__, e, flush=True)
                    os._exit(3)
            _, status = os.waitpid(pid, 0)
            print(os.waitstatus_to_exitcode(status), torch.openreg.memory_reserved() > 0)
            torch.openreg.empty_cache()
            print(torch.openreg.memory_reserved())
            """
        )
        self.assertEqual(r.stdout.split("\n")[:3], ["child: no error", "0 True", "0"], r.stderr)

    def test_python_locks_held_at_a_fork_are_fresh_in_the_child(self):
        # The default generators' lock and the plugin-import hook's were kept in a child forked
        # while another thread held them: its first torch.manual_seed (or watched import) waited
        # for ever. They are renewed in the child (torch_openreg/utils/fork.py), as IPC's is.
        r = run_python(
            """
            import os, torch
            from torch_openreg.openreg import ipc, random
            from torch_openreg.utils import imports
            held = [random._DEFAULT_GENERATORS_LOCK, imports._lock, ipc._opening]
            for lock in held:  # held by the forking thread, as another thread would hold them
                lock.acquire()
            pid = os.fork()
            if pid == 0:
                fresh = [random._DEFAULT_GENERATORS_LOCK, imports._lock, ipc._opening]
                ok = all(lock.acquire(timeout=10) for lock in fresh) and not any(a is b for a, b in zip(held, fresh))
                os._exit(0 if ok else 3)
            for lock in held:
                lock.release()
            _, status = os.waitpid(pid, 0)
            print(os.waitstatus_to_exitcode(status))
            """
        )
        self.assertEqual(r.stdout.strip(), "0", r.stderr)

    def test_inherited_tensor_meets_the_runtime_guard(self):
        # a tensor made in the parent never passes torch's lazy initialisation in the child: the
        # runtime itself refuses the child's kernel (and its read-back) with orErrorForkedProcess
        r = run_python(
            """
            import os, torch
            x = torch.ones(2, device="openreg")
            x.cpu()
            pid = os.fork()
            if pid == 0:
                try:
                    (x + 1).cpu()
                    os._exit(3)
                except RuntimeError as e:
                    ok = "orErrorForkedProcess" in str(e) and "'spawn'" in str(e)
                    os._exit(0 if ok else 4)
            _, status = os.waitpid(pid, 0)
            print(os.waitstatus_to_exitcode(status), x.cpu().tolist())
            """
        )
        self.assertEqual(r.stdout.strip(), "0 [1.0, 1.0]", r.stderr)

    def test_fork_after_only_counting_devices_is_usable(self):
        # torch.openreg.device_count() reads the count from the runtime, which then existed in the
        # parent and refused every call of the child; nothing of a device had been set up, so the
        # child now starts afresh (as CUDA's child after an NVML device count).
        r = run_python(
            """
            import os, torch
            print(torch.openreg.is_available(), torch.openreg.device_count(), torch.openreg.is_initialized())
            pid = os.fork()
            if pid == 0:
                try:
                    ok = (torch.ones(2, device="openreg") + 1).cpu().tolist() == [2.0, 2.0]
                    os._exit(0 if ok else 3)
                except RuntimeError as e:
                    print("child:", e, flush=True)
                    os._exit(4)
            _, status = os.waitpid(pid, 0)
            print(os.waitstatus_to_exitcode(status))
            """
        )
        self.assertEqual(r.stdout.split(), ["True", "2", "False", "0"], r.stderr)

    def test_seeding_before_first_use_does_not_initialise(self):
        # torch.manual_seed seeds every backend; openreg's seeding started openreg (as torch.cuda's
        # does not), so a process that seeded and then forked had a child that could not use the
        # device. The seeds are queued and applied at initialisation, the latest of each kind.
        r = run_python(
            """
            import torch
            torch.manual_seed(0)
            torch.openreg.manual_seed(5)  # the current device's seed, after the all-devices one
            print(torch.openreg.is_initialized())
            a = torch.randn(4, device="openreg").cpu()
            b = torch.randn(4, device="openreg:1").cpu()
            torch.manual_seed(0)
            torch.openreg.manual_seed(5)
            print(torch.equal(a, torch.randn(4, device="openreg").cpu()),
                  torch.equal(b, torch.randn(4, device="openreg:1").cpu()))
            torch.openreg.manual_seed_all(0)
            print(torch.equal(b, torch.randn(4, device="openreg:1").cpu()),
                  torch.openreg.initial_seed())
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["False", "True", "True", "True", "0"])

    def test_seeding_and_memory_queries_before_first_use_leave_the_child_of_a_fork_usable(self):
        # torch.openreg.manual_seed/seed asked the runtime for the current device, which counted as
        # a use of it, and memory_stats() initialised openreg: a child forked afterwards was refused
        # (torch.cuda's leave it usable: its memory_stats answers {} before initialisation).
        r = run_python(
            """
            import os, torch
            torch.openreg.manual_seed(3)
            torch.openreg.seed()
            print(torch.openreg.memory_stats(), torch.openreg.memory_allocated(), torch.openreg.max_memory_reserved())
            print(dict(torch.accelerator.memory_stats()), torch.accelerator.memory_allocated())
            torch.accelerator.reset_peak_memory_stats()
            print(torch.openreg.is_initialized())
            pid = os.fork()
            if pid == 0:
                ok = (torch.ones(3, device="openreg") + 1).cpu().tolist() == [2.0, 2.0, 2.0]
                os._exit(0 if ok else 3)
            _, status = os.waitpid(pid, 0)
            print(os.waitstatus_to_exitcode(status))
            """
        )
        self.assertEqual(r.stdout.split("\n")[:4], ["{} 0 0", "{} 0", "False", "0"], r.stderr)

    def test_default_generators_run_the_queued_seeds_first(self):
        # torch.manual_seed before first use is queued; default_generators handed out the generators
        # without running it, so a seed given to one (or a state restored into it) was replaced by
        # the queued seed at initialisation. torch.cuda.default_generators is empty until CUDA is
        # initialised: openreg's initialises first.
        r = run_python(
            """
            import torch
            torch.manual_seed(5)  # queued: openreg is not initialised
            g = torch.openreg.default_generators[0]
            print(torch.openreg.is_initialized())
            g.manual_seed(7)
            x = torch.rand(3, device="openreg").cpu()
            torch.openreg.manual_seed(7)
            print(torch.equal(x, torch.rand(3, device="openreg").cpu()), g.initial_seed())
            """
        )
        self.assertEqual(r.stdout.split(), ["True", "True", "7"], r.stderr)

    def test_seeding_without_a_device_is_ignored(self):
        # torch.cuda documents manual_seed and seed as safe without a device (silently ignored).
        r = run_python(
            """
            import torch
            print(torch.openreg.is_available())
            torch.openreg.manual_seed(1); torch.openreg.seed()
            torch.openreg.manual_seed_all(1); torch.openreg.seed_all(); torch.manual_seed(1)
            print("ignored")
            # nothing to initialise: the tuple as it is, without raising (hasattr must answer)
            print(hasattr(torch.openreg, "default_generators"), torch.openreg.default_generators)
            """,
            env={"OPENREG_DEVICE_COUNT": "0"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["False", "ignored", "True", "()"])

    def test_a_queued_call_that_fails_names_where_it_was_made(self):
        r = run_python(
            """
            import torch
            def broken():
                raise ValueError("from the queued call")
            torch.openreg._lazy_call(broken)
            ran = []
            torch.openreg._lazy_call(lambda: ran.append("after"))
            torch.openreg.manual_seed(1234)
            try:
                torch.ones(1, device="openreg")
            except RuntimeError as e:
                print(str(e).splitlines()[0])
                print('originally invoked at:' in str(e) and '"<string>", line 5' in str(e))  # the _lazy_call
            print(torch.openreg.is_initialized(), ran)
            # reported once and dropped: the next use initialises, and runs the calls queued after it
            print((torch.ones(1, device="openreg") + 1).item(), torch.openreg.is_initialized(), ran)
            print(torch.openreg.initial_seed())
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(
            r.stdout.splitlines(),
            [
                "openreg call failed lazily at initialization with error: from the queued call",
                "True",
                "False []",
                "2.0 True ['after']",
                "1234",
            ],
        )

    def test_an_interrupted_queued_call_stays_queued(self):
        r = run_python(
            """
            import torch
            state = {"runs": 0}
            def interrupted_once():
                state["runs"] += 1
                if state["runs"] == 1:
                    raise KeyboardInterrupt
            torch.openreg._lazy_call(interrupted_once)
            torch.openreg.manual_seed(99)
            try:
                torch.openreg.init()
            except KeyboardInterrupt:
                print("interrupted", torch.openreg.is_initialized())
            torch.openreg.init()
            print(state["runs"], torch.openreg.initial_seed())
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), ["interrupted False", "2 99"])

    def test_queued_seeds_keep_their_device_and_may_seed_again(self):
        r = run_python(
            """
            import torch
            # a seed for the current device is for the device current at the call
            with torch.openreg._DeviceGuard(1):
                torch.openreg.manual_seed(5)
            torch.openreg.manual_seed(7)
            # a queued call may seed again (it ran while the initialisation held its lock)
            torch.openreg._lazy_call(lambda: torch.openreg.manual_seed(7))
            # a seed out of range is refused at the call, as by the CPU generator, and not queued
            try:
                torch.openreg.manual_seed_all(2**64)
            except ValueError as e:
                print("refused:", e)
            a0, a1 = torch.randn(3, device="openreg:0").cpu(), torch.randn(3, device="openreg:1").cpu()
            torch.openreg.manual_seed(7)
            with torch.openreg.device(1):
                torch.openreg.manual_seed(5)
            print(torch.equal(a0, torch.randn(3, device="openreg:0").cpu()),
                  torch.equal(a1, torch.randn(3, device="openreg:1").cpu()))
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), ["refused: Overflow when unpacking long long", "True True"])


class TestExit(TestCase):
    def test_program_ending_right_after_backward_exits_cleanly(self):
        # autograd's device thread let go of a finished pass after waking the caller and needed the
        # GIL for it; when the program ended first, the interpreter's finalization ended that thread
        # and the process aborted. On one CPU the woken caller usually runs first: 80 % of runs aborted.
        code = """
            import os, torch
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
            x = torch.randn(4, 4, device="openreg", requires_grad=True)
            (x.sin() * x).sum().backward()
        """
        for _ in range(4):
            r = run_python(code)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotIn("terminate called", r.stderr)

    def test_exit_settle_launches_no_kernel(self):
        # The settle is core's own work: under the user's strict mode, or with a fault armed for a
        # kernel the program never reached, it failed (zeros and mul), warned at exit naming an
        # 'aten::zero_' the program never called, and left the device threads unsettled.
        code = """
            import torch
            x = torch.randn(4, 4, device="openreg", requires_grad=True)
            (x * x).sum().backward()
            torch.openreg.set_strict_mode(True)
            torch.openreg._inject_faults("kernel:aten::mul,alloc:1:100")  # no kernel, no allocation
            counters = torch.openreg._runtime_counters
            before = counters()["kernels_launched"]
            torch.openreg.reset_fallback_op_counts()
            torch.openreg._C._settle_autograd_device_threads(torch.openreg.device_count())
            print(counters()["kernels_launched"] - before, torch.openreg.fallback_op_counts())
        """
        r = run_python(code)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["0", "{}"])
        self.assertNotIn("Warning", r.stderr)  # the settle at exit is refused nothing either


if __name__ == "__main__":
    pytest.main([__file__])
