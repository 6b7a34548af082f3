"""Every function of torch.accelerator (torch 2.13) on openreg, and device-generic tests
written the way PyTorch writes them (instantiate_device_type_tests with PrivateUse1TestBase)."""

import unittest

import torch
from torch.testing._internal.common_device_type import (
    instantiate_device_type_tests,
    onlyPRIVATEUSE1,
    skipPRIVATEUSE1If,
)
from torch.testing._internal.common_utils import TestCase, run_tests

MiB = 1 << 20

# torch.accelerator.Graph, the one class, has its own test file: test_graphs.py.
COVERED = {
    "current_accelerator",
    "current_device_idx",
    "current_device_index",
    "get_device_capability",
    "current_stream",
    "device_count",
    "device_index",
    "empty_cache",
    "empty_host_cache",
    "get_memory_info",
    "is_available",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "set_device_idx",
    "set_device_index",
    "set_stream",
    "synchronize",
}


class TestAcceleratorAPI(TestCase):
    def test_every_function_is_covered(self):
        functions = {n for n in torch.accelerator.__all__ if callable(getattr(torch.accelerator, n)) and n != "Graph"}
        self.assertEqual(functions - COVERED, set())

    def test_device_functions(self):
        self.assertEqual(torch.accelerator.current_accelerator(), torch.device("openreg"))
        self.assertTrue(torch.accelerator.is_available())
        self.assertEqual(torch.accelerator.device_count(), 2)
        torch.accelerator.set_device_index(1)
        self.assertEqual(torch.accelerator.current_device_index(), 1)
        torch.accelerator.set_device_idx(0)
        self.assertEqual(torch.accelerator.current_device_idx(), 0)
        with torch.accelerator.device_index(1):
            self.assertEqual(torch.openreg.current_device(), 1)
        self.assertEqual(torch.openreg.current_device(), 0)
        caps = torch.accelerator.get_device_capability()
        self.assertIn(torch.float32, caps["supported_dtypes"])
        self.assertIn(torch.bfloat16, caps["supported_dtypes"])

    def test_streams(self):
        s = torch.Stream(device="openreg:0")
        torch.accelerator.set_stream(s)
        self.assertEqual(torch.accelerator.current_stream(), s)
        self.assertEqual(torch.openreg.current_stream(), s)
        x = torch.ones(8, device="openreg") + 1
        torch.accelerator.synchronize()
        self.assertTrue(s.query())
        torch.accelerator.set_stream(torch.openreg.default_stream())
        self.assertEqual(x.cpu().tolist(), [2.0] * 8)
        torch.accelerator.synchronize(1)

    def test_memory(self):
        torch.accelerator.empty_cache()
        torch.accelerator.reset_peak_memory_stats()
        torch.accelerator.reset_accumulated_memory_stats()
        base = torch.accelerator.memory_allocated()
        x = torch.empty(MiB, device="openreg")
        self.assertEqual(torch.accelerator.memory_allocated(), base + 4 * MiB)
        self.assertEqual(torch.accelerator.max_memory_allocated(), base + 4 * MiB)
        self.assertGreaterEqual(torch.accelerator.memory_reserved(), 4 * MiB)
        self.assertGreaterEqual(torch.accelerator.max_memory_reserved(), torch.accelerator.memory_reserved())
        self.assertEqual(torch.accelerator.memory_stats()["allocation.all.allocated"], 1)
        free, total = torch.accelerator.get_memory_info()
        self.assertEqual(total, 8 << 30)
        self.assertLessEqual(free, total - 4 * MiB)
        del x
        p = torch.ones(100).pin_memory()
        del p
        torch.accelerator.empty_host_cache()
        torch.accelerator.empty_cache()
        self.assertEqual(torch.accelerator.memory_reserved(), 0)


class TestBadInput(TestCase):
    def test_event_recorded_on_other_device_stream(self):
        # An event belongs to the device of the stream it was first recorded on.
        e = torch.Event(device="openreg")
        e.record(torch.Stream(device="openreg:0"))
        with self.assertRaisesRegex(RuntimeError, "does not match recording stream's device index 1"):
            e.record(torch.Stream(device="openreg:1"))
        e.synchronize()
        self.assertTrue(e.query())

    def test_set_stream_rejects_other_device_type(self):
        with self.assertRaisesRegex(ValueError, "Expected an openreg stream"):
            torch.openreg.set_stream(torch.Stream(device="cpu"))


class TestDeviceGeneric(TestCase):
    """Instantiated for openreg as TestDeviceGenericPRIVATEUSE1 by PyTorch's device-type machinery
    (the class is named after the dispatch key, PrivateUse1, not after the device name)."""

    def test_matches_cpu(self, device):
        self.assertEqual(torch.device(device).type, "openreg")
        a = torch.randn(6, 6)
        self.assertEqual(torch.linalg.matrix_norm(a.to(device)), torch.linalg.matrix_norm(a))

    @onlyPRIVATEUSE1
    def test_only_privateuse1(self, device):
        self.assertTrue(torch.ones(1, device=device).is_openreg)

    def test_skip_decorator_applies_to_openreg(self, device):
        @skipPRIVATEUSE1If(True, "skipped on openreg")
        def skipped(self, device):
            raise AssertionError("must not run on openreg")

        @skipPRIVATEUSE1If(False, "not skipped")
        def runs(self, device):
            return device

        with self.assertRaisesRegex(unittest.SkipTest, "skipped on openreg"):
            skipped(self, device)
        self.assertEqual(runs(self, device), device)

    def test_dtypes(self, device):
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bool, torch.bfloat16):
            a = torch.arange(6).reshape(2, 3).to(dtype)
            self.assertEqual(a.to(device).sum(0), a.sum(0))


instantiate_device_type_tests(TestDeviceGeneric, globals(), only_for="openreg", allow_mps=False)

if __name__ == "__main__":
    run_tests()
