"""cpp_wrapper=True on openreg (openreg_inductor/codegen/cpp_wrapper.py): the graph's call written in
C++, kernels launched on the current stream through core's C ABI, fallback operators through C shims
generated from torch's schemas (openreg_inductor/codegen/shims.py); each against CPU Inductor's C++
wrapper on the same inputs."""

import re

import torch
from conftest import run_python
from torch._inductor.utils import run_and_get_code
from torch.testing._internal.common_utils import TestCase, run_tests
from torch_openreg.utils.testing import StreamHold

CPP = dict(options={"cpp_wrapper": True})

# An openreg kernel dividing by zero in its last element (a long kernel, still running on the
# stream's worker) while the host runs the graph's CPU kernel: one that divides, and one that does not.
SHARED_DIVISION_FLAG = """
import torch
N = 1 << 24
a, b = torch.randint(1, 100, (N,)), torch.randint(1, 7, (N,))
b[-1] = 0
c, d = torch.randint(1, 100, (N // 4,)), torch.randint(1, 7, (N // 4,))
ao, bo = a.to("openreg"), b.to("openreg")
for cpu_part in (lambda c, d: c // d, lambda c, d: c * d):
    f = torch.compile(lambda a, b, c, d: (a // b, cpu_part(c, d)), options={"cpp_wrapper": True})
    for _ in range(3):
        _, on_cpu = f(ao, bo, c, d)
        assert torch.equal(on_cpu, cpu_part(c, d))
        try:
            torch.openreg.synchronize()
            print("no error")
        except RuntimeError as err:
            print(str(err).splitlines()[0])
"""


class TestCppWrapper(TestCase):
    def test_matches_cpu_cpp_wrapper(self):
        """Fused kernels, extern matmul and convolution, fallback operators (C shims generated for
        openreg) in one graph (C++ wrapper compiles are slow: one per device).

        Three of them are written by torch 2.13 paths of their own, past the shim hook, and their
        shims were not defined (the C++ failed to build): the scatter fallback (scatter_reduce amax
        without self), the in-place bernoulli fallback (fallback_random) and a dtype view of a
        computed buffer. The last two are method-only operators, whose shims called a nonexistent
        at:: function."""

        def f(x, w, b, img, k, index):
            y = torch.relu(x @ w + b)
            values, indices = torch.cummax(y, dim=1)
            conv = torch.nn.functional.conv2d(img, k, padding=1).relu()
            scattered = torch.zeros(3, 24, device=y.device).scatter_reduce(0, index, y[:5], "amax", include_self=False)
            coin = torch.empty_like(y).bernoulli_(1.0)  # p = 1: the same on both devices
            bits = (y * 2).view(torch.uint8)[..., :3]  # a reinterpreting view of a buffer
            out = torch.softmax(y, dim=-1), values * 2, indices, torch.kthvalue(y, 3, dim=1).values + 1, conv
            return out + (scattered, coin, bits)

        args = (torch.randn(16, 32), torch.randn(32, 24), torch.randn(24))
        args += (torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randint(0, 3, (5, 24)))
        options = dict(options={"cpp_wrapper": True, "fallback_random": True})
        torch._dynamo.reset()
        expected = torch.compile(f, **options)(*args)
        torch._dynamo.reset()
        out, codes = run_and_get_code(torch.compile(f, **options), *(a.to("openreg") for a in args))
        self.assertEqual([t.cpu() for t in out], list(expected), atol=1e-5, rtol=1e-5)
        code = "\n".join(codes)
        self.assertIn("openreg_inductor::current_stream(0)", code)  # kernels go to the current stream
        self.assertIn("openreg_inductor::DeviceGuard device_guard(0);", code)
        self.assertIn("cached_torch_device_type_privateuse1", code)  # buffers on the device
        for op in (
            "addmm_out",
            "cummax",
            "kthvalue",
            "convolution",
            "scatter_reduce_two_out",
            "bernoulli__float",
            "view_dtype",
        ):
            self.assertRegex(code, rf"static AOTITorchError aoti_torch_openreg_{op}\(")

    def test_call_is_asynchronous_on_the_current_stream_without_copies(self):
        f = torch.compile(lambda x, w: (x @ w).sin().sum(-1), **CPP)
        x, w = torch.randn(32, 32, device="openreg"), torch.randn(32, 32, device="openreg")
        expected = f(x, w).cpu()
        with StreamHold() as held:  # the call returns while the device is busy, and copies nothing
            before = torch.openreg._runtime_counters()
            out = f(x, w)
            after = torch.openreg._runtime_counters()
            self.assertFalse(held.stream.query())
        self.assertEqual(after["memcpy_h2d"] - before["memcpy_h2d"], 0)
        self.assertEqual(after["memcpy_d2h"] - before["memcpy_d2h"], 0)
        self.assertEqual(after["kernels_launched"] - before["kernels_launched"], 2)  # mm + the fused kernel
        self.assertEqual(out.cpu(), expected)
        self.assertEqual(expected, (x.cpu() @ w.cpu()).sin().sum(-1), atol=1e-4, rtol=1e-5)
        s = torch.openreg.Stream()
        s.wait_stream(torch.openreg.current_stream())
        with StreamHold():  # the default stream is held: the call must run on s to finish
            with torch.openreg.stream(s):
                out = f(x, w)
                s.synchronize()
                got = out.cpu()
        self.assertEqual(got, expected)

    def test_stream_context_inside_the_region_is_refused(self):
        """Inductor's C++ wrappers write a stream context in the region as Python: refused at code
        generation, with the way out, instead of a C++ build failing half a minute later."""
        side = torch.openreg.Stream()

        def f(x):
            with side:
                y = x * 2
            torch.accelerator.current_stream().wait_stream(side)
            return y + 1

        torch._dynamo.reset()
        with self.assertRaisesRegex(
            torch._inductor.exc.InductorError,
            r"NotImplementedError: openreg-inductor: cpp_wrapper=True does not support a stream context "
            r"inside the compiled region .* use the Python wrapper",
        ):
            torch.compile(f, **CPP)(torch.randn(8, device="openreg"))

    def test_second_device_and_a_synchronize_between_kernels(self):
        # The synchronize is a fallback call without a device: its call used to be written before the
        # kernel that precedes it, after that kernel's input was released (a crash; workaround 12).
        def f(t):
            y = t.cos()
            torch.openreg.synchronize(1)
            return y * 3

        x = torch.randn(100)
        out, (code,) = run_and_get_code(torch.compile(f, **CPP), x.to("openreg:1"))
        self.assertEqual(out.device, torch.device("openreg:1"))
        self.assertEqual(out.cpu(), x.cos() * 3)
        self.assertLess(code.index("current_stream(1)"), code.index('"streams::synchronize_device"'))

    def test_cpu_kernels_of_the_library_share_the_division_flag_safely(self):
        # The C++ wrapper builds the graph's CPU kernels into the openreg kernels' library, with its
        # one integer-division flag: a CPU kernel, dividing or not, reset it under the running openreg
        # kernel, whose division by zero then threw inside its OpenMP region (std::terminate).
        r = run_python(SHARED_DIVISION_FLAG)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        lines = r.stdout.strip().split("\n")
        self.assertEqual(len(lines), 6, r.stdout)
        for line in lines:
            self.assertRegex(line, r"kernel 'openreg_fused_floor_divide_0' failed .*ZeroDivisionError")
            # Not the division helper's throw on a null flag (the flag reset under the kernel), which
            # launch.catch_in_parallel_regions now reports instead of ending the process.
            self.assertNotIn("inductor_cpu_note_integer_div_by_zero", line)

    def test_every_fallback_operator_has_a_generated_shim(self):
        from openreg_inductor.codegen import shims
        from torchgen.aoti.fallback_ops import inductor_fallback_ops

        covered = {s.op for s in shims.all_shims().values()}
        missing = sorted(set(inductor_fallback_ops) - covered)
        self.assertEqual(missing, [])
        self.assertTrue(all(re.match(r"aoti_torch_openreg_\w+$", n) for n in shims.all_shims()))


if __name__ == "__main__":
    run_tests()
