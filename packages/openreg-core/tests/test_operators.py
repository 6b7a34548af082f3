"""The native operator set and the generic zero-copy path, compared with the CPU."""

import copy
import threading
import time
import warnings

import torch
import torch.nn.functional as F
from conftest import run_python
from torch.testing._internal.common_utils import TestCase, run_tests
from torch_openreg.utils.testing import StreamHold, died_of_memory_fault


@torch.library.custom_op("openreg_test::grow_to", mutates_args=("x",), device_types="cpu")
def grow_to(x: torch.Tensor, n: int) -> None:
    """Resizes its argument in place (as some ATen kernels do with their statistics) and fills it."""
    x.resize_(n).fill_(1.0)


def pair(*shape, dtype=torch.float32):
    cpu = torch.randn(*shape).to(dtype)
    return cpu, cpu.to("openreg")


def outcome(call, device: str):
    """What `call(device)` does: its result on the host, or its error's type and first line
    (synchronising, so that an error found on the device counts too)."""
    try:
        result = call(device)
        if device != "cpu":
            torch.openreg.synchronize()
        results = result if isinstance(result, tuple) else (result,)
        return "result", tuple(r.cpu() if isinstance(r, torch.Tensor) else r for r in results)
    except Exception as e:
        return type(e).__name__, str(e).splitlines()[0]


class TestNativeOps(TestCase):
    def test_kaiser_window(self):
        # Its composite kernel calls a DispatchStub directly, which no fallback sees: an internal
        # assert ("DispatchStub: missing kernel for openreg") until openreg filled the stub.
        cases = ((8, True, 12.0, torch.float32), (5, False, 8.0, torch.float64), (1, True, 1.0, torch.float32))
        for device in ("openreg:0", "openreg:1"):
            for n, periodic, beta, dtype in cases:
                got = torch.kaiser_window(n, periodic, beta, device=device, dtype=dtype)
                self.assertEqual(got.device, torch.device(device))
                self.assertEqual(got.cpu(), torch.kaiser_window(n, periodic, beta, dtype=dtype))
        with torch.device("openreg"):  # a factory the default device applies to
            self.assertEqual(torch.kaiser_window(6).cpu(), torch.kaiser_window(6, device="cpu"))

    def test_factories_and_copies(self):
        x = torch.empty(3, 4, device="openreg")
        self.assertEqual(x.shape, (3, 4))
        self.assertEqual(torch.empty_strided((2, 3), (1, 2), device="openreg").stride(), (1, 2))
        cpu = torch.arange(12.0).reshape(3, 4)
        d = cpu.to("openreg")
        self.assertEqual(d.cpu(), cpu)
        self.assertEqual(d.to(torch.int32).cpu(), cpu.to(torch.int32))
        self.assertEqual(cpu.t().to("openreg").cpu(), cpu.t())  # non-contiguous host to device
        self.assertEqual(d.t().cpu(), cpu.t())  # non-contiguous device to host
        self.assertEqual(d.to("openreg:1").cpu(), cpu)
        self.assertEqual(d[1, 2].item(), 6.0)

    def test_copy_checks_shapes_like_the_cpu(self):
        # Copying into an empty tensor returned before the broadcast check: a tensor of another
        # shape was "copied" without an error. Found by tests/fuzz.
        calls = (
            lambda d: torch.ones(2, 3, device=d)[:, 0:0].copy_(torch.ones(2, 3, device=d)),
            lambda d: torch.ones(2, 1, 0, device=d).copy_(torch.ones(2, 1, 3, 1, dtype=torch.int32, device=d)),
            lambda d: torch.ones(2, 3, device=d).copy_(torch.ones(1, 0, device=d)),
            lambda d: torch.ones(2, 0, device=d).copy_(torch.ones(1, 0)),  # from the host
            lambda d: torch.ones(2, 0, device=d).copy_(torch.ones(0, device=d)),  # broadcasts: allowed
        )
        for i, call in enumerate(calls):
            self.assertEqual(outcome(call, "openreg"), outcome(call, "cpu"), msg=f"call {i}")

    def test_conversions_the_cpu_has_no_kernel_for_are_refused_at_the_call(self):
        # They returned an unwritten tensor and failed the device's copy kernel, so the error came
        # at a later, unrelated call (an .item()), as a launch failure.
        pairs = ((torch.bits8, torch.float32), (torch.float32, torch.uint1), (torch.uint3, torch.int32))
        for src, dst in pairs:
            calls = {
                "on the device": lambda d: torch.zeros(4, dtype=src, device=d).to(dst),
                "to the host": lambda d: torch.zeros(4, dtype=src, device=d).to("cpu", dst),
                "from the host": lambda d: torch.zeros(4, dtype=src).to(d, dst),
            }
            odd = src if src != torch.float32 else dst
            if odd != torch.bits8:  # sub-byte dtypes: only a plain copy of the same dtype has a kernel (a memcpy)
                calls["transposed"] = lambda d: torch.zeros(2, 2, dtype=odd, device=d).t().contiguous()
                calls["broadcast"] = lambda d: torch.zeros(2, 2, dtype=odd, device=d).copy_(
                    torch.zeros(2, dtype=odd, device=d)
                )
            for how, call in calls.items():
                with self.subTest(f"{src} -> {dst} {how}"):
                    with self.assertRaises(NotImplementedError) as cpu:
                        call("cpu")
                    with self.assertRaises(NotImplementedError) as device:
                        call("openreg")  # no synchronisation: raised at the call
                    self.assertEqual(str(device.exception).splitlines()[0], str(cpu.exception).splitlines()[0])
        torch.openreg.synchronize()  # nothing left to fail later
        empty = torch.empty(0, dtype=torch.bits8)  # nothing to convert: the CPU accepts it
        self.assertEqual(empty.to("openreg").to(torch.float32).cpu(), empty.to(torch.float32))
        x = torch.arange(4, dtype=torch.uint8).view(torch.bits8).view(2, 2)
        self.assertEqual(x.to("openreg").t().contiguous().view(torch.uint8).cpu(), x.t().contiguous().view(torch.uint8))
        self.assertEqual(torch.arange(4.0, device="openreg").to(torch.bfloat16).cpu(), torch.arange(4.0).bfloat16())

    def test_set_with_a_negative_stride_is_refused_like_the_cpu(self):
        # TensorImpl replaced the negative strides with contiguous ones: the tensor read other
        # elements than asked, even past the end of its storage.
        for offset, size, stride in ((0, (2, 2), (-1, 1)), (2, (3,), (-1,))):
            with self.subTest(stride=stride):
                errors = []
                for device in ("cpu", "openreg"):
                    storage = torch.arange(4.0, device=device).untyped_storage()
                    x = torch.empty(0, device=device)
                    with self.assertRaises(RuntimeError) as caught:
                        x.set_(storage, offset, size, stride)
                    errors.append(str(caught.exception).splitlines()[0])
                    self.assertEqual(storage.nbytes(), 16)
                self.assertEqual(errors[1], errors[0])
                self.assertIn("Storage size calculation overflowed", errors[0])
        # The refusal leaves the tensor its own storage: it kept its 4096 elements on the new 16-byte
        # storage, and a fill_ overwrote its neighbours.
        x = torch.zeros(4096, device="openreg")
        neighbours = [torch.zeros(16, device="openreg") for _ in range(8)]
        with self.assertRaisesRegex(RuntimeError, "Storage size calculation overflowed"):
            x.set_(torch.zeros(4, device="openreg").untyped_storage(), 1, (3,), (-1,))
        self.assertEqual(x.untyped_storage().nbytes(), x.numel() * 4)
        x.fill_(1.0)
        self.assertEqual(torch.stack(neighbours).cpu(), torch.zeros(8, 16))

    def test_views_share_storage(self):
        cpu, d = pair(4, 6)
        v = d.view(6, 4)
        t = d.t()
        s = d[1:3, ::2]
        self.assertEqual(v.untyped_storage().data_ptr(), d.untyped_storage().data_ptr())
        self.assertEqual(t.data_ptr(), d.data_ptr())
        s.fill_(7.0)
        cpu[1:3, ::2] = 7.0
        self.assertEqual(d.cpu(), cpu)
        self.assertEqual(v.cpu(), cpu.view(6, 4))

    def test_resize_and_set(self):
        d = torch.arange(4.0, device="openreg")
        d.resize_(8)
        self.assertEqual(d[:4].cpu(), torch.arange(4.0))
        e = torch.empty(0, device="openreg")
        e.set_(d.untyped_storage(), 0, (2, 2), (2, 1))
        self.assertEqual(e.cpu(), torch.arange(4.0).reshape(2, 2))
        f = torch.empty(0, device="openreg").set_(d)
        self.assertEqual(f.data_ptr(), d.data_ptr())

    def test_a_tensor_its_storage_no_longer_holds_is_refused_at_the_call(self):
        # untyped_storage().resize_(0) frees a tensor's memory (FSDP frees parameters so). The tensor
        # used before its storage grows back computed silently on uninitialised host memory (w + 1
        # gave ones, w.sum() zero) on the first (synchronous) and later (asynchronous) calls; the
        # CPU reads freed memory and CUDA faults. Refused at the call now, on every path; the storage
        # grown back works as before.
        w = torch.arange(10.0, device="openreg")
        storage = w.untyped_storage()
        storage.resize_(0)
        message = r"an openreg tensor of size \[10\] needs 40 bytes of its storage, which holds 0"
        for _ in range(2):  # the first call of a signature runs the generic path, the next the fast one
            for call in (
                lambda: w + 1,
                lambda: w.sum(),
                lambda: torch.cat([w, w]),
                lambda: w.cpu(),
                lambda: w.copy_(torch.ones(10)),
                lambda: torch.ones(10, device="openreg").copy_(w),
                lambda: w.mul_(2),
                lambda: torch._foreach_add([w], 1.0),
            ):
                with self.assertRaisesRegex(RuntimeError, message):
                    call()
        storage.resize_(8)  # grown, but not enough
        with self.assertRaisesRegex(RuntimeError, "needs 40 bytes of its storage, which holds 8"):
            w.neg()
        storage.resize_(40)
        w.copy_(torch.arange(10.0))
        self.assertEqual((w + 1).cpu(), torch.arange(10.0) + 1)
        torch.openreg.synchronize()  # nothing failed on the device

    def test_a_write_to_a_lazy_clone_leaves_its_original_alone(self):
        # torch._lazy_clone shares memory copy-on-write: the CPU's and CUDA's kernels copy it when
        # they take a mutable pointer. openreg's launch sites took the device pointer without that,
        # so every write to the clone (add_, out=, fill_, a kernel-written copy) wrote the original
        # too. A clone of a tensor a queued kernel is still writing copies what the kernel wrote.
        def writes(device):
            x = torch.arange(8.0, device=device)
            results = []
            for write in (
                lambda t: t.add_(1),  # the first call of a signature: the generic path
                lambda t: t.add_(1),  # then the fast path
                lambda t: torch.mul(t, 3, out=t),
                lambda t: t.fill_(7),
                lambda t: t.index_put_((torch.tensor([1], device=device),), torch.tensor(-1.0, device=device)),
                lambda t: t.view(2, 4).t().copy_(torch.ones(4, 2, device=device)),  # a strided copy kernel
                lambda t: t.copy_(torch.zeros(8)),
            ):
                clone = torch._lazy_clone(x)
                write(clone)
                results += [clone.cpu(), x.cpu()]
            read = torch._lazy_clone(x)
            results.append((read * 2).cpu())
            queued = torch.ones(1 << 16, device=device).cumsum(0)  # still queued on openreg
            late = torch._lazy_clone(queued)
            late.zero_()
            results += [queued.cpu()[-3:], late.cpu()[-3:]]
            return results

        for cpu, dev in zip(writes("cpu"), writes("openreg"), strict=True):
            self.assertEqual(dev, cpu)

    def test_a_lazy_clone_copies_on_its_own_device_after_its_queued_writers(self):
        # review33: the copy-on-write copy took memory from the current device (openreg:0 for a
        # tensor on openreg:1), ran synchronously on the default stream (the host waited for the
        # device), and was not ordered with writes queued on a side stream: reads of a lazy clone
        # gave what the queued writes had not yet written.
        from torch_openreg.utils.testing import StreamHold

        n = 1 << 18
        want = torch.arange(n, dtype=torch.float32) + 20
        torch.openreg.set_device(0)
        try:
            x = torch.arange(n, dtype=torch.float32, device="openreg:1")
            for _ in range(20):
                x.add_(1)  # queued on openreg:1
            clone = torch._lazy_clone(x)
            self.assertEqual(clone.cpu(), want)  # a read: the copy is made on openreg:1
            self.assertEqual(clone.untyped_storage().device, torch.device("openreg:1"))
            self.assertEqual(x.cpu(), want)

            def work(t, zeros):
                t.add_(zeros.sum())
                for _ in range(20):
                    t.add_(1)
                c = torch._lazy_clone(t)
                c.mul_(2)  # materializes on the current stream, after the queued adds
                return c

            side = torch.openreg.Stream(device=0)
            y = torch.arange(n, dtype=torch.float32, device="openreg:0")
            side.wait_stream(torch.openreg.current_stream(0))
            with torch.openreg.stream(side):
                work(torch.zeros(n, device="openreg:0"), torch.zeros(4, device="openreg:0"))  # first calls
                with StreamHold() as held:  # the side stream is busy: a waiting host would block
                    clone = work(y, held.output)  # queued behind the hold
                    self.assertFalse(side.query())  # the host did not wait
                torch.openreg.synchronize()
            self.assertEqual(clone.cpu(), want * 2)
            self.assertEqual(y.cpu(), want)
        finally:
            torch.openreg.set_device(0)

    def test_sparse_members_are_checked_and_copied_on_write_at_launch(self):
        # review33: the members of sparse compressed tensors skipped the launch checks: a lazy clone
        # of CSR values was written through to its original, and values over a freed storage
        # computed silently.
        dense = torch.tensor([[1.0, 0.0], [2.0, 3.0]])
        csr = dense.to_sparse_csr().to("openreg")
        values = csr.values()
        shared = torch.sparse_csr_tensor(
            csr.crow_indices(), csr.col_indices(), torch._lazy_clone(values), (2, 2), device="openreg"
        )
        shared.mul_(2)
        self.assertEqual(values.cpu(), torch.tensor([1.0, 2.0, 3.0]))
        self.assertEqual(shared.to_dense().cpu(), dense * 2)
        values.untyped_storage().resize_(0)
        with self.assertRaisesRegex(RuntimeError, "needs 12 bytes of its storage, which holds 0"):
            csr.mul_(2)

    def test_resize_to_the_same_shape_keeps_strides(self):
        # resize_ used to make every tensor contiguous, so a transposed tensor's values moved.
        cpu = torch.arange(6.0).reshape(2, 3).t()
        d = torch.arange(6.0, device="openreg").reshape(2, 3).t()
        d.resize_(3, 2)
        cpu.resize_(3, 2)
        self.assertEqual((d.stride(), d.cpu()), (cpu.stride(), cpu))
        d.resize_as_(torch.empty(3, 2))
        self.assertEqual((d.stride(), d.cpu()), (cpu.stride(), cpu))

    def test_deterministic_mode_fills_uninitialized_memory_as_the_cpu(self):
        # Under torch.use_deterministic_algorithms(True) the CPU's and CUDA's empty* and a growing
        # resize_ fill new memory with NaN (integers: their largest value); openreg's returned what
        # the caching allocator's reused block held.
        def results(device):
            for dtype in (torch.float32, torch.int64):  # leave blocks with known values to be reused
                torch.full((64,), 5, dtype=dtype, device=device)
            grown = torch.ones(2, device=device)
            grown.resize_(5)
            grown_int = torch.ones(2, dtype=torch.int32, device=device)
            grown_int.resize_as_(torch.empty(4))
            return [
                torch.empty(64, device=device),
                torch.empty(64, dtype=torch.int64, device=device),
                torch.empty(3, dtype=torch.complex64, device=device),
                torch.empty(2, dtype=torch.bool, device=device),
                torch.empty_like(torch.ones(2, 3, device=device)),
                torch.empty_strided((2, 2), (1, 2), dtype=torch.float16, device=device),
                torch.ones(1, device=device).new_empty(4, dtype=torch.uint8),
                grown,
                grown_int,
            ]

        before = torch.are_deterministic_algorithms_enabled()
        try:
            torch.use_deterministic_algorithms(True)
            for cpu, dev in zip(results("cpu"), results("openreg"), strict=True):
                self.assertEqual(dev.cpu(), cpu, equal_nan=True, exact_dtype=True)
        finally:
            torch.use_deterministic_algorithms(before)

    def test_set_and_resize_reject_what_the_cpu_rejects(self):
        # A negative offset used to be accepted, and a later copy wrote into the tensor allocated before.
        for device in ("cpu", "openreg"):
            base = torch.arange(8.0, device=device)
            t = torch.empty(0, device=device)
            with self.assertRaisesRegex(RuntimeError, "Tensor: invalid storage offset -1"):
                t.set_(base.untyped_storage(), -1, (2,), (1,))
            with self.assertRaisesRegex(RuntimeError, r"unequal size length \(1\) and stride length \(2\)"):
                t.set_(base.untyped_storage(), 0, (2,), (1, 1))
            with self.assertRaises(RuntimeError):  # the CPU: "numel: integer multiplication overflow"
                torch.empty(2, device=device).resize_(-1)
        for call in (
            lambda: torch.empty(2, device="openreg").resize_(-1),
            lambda: torch.empty(0, device="openreg").set_(base.untyped_storage(), 0, (-1,), (1,)),
        ):
            with self.assertRaisesRegex(RuntimeError, "Trying to create tensor with negative dimension -1"):
                call()
        cpu_storage = torch.arange(4.0).untyped_storage()
        different = 'tensor on device "openreg:0" to a storage on different device "cpu"'
        with self.assertRaisesRegex(RuntimeError, different):
            torch.empty(0, device="openreg").set_(cpu_storage, 0, (2,), (1,))
        self.assertEqual(base.cpu(), torch.arange(8.0))

    def test_set_without_strides_and_on_another_device(self):
        # set_(storage, offset, size) means contiguous (it failed on the missing strides), and set_()
        # of a tensor on openreg:1 gives it an empty storage there (it took the current device's).
        s = torch.arange(12.0, device="openreg").untyped_storage()
        t = torch.tensor([], device="openreg").set_(s, 2, (2, 3))
        expected = torch.tensor([]).set_(torch.arange(12.0).untyped_storage(), 2, (2, 3))
        self.assertEqual((t.stride(), t.cpu()), (expected.stride(), expected))
        other = torch.ones(3, device="openreg:1")
        other.set_()
        self.assertEqual((other.device, other.shape), (torch.device("openreg:1"), (0,)))
        self.assertEqual(torch.openreg.current_device(), 0)

    def test_module_to_keeps_its_parameters(self):
        # Module.to() keeps the Parameter objects when a parameter may take the new tensor's data
        # (torch._has_compatible_shallow_copy_type). PyTorch's answer knows only its own backends:
        # Module.to("openreg") made new Parameters, and an optimizer built before it kept updating
        # the old CPU ones, silently.
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 3)
        weight = model.weight
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = weight.detach().clone()
        model.to("openreg")
        self.assertIs(model.weight, weight)
        self.assertEqual(weight.device, torch.device("openreg:0"))
        model(torch.ones(2, 3, device="openreg")).sum().backward()
        opt.step()
        self.assertEqual(weight.detach().cpu(), before - 0.1 * 2)  # d(sum)/dW = 2 for every entry
        self.assertIs(model.to("openreg:1").cpu().weight, weight)
        p = torch.nn.Parameter(torch.ones(2))
        p.data = torch.zeros(2, device="openreg")  # raised "incompatible tensor type" before
        self.assertEqual(p.device, torch.device("openreg:0"))
        self.assertFalse(torch._has_compatible_shallow_copy_type(p, torch.ones(2).to_sparse()))

    def test_copy_into_conjugated_and_negated_views(self):
        # Host to device into a view with the conj or neg bit went into endless recursion (a crash).
        src = torch.tensor([1 + 2j, 3 - 1j, -2 + 0.5j])
        for make in (lambda t: t.conj(), lambda t: t.conj().imag, lambda t: torch._neg_view(t.real)):
            expected = torch.zeros(3, dtype=torch.complex64)
            actual = expected.to("openreg")
            view_src = make(src.clone())
            make(expected).copy_(view_src)
            make(actual).copy_(view_src)  # host to device
            self.assertEqual(actual.cpu(), expected)
            actual.zero_()
            make(actual).copy_(view_src.to("openreg"))  # device to device
            self.assertEqual(actual.cpu(), expected)
        w = torch.zeros(3, dtype=torch.complex64, device="openreg").conj()
        w[:] = src
        self.assertEqual(w.cpu(), src)

    def test_copy_overlap_errors_match_cpu_at_the_call(self):
        for device in ("cpu", "openreg"):
            a = torch.arange(6.0, device=device)
            with self.assertRaisesRegex(RuntimeError, "some elements of the input tensor and the written-to tensor"):
                a[1:].copy_(a[:-1])
            with self.assertRaisesRegex(RuntimeError, "more than one element of the written-to tensor"):
                torch.zeros(1, device=device).expand(4).copy_(torch.arange(4.0))
            a.copy_(a)  # the same memory: nothing to do
            a[:3].copy_(a[3:])  # disjoint parts of one storage
            self.assertEqual(a.cpu(), torch.tensor([3.0, 4.0, 5.0, 3.0, 4.0, 5.0]))
            # Two equal expanded views: nothing to do, before the internal-overlap check (hunt36d).
            one = torch.ones(1, device=device)
            one.expand(4).copy_(one.expand(4))
            # A broadcast source that partly overlaps: checked as given, not expanded (it passed and
            # read what the copy had overwritten; hunt36d).
            x = torch.arange(8.0, device=device)
            with self.assertRaisesRegex(RuntimeError, "some elements of the input tensor and the written-to tensor"):
                x.view(2, 4).copy_(x[2:6])
            with self.assertRaisesRegex(RuntimeError, "some elements of the input tensor and the written-to tensor"):
                x[0:2].copy_(x[0:1])
            self.assertEqual(x.cpu(), torch.arange(8.0))

    def test_negative_views_copy_as_the_cpus_copy(self):
        # The CPU's copy_ converts, then negates in the destination's dtype. A negative view into a
        # dtype the CPU cannot negate is refused at the call; the check probed without the view's
        # bits, accepted it, and the device's copy failed at a later call (hunt36d).
        refused = [
            lambda d: torch._neg_view(torch.ones(2, dtype=torch.uint16, device=d)).clone(),
            lambda d: torch._neg_view(torch.ones(2, dtype=torch.float8_e4m3fn, device=d)).to(torch.float32),
            lambda d: torch.empty(2, dtype=torch.bool, device=d).copy_(torch._neg_view(torch.ones(2, device=d))),
        ]
        z = torch.tensor([1 + 1j, 2 - 3j])
        refused.append(lambda d: torch.empty(2, dtype=torch.uint16, device=d).copy_(z.conj().imag))  # from the host
        for i, call in enumerate(refused):
            for device in ("cpu", "openreg"):
                with self.assertRaisesRegex(NotImplementedError, '"neg_cpu" not implemented for', msg=f"{i} {device}"):
                    call(device)
        torch.openreg.synchronize()  # and nothing failed on the device
        # Host to device, negated in the destination's dtype: int8 -128 into int16 is 128 (it was
        # resolved in int8 on the host first, giving -128).
        values = torch.tensor([-128, 1, 5], dtype=torch.int8)
        src = torch._neg_view(values)
        expected = torch.empty(3, dtype=torch.int16).copy_(src)
        self.assertEqual(expected.tolist(), [128, -1, -5])
        for source in (src, torch._neg_view(values.pin_memory())):
            for non_blocking in (False, True):
                got = torch.empty(3, dtype=torch.int16, device="openreg").copy_(source, non_blocking=non_blocking)
                self.assertEqual(got.cpu(), expected)
        # Between host and device, the copy is the one the CPU makes, with both sides' bits and
        # layouts: staged through a plain tensor, a negative view into a negative uint16 view needed
        # a neg the CPU does not have (it negates nothing), and a float16 negative view into a
        # transposed float32 view hit the CPU's contiguous fast path, which drops the sign (review36).
        cases = [  # (source on a device, destination on a device)
            (
                lambda d: torch._neg_view(torch.arange(4).to(torch.uint16).to(d)),
                lambda d: torch._neg_view(torch.zeros(4, dtype=torch.uint16, device=d)),
            ),
            (
                lambda d: torch._neg_view(torch.arange(6.0).half().view(3, 2).to(d)),
                lambda d: torch.zeros(2, 3, device=d).t(),
            ),
        ]
        for make_src, make_dst in cases:
            expected = make_dst("cpu").copy_(make_src("cpu"))
            h2d = make_dst("openreg").copy_(make_src("cpu"))
            d2h = make_dst("cpu").copy_(make_src("openreg"))
            stored = [torch._neg_view(t) if t.is_neg() else t for t in (h2d, d2h, expected)]  # the values held
            self.assertEqual((stored[0].cpu(), stored[1]), (stored[2], stored[2]))


class TestForwardAD(TestCase):
    def test_a_missing_tangent_is_a_zero_tensor(self):
        # Forward AD stands an operand without a tangent in for torch._efficientzerotensor: on the
        # generic path it became ordinary zeros, so 0 * inf gave NaN where the CPU's tangent is
        # finite (a masked softmax's jvp), and each one took device memory.
        z = torch._efficientzerotensor(3, 4, device="openreg")
        self.assertTrue(z._is_zerotensor())
        self.assertEqual((z.device, z.shape, z.dtype), (torch.device("openreg:0"), (3, 4), torch.float32))
        self.assertEqual(torch._efficientzerotensor(2, device="openreg:1").device, torch.device("openreg:1"))
        self.assertEqual((z + 1).cpu(), torch.ones(3, 4))  # materialised where an op needs values

        from torch.func import jacfwd, jvp

        scale = torch.tensor([2.0, 3.0, 4.0, 5.0])
        mask = torch.tensor([False, True, False, False])

        def masked(x):
            return torch.softmax(x.masked_fill(mask.to(x.device), float("-inf")), -1) * scale.to(x.device)

        x, t = torch.randn(4), torch.randn(4)
        want = jvp(masked, (x,), (t,))
        got = jvp(masked, (x.to("openreg"),), (t.to("openreg"),))
        for g, w in zip(got, want):
            self.assertEqual(g.cpu(), w)
        self.assertEqual(jacfwd(masked)(x.to("openreg")).cpu(), jacfwd(masked)(x))

    def test_zero_tensors_reaching_the_backend(self):
        # dot, vdot and views pass torch's ZeroTensor fallback to the backend, whose CPU and CUDA
        # kernels test for them; on the generic path a ZeroTensor's missing storage was read as
        # host memory nobody wrote (NaN or garbage in jvp and hessian of x @ w against a constant).
        from torch.func import hessian, jvp

        z, ones = torch._efficientzerotensor(4, device="openreg"), torch.ones(4, device="openreg")
        d = torch.dot(z, ones)
        self.assertTrue(d._is_zerotensor())
        self.assertEqual(d.cpu(), torch.tensor(0.0))
        self.assertEqual(torch.vdot(ones, z).cpu(), torch.tensor(0.0))
        with self.assertRaisesRegex(RuntimeError, "inconsistent tensor size"):
            torch.dot(z, torch.ones(3, device="openreg"))
        zc = torch._efficientzerotensor(2, 3, dtype=torch.complex64, device="openreg")
        for _ in range(2):  # the synchronous first call, then the asynchronous path
            self.assertEqual(torch.view_as_real(zc).cpu(), torch.zeros(2, 3, 2))
        with self.assertRaisesRegex(RuntimeError, "invalid device|device index"):
            torch._efficientzerotensor(2, device="openreg:5")

        torch.manual_seed(0)
        x, t, w = torch.randn(4), torch.randn(4), torch.randn(4)
        for f in (
            lambda a: torch.dot(a, w.to(a.device)),
            lambda a: a @ w.to(a.device),
            lambda a: torch.inner(a, w.to(a.device)),
        ):
            want = jvp(f, (x,), (t,))
            got = jvp(f, (x.to("openreg"),), (t.to("openreg"),))
            for g, v in zip(got, want):
                self.assertEqual(g.cpu(), v)
        logistic = lambda a: torch.sigmoid(a @ w.to(a.device))  # noqa: E731
        self.assertEqual(hessian(logistic)(x.to("openreg")).cpu(), hessian(logistic)(x))


class TestGenericPath(TestCase):
    def test_conj_physical_in_place(self):
        # Its CompositeExplicitAutograd kernel calls a DispatchStub that has no openreg entry (an
        # internal assert); the generic path runs the composite on the device.
        x = torch.tensor([1 + 2j, 3 - 1j, -4j])
        d = x.to("openreg")
        for _ in range(3):  # the first call synchronous, the later ones asynchronous
            self.assertIs(d.conj_physical_(), d)
            x.conj_physical_()
            self.assertEqual(d.cpu(), x)
        r = torch.arange(3.0, device="openreg")
        self.assertEqual(r.conj_physical_().cpu(), torch.arange(3.0))  # real: nothing to do

    def test_a_verdict_for_one_mode_or_reduction_is_not_reused_for_another(self):
        # The first-call verdict is shared by a coarse signature, which kept only that an argument
        # is an int: embedding_bag's mode and the margin losses' reduction are ints. A mode whose
        # meta kernel agrees with the CPU (max) verified the signature for the others, whose
        # auxiliary outputs the meta kernel shapes differently: their kernels failed at a later
        # call, and a backward then read outputs never written (a segfault). Small ints are keyed.
        F = torch.nn.functional
        weight = torch.arange(30.0).reshape(10, 3)
        idx, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3])
        for grad in (False, True):
            for mode in ("max", "mean", "sum", "max", "sum"):
                results = {}
                for d in ("cpu", "openreg"):
                    w = weight.to(d, copy=True).requires_grad_(grad)
                    out = F.embedding_bag(idx.to(d), w, offsets.to(d), mode=mode)
                    if grad:
                        out.pow(2).sum().backward()
                    results[d] = (out.detach().cpu(), w.grad.cpu() if grad else None)
                self.assertEqual(results["openreg"], results["cpu"], msg=f"mode={mode} grad={grad}")
        x, target = torch.tensor([0.1, 0.9, 0.4, -0.3]), torch.tensor(1)
        for reduction in ("mean", "none", "sum", "none"):
            for loss, t in ((F.multi_margin_loss, target), (F.multilabel_margin_loss, torch.tensor([3, 0, -1, 1]))):
                want = loss(x, t, reduction=reduction)
                got = loss(x.to("openreg"), t.to("openreg"), reduction=reduction)
                self.assertEqual(got.cpu(), want, msg=f"{loss.__name__} {reduction}")
        torch.openreg.synchronize()

    def test_a_kernel_that_restrides_its_output_in_place_lands_its_values(self):
        # The CPU's replication and reflection pads restride a contiguous output to channels-last
        # and write it in that order: the result is the output's own memory, and copying it onto the
        # output read elements the copy had already overwritten (from the second call of a
        # signature on; with out= from the first). Compared with the CPU over three calls each.
        cl, cl3 = torch.channels_last, torch.channels_last_3d
        g = torch.Generator().manual_seed(0)
        x4 = torch.randn(2, 3, 5, 6, generator=g).contiguous(memory_format=cl)
        x5 = torch.randn(2, 3, 4, 5, 6, generator=g).contiguous(memory_format=cl3)
        cases = [
            (torch._C._nn.replication_pad2d, x4, (1, 2, 0, 1)),
            (torch._C._nn.reflection_pad2d, x4, (1, 2, 0, 1)),
            (torch._C._nn.replication_pad3d, x5, (1, 2, 0, 1, 1, 1)),
            (torch._C._nn.reflection_pad3d, x5, (1, 2, 0, 1, 1, 1)),
        ]
        for pad, x, widths in cases:
            want = pad(x, widths)
            for _ in range(3):
                self.assertEqual(pad(x.to("openreg"), widths).cpu(), want, atol=0, rtol=0)
                out = torch.empty(want.shape, device="openreg")  # contiguous: the kernel restrides it
                pad(x.to("openreg"), widths, out=out)
                self.assertEqual(out.cpu(), want, atol=0, rtol=0)
        conv = torch.nn.Conv2d(3, 4, 3, padding=1, padding_mode="replicate").to(memory_format=cl)
        want = conv(x4)
        conv.to("openreg")
        for _ in range(3):
            self.assertEqual(conv(x4.to("openreg")).cpu(), want)

    def test_results_of_sub_byte_dtypes_land(self):
        # The generic path copied a result into its device output with the CPU's copy_, which has
        # no kernel for uint1..7 and int1..7 even between equal dtypes: torch.cat of uint4 failed on
        # each signature's first call. They land as bits.
        raw = torch.tensor([1, 2, 7, 0], dtype=torch.uint8)
        for dtype in (torch.uint4, torch.uint1, torch.int4):
            x = raw.view(dtype)
            for _ in range(2):  # the first call synchronous, the second asynchronous
                got = torch.cat([x.to("openreg"), x.to("openreg")]).cpu()
                self.assertEqual(got.view(torch.uint8), torch.cat([x, x]).view(torch.uint8), msg=str(dtype))
                got = x.to("openreg").narrow_copy(0, 1, 2).cpu()
                self.assertEqual(got.view(torch.uint8), x.narrow_copy(0, 1, 2).view(torch.uint8), msg=str(dtype))

    def test_results_keep_the_cpu_kernels_dtypes_after_the_first_call(self):
        # The first call's check compared the results' shapes with the meta kernel's, not their
        # dtypes. Where the meta kernel describes CUDA's dtypes (batch norm's saved statistics in
        # float16 training are float32 there, float16 on the CPU; group norm's and weight norm's
        # the other way round), every later call returned them in the meta dtype, and the CPU's
        # backward kernels refused them ("expected scalar type Half but found Float").
        torch.manual_seed(0)
        cases = [
            (lambda: torch.nn.BatchNorm2d(3), torch.float16, (4, 3, 5, 5)),
            (lambda: torch.nn.BatchNorm2d(3), torch.bfloat16, (4, 3, 5, 5)),
            (lambda: torch.nn.GroupNorm(2, 4), torch.float32, (2, 4, 3)),  # float32 params, half input
            (lambda: torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(5, 3)), torch.float16, (2, 5)),
        ]
        for make, dtype, shape in cases:
            x = torch.randn(shape).half() if dtype == torch.float32 else torch.randn(shape).to(dtype)
            module = make().to(dtype)
            for step in range(3):  # the first call synchronous, the later ones asynchronous
                grads = {}
                for device in ("cpu", "openreg"):
                    m = copy.deepcopy(module).to(device)
                    with torch.autocast(device, enabled=False):
                        m(x.to(device)).float().pow(2).sum().backward()
                    grads[device] = [p.grad.cpu() for p in m.parameters()]
                self.assertEqual(grads["openreg"], grads["cpu"], msg=f"{type(module).__name__} {dtype} step {step}")
        # ... and they stay asynchronous (the verdict keeps the CPU's dtypes for later calls): a
        # 16-bit network's every batch norm made the host wait for the device otherwise.
        x = torch.randn(4, 3, 5, 5, dtype=torch.float16)
        w, b = torch.ones(3, dtype=torch.float16), torch.zeros(3, dtype=torch.float16)
        want = torch.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
        d = [t.to("openreg") for t in (x, w, b)]
        torch.native_batch_norm(*d, None, None, True, 0.1, 1e-5)  # the signature's first call
        with StreamHold() as held:
            got = torch.native_batch_norm(*d, None, None, True, 0.1, 1e-5)
            self.assertFalse(held.stream.query())  # returned with the kernel still queued
        self.assertEqual([t.dtype for t in got], [t.dtype for t in want])
        self.assertEqual([t.cpu() for t in got], list(want))

    def test_views_of_conjugate_and_negative_views_keep_their_bit(self):
        # The meta mirror of an input dropped its conjugate and negative bits, so the asynchronous
        # path's views (from a signature's second call on) of x.conj() or a negative view came back
        # without them: unfold, view_as_real and view_as_complex returned the conjugate (or negation)
        # of the answer.
        z = torch.tensor([1 + 2j, 3 - 4j, 5 + 6j, 7 - 8j])
        w = torch.tensor([1.0, 2.0, 3.0, 4.0])
        cases = {
            "unfold of conj": lambda z, w: z.conj().unfold(0, 2, 2),
            "unfold of neg": lambda z, w: w._neg_view().unfold(0, 2, 2),
            "mH unfold sum": lambda z, w: z.view(2, 2).mH.unfold(0, 1, 1).sum(-1),
            "view_as_real of neg": lambda z, w: torch.view_as_real(z._neg_view()),
            "view_as_complex of neg": lambda z, w: torch.view_as_complex(w.view(2, 2)._neg_view()),
        }
        for name, f in cases.items():
            want = f(z, w)
            for _ in range(3):
                got = f(z.to("openreg"), w.to("openreg"))
                self.assertEqual((got.is_conj(), got.is_neg()), (want.is_conj(), want.is_neg()), msg=name)
                self.assertEqual(got.cpu(), want, msg=name)

    def test_a_conjugate_view_returned_by_a_kernel_is_resolved(self):
        # ATen's linalg_lu_solve with left=False answers by flipping its output's conj bit; the
        # bit stayed on the CPU side and every call after the first (the asynchronous path)
        # returned the conjugate of the answer, out= too.
        torch.manual_seed(0)
        A = torch.randn(2, 4, 4, dtype=torch.complex64)
        B = torch.randn(2, 3, 4, dtype=torch.complex64)
        LU, pivots = torch.linalg.lu_factor(A)
        want = torch.linalg.lu_solve(LU, pivots, B, left=False)
        dA, dB, dLU, dpiv = (t.to("openreg") for t in (A, B, LU, pivots))
        for _ in range(3):
            self.assertEqual(torch.linalg.lu_solve(dLU, dpiv, dB, left=False).cpu(), want)
            self.assertEqual(torch.linalg.solve(dA, dB, left=False).cpu(), torch.linalg.solve(A, B, left=False))
        out = torch.empty_like(dB)
        torch.linalg.lu_solve(dLU, dpiv, dB, left=False, out=out)
        self.assertEqual(out.resolve_conj().cpu(), want.resolve_conj())

    def test_fill_values_out_of_range_raise_at_the_call(self):
        # The CPU kernels of fill_, masked_fill_ and index_fill_ refuse a value their dtype cannot
        # hold; on the asynchronous path that error came at the next synchronising call, not at the
        # call as on the CPU and CUDA. Found by tests/fuzz.
        mask, index = torch.tensor([True, False, True]), torch.tensor([0])
        calls = {
            "fill_": lambda x, v: x.fill_(v),
            "masked_fill_": lambda x, v: x.masked_fill_(mask.to(x.device), v),
            "index_fill_": lambda x, v: x.index_fill_(0, index.to(x.device), v),
            "full": lambda x, v: torch.full((2,), v, dtype=x.dtype, device=x.device),
        }
        for name, call in calls.items():
            for dtype, value in ((torch.uint8, -1.25), (torch.int8, 200), (torch.float16, 1e10)):
                for device in ("cpu", "openreg"):
                    call(torch.zeros(3, dtype=dtype, device=device), 1)  # a first call of the signature
                    with self.assertRaisesRegex(RuntimeError, "value cannot be converted to type .* without overflow"):
                        call(torch.zeros(3, dtype=dtype, device=device), value)
                torch.openreg.synchronize()  # nothing left to report
            x = torch.zeros(3, dtype=torch.uint8, device="openreg")
            self.assertEqual(call(x, -1).cpu(), call(torch.zeros(3, dtype=torch.uint8), -1))  # wraps, as on the CPU

    def test_an_object_result_holds_host_copies_of_its_arguments(self):
        # quantized::linear_prepack_fp16 has no openreg kernel; its packed weight keeps the bias
        # tensor it was given. Packed from kernel views, that bias was device memory read after its
        # kernel had ended: unpack() gave garbage and the packed linear was off by whole units.
        g = torch.Generator().manual_seed(0)
        w, b, x = torch.randn(16, 8, generator=g), torch.randn(16, generator=g), torch.randn(4, 8, generator=g)
        on_cpu = torch.ops.quantized.linear_prepack_fp16(w, b)
        packed = torch.ops.quantized.linear_prepack_fp16(w.to("openreg"), b.to("openreg"))
        torch.ones(1 << 16, device="openreg").mul_(7.0)  # device memory is reused and written meanwhile
        torch.openreg.synchronize()
        (w_got, b_got), (w_want, b_want) = packed.unpack(), on_cpu.unpack()
        self.assertEqual((w_got.device, b_got.device), (torch.device("cpu"),) * 2)  # host memory, as packed on the CPU
        self.assertEqual(w_got, w_want, atol=0, rtol=0)
        self.assertEqual(b_got, b_want, atol=0, rtol=0)
        out = torch.ops.quantized.linear_dynamic_fp16(x.to("openreg"), packed)
        self.assertEqual(out.device, torch.device("openreg", 0))
        self.assertEqual(out.cpu(), torch.ops.quantized.linear_dynamic_fp16(x, on_cpu), atol=0, rtol=0)
        # On openreg:1 the arguments come from that device; an object result cannot write an argument.
        self.assertEqual(
            torch.ops.quantized.linear_prepack_fp16(w.to("openreg:1"), None).unpack()[0], w_want, atol=0, rtol=0
        )

    def test_a_host_tensor_is_read_at_the_call(self):
        # A CPU scalar tensor (allowed with device tensors, as on CUDA) was kept by reference and
        # read when the kernel ran: changed by the host after the call, it gave the new value
        # (an in-place update of a CPU step or decay between steps). The CPU computes with its
        # value at the call, and CUDA copies it at the launch.
        x = torch.ones(4, device="openreg")
        s = torch.tensor(2.0)
        calls = {
            "mul": lambda: x * s,
            "fill_": lambda: x.clone().fill_(s),
            "where": lambda: torch.where(x > 0, s, x),
            "_foreach_mul": lambda: torch._foreach_mul([x], s)[0],
        }
        for name, call in calls.items():
            s.fill_(2.0)
            want = call().cpu()  # a signature's first call runs synchronously: this one is queued
            with StreamHold() as held:
                got = call()
                s.fill_(100.0)
                self.assertFalse(held.stream.query())  # the kernel has not run yet
            self.assertEqual(got.cpu(), want, atol=0, rtol=0, msg=name)
        self.assertEqual(s.item(), 100.0)  # the caller's tensor is the caller's

    def test_an_out_that_is_also_an_input_is_one_tensor_to_the_kernel(self):
        # logical_and_'s composite calls logical_and_out(self, self, other). The CPU kernel refuses
        # to resize self to the broadcast shape because out and self are one tensor; its kernel
        # tensors were two, and openreg resized self silently. Found by tests/fuzz.
        def logical_and_(d):
            x = torch.ones(3, device=d)
            x.logical_and_(torch.ones(2, 3, device=d))
            return x

        def out_is_input(d):  # the CPU resizes the input with its out=, then reduces the resized input
            x = torch.arange(6.0, device=d).reshape(2, 3)
            return torch.mean(x, 0, out=x), x

        def out_is_a_view_of_an_input(d):  # the kernel refused the overlap the host made by resizing first
            x = torch.full((), 2, dtype=torch.int8, device=d)
            return torch.eq(torch.full((4, 1), 2, dtype=torch.int8, device=d), x.t(), out=x), x

        for call in range(2):  # the second call of a signature after one that needs no resize
            torch.ones(3, device="openreg").logical_and_(torch.ones(3, device="openreg"))
            torch.mean(torch.ones(2, device="openreg"), 0, out=torch.ones((), device="openreg"))
            for f in (logical_and_, out_is_input, out_is_a_view_of_an_input):
                expected = outcome(f, "cpu")
                self.assertEqual(outcome(f, "openreg"), expected, msg=f"{f.__name__}, call {call}")
        self.assertEqual(outcome(logical_and_, "cpu")[0], "RuntimeError")

    def test_outputs_the_call_does_not_ask_for(self):
        # native_batch_norm_backward leaves the outputs its mask does not ask for undefined (None
        # in Python). The second call of a signature takes the asynchronous path.
        torch.manual_seed(0)
        x, g, w = torch.randn(4, 3, 5), torch.randn(4, 3, 5), torch.randn(3)
        mean, invstd = x.mean((0, 2)), (x.var((0, 2), unbiased=False) + 1e-5).rsqrt()
        args = (g, x, w, None, None, mean, invstd, True, 1e-5)
        for mask in ([True, False, False], [False, True, True]):
            expected = torch.ops.aten.native_batch_norm_backward(*args, mask)
            for call in range(2):
                got = torch.ops.aten.native_batch_norm_backward(
                    *[a.openreg() if isinstance(a, torch.Tensor) else a for a in args], mask
                )
                for i, (r, e) in enumerate(zip(got, expected)):
                    if e is None:
                        self.assertIsNone(r, f"call {call}, output {i}")
                    else:
                        self.assertEqual(r.cpu(), e, msg=f"call {call}, output {i}")

    def test_elementwise_reductions_linalg(self):
        a, da = pair(5, 7)
        b, db = pair(5, 7)
        self.assertEqual((da + db).cpu(), a + b)
        self.assertEqual(torch.sin(da).cpu(), torch.sin(a))
        self.assertEqual(da.sum(dim=1).cpu(), a.sum(dim=1))
        self.assertEqual((da @ db.t()).cpu(), a @ b.t())
        self.assertEqual(torch.softmax(da, 1).cpu(), torch.softmax(a, 1))
        self.assertEqual(da.max(dim=0).values.cpu(), a.max(dim=0).values)

    def test_integer_and_bool(self):
        a = torch.randint(-5, 5, (10,))
        d = a.to("openreg")
        self.assertEqual((d * 3 - 1).cpu(), a * 3 - 1)
        self.assertEqual((d > 0).cpu(), a > 0)
        self.assertEqual(((d > 0) & (d < 3)).cpu(), (a > 0) & (a < 3))

    def test_inplace_and_out_keep_storage(self):
        a, da = pair(4, 4)
        ptr = da.data_ptr()
        da.mul_(2).add_(1)
        self.assertEqual(da.data_ptr(), ptr)
        self.assertEqual(da.cpu(), a * 2 + 1)
        out = torch.empty(4, 4, device="openreg")
        optr = out.data_ptr()
        torch.exp(da, out=out)
        self.assertEqual(out.data_ptr(), optr)
        self.assertEqual(out.cpu(), torch.exp(a * 2 + 1))
        small = torch.empty(0, device="openreg")
        torch.add(da, 1, out=small)  # out= resized by the op
        self.assertEqual(small.cpu(), a * 2 + 2)

    def test_non_contiguous_and_channels_last(self):
        a, da = pair(2, 3, 5, 5)
        cl = da.contiguous(memory_format=torch.channels_last)
        self.assertTrue(cl.is_contiguous(memory_format=torch.channels_last))
        self.assertEqual((cl * 2).cpu(), a * 2)
        self.assertEqual(torch.relu(da.transpose(1, 3)).cpu(), torch.relu(a.transpose(1, 3)))

    def test_data_dependent_shapes(self):
        a, da = pair(50)
        self.assertEqual(da[da > 0].cpu(), a[a > 0])
        self.assertEqual(torch.nonzero(da > 0).cpu(), torch.nonzero(a > 0))
        self.assertEqual(torch.unique(da.round()).cpu(), torch.unique(a.round()))

    def test_convolution_and_backward(self):
        x, dx = pair(2, 3, 8, 8)
        conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        dconv = torch.nn.Conv2d(3, 4, 3, padding=1).to("openreg")
        dconv.load_state_dict({k: v.to("openreg") for k, v in conv.state_dict().items()})
        dx.requires_grad_(True)
        x.requires_grad_(True)
        conv(x).square().sum().backward()
        dconv(dx).square().sum().backward()
        self.assertEqual(dx.grad.cpu(), x.grad, atol=1e-4, rtol=1e-4)
        self.assertEqual(dconv.weight.grad.cpu(), conv.weight.grad, atol=1e-4, rtol=1e-4)
        self.assertEqual(dconv.bias.grad.cpu(), conv.bias.grad, atol=1e-4, rtol=1e-4)

    def test_convolution_layout_and_devices(self):
        # The layout is the one FakeTensor predicts for openreg (what compiled graphs were traced
        # with and assert), for the output and both gradients; the values are the CPU's.
        x, w = torch.randn(1, 2, 4, 5), torch.randn(3, 2, 3, 3)
        cl = torch.channels_last
        for xi, wi in ((x.to(memory_format=cl), w), (x, w.to(memory_format=cl)), (x, w)):
            expected = F.conv2d(xi, wi)
            dx, dw = xi.to("openreg").requires_grad_(), wi.to("openreg").requires_grad_()
            out = F.conv2d(dx, dw)
            with torch._subclasses.FakeTensorMode() as mode:
                fx, fw = mode.from_tensor(dx).requires_grad_(), mode.from_tensor(dw).requires_grad_()
                fake = F.conv2d(fx, fw)
                fake_grads = torch.autograd.grad(fake.sum(), (fx, fw))
            self.assertEqual(out.stride(), fake.stride())
            self.assertEqual(out.cpu(), expected, atol=1e-5, rtol=1e-5)
            grads = torch.autograd.grad(out.sum(), (dx, dw))
            self.assertEqual([g.stride() for g in grads], [g.stride() for g in fake_grads])
        # A weight elsewhere is refused at the call (it was computed from openreg:1 silently, or
        # failed later in the kernel for a CPU weight).
        dx = x.to("openreg")
        for weight in (w.to("openreg:1"), w):
            with self.assertRaisesRegex(RuntimeError, "Expected all tensors to be on the same device.*openreg:0 and"):
                F.conv2d(dx, weight)
        self.assertEqual(F.conv2d(dx, w.to("openreg")).cpu(), F.conv2d(x, w), atol=1e-5, rtol=1e-5)

    def test_in_place_resize_of_a_written_argument(self):
        # The CPU kernel grows the per-channel statistics it is given in place. On the device such a
        # resize happens in host memory: the first call of a signature (run synchronously) carries
        # it back, and the signature stays synchronous; were it missed on the asynchronous path,
        # the kernel fails naming the operator and the argument, never a silent wrong result
        # (the statistics kept their old size: found by openreg-quant's QAT tests).
        op = torch.ops.aten.fused_moving_avg_obs_fake_quant
        x = torch.randn(6, 4)

        def state(stats_size, qparams_size):
            return [torch.zeros(stats_size), torch.zeros(stats_size), torch.ones(qparams_size),
                    torch.zeros(qparams_size, dtype=torch.int32)]  # fmt: skip

        on = torch.ones(1, dtype=torch.long)
        for sizes in ((0, 1), (6, 6), (0, 1)):
            cpu_state = state(*sizes)
            dev_state = [t.to("openreg") for t in cpu_state]
            ref = op(x, on, on, *cpu_state, 0.01, -128, 127, 0, True)
            out = op(x.to("openreg"), on.to("openreg"), on.to("openreg"), *dev_state, 0.01, -128, 127, 0, True)
            self.assertEqual(out.cpu(), ref)
            self.assertEqual([t.cpu() for t in dev_state], cpu_state)  # resized to 6 values, as on the CPU

    def test_out_resized_on_the_first_call_keeps_later_calls_asynchronous(self):
        # An out= tensor the CPU kernel resizes is a returned alias, carried back as such; it is not
        # an unreturned resized argument, which would keep its signature synchronous for good.
        a, b = torch.randn(5, device="openreg"), torch.randn(5, device="openreg")
        torch.atan2(a, b, out=torch.empty(0, device="openreg"))  # verified synchronously: 0 -> 5
        torch.openreg.synchronize()
        with StreamHold() as held:
            out = torch.empty(0, device="openreg")
            torch.atan2(a, b, out=out)
            self.assertFalse(held.stream.query(), "the call waited for the device")
        self.assertEqual(out.cpu(), torch.atan2(a.cpu(), b.cpu()))

    def test_in_place_resize_missed_by_the_asynchronous_path_fails_the_kernel(self):
        # A signature verified without a resize runs asynchronously afterwards; a later call whose
        # CPU kernel resizes a written argument fails at the next synchronisation, naming it. (Sizes
        # of 64 and more: a smaller int is part of the coarse signature, a new one for each value.)
        x = torch.zeros(100, device="openreg")
        grow_to(x, 100)  # verified: no resize
        torch.openreg.synchronize()
        with self.assertRaisesRegex(
            RuntimeError, r"openreg_test::grow_to resized its argument 'x' in place \(from \[100\] to \[120\]\)"
        ):
            grow_to(x, 120)
            torch.openreg.synchronize()
        self.assertEqual(x.shape, (100,))
        self.assertEqual((torch.ones(2, device="openreg") + 1).cpu(), torch.full((2,), 2.0))  # still usable

    def test_fft(self):
        a, da = pair(16)
        self.assertEqual(torch.fft.rfft(da).cpu(), torch.fft.rfft(a))

    def test_autograd_mlp(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        dmodel = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to("openreg")
        dmodel.load_state_dict({k: v.to("openreg") for k, v in model.state_dict().items()})
        x = torch.randn(4, 8)
        model(x).sum().backward()
        dmodel(x.to("openreg")).sum().backward()
        for p, dp in zip(model.parameters(), dmodel.parameters()):
            self.assertEqual(dp.grad.cpu(), p.grad)

    def test_device_mismatch(self):
        a = torch.ones(3, device="openreg:0")
        b = torch.ones(3, device="openreg:1")
        with self.assertRaisesRegex(
            RuntimeError, "Expected all tensors to be on the same device.*openreg:0.*openreg:1"
        ):
            a + b
        self.assertEqual((a + a).cpu().tolist(), [2.0] * 3)

    def test_indices_from_another_device_are_refused_in_atens_words(self):
        # ATen's check_indices_on_cpu_or_selfdevice, as on CUDA: an IndexError naming the indexed
        # tensor's device (the generic device-mismatch RuntimeError before). CPU indices are moved.
        x = torch.arange(4.0, device="openreg:0")
        index = torch.tensor([0, 2])
        self.assertEqual(x[index].cpu().tolist(), [0.0, 2.0])
        self.assertEqual(x[index.to("openreg:0")].cpu().tolist(), [0.0, 2.0])
        for call, device in (
            (lambda: x[index.to("openreg:1")], "openreg:0"),
            (lambda: x.clone().index_put_((index.to("openreg:1"),), torch.tensor(5.0, device="openreg")), "openreg:0"),
            (lambda: torch.arange(4.0)[index.to("openreg:0")], "cpu"),
        ):
            with self.assertRaisesRegex(
                IndexError,
                rf"^indices should be either on cpu or on the same device as the indexed tensor \({device}\)",
            ):
                call()

    def test_pinned_device_factories_are_refused_as_on_cuda(self):
        # pin_memory=True with an openreg device was ignored: no pinned memory, and no signal.
        for call in (
            lambda: torch.empty(3, device="openreg", pin_memory=True),
            lambda: torch.empty_strided((3,), (1,), device="openreg", pin_memory=True),
            lambda: torch.zeros(3, device="openreg", pin_memory=True),
            lambda: torch.ones(2, device="openreg").new_empty(3, pin_memory=True),
        ):
            with self.assertRaisesRegex(RuntimeError, "^Only dense CPU tensors can be pinned"):
                call()
        self.assertTrue(torch.empty(3, pin_memory=True).is_pinned())  # host memory: pinned

    def test_host_tensors_are_rejected_as_on_cuda(self):
        # A CPU tensor among openreg ones used to be read by the device kernel from host memory.
        a = torch.ones(2, device="openreg")
        host = torch.ones(2)
        message = r"Expected all tensors to be on the same device, but found at least two devices, openreg:0 and cpu!"
        for call in (
            lambda: a + host,
            lambda: torch.cat([a, host]),
            lambda: torch.sin(a, out=torch.empty(2)),
            lambda: host.add_(a),
        ):
            with self.assertRaisesRegex(RuntimeError, message):
                call()
        self.assertEqual(host.tolist(), [1.0, 1.0])
        self.assertEqual((a + torch.tensor(2.0)).cpu().tolist(), [3.0, 3.0])  # a CPU scalar is fine, as on CUDA
        host_scalar = torch.tensor(1.0)  # ... to read: the device must not write host memory
        for call in (lambda: host_scalar.add_(a[0]), lambda: torch.add(a[0], a[0], out=host_scalar)):
            with self.assertRaisesRegex(RuntimeError, message):
                call()
        self.assertEqual(host_scalar.item(), 1.0)
        with self.assertRaisesRegex(RuntimeError, "Expected a 'cpu' device type for generator but found 'openreg'"):
            torch.randn(3, generator=torch.Generator(device="openreg"))
        # ... and the other way round, in torch's words too (openreg's own wording before).
        for call in (
            lambda: torch.rand(3, device="openreg", generator=torch.Generator()),
            lambda: a.clone().normal_(generator=torch.Generator()),
        ):
            with self.assertRaisesRegex(
                RuntimeError, "^Expected a 'openreg' device type for generator but found 'cpu'$"
            ):
                call()

    def test_host_index_tensors_are_moved_to_the_device(self):
        # Advanced indexing accepts index tensors on the CPU (ATen moves them, on CUDA too).
        cpu = torch.arange(12.0).reshape(3, 4)
        d = cpu.to("openreg")
        i, mask = torch.tensor([2, 0]), torch.tensor([True, False, True])
        for index in ((i,), (slice(None), i), (i, i), (mask,)):
            self.assertEqual(d[index].cpu(), cpu[index])
        before = torch.openreg._runtime_counters()["memcpy_h2d"]
        d[i] = 7.0
        cpu[i] = 7.0
        self.assertEqual(d.cpu(), cpu)
        self.assertGreater(torch.openreg._runtime_counters()["memcpy_h2d"], before)  # the indices were copied
        with self.assertRaisesRegex(RuntimeError, "found at least two devices, openreg:0 and cpu"):
            d.index_put_((i,), torch.ones(2, 4))  # values are not indices

    def test_overlapping_input_and_output_raise_as_on_cpu(self):
        # Each kernel tensor used to have a CPU storage of its own, so the CPU kernels' aliasing
        # checks passed and the kernels read what they had overwritten. The second call of each
        # signature would take the asynchronous path: a partial overlap's error still belongs to
        # the call.
        def shifted_add(t):
            t[1:] += t[:-1]

        def mul_into_shifted_view(t):
            torch.mul(t[:-1], 2, out=t[1:])

        def cat_into_input(t):
            torch.cat([t[:3], t[:3]], out=t)

        def addcmul_shifted(t):
            t[1:].addcmul_(t[:-1], t[:-1])

        overlap = "unsupported operation: some elements of the input tensor and the written-to tensor"
        for op in (shifted_add, mul_into_shifted_view, cat_into_input, addcmul_shifted):
            with self.assertRaisesRegex(RuntimeError, overlap):
                op(torch.arange(6.0))  # the CPU's verdict
            for call in range(2):
                d = torch.arange(6.0, device="openreg")
                with self.assertRaisesRegex(RuntimeError, overlap):
                    op(d)
                self.assertEqual(d.cpu(), torch.arange(6.0), msg=op.__name__)  # left as it was
        # Exactly the same memory stays asynchronous (elementwise kernels allow it): a kernel that
        # forbids it fails on the device, and the next synchronisation reports the CPU's error.
        for call in range(2):
            d = torch.arange(3.0, device="openreg")
            with self.assertRaisesRegex(RuntimeError, overlap):
                torch.index_select(d, 0, torch.tensor([2, 1, 0], device="openreg"), out=d)
                torch.openreg.synchronize()
            self.assertEqual(d.cpu(), torch.arange(3.0))
        # Overlaps the CPU allows give the CPU's results, on both paths.
        for call in range(2):
            cpu, d = torch.arange(6.0), torch.arange(6.0, device="openreg")
            for t in (cpu, d):
                t.add_(t)
                torch.mul(t, t, out=t)
                torch.add(t[:3], 1, out=t[3:])
            self.assertEqual(d.cpu(), cpu)

    def test_threads_that_end_give_back_their_launch_records(self):
        # Each thread that launches generic kernels keeps records for reuse; a thread that ended
        # used to keep them forever (about 30 KB per thread).
        import time

        import torch_openreg

        x = torch.ones(16, device="openreg")
        (x * 2).cpu()
        baseline = torch_openreg._C._generic_launches_alive()
        while_alive = []

        def work():
            for _ in range(300):
                x * 2 + 1
            torch.openreg.synchronize()
            while_alive.append(torch_openreg._C._generic_launches_alive())

        for _ in range(10):
            t = threading.Thread(target=work)
            t.start()
            t.join()
        self.assertTrue(all(n > baseline for n in while_alive), (baseline, while_alive))  # kept for reuse
        # join() returns when the Python thread is done; its C++ thread-locals go a little later.
        deadline = time.monotonic() + 30
        while torch_openreg._C._generic_launches_alive() != baseline and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(torch_openreg._C._generic_launches_alive(), baseline)
        # A thread that ends with its kernels still queued: the worker frees them once they ran.
        with StreamHold():  # keeps the stream busy, so that the threads' kernels are still queued when they end
            for _ in range(10):
                t = threading.Thread(target=lambda: [x * 2 + 1 for _ in range(50)])
                t.start()
                t.join()
            queued = torch_openreg._C._generic_launches_alive()
        torch.openreg.synchronize()
        deadline = time.monotonic() + 30
        while torch_openreg._C._generic_launches_alive() > baseline + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertGreater(queued, baseline + 500)
        self.assertLessEqual(torch_openreg._C._generic_launches_alive(), baseline + 1)  # + the hold's own

    def test_shape_error_matches_cpu(self):
        with self.assertRaisesRegex(RuntimeError, "must match the size"):
            torch.ones(3, device="openreg") + torch.ones(4, device="openreg")

    def test_deterministic_mode_alerts_at_the_call_as_the_cpu(self):
        # put_(accumulate=False) has no deterministic CPU kernel. A signature verified before
        # use_deterministic_algorithms(True) stayed asynchronous: the refusal came later, as a
        # kernel failure of an unrelated synchronising call. With warn_only=True the kernel's
        # warning was dropped with every other device warning: openreg never warned.
        def put(device):
            index = torch.tensor([0, 2], device=device)
            return torch.zeros(5, device=device).put_(index, torch.ones(2, device=device))

        def alerts(call, device):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                call(device)
            return [str(w.message).split(",")[0] for w in caught if "deterministic" in str(w.message)]

        for _ in range(2):  # verified: later calls take the asynchronous path
            put("openreg")
        torch.openreg.synchronize()
        before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
        try:
            torch.use_deterministic_algorithms(True)
            for device in ("cpu", "openreg"):
                with self.assertRaisesRegex(RuntimeError, "^put_ does not have a deterministic implementation"):
                    put(device)  # at the call, with the CPU's error
            self.assertEqual(torch.ones(2, device="openreg").sum().item(), 2.0)  # nothing left to fail later
            torch.use_deterministic_algorithms(True, warn_only=True)
            for _ in range(3):  # every call warns, as on the CPU
                self.assertEqual(alerts(put, "openreg"), alerts(put, "cpu"))
                self.assertEqual(len(alerts(put, "cpu")), 1)
            self.assertEqual(outcome(put, "openreg"), outcome(put, "cpu"))
        finally:
            torch.use_deterministic_algorithms(before[0], warn_only=before[1])

    def test_python_scalars_promote_as_scalars(self):
        # A Python number and a 0-dim tensor promote differently; the meta cache took them for the
        # same signature, so whichever came first decided the dtype of both.
        for dtype, value in ((torch.int32, 2), (torch.int8, 100), (torch.float16, 1e5)):
            cpu = torch.ones(3, dtype=dtype)
            d = cpu.to("openreg")
            for other in (torch.tensor(value), value):
                self.assertEqual((d + other).cpu(), cpu + other, exact_dtype=True)

    def test_new_sizes_offsets_and_scalar_values_do_not_make_the_host_wait(self):
        # A call's first run is synchronous (the meta kernel is checked against the CPU kernel).
        # The check used to be per exact signature, so every new scalar value (a learning rate),
        # slice offset or size made the host wait for the device again.
        x = torch.arange(8.0, device="openreg")
        cpu = x.cpu()
        calls = (
            lambda t, k: t.add(t, alpha=0.5 + k),
            lambda t, k: t.clamp(min=0.1 + k),
            lambda t, k: t[1 + k : 5 + k].sum(),
            lambda t, k: t[: 3 + k].mul(2.5 + k),
        )
        for call in calls:
            call(x, 0)
        torch.openreg.synchronize()
        with StreamHold() as held:  # the device is busy until released
            results = [call(x, 1) for call in calls]
            busy = not held.stream.query()
        self.assertTrue(busy, "a call waited for the device")
        for call, got in zip(calls, results):
            self.assertEqual(got.cpu(), call(cpu, 1))

    def test_ops_with_a_decomposition_run_the_cpu_kernel(self):
        # A CompositeExplicitAutograd kernel outranks the generic path: layer norm, group norm and
        # addr ran their decompositions, whose rounding differs from the CPU kernels'.
        x = torch.tensor([[-3.7196], [123.456]])
        y = torch.randn(4, 768)
        v, w = torch.randn(3), torch.randn(5)
        cases = (
            (lambda t: F.layer_norm(t, (1,)), x),
            (lambda t: F.layer_norm(t, (768,)), y),
            (lambda t: F.group_norm(t.reshape(4, 4, 192), 2), y),
            (lambda t: torch.addr(torch.zeros(3, 5, device=t.device), t, t.new_ones(5)), v),
            (lambda t: torch.stack([t, t]), w),
        )
        for f, t in cases:
            self.assertEqual(f(t.to("openreg")).cpu(), f(t), atol=0, rtol=0)

    def test_resized_out_has_the_same_layout_on_every_call(self):
        # The first call of a signature used to return the CPU kernel's layout, later ones the meta
        # kernel's. Both now follow the meta kernel (contiguous here; the CPU gives channels-last).
        x = torch.randn(2, 3, 4, 5, device="openreg").to(memory_format=torch.channels_last)
        strides = []
        for _ in range(2):
            out = torch.empty(0, device="openreg")
            torch.sin(x, out=out)
            strides.append(out.stride())
            self.assertEqual(out.cpu(), x.cpu().sin())
        self.assertEqual(strides[0], strides[1])

    def test_no_host_device_copies(self):
        a = torch.randn(64, 64, device="openreg")
        b = torch.randn(64, 64, device="openreg")
        torch.openreg.synchronize()
        before = torch.openreg._runtime_counters()
        c = torch.relu(a @ b + 1).sum(0)
        c.mul_(2)
        torch.openreg.synchronize()
        after = torch.openreg._runtime_counters()
        self.assertEqual(after["memcpy_h2d"], before["memcpy_h2d"])
        self.assertEqual(after["memcpy_d2h"], before["memcpy_d2h"])
        self.assertEqual(after["memcpy_d2d"], before["memcpy_d2d"])
        self.assertGreaterEqual(after["kernels_launched"] - before["kernels_launched"], 4)

    def test_structured_ops_go_straight_to_the_generic_path(self):
        # The functional and in-place overloads of a structured op reach the generic path directly
        # (route_structured_ops), not through PyTorch's host-side meta + out= wrapper; the device
        # kernel of a functional one runs the out= overload into its output.
        a, b = torch.arange(4.0, device="openreg"), torch.full((4,), 2.0, device="openreg")
        out = torch.empty(4, device="openreg")
        torch.openreg.reset_fallback_op_counts()
        c = torch.add(a, b, alpha=3)
        torch.add(a, b, out=out)
        a.add_(b)
        a.t_()  # an in-place view op: metadata only, never a kernel
        self.assertEqual(
            torch.openreg.fallback_op_counts(), {"aten::add.Tensor": 1, "aten::add.out": 1, "aten::add_.Tensor": 1}
        )
        self.assertEqual(c.cpu().tolist(), [6.0, 7.0, 8.0, 9.0])
        self.assertEqual(out.cpu().tolist(), [2.0, 3.0, 4.0, 5.0])
        self.assertEqual(a.cpu().tolist(), [2.0, 3.0, 4.0, 5.0])
        # Output layout follows the meta kernel, as on the CPU (channels-last in, channels-last out).
        x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
        y = torch.mul(x.to("openreg"), 2)
        self.assertEqual(y.stride(), (x * 2).stride())
        self.assertEqual(y.cpu(), x * 2)

    def test_functional_copies_take_a_source_on_another_device(self):
        # aten::copy and the *_scatter ops end in copy_(src), which copies from another device as on
        # CUDA. Routed to the generic path, they refused a CPU or openreg:1 source: functionalization
        # turns x[0] = cpu_tensor into aten::copy, so it failed under torch.func.functionalize and
        # torch.compile(backend="aot_eager") where eager worked (hunt33a).
        from torch.func import functionalize

        def calls(device, src_device):
            x = torch.arange(12.0, device=device).reshape(3, 4)
            row = torch.tensor([9.0, 8.0, 7.0, 6.0], device=src_device)
            return [
                torch.ops.aten.copy(x, row.expand(3, 4)),
                torch.slice_scatter(x, row[:2].expand(3, 2), dim=1, start=1, end=3),
                torch.select_scatter(x, row, 0, 1),
                torch.diagonal_scatter(x, row[:3]),
                torch.as_strided_scatter(x, row[:2], (2,), (5,)),
            ]

        def setitem(x, row):
            y = x.clone()
            y[0] = row
            y[1:, 2:].copy_(row[:2])
            return y

        x, row = torch.arange(12.0).reshape(3, 4), torch.tensor([9.0, 8.0, 7.0, 6.0])
        want = setitem(x, row)
        for src_device in ("cpu", "openreg:1"):
            for got, cpu in zip(calls("openreg", src_device), calls("cpu", "cpu"), strict=True):
                self.assertEqual(got.device, torch.device("openreg:0"))
                self.assertEqual(got.cpu(), cpu)
            for f in (functionalize(setitem), torch.compile(setitem, backend="aot_eager")):
                self.assertEqual(f(x.to("openreg"), row.to(src_device)).cpu(), want)

    def test_index_select_runs_its_out_kernel_into_the_device_output(self):
        # index_select is not structured, but its CPU kernel allocates the result and runs the out=
        # kernel into it: on the device the out= kernel writes the device output (no result of the
        # CPU kernel's own to copy). Other functional ops keep the copy.
        from torch_openreg import _C

        self.assertEqual(_C._routed_out_overload("aten::index_select"), "aten::index_select.out")
        self.assertEqual(_C._routed_out_overload("aten::add.Tensor"), "aten::add.out")  # structured
        self.assertEqual(_C._routed_out_overload("aten::binary_cross_entropy"), "")
        with self.assertRaisesRegex(RuntimeError, "no operator named aten::no_such_op"):
            _C._routed_out_overload("aten::no_such_op")
        base = torch.randn(6, 5, 4)
        cases = [
            (base, 0, torch.tensor([5, 0, 0, 3])),
            (base, 1, torch.tensor([4, 1], dtype=torch.int32)),
            (base.transpose(0, 2), 2, torch.tensor([1, 5])),  # a non-contiguous input
            (base[:, 1], 0, torch.tensor([], dtype=torch.long)),  # an empty index
            (torch.arange(10).view(2, 5), 1, torch.tensor([3])),  # integers
            (torch.tensor(7.0), 0, torch.tensor([0])),  # a 0-dim input
            (base.to(torch.bfloat16), 2, torch.tensor(3)),  # a 0-dim index
        ]
        for x, dim, index in cases:
            expected = x.index_select(dim, index)
            for call in range(2):  # a signature's first call runs synchronously, later ones asynchronously
                got = x.to("openreg").index_select(dim, index.to("openreg"))
                self.assertEqual(got.shape, expected.shape)
                self.assertEqual(got.stride(), expected.stride())
                self.assertEqual(got.cpu(), expected, atol=0, rtol=0)
        # Its checks are the CPU's, at the call.
        with self.assertRaisesRegex(IndexError, "index_select\\(\\): Index is supposed to be a vector"):
            base.to("openreg").index_select(0, torch.zeros(2, 2, dtype=torch.long, device="openreg"))
        # Also on the asynchronous path (a signature already verified): an empty input indexed
        # along an empty dimension is refused from the shapes, not by the kernel at a later sync.
        empty = torch.randn(0, 3, device="openreg")
        self.assertEqual(empty.index_select(1, torch.tensor([2, 0], device="openreg")).shape, (0, 2))
        for call in range(2):
            with self.assertRaisesRegex(RuntimeError, "index_select\\(\\): self indexing axis dim should be positive"):
                empty.index_select(0, torch.tensor([0], device="openreg"))
        self.assertEqual((torch.ones(3, device="openreg") * 2).cpu(), torch.full((3,), 2.0))  # nothing left pending

    def test_fallback_counts_and_strict_mode(self):
        d = torch.ones(3, device="openreg")
        torch.openreg.reset_fallback_op_counts()
        torch.sin(d)
        torch.sin(d)
        counts = torch.openreg.fallback_op_counts()
        self.assertEqual(counts, {"aten::sin": 2})
        torch.openreg.set_strict_mode(True)
        try:
            with self.assertRaisesRegex(RuntimeError, "strict mode: 'aten::cos' has no native openreg kernel"):
                torch.cos(d)
            self.assertEqual(d.view(3, 1).shape, (3, 1))  # native ops still work
            with self.assertRaisesRegex(RuntimeError, "strict mode: 'aten::nonzero' has no native openreg kernel"):
                d.nonzero()  # data-dependent ops take the synchronous generic path
        finally:
            torch.openreg.set_strict_mode(False)
        self.assertFalse(torch.openreg.is_strict_mode())

    def test_kernel_failure_reported_at_sync(self):
        # The host cannot know the index is out of range without reading device memory:
        # the failure surfaces at the next synchronising call, naming the kernel.
        d = torch.zeros(4, device="openreg")
        d.index_select(0, torch.tensor([1], device="openreg"))  # a signature's first call runs synchronously
        idx = torch.tensor([10], device="openreg")
        with self.assertRaisesRegex(RuntimeError, "kernel 'aten::.*' failed on openreg device 0"):
            d.index_select(0, idx)
            torch.openreg.synchronize()
        self.assertEqual((d + 1).cpu().tolist(), [1.0] * 4)

    def test_kernel_failure_message_has_no_cpp_backtrace(self):
        # The kernel's c10::Error carries a C++ backtrace in what(); Python shows PyTorch's own errors
        # without one (unless TORCH_SHOW_CPP_STACKTRACES=1), and so must the device's report.
        # Several samples with replacement: the kernel checks the probabilities (the host checks
        # them only without replacement or for one sample, as ATen does).
        with self.assertRaises(RuntimeError) as cpu:
            torch.multinomial(torch.tensor([0.0, 1.0, -1.0]), 2, replacement=True)
        cpu_message = str(cpu.exception).splitlines()[0]
        torch.multinomial(torch.tensor([0.0, 1.0, 1.0], device="openreg"), 2, True)  # later calls: asynchronous
        with self.assertRaises(RuntimeError) as dev:
            torch.multinomial(torch.tensor([0.0, 1.0, -1.0], device="openreg"), 2, replacement=True)
            torch.openreg.synchronize()
        message = str(dev.exception)
        self.assertIn("kernel 'aten::multinomial' failed on openreg device 0: ", message)
        self.assertIn(cpu_message, message)
        self.assertNotIn("Exception raised from", message)
        self.assertNotIn("frame #", message)

    def failed_index_select(self):
        """An index_select that fails on the device (unreported yet) and its output."""
        d = torch.arange(4.0, device="openreg")
        d.index_select(0, torch.tensor([1], device="openreg"))  # a signature's first call runs synchronously
        torch.openreg.synchronize()
        return d.index_select(0, torch.tensor([1, 10], device="openreg"))

    def test_a_query_reports_a_pending_kernel_failure(self):
        # As CUDA's queries return the pending error: a program that polls before it reads a copy's
        # result learns that it holds a failed kernel's output. Reported once, by either query.
        pinned = torch.empty(2).pin_memory()
        for query in ("event", "stream"):
            stream = torch.openreg.current_stream()
            pinned.copy_(self.failed_index_select(), non_blocking=True)
            event = torch.openreg.Event()
            event.record()
            with self.assertRaisesRegex(RuntimeError, "kernel 'aten::index_select' failed on openreg device 0: index"):
                while not (event.query() if query == "event" else stream.query()):
                    pass
            # Reported once: the queries then answer, without raising, once the copy and the record
            # behind the failed kernel have run (the error may come before they ran: ci139).
            deadline = time.monotonic() + 30
            while not (event.query() and stream.query()):
                self.assertLess(time.monotonic(), deadline, query)
            torch.openreg.synchronize()  # nothing left to report
        self.assertEqual((torch.ones(2, device="openreg") + 1).cpu(), torch.full((2,), 2.0))

    def test_a_copy_into_pageable_memory_reports_a_pending_kernel_failure(self):
        # Done when the call returns, non_blocking or not (as on CUDA), so it reports the failure.
        host = torch.zeros(2)
        with self.assertRaisesRegex(RuntimeError, "kernel 'aten::index_select' failed on openreg device 0: index"):
            host.copy_(self.failed_index_select(), non_blocking=True)
        torch.openreg.synchronize()

    def test_launch_blocking_reports_at_the_failing_call(self):
        # The failure is raised by a later synchronising call, and its message says how to have it
        # raised at the failing call instead: OPENREG_LAUNCH_BLOCKING=1, as CUDA_LAUNCH_BLOCKING.
        code = """
            import torch
            i = torch.tensor([1], device="openreg")
            w = torch.randn(10, 3, device="openreg")
            torch.nn.functional.embedding(i, w)  # a signature's first call runs synchronously
            torch.openreg.synchronize()
            try:
                y = torch.nn.functional.embedding(torch.tensor([12], device="openreg"), w)
                print("launched", flush=True)
                y.sum().item()
            except RuntimeError as e:
                print("raised:", str(e).replace("\\n", " | "))
        """
        deferred = run_python(code)
        self.assertEqual(deferred.returncode, 0, deferred.stderr)
        self.assertIn("launched\nraised: orErrorLaunchFailure: kernel 'aten::index_select' failed", deferred.stdout)
        self.assertIn("set OPENREG_LAUNCH_BLOCKING=1 to report them at the launch", deferred.stdout)
        blocking = run_python(code, env={"OPENREG_LAUNCH_BLOCKING": "1"})
        self.assertEqual(blocking.returncode, 0, blocking.stderr)
        self.assertNotIn("launched", blocking.stdout)
        self.assertIn("raised: orErrorLaunchFailure: kernel 'aten::index_select' failed", blocking.stdout)
        self.assertNotIn("OPENREG_LAUNCH_BLOCKING", blocking.stdout)
        bad = run_python("import torch; torch.zeros(1, device='openreg')", env={"OPENREG_LAUNCH_BLOCKING": "yes"})
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("OPENREG_LAUNCH_BLOCKING='yes' is not a whole number from 0 to 1", bad.stderr)


class TestErrorsAtTheCall(TestCase):
    """Errors the CPU (and CUDA) raise at the call, raised there on openreg too after a good call of
    the same signature verified it: the signature cache keys on dtypes and shapes, not on scalar
    values or on a written tensor overlapping itself, so these went to the device and their error
    surfaced at a later, unrelated synchronising call (OpenRegFallback.cpp::probe_value_checks,
    ::written_memory_overlaps; OpenRegPerOpFallback.cpp)."""

    def _same_error_at_the_call(self, good, bad):
        errors = []
        for d in ("cpu", "openreg"):
            good(d)
            with self.assertRaises(RuntimeError) as caught:
                bad(d)
            errors.append((type(caught.exception), str(caught.exception).splitlines()[0]))
        self.assertEqual(errors[1], errors[0])
        torch.openreg.synchronize()  # nothing left to fail later
        self.assertEqual((torch.ones(2, device="openreg") + 1).cpu(), torch.full((2,), 2.0))

    def test_dtypes_the_cpu_kernel_is_not_compiled_for(self):
        # abs, mm and the fused attention accepted dtypes the CPU's kernels have no code for
        # (float8_e8m0fnu, bits, sub-byte, float8 in attention): the kernel failed at a later,
        # unrelated synchronisation with a RuntimeError. The CPU's NotImplementedError, at the call.
        F = torch.nn.functional
        cases = {
            "abs": (lambda x: torch.abs(x), (torch.float8_e8m0fnu, torch.bits8, torch.uint4, torch.int3)),
            "mm": (lambda x: torch.mm(x.view(2, 2), x.view(2, 2)), (torch.float8_e8m0fnu, torch.bits8, torch.int4)),
            "sdpa": (
                lambda x: F.scaled_dot_product_attention(*[x.view(1, 1, 2, 2)] * 3),
                (torch.float8_e4m3fn, torch.float8_e8m0fnu),
            ),
        }
        for name, (op, dtypes) in cases.items():
            for dtype in dtypes:
                errors = []
                for d in ("cpu", "openreg"):
                    x = torch.zeros(4, dtype=torch.uint8).view(dtype).to(d)
                    with self.assertRaises(NotImplementedError, msg=f"{name} {dtype} on {d}") as caught:
                        op(x)
                    errors.append(str(caught.exception).splitlines()[0])
                self.assertEqual(errors[1], errors[0], msg=f"{name} {dtype}")
        torch.openreg.synchronize()  # nothing left to fail later
        self.assertEqual((torch.ones(2, device="openreg") + 1).cpu(), torch.full((2,), 2.0))

    def test_scalar_values_checked_by_the_cpu_kernel(self):
        cases = {
            "random_": (
                lambda d: torch.empty(3, device=d).random_(0, 5),
                lambda d: torch.empty(3, device=d).random_(5, 2),
            ),
            "random_ to": (
                lambda d: torch.empty(3, device=d).random_(7),
                lambda d: torch.empty(3, device=d).random_(-1),
            ),
            "randint": (lambda d: torch.randint(0, 5, (3,), device=d), lambda d: torch.randint(5, 2, (3,), device=d)),
            "uint8 range": (
                lambda d: torch.empty(3, dtype=torch.uint8, device=d).random_(0, 10),
                lambda d: torch.empty(3, dtype=torch.uint8, device=d).random_(0, 1000),
            ),
            "bernoulli_": (
                lambda d: torch.empty(3, device=d).bernoulli_(0.5),
                lambda d: torch.empty(3, device=d).bernoulli_(1.5),
            ),
            "bernoulli": (
                lambda d: torch.empty(3, device=d).bernoulli(0.5),
                lambda d: torch.empty(3, device=d).bernoulli(-0.5),
            ),
            "multinomial": (
                lambda d: torch.ones(3, device=d).multinomial(2),
                lambda d: torch.ones(3, device=d).multinomial(5),
            ),
            "multinomial 2-D": (
                lambda d: torch.ones(2, 3, device=d).multinomial(2),
                lambda d: torch.ones(2, 3, device=d).multinomial(0),
            ),
            # The probe of a 0-dim input was an empty 1-D tensor: refused by its size, with another
            # message than the CPU's.
            "multinomial 0-dim": (
                lambda d: torch.ones(3, device=d).multinomial(1),
                lambda d: torch.tensor(1.0, device=d).multinomial(1),
            ),
            # n against the dtype (ATen's check_supported_max_int_with_precision, on the host).
            "randperm half": (
                lambda d: torch.randperm(100, dtype=torch.half, device=d),
                lambda d: torch.randperm(3000, dtype=torch.half, device=d),
            ),
            "randperm uint8": (
                lambda d: torch.randperm(100, dtype=torch.uint8, device=d),
                lambda d: torch.randperm(300, dtype=torch.uint8, device=d),
            ),
            "randperm out=": (
                lambda d: torch.randperm(100, out=torch.empty(0, dtype=torch.uint8, device=d)),
                lambda d: torch.randperm(300, out=torch.empty(0, dtype=torch.uint8, device=d)),
            ),
            # A tensor std's values, checked on the host with a synchronisation as CUDA does.
            "normal tensor std": (
                lambda d: torch.normal(torch.zeros(3, device=d), torch.ones(3, device=d)),
                lambda d: torch.normal(torch.zeros(3, device=d), torch.tensor([1.0, -1.0, 1.0], device=d)),
            ),
            "normal float mean": (
                lambda d: torch.normal(0.0, torch.ones(3, device=d)),
                lambda d: torch.normal(0.0, -torch.ones(3, device=d)),
            ),
            # multinomial without replacement, or of one sample: the probabilities' values, on the
            # host with a synchronisation (ATen's multinomial does it for every device).
            "multinomial negative": (
                lambda d: torch.ones(3, device=d).multinomial(1),
                lambda d: torch.tensor([1.0, -1.0, 1.0], device=d).multinomial(1),
            ),
            "multinomial zero sum": (
                lambda d: torch.ones(2, 3, device=d).multinomial(2),
                lambda d: torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], device=d).multinomial(2),
            ),
            "normal out=": (
                lambda d: torch.normal(torch.zeros(3, device=d), torch.ones(3, device=d), out=torch.empty(3, device=d)),
                lambda d: torch.normal(
                    torch.zeros(3, device=d), torch.ones(3, device=d).neg(), out=torch.empty(3, device=d)
                ),
            ),
        }
        for name, (good, bad) in cases.items():
            with self.subTest(name):
                self._same_error_at_the_call(good, bad)
        # The probe (the CPU op on an empty CPU tensor, without the device's generator) draws nothing
        # from the CPU's default generator, and the device's draws follow its seed as before.
        cpu_state = torch.get_rng_state()
        torch.openreg.manual_seed(3)
        a = torch.empty(4, device="openreg").random_(0, 100).cpu()
        torch.openreg.manual_seed(3)
        self.assertEqual(torch.empty(4, device="openreg").random_(0, 100).cpu(), a)
        self.assertEqual(torch.get_rng_state(), cpu_state)

    def test_linear_algebra_that_fails_on_the_values(self):
        nan = float("nan")
        sick = [[nan, 1.0], [1.0, 3.0]]
        # Each good on the identity, bad on a matrix with a NaN (cholesky_inverse: on a zero factor).
        bad_input = {"cholesky_inverse": [[0.0, 0.0], [0.0, 0.0]]}
        ops = {
            "svd": torch.linalg.svd,
            "pinv": torch.linalg.pinv,
            "matrix_rank": torch.linalg.matrix_rank,
            "eig": torch.linalg.eig,
            "cholesky_inverse": torch.cholesky_inverse,
        }
        for name, f in ops.items():
            with self.subTest(name):
                m = bad_input.get(name, sick)
                self._same_error_at_the_call(
                    lambda d: f(torch.eye(2, device=d)), lambda d: f(torch.tensor(m, device=d))
                )

    def test_writing_into_an_expanded_tensor(self):
        cases = {
            "cumsum out=": (
                lambda d: torch.cumsum(torch.arange(4.0, device=d), 0, out=torch.empty(4, device=d)),
                lambda d: torch.cumsum(torch.arange(4.0, device=d), 0, out=torch.zeros(1, device=d).expand(4)),
            ),
            "cumsum_": (
                lambda d: torch.ones(2, 4, device=d).cumsum_(1),
                lambda d: torch.ones(1, 4, device=d).expand(2, 4).cumsum_(1),
            ),
            "index_select out=": (
                lambda d: torch.index_select(
                    torch.ones(4, device=d), 0, torch.tensor([0, 1], device=d), out=torch.empty(2, device=d)
                ),
                lambda d: torch.index_select(
                    torch.ones(4, device=d), 0, torch.tensor([0, 1], device=d), out=torch.zeros(1, device=d).expand(2)
                ),
            ),
        }
        for name, (good, bad) in cases.items():
            with self.subTest(name):
                self._same_error_at_the_call(good, bad)

    def test_index_put_and_put_check_shapes_at_the_call(self):
        # Their meta kernels check no shapes: after one good call of a signature a bad one went to the
        # device and failed a later, unrelated call. The CPU and CUDA check them on the host.
        rows = lambda d: torch.tensor([0, 1], device=d)  # noqa: E731
        mask = lambda *shape: torch.ones(*shape[:-1], dtype=torch.bool, device=shape[-1])  # noqa: E731
        cases = {
            "values": (
                lambda d: torch.zeros(5, 4, device=d).index_put_((rows(d),), torch.ones(2, 4, device=d)),
                lambda d: torch.zeros(5, 4, device=d).index_put_((rows(d),), torch.ones(3, 4, device=d)),
            ),
            "values, accumulate": (
                lambda d: torch.zeros(5, 4, device=d).index_put_((rows(d),), torch.ones(2, 4, device=d), True),
                lambda d: torch.zeros(5, 4, device=d).index_put_((rows(d),), torch.ones(3, 4, device=d), True),
            ),
            "indices": (
                lambda d: torch.zeros(5, 4, device=d).index_put_((rows(d), rows(d)), torch.tensor(1.0, device=d)),
                lambda d: torch.zeros(5, 4, device=d).index_put_(
                    (rows(d), torch.tensor([0, 1, 2], device=d)), torch.tensor(1.0, device=d)
                ),
            ),
            "mask count": (
                lambda d: torch.zeros(5, device=d).__setitem__(torch.arange(5, device=d) < 2, torch.ones(2, device=d)),
                lambda d: torch.zeros(5, device=d).__setitem__(torch.arange(5, device=d) < 2, torch.ones(3, device=d)),
            ),
            "mask shape": (
                lambda d: torch.zeros(3, 4, device=d).index_put_((mask(3, 4, d),), torch.tensor(1.0, device=d)),
                lambda d: torch.zeros(3, 4, device=d).index_put_((mask(4, 3, d),), torch.tensor(1.0, device=d)),
            ),
            "put_": (
                lambda d: torch.zeros(5, device=d).put_(rows(d), torch.ones(2, device=d)),
                lambda d: torch.zeros(5, device=d).put_(rows(d), torch.ones(3, device=d)),
            ),
        }  # fmt: skip
        for name, (good, bad) in cases.items():
            with self.subTest(name):
                errors = []
                for d in ("cpu", "openreg"):
                    good(d)
                    with self.assertRaises(Exception) as caught:
                        bad(d)  # no synchronisation: at the call
                    errors.append((type(caught.exception), str(caught.exception).splitlines()[0]))
                self.assertEqual(errors[1], errors[0])
        torch.openreg.synchronize()  # nothing left to fail later
        x = torch.zeros(5, 4, device="openreg")
        x[rows("openreg")] = torch.arange(4.0, device="openreg")  # a good call still runs
        self.assertEqual(x.cpu()[:2], torch.arange(4.0).expand(2, 4))

    def test_an_in_place_self_is_never_resized(self):
        # The good call verifies the signature (same dtypes and ranks); the bad one must not then
        # broadcast self to a larger shape on the asynchronous path, as floor_divide_'s meta kernel
        # allows. addr_ refuses a self of another shape only when self and out are one C++ reference.
        cases = {
            "floor_divide_": (
                lambda d: torch.ones(5, 10, 5, device=d).floor_divide_(torch.ones(10, 5, device=d)),
                lambda d: torch.ones(10, 1, 5, device=d).floor_divide_(torch.ones(10, 5, device=d)),
            ),
            "addr_": (
                lambda d: torch.ones(5, 10, device=d).addr_(torch.ones(5, device=d), torch.ones(10, device=d)),
                lambda d: torch.tensor(1.0, device=d).addr_(torch.ones(5, device=d), torch.ones(10, device=d)),
            ),
        }
        for name, (good, bad) in cases.items():
            with self.subTest(name):
                self._same_error_at_the_call(good, bad)


class TestWarnings(TestCase):
    def test_a_complex_to_real_copy_warns_on_the_host_and_the_device_is_silent(self):
        # The CPU's copy warns at the call. On openreg the copy kernel warned on its worker, where the
        # warning went to stderr past every filter, and the caller's Python saw none.
        r = run_python(
            """
            import warnings, torch
            z = torch.tensor([1 + 2j], device="openreg")
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                nonzero = z.to(torch.bool)  # keeps "nonzero", imaginary part included: no warning, as the CPU's
                torch.openreg.synchronize()
            print(nonzero.cpu().tolist(), len(w))
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                real = z.to(torch.float32)
                torch.openreg.synchronize()
            print(real.cpu().tolist(), [str(x.message).split(" (")[0] for x in w])
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(
            r.stdout.strip().splitlines(),
            ["[True] 0", "[1.0] ['Casting complex values to real discards the imaginary part']"],
        )
        self.assertNotIn("Casting complex", r.stderr)


class TestValueTensorsFromAnotherDevice(TestCase):
    def test_a_0_dim_value_on_another_openreg_device(self):
        # fill_, masked_fill_, index_fill_ and index_put_ take a 0-dim value from any device (CUDA's
        # kernels read it with item() or move it); a CPU one worked, one on openreg:1 was refused.
        calls = {
            "fill_": lambda x, v, i: x.fill_(v),
            "masked_fill_": lambda x, v, i: x.masked_fill_(x > 1, v),
            "index_fill_": lambda x, v, i: x.index_fill_(0, i, v),
            "index_put_": lambda x, v, i: x.index_put_((i,), v),
            "setitem": lambda x, v, i: x.__setitem__(i, v) or x,
        }
        for name, call in calls.items():
            with self.subTest(name):
                got = call(
                    torch.arange(4.0, device="openreg"),
                    torch.tensor(9.0, device="openreg:1"),
                    torch.tensor([1], device="openreg"),
                )
                self.assertEqual(got.device, torch.device("openreg:0"))
                self.assertEqual(got.cpu(), call(torch.arange(4.0), torch.tensor(9.0), torch.tensor([1])))
        with self.assertRaisesRegex(RuntimeError, "Expected all tensors to be on the same device"):
            torch.arange(4.0, device="openreg").add_(torch.ones(4, device="openreg:1"))  # not 0-dim: refused


class TestRandom(TestCase):
    def test_manual_seed_reproducible(self):
        torch.openreg.manual_seed(123)
        a = torch.randn(100, device="openreg")
        b = torch.rand(100, device="openreg")
        torch.openreg.manual_seed(123)
        self.assertEqual(torch.randn(100, device="openreg").cpu(), a.cpu())
        self.assertEqual(torch.rand(100, device="openreg").cpu(), b.cpu())
        self.assertEqual(torch.openreg.initial_seed(), 123)

    def test_rng_state_roundtrip(self):
        state = torch.openreg.get_rng_state()
        a = torch.randn(10, device="openreg").cpu()
        torch.openreg.set_rng_state(state)
        self.assertEqual(torch.randn(10, device="openreg").cpu(), a)
        states = torch.openreg.get_rng_state_all()
        self.assertEqual(len(states), 2)
        torch.openreg.set_rng_state_all(states)

    def test_bad_state_size(self):
        with self.assertRaisesRegex(RuntimeError, "(?i)state"):
            torch.openreg.set_rng_state(torch.zeros(10, dtype=torch.uint8))
        self.assertEqual(torch.randn(3, device="openreg").shape, (3,))

    def test_devices_have_own_generators(self):
        torch.openreg.manual_seed_all(7)
        a = torch.randn(5, device="openreg:0").cpu()
        b = torch.randn(5, device="openreg:1").cpu()
        self.assertEqual(a, b)  # same seed, separate generators
        c = torch.randn(5, device="openreg:0").cpu()
        self.assertNotEqual(a, c)

    def test_explicit_generator_and_dropout(self):
        g = torch.Generator(device="openreg")
        g.manual_seed(3)
        a = torch.randn(8, device="openreg", generator=g).cpu()
        g.manual_seed(3)
        self.assertEqual(torch.randn(8, device="openreg", generator=g).cpu(), a)
        torch.openreg.manual_seed(0)
        x = torch.nn.functional.dropout(torch.ones(1000, device="openreg"), 0.5)
        frac = (x == 0).float().mean().item()
        self.assertTrue(0.4 < frac < 0.6, frac)

    def test_dropout_draws_from_the_openreg_generator(self):
        # native_dropout has no generator argument: its CPU kernel drew from the CPU's generator, so
        # torch.openreg.manual_seed did not reproduce dropout, and the host's random calls raced with it.
        x = torch.ones(1000, device="openreg")
        cpu_state = torch.get_rng_state()
        torch.openreg.manual_seed(5)
        a = F.dropout(x, 0.5).cpu()
        torch.openreg.manual_seed(5)
        b = F.dropout(x, 0.5).cpu()
        self.assertEqual(a, b)
        self.assertEqual(torch.get_rng_state(), cpu_state)
        self.assertEqual(set(a.unique().tolist()), {0.0, 2.0})
        out, mask = torch.native_dropout(x, 0.25, True)
        self.assertEqual(mask.dtype, torch.bool)
        self.assertEqual(out.cpu(), mask.cpu() / 0.75)
        cl = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
        for p, train in ((0.5, False), (1.0, True), (0.0, True)):  # the CPU's special cases
            got, want = torch.native_dropout(cl.to("openreg"), p, train), torch.native_dropout(cl, p, train)
            for g, w in zip(got, want):
                self.assertEqual((g.cpu(), g.stride()), (w, w.stride()))
        got, want = (
            torch.native_dropout(torch.empty(0, 3, device="openreg"), 0.5, True),
            torch.native_dropout(torch.empty(0, 3), 0.5, True),
        )
        self.assertEqual([(g.shape, g.dtype) for g in got], [(w.shape, w.dtype) for w in want])

    def test_generator_pickles_and_deep_copies(self):
        # torch.Generator.__reduce__ asks a non-CPU generator for its offset and sets it back.
        import copy
        import pickle

        g = torch.Generator(device="openreg")
        g.manual_seed(7)
        torch.randn(3, device="openreg", generator=g)
        copies = [copy.deepcopy(g), pickle.loads(pickle.dumps(g))]
        expected = torch.randn(4, device="openreg", generator=g).cpu()
        for c in copies:
            self.assertEqual(c.device, torch.device("openreg", 0))
            self.assertEqual(torch.randn(4, device="openreg", generator=c).cpu(), expected)
        self.assertEqual([c.get_offset() for c in copies], [8, 8])  # 4 for randn(3), 4 for randn(4)
        with self.assertRaisesRegex(RuntimeError, "offset must be a multiple of 4"):
            g.set_offset(5)


class TestAddressSpace(TestCase):
    def test_host_read_of_device_memory_faults(self):
        r = run_python(
            """
            import ctypes, torch
            x = torch.ones(4, device="openreg")
            torch.openreg.synchronize()
            print("reading", flush=True)
            ctypes.string_at(x.data_ptr(), 4)
            print("read succeeded")
            """
        )
        self.assertIn("reading", r.stdout)
        self.assertNotIn("read succeeded", r.stdout)
        self.assertTrue(died_of_memory_fault(r.returncode), f"the process should have died of a fault: {r.returncode}")


if __name__ == "__main__":
    run_tests()
