"""Quantized tensors on openreg (QuantizedPrivateUse1): torch.quantize_per_tensor / quantize_per_channel
of openreg tensors, dequantize, int_repr, views, copies, printing and torch.save (csrc/qtensor/QTensorOps.cpp
on top of core's storage layer), each compared with the same calls on CPU tensors; errors by type and
message; native, asynchronous launches."""

import copy
import io
import re

import torch
from torch.testing._internal.common_utils import TestCase
from torch_openreg.utils.testing import StreamHold, assert_same_quantization

QDTYPES = {torch.quint8: (0, 255), torch.qint8: (-128, 127), torch.qint32: (-(2**31), 2**31 - 1)}
DOCS = "docs/mechanisms/quantization.md"


def values(*shape, seed=0):
    """Random values plus exact ties for scale 0.5 (x / 0.5 halfway between integers) and out-of-range ones."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 20
    flat = x.view(-1)
    k = min(flat.numel(), 16)
    flat[:k] = torch.arange(k) * 0.5 + 0.25 - 4
    flat[-2:] = torch.tensor([1e6, -1e6])
    return x


def layouts(x):
    """x in several layouts with the same values."""
    out = [x, x.transpose(0, -1).contiguous().transpose(0, -1), x[..., ::2]]
    if x.dim() == 4:
        out.append(x.contiguous(memory_format=torch.channels_last))
    return out


class QTestCase(TestCase):
    def assertSameQ(self, got: torch.Tensor, want: torch.Tensor, msg=None):
        """got (openreg) equals want (CPU): dtype, scheme, parameters, shape, strides and integer values."""
        self.assertEqual(got.device.type, "openreg", msg=msg)
        assert_same_quantization(self, got, want, msg)
        r = got.int_repr()
        self.assertEqual(r.device, got.device)
        if not torch.equal(r.cpu(), want.int_repr()):  # the message prints both: only made when it fails
            self.fail(f"{msg}: {r.cpu()} != {want.int_repr()}")

    def assertSameError(self, on_cpu, on_openreg, msg=None):
        """Both calls raise the same exception type with the same message."""
        try:
            on_cpu()
        except Exception as e:  # noqa: BLE001  (whatever the CPU raises is the reference)
            want = e
        else:
            self.fail(f"{msg}: the CPU call did not raise")
        with self.assertRaises(type(want), msg=msg) as got:
            on_openreg()
        self.assertEqual(str(got.exception).splitlines()[0], str(want).splitlines()[0], msg=msg)


class TestQuantize(QTestCase):
    def test_quantize_per_tensor_matches_cpu(self):
        for dtype, (lo, hi) in QDTYPES.items():
            for x in layouts(values(2, 3, 4, 6)):
                for scale, zp in ((0.5, 3), (0.0371, max(lo, -7) if lo < 0 else 11)):
                    msg = f"{dtype} {x.stride()} {scale} {zp}"
                    self.assertSameQ(
                        torch.quantize_per_tensor(x.to("openreg"), scale, zp, dtype),
                        torch.quantize_per_tensor(x, scale, zp, dtype),
                        msg,
                    )

    def test_quantize_per_channel_every_axis(self):
        for dtype in QDTYPES:
            for axis in range(4):
                for s_dtype in (torch.float32, torch.float64):
                    for xl in layouts(values(3, 4, 5, 6)):
                        n = xl.shape[axis]
                        scales = torch.linspace(0.03, 0.7, n, dtype=s_dtype)
                        zps = torch.arange(n) - (0 if dtype == torch.quint8 else 2)
                        msg = f"{dtype} axis={axis} {s_dtype} {xl.stride()}"

                        def on(device, xl=xl, scales=scales, zps=zps, axis=axis, dtype=dtype):
                            return torch.quantize_per_channel(
                                xl.to(device), scales.to(device), zps.to(device), axis, dtype
                            )

                        if xl.is_contiguous(memory_format=torch.channels_last) and axis > 1:
                            # the CPU's kernel refuses channels-last inputs quantized along H or W
                            self.assertSameError(lambda: on("cpu"), lambda: on("openreg"), msg)
                            continue
                        self.assertSameQ(on("openreg"), on("cpu"), msg)

    def test_per_channel_float_qparams(self):
        # float zero points (per_channel_affine_float_qparams, as embedding quantization uses)
        x = values(6, 8)
        scales, zps = torch.rand(6) * 0.1 + 0.01, torch.randn(6)
        want = torch.quantize_per_channel(x, scales, zps, 0, torch.quint8)
        got = torch.quantize_per_channel(x.to("openreg"), scales.to("openreg"), zps.to("openreg"), 0, torch.quint8)
        self.assertSameQ(got, want)
        self.assertTrue(torch.equal(got.dequantize().cpu(), want.dequantize()))

    def test_tensor_qparams_and_make_quantized_tensor(self):
        x = values(5, 7)
        s, z = torch.tensor(0.125, dtype=torch.float64), torch.tensor(5)
        want = torch.quantize_per_tensor(x, s, z, torch.quint8)
        self.assertSameQ(
            torch.quantize_per_tensor(x.to("openreg"), s.to("openreg"), z.to("openreg"), torch.quint8), want
        )
        # integer values taken as a quantized tensor: the inverse of int_repr
        for dtype, (lo, hi) in ((torch.uint8, (0, 255)), (torch.int8, (-128, 127)), (torch.int32, (-1000, 1000))):
            ints = torch.randint(lo, hi + 1, (4, 6), dtype=dtype).t()
            self.assertSameQ(
                torch._make_per_tensor_quantized_tensor(ints.to("openreg"), 0.2, 3),
                torch._make_per_tensor_quantized_tensor(ints, 0.2, 3),
                str(dtype),
            )
            scales, zps = torch.rand(6, dtype=torch.float64) + 0.1, torch.arange(6)
            self.assertSameQ(
                torch._make_per_channel_quantized_tensor(
                    ints.to("openreg"), scales.to("openreg"), zps.to("openreg"), 0
                ),
                torch._make_per_channel_quantized_tensor(ints, scales, zps, 0),
                str(dtype),
            )
        # channels-last codes: per tensor keeps the layout, per channel is contiguous, as on the CPU
        ints = torch.randint(0, 256, (2, 3, 4, 5), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
        scales, zps = torch.rand(3, dtype=torch.float64) + 0.1, torch.arange(3)
        self.assertSameQ(
            torch._make_per_tensor_quantized_tensor(ints.to("openreg"), 0.2, 3),
            torch._make_per_tensor_quantized_tensor(ints, 0.2, 3),
        )
        self.assertSameQ(
            torch._make_per_channel_quantized_tensor(ints.to("openreg"), scales.to("openreg"), zps.to("openreg"), 1),
            torch._make_per_channel_quantized_tensor(ints, scales, zps, 1),
        )

    def test_dequantize_matches_cpu(self):
        x = values(3, 4, 8)
        cases = [torch.quantize_per_tensor(x, 0.0371, zp, dt) for dt, zp in ((torch.quint8, 100), (torch.qint8, -3))]
        cases.append(torch.quantize_per_tensor(x, 0.5, 1000, torch.qint32))
        for axis in range(3):
            n = x.shape[axis]
            cases.append(torch.quantize_per_channel(x, torch.rand(n) + 0.05, torch.arange(n) - 1, axis, torch.qint8))
        for i, q in enumerate(cases):
            d = q.to("openreg")
            views = [(d, q), (d[:, 1:3], q[:, 1:3])]
            if q.qscheme() == torch.per_tensor_affine:
                views.append((d.transpose(0, 2), q.transpose(0, 2)))
            for got_q, want_q in views:
                got = got_q.dequantize()
                self.assertEqual(got.device.type, "openreg")
                self.assertEqual(got.dtype, torch.float32)
                want = want_q.dequantize()
                self.assertEqual(got.stride(), want.stride(), f"case {i}")
                self.assertTrue(torch.equal(got.cpu(), want), f"case {i} {got_q.stride()}")
            self.assertTrue(torch.equal(torch.dequantize(d).cpu(), q.dequantize()))

    def test_bad_arguments_raise_as_on_the_cpu(self):
        x = values(2, 4)
        d = x.to("openreg")

        def both(f, *args):  # f with CPU tensors, then with openreg ones
            return (lambda: f(*args), lambda: f(*(a.to("openreg") if isinstance(a, torch.Tensor) else a for a in args)))

        s4, z4 = torch.ones(4), torch.zeros(4, dtype=torch.long)
        cases = {
            "float64 input": both(torch.quantize_per_tensor, x.double(), 0.1, 0, torch.qint8),
            "zero point above": both(torch.quantize_per_tensor, x, 0.1, 300, torch.quint8),
            "zero point below": both(torch.quantize_per_tensor, x, 0.1, -1, torch.quint8),
            "scales length": both(
                torch.quantize_per_channel, x, torch.ones(3), torch.zeros(3, dtype=torch.long), 1, torch.qint8
            ),
            "axis": both(torch.quantize_per_channel, x, s4, z4, 2, torch.qint8),
            # a negative axis of a channels-last input: openreg's layout check named the layout
            "negative axis, channels-last": both(
                torch.quantize_per_channel,
                values(2, 3, 4, 4).contiguous(memory_format=torch.channels_last),
                s4,
                z4,
                -1,
                torch.quint8,
            ),
            "2-D scales": both(torch.quantize_per_channel, x, s4.view(2, 2), z4, 1, torch.qint8),
            "integer scales": both(torch.quantize_per_channel, x, z4, z4, 1, torch.qint8),
            # a per-channel tensor along axis 2 in channels-last memory: refused by dequantize (on
            # openreg it was refused by the kernel, at the next synchronising call)
            "channels-last dequantize": both(
                lambda v, s, z: (
                    torch.quantize_per_channel(v, s, z, 2, torch.qint8)
                    .contiguous(memory_format=torch.channels_last)
                    .dequantize()
                ),
                values(2, 3, 4, 5),
                s4,
                z4,
            ),
        }
        for name, (on_cpu, on_openreg) in cases.items():
            self.assertSameError(on_cpu, on_openreg, name)
        # openreg's own: per-channel parameters on the input's device
        with self.assertRaisesRegex(RuntimeError, "aten::quantize_per_channel: scales must be on openreg:0"):
            torch.quantize_per_channel(d, s4, z4.to("openreg"), 1, torch.qint8)
        # qint32 with floating-point zero points: the CPU's kernel dies of an illegal instruction
        # (in the CPU's process too); refused at the call instead of killing a stream worker
        with self.assertRaisesRegex(RuntimeError, "floating-point zero points supports torch.quint8 and torch.qint8"):
            torch.quantize_per_channel(
                d, torch.ones(2, device="openreg"), torch.zeros(2, device="openreg"), 0, torch.qint32
            )
        # sub-byte dtypes are not supported on openreg
        with self.assertRaisesRegex(NotImplementedError, "sub-byte dtype QUInt4x2 are not supported on openreg"):
            torch.quantize_per_tensor(d, 0.1, 0, torch.quint4x2)
        self.assertEqual((d + 1).cpu(), x + 1)  # the device keeps working

    def test_per_channel_zero_points_are_checked_by_the_kernel(self):
        # Their values are in device memory: the kernel checks them (as ATen leaves it to CUDA's), and
        # the next synchronising call reports the failure.
        x = values(2, 4)
        z = torch.tensor([0, 1, 300, 2])
        with self.assertRaisesRegex(RuntimeError, "above upper bound"):
            torch.quantize_per_channel(x, torch.ones(4), z, 1, torch.quint8)
        torch.quantize_per_channel(x.to("openreg"), torch.ones(4, device="openreg"), z.to("openreg"), 1, torch.quint8)
        with self.assertRaisesRegex(RuntimeError, "above upper bound"):
            torch.openreg.synchronize()
        self.assertEqual((x.to("openreg") * 2).cpu(), x * 2)


class TestViewsCopiesAndPrinting(QTestCase):
    def setUp(self):
        super().setUp()
        self.x = values(4, 6, 5)
        self.q = torch.quantize_per_tensor(self.x, 0.05, 120, torch.quint8)
        self.d = torch.quantize_per_tensor(self.x.to("openreg"), 0.05, 120, torch.quint8)

    def test_views_and_slicing(self):
        views = {
            "index": lambda t: t[1],
            "slice": lambda t: t[:, 1:4],
            "step": lambda t: t[..., ::2],
            "t": lambda t: t[0].t(),
            "permute": lambda t: t.permute(2, 0, 1),
            "view": lambda t: t.view(24, 5),
            "reshape": lambda t: t.transpose(0, 1).reshape(-1),
            "flatten": lambda t: t.flatten(1),
            "unsqueeze": lambda t: t.unsqueeze(-1),
            "squeeze": lambda t: t[:, :1].squeeze(1),
            "chunk": lambda t: t.chunk(2, dim=1)[1],
            "expand": lambda t: t[:1].expand(3, 6, 5),
        }
        for name, f in views.items():
            self.assertSameQ(f(self.d), f(self.q), name)
            self.assertTrue(torch.equal(f(self.d).dequantize().cpu(), f(self.q).dequantize()), name)

    def test_clone_contiguous_and_round_trips(self):
        t, td = self.q.transpose(0, 2), self.d.transpose(0, 2)
        self.assertSameQ(td.contiguous(), t.contiguous())
        self.assertSameQ(td.clone(), t.clone())
        x4 = values(2, 3, 4, 5)
        q4 = torch.quantize_per_tensor(x4, 0.1, 3, torch.qint8)
        d4 = q4.to("openreg")
        self.assertSameQ(
            d4.contiguous(memory_format=torch.channels_last), q4.contiguous(memory_format=torch.channels_last)
        )
        self.assertSameQ(d4, q4)
        back = self.d.cpu()
        self.assertEqual(back.device.type, "cpu")
        self.assertTrue(torch.equal(back.int_repr(), self.q.int_repr()))
        pc = torch.quantize_per_channel(self.x, torch.rand(6) + 0.1, torch.arange(6), 1, torch.qint8)
        self.assertSameQ(pc.to("openreg"), pc)
        self.assertSameQ(pc.to("openreg").to("openreg:1").to("openreg:0"), pc)

    def test_copy_between_quantized_tensors(self):
        other = torch.quantize_per_tensor(values(4, 6, 5, seed=3), 0.2, 7, torch.quint8)
        want = self.q.clone().copy_(other)
        got = self.d.clone().copy_(other)  # from the CPU
        self.assertSameQ(got, want)
        got = self.d.clone().copy_(other.to("openreg"))  # on the device
        self.assertSameQ(got, want)

    def test_printing(self):
        def strip(s):  # without the device suffix, and the line breaks it moves
            return re.sub(r"\s+", " ", re.sub(r",?\s*device='openreg:0'", "", s))

        pc = torch.quantize_per_channel(
            self.x[:2, :3, 0], torch.tensor([0.1, 0.2]), torch.tensor([1, -1]), 0, torch.qint8
        )
        for q in (self.q[:2], pc):
            d = q.to("openreg")
            self.assertIn("device='openreg:0'", repr(d))
            self.assertEqual(strip(repr(d)), strip(repr(q)))

    def test_save_load_and_deepcopy(self):
        pc = torch.quantize_per_channel(self.x, torch.rand(6) + 0.1, torch.arange(6), 1, torch.qint8)
        payload = {"per_tensor": self.d, "view": self.d[1:, 2:], "per_channel": pc.to("openreg")}
        want = {"per_tensor": self.q, "view": self.q[1:, 2:], "per_channel": pc}
        buf = io.BytesIO()
        torch.save(payload, buf)
        buf.seek(0)
        loaded = torch.load(buf)
        for k, v in loaded.items():
            self.assertSameQ(v, want[k], k)
        self.assertEqual(loaded["view"].untyped_storage().data_ptr(), loaded["per_tensor"].untyped_storage().data_ptr())
        self.assertSameQ(copy.deepcopy(payload["per_channel"]), pc)


class TestNativeAndAsynchronous(TestCase):
    def _calls(self):
        x = torch.randn(4, 8, device="openreg")
        s, z = (
            torch.rand(8, dtype=torch.float64, device="openreg") + 0.1,
            torch.zeros(8, dtype=torch.long, device="openreg"),
        )
        q = torch.quantize_per_tensor(x, 0.05, 3, torch.qint8)
        qc = torch.quantize_per_channel(x, s, z, 1, torch.qint8)
        ints = torch.zeros(4, 8, dtype=torch.uint8, device="openreg")
        return {
            "quantize_per_tensor": (lambda: torch.quantize_per_tensor(x, 0.05, 3, torch.qint8), 1),
            "quantize_per_channel": (lambda: torch.quantize_per_channel(x, s, z, 1, torch.qint8), 1),
            "dequantize": (lambda: q.dequantize(), 1),
            "dequantize per channel": (lambda: qc.dequantize(), 1),
            "int_repr": (lambda: q.int_repr(), 1),
            "make_per_tensor": (lambda: torch._make_per_tensor_quantized_tensor(ints, 0.1, 0), 1),
            "clone": (lambda: q.clone(), 1),
            "views": (lambda: q[1:, ::2].t(), 0),
        }

    def test_one_native_launch_per_call_no_host_copy(self):
        calls = self._calls()
        torch.openreg.synchronize()
        torch.openreg.reset_fallback_op_counts()
        torch.openreg.set_strict_mode(True)  # an op without a native kernel would raise
        for name, (call, launches) in calls.items():
            before = torch.openreg._runtime_counters()
            call()
            after = torch.openreg._runtime_counters()
            # a kernel, or a device-to-device copy (int_repr, clone: plain bytes)
            count = sum(after[k] - before[k] for k in ("kernels_launched", "memcpy_d2d"))
            self.assertEqual(count, launches, name)
            self.assertEqual(after["memcpy_d2h"] - before["memcpy_d2h"], 0, name)
        torch.openreg.synchronize()
        self.assertEqual(torch.openreg.fallback_op_counts(), {})

    def test_no_host_wait(self):
        calls = self._calls()
        with StreamHold() as held:  # the device is busy until released
            results = [call() for call, _ in calls.values()]
            busy = not held.stream.query()
        self.assertTrue(busy, "a call waited for the device")
        torch.openreg.synchronize()
        self.assertEqual(len(results), len(calls))


class TestUnsupportedOperators(TestCase):
    def test_operators_without_a_kernel_raise_naming_the_op(self):
        d = torch.quantize_per_tensor(torch.randn(3, device="openreg"), 0.25, 9, torch.quint8)
        for call, op in (
            (lambda: torch.ops.quantized.add(d, d, 0.1, 0), "quantized::add"),
            (lambda: torch.relu(d), "aten::relu"),
            (lambda: torch.cat([d, d]), "aten::cat.out"),
        ):
            with self.assertRaisesRegex(
                NotImplementedError,
                f"{op}: openreg has no kernel for this operator on quantized tensors \\(QUInt8\\)\\. openreg-quant "
                f"provides the quantized-tensor operators that {DOCS} lists; this is not one of them",
            ):
                call()
        x = torch.ones(3, device="openreg")
        self.assertEqual((x + 1).cpu(), torch.full((3,), 2.0))
