"""DLPack: openreg tensors exported and imported zero-copy as kDLExtDev (torch_openreg/openreg/_dlpack.py)."""

import contextlib
from unittest import mock

import numpy
import torch
import torch.utils.dlpack
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.utils.dlpack import DLDeviceType


def d2h_copies() -> int:
    return torch.openreg._runtime_counters()["memcpy_d2h"]


@contextlib.contextmanager
def spy_on_synchronize():
    """Records the openreg streams synchronised from the host (and still synchronises them)."""
    synchronized = []
    original = torch.openreg.Stream.synchronize

    def synchronize(stream):
        synchronized.append(stream)
        return original(stream)

    with mock.patch.object(torch.openreg.Stream, "synchronize", synchronize):
        yield synchronized


def sample_tensors(device: str) -> dict:
    """Tensors of several dtypes and layouts on `device`."""
    torch.manual_seed(0)
    base = torch.randn(6, 8, device=device)
    return {
        "contiguous": base,
        "transposed": base.t(),
        "sliced": base[2:5, 1:7:2],  # storage offset 17, strides (8, 2)
        "bf16": torch.randn(5, 3, device=device).to(torch.bfloat16),
        "int64": torch.arange(-4, 8, device=device).view(3, 4),
        "bool": torch.tensor([True, False, True], device=device),
    }


class TestDLPackRoundTrip(TestCase):
    def assert_same_tensor_memory(self, got: torch.Tensor, orig: torch.Tensor) -> None:
        """`got` is `orig`'s memory seen through DLPack: same device, pointer, shape, strides, dtype."""
        self.assertEqual(got.device, orig.device)
        self.assertEqual(got.data_ptr(), orig.data_ptr())
        self.assertEqual(got.shape, orig.shape)
        self.assertEqual(got.stride(), orig.stride())
        self.assertEqual(got.dtype, orig.dtype)
        # DLPack has no storage: the import starts at the exported pointer
        self.assertEqual(got.storage_offset(), 0)

    def test_round_trips_are_zero_copy(self):
        exporters = {
            "to_dlpack": lambda t: torch.from_dlpack(torch.utils.dlpack.to_dlpack(t)),
            "utils_from_dlpack": lambda t: torch.utils.dlpack.from_dlpack(t),
            "from_dlpack": torch.from_dlpack,
            "dlpack_v0": lambda t: torch.from_dlpack(t.__dlpack__()),
            "dlpack_v1": lambda t: torch.from_dlpack(t.__dlpack__(max_version=(1, 0))),
        }
        for device in ("openreg:0", "openreg:1"):
            tensors = sample_tensors(device)
            reference = {k: v.cpu() for k, v in tensors.items()}
            for how, round_trip in exporters.items():
                for name, t in tensors.items():
                    with self.subTest(device=device, how=how, tensor=name):
                        before = d2h_copies()
                        got = round_trip(t)
                        self.assertEqual(d2h_copies(), before)  # the data never left the device
                        self.assert_same_tensor_memory(got, t)
                        self.assertEqual(got.cpu(), reference[name], atol=0, rtol=0)
        self.assertEqual(tensors["sliced"].storage_offset(), 17)

    def test_import_shares_memory(self):
        t = torch.zeros(4, device="openreg:1")
        u = torch.from_dlpack(t)
        u[2] = 5.0
        self.assertEqual(t.cpu(), torch.tensor([0.0, 0.0, 5.0, 0.0]))

    def test_capsule_kinds(self):
        t = torch.ones(2, device="openreg:1")
        self.assertIn('"dltensor"', repr(torch.utils.dlpack.to_dlpack(t)))
        self.assertIn('"dltensor"', repr(t.__dlpack__()))
        self.assertIn('"dltensor"', repr(t.__dlpack__(max_version=(0, 8))))
        self.assertIn('"dltensor_versioned"', repr(t.__dlpack__(max_version=(1, 0))))

    def test_dlpack_device(self):
        self.assertEqual(torch.ones(1, device="openreg:0").__dlpack_device__(), (DLDeviceType.kDLExtDev, 0))
        self.assertEqual(torch.ones(1, device="openreg:1").__dlpack_device__(), (12, 1))
        # other devices are torch's business, unchanged
        self.assertEqual(torch.ones(1).__dlpack_device__(), (DLDeviceType.kDLCPU, 0))
        self.assertEqual(torch.ones(1).pin_memory().__dlpack_device__(), (DLDeviceType.kDLCUDAHost, 0))
        self.assertEqual(torch._C._torchDeviceToDLDevice(torch.device("openreg:1")), (12, 1))

    def test_from_dlpack_to_another_device(self):
        t = torch.arange(12.0, device="openreg:1").view(3, 4).t()
        reference = t.cpu()
        c = torch.from_dlpack(t, device="cpu")
        self.assertEqual(c.device, torch.device("cpu"))
        self.assertEqual(c, reference, atol=0, rtol=0)
        c[0, 0] = -1.0  # a copy
        self.assertEqual(t[0, 0].item(), 0.0)
        d = torch.from_dlpack(t, device="openreg:0")
        self.assertEqual(d.device, torch.device("openreg:0"))
        self.assertEqual(d.cpu(), reference, atol=0, rtol=0)
        with self.assertRaisesRegex(ValueError, r"cannot move DLPack tensor from device .* without copying"):
            torch.from_dlpack(t, device="cpu", copy=False)

    def test_export_refusals_are_torchs(self):
        t = torch.ones(2, device="openreg", requires_grad=True)
        with self.assertRaisesRegex(BufferError, "Can't export tensors that require gradient, use tensor.detach()"):
            t.__dlpack__()
        with self.assertRaisesRegex(TypeError, "stream must be ``int`` or ``none``"):
            t.detach().__dlpack__(stream="0")


class TestDLPackSynchronisation(TestCase):
    def test_export_waits_for_queued_kernels(self):
        # Kernels queued on a non-default stream of device 1, made current there: __dlpack__
        # synchronises that stream (the tensor's device's current one) before handing out the capsule.
        side = torch.openreg.Stream("openreg:1")
        for stream_arg in ({}, {"stream": None}, {"stream": -1}, {"stream": 1}):
            with self.subTest(**{"stream": stream_arg.get("stream", "default")}):
                with torch.openreg.stream(side):
                    a = torch.full((256, 256), 0.5, device="openreg:1")
                    for _ in range(4):
                        a = a @ a.t()  # every element: 256 * 0.25 = 64, then 256 * 64**2, ...
                    with spy_on_synchronize() as synchronized:
                        capsule = a.__dlpack__(**stream_arg)
                    self.assertEqual(synchronized, [side])
                    self.assertTrue(side.query())  # nothing left in flight when the consumer gets the capsule
                got = torch.from_dlpack(capsule)
                expected = torch.full((256, 256), 0.5)
                for _ in range(4):
                    expected = expected @ expected.t()
                self.assertEqual(got.cpu(), expected)

    def test_cpu_export_is_not_synchronised(self):
        with spy_on_synchronize() as synchronized:
            torch.from_dlpack(torch.ones(3))
        self.assertEqual(synchronized, [])


class TestInstall(TestCase):
    def test_wrapped_only_while_torchs_method_is_broken(self):
        from torch_openreg.openreg import _dlpack

        method = torch.Tensor.__dlpack_device__
        torchs = getattr(method, "__wrapped__", method)
        pretender = _dlpack._DevicePretender(torch.device("openreg", 1))
        try:
            result = torchs(pretender)
        except ValueError as e:
            # torch 2.13 compares the device type with the literal "privateuse1" (pytorch/pytorch#195815)
            self.assertEqual(str(e), "Unknown device type openreg for Dlpack")
            self.assertTrue(getattr(method, _dlpack._MARK))
        else:  # a torch with the upstream fix: left alone
            self.assertEqual(result, (DLDeviceType.kDLExtDev, 1))
            self.assertIs(method, torchs)
        self.assertTrue(getattr(torch.Tensor.__dlpack__, _dlpack._MARK))

    def test_install_is_idempotent(self):
        from torch_openreg.openreg import _dlpack

        before = (torch.Tensor.__dlpack_device__, torch.Tensor.__dlpack__)
        _dlpack.install()
        self.assertEqual((torch.Tensor.__dlpack_device__, torch.Tensor.__dlpack__), before)


class TestForeignConsumers(TestCase):
    def test_numpy_refuses_device_memory(self):
        t = torch.arange(4.0, device="openreg:1")
        with self.assertRaisesRegex(RuntimeError, "^Unsupported device in DLTensor.$"):
            numpy.from_dlpack(t)
        self.assertEqual(t.add(1).cpu(), torch.tensor([1.0, 2.0, 3.0, 4.0]))  # the process and device are fine

    def test_numpy_with_cpu_device_gets_a_copy(self):
        t = torch.arange(6.0, device="openreg:1").view(2, 3)
        a = numpy.from_dlpack(t, device="cpu")  # torch copies to the host for the consumer
        numpy.testing.assert_array_equal(a, numpy.arange(6.0).reshape(2, 3))


if __name__ == "__main__":
    run_tests()
