"""cpp_wrapper=True on openreg (openreg_inductor/codegen/cpp_wrapper.py): the graph's call written in
C++, kernels launched on the current stream through core's C ABI, fallback operators through C shims
generated from torch's schemas (openreg_inductor/codegen/shims.py); each against CPU Inductor's C++
wrapper on the same inputs."""

import re

import torch
from torch._inductor.utils import run_and_get_code
from torch.testing._internal.common_utils import TestCase, run_tests
from torch_openreg.utils.testing import StreamHold

CPP = dict(options={"cpp_wrapper": True})


class TestCppWrapper(TestCase):
    def test_matches_cpu_cpp_wrapper(self):
        """Fused kernels, extern matmul and convolution, fallback operators (C shims generated for
        openreg) in one graph (C++ wrapper compiles are slow: one per device)."""

        def f(x, w, b, img, k):
            y = torch.relu(x @ w + b)
            values, indices = torch.cummax(y, dim=1)
            conv = torch.nn.functional.conv2d(img, k, padding=1).relu()
            return torch.softmax(y, dim=-1), values * 2, indices, torch.kthvalue(y, 3, dim=1).values + 1, conv

        args = (torch.randn(16, 32), torch.randn(32, 24), torch.randn(24))
        args += (torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3))
        torch._dynamo.reset()
        expected = torch.compile(f, **CPP)(*args)
        torch._dynamo.reset()
        out, codes = run_and_get_code(torch.compile(f, **CPP), *(a.to("openreg") for a in args))
        self.assertEqual([t.cpu() for t in out], list(expected), atol=1e-5, rtol=1e-5)
        code = "\n".join(codes)
        self.assertIn("openreg_inductor::current_stream(0)", code)  # kernels go to the current stream
        self.assertIn("openreg_inductor::DeviceGuard device_guard(0);", code)
        self.assertIn("cached_torch_device_type_privateuse1", code)  # buffers on the device
        for op in ("addmm_out", "cummax", "kthvalue", "convolution"):  # generated shims, defined in the source
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

    def test_every_fallback_operator_has_a_generated_shim(self):
        from openreg_inductor.codegen import shims
        from torchgen.aoti.fallback_ops import inductor_fallback_ops

        covered = {s.op for s in shims.all_shims().values()}
        missing = sorted(set(inductor_fallback_ops) - covered)
        self.assertEqual(missing, [])
        self.assertTrue(all(re.match(r"aoti_torch_openreg_\w+$", n) for n in shims.all_shims()))


if __name__ == "__main__":
    run_tests()
