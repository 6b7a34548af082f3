"""Compiled kernels in the profiler: each launch is an openreg device activity named after the
generated kernel, with its host-side launch (orLaunchKernel) under the compiled region."""

import torch
from torch.profiler import ProfilerActivity, profile
from torch.testing._internal.common_utils import TestCase, run_tests


class TestProfiler(TestCase):
    def test_compiled_kernels_are_device_activities(self):
        f = torch.compile(lambda x: (x.sin() + 1).sum())
        x = torch.randn(1000, device="openreg")
        f(x)
        torch.openreg.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            f(x)
            torch.openreg.synchronize()
        device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
        host = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
        self.assertEqual([e.name for e in device], ["openreg_fused_add_sin_sum_0"])
        self.assertEqual(device[0].device_index, 0)
        self.assertIn("orLaunchKernel", host)
        self.assertTrue(any(name.startswith("Torch-Compiled Region") for name in host), host)


if __name__ == "__main__":
    run_tests()
