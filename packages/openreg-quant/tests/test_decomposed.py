"""The quantized_decomposed ops on openreg (csrc/decomposed/): bit-exact with the decomposition on
the CPU over dtypes, axes and layouts; the decomposition's argument errors at the call; one native
launch per call, no generic path, no host wait."""

import torch
from torch.testing._internal.common_utils import TestCase
from torch_openreg.utils.testing import StreamHold

qd = torch.ops.quantized_decomposed
BOUNDS = {torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int16: (-32768, 32767), torch.uint16: (0, 65535)}
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def layouts(x: torch.Tensor):
    """x in several layouts with the same values: contiguous, transposed, strided slice, channels-last."""
    out = [x, x.transpose(0, -1).contiguous().transpose(0, -1), x[..., ::2]]
    if x.dim() == 4:
        out.append(x.contiguous(memory_format=torch.channels_last))
    return out


def ties(n: int, dtype=torch.float32) -> torch.Tensor:
    """Values whose x / 0.5 lies exactly halfway between integers (and random ones)."""
    k = torch.arange(-n, n, dtype=torch.float32)
    return torch.cat([k * 0.5 + 0.25, torch.randn(2 * n) * 20]).reshape(4, -1).to(dtype)


class QuantTestCase(TestCase):
    def assertSame(self, got: torch.Tensor, want: torch.Tensor, msg=None):
        """Bit-exact, same dtype and shape, on openreg."""
        self.assertEqual(got.device.type, "openreg", msg=msg)
        self.assertEqual(got.dtype, want.dtype, msg=msg)
        self.assertEqual(got.shape, want.shape, msg=msg)
        g = got.cpu()
        if not torch.equal(g, want):  # the message prints both tensors: only made when it fails
            self.fail(f"{msg}: {g} != {want}")


class TestPerTensor(QuantTestCase):
    def test_quantize_matches_decomposition(self):
        torch.manual_seed(0)
        for in_dtype in FLOATS:
            for out_dtype, (lo, hi) in BOUNDS.items():
                for x in layouts(ties(64, in_dtype).reshape(2, 2, 8, 8)):
                    for scale, zp in ((0.5, 3), (0.0371, -5 if lo < 0 else 7)):
                        want = qd.quantize_per_tensor(x, scale, zp, lo, hi, out_dtype)
                        got = qd.quantize_per_tensor(x.to("openreg"), scale, zp, lo, hi, out_dtype)
                        self.assertSame(got, want, f"{in_dtype} {out_dtype} {x.stride()} {scale}")
                        self.assertEqual(got.stride(), want.stride())

    def test_large_and_non_finite_values_match_decomposition(self):
        # Beyond 2^23 every float32 is an integer; infinities clamp; NaN converts as the CPU's does.
        big = [2.0**23 + 1, -(2.0**23) - 1, 2.0**24 + 2, 1e10, -1e10, 3e38]
        x = torch.tensor([float("nan"), float("inf"), -float("inf"), *big] * 700)  # long enough to vectorise
        for out_dtype, (lo, hi) in BOUNDS.items():
            for scale in (1.0, 0.5):
                want = qd.quantize_per_tensor(x, scale, 3, lo, hi, out_dtype)
                self.assertSame(qd.quantize_per_tensor(x.to("openreg"), scale, 3, lo, hi, out_dtype), want, out_dtype)

    def test_ties_round_half_to_even_before_the_zero_point(self):
        # aten::quantize_per_tensor rounds round(x / s + zp); the decomposition round(x / s) + zp:
        # with an odd zero point they differ at ties, and openreg follows the decomposition.
        x = torch.tensor([0.25, 0.75, 1.25, -0.25, -0.75])
        got = qd.quantize_per_tensor(x.to("openreg"), 0.5, 3, -128, 127, torch.int8).cpu()
        self.assertEqual(got.tolist(), [3, 5, 5, 3, 1])
        aten = torch.quantize_per_tensor(x, 0.5, 3, torch.qint8).int_repr()
        self.assertNotEqual(aten.tolist(), got.tolist())

    def test_tensor_variants_with_device_and_cpu_parameters(self):
        x = ties(32)
        d = x.to("openreg")
        want = qd.quantize_per_tensor(x, 0.5, 3, -128, 127, torch.int8)
        for where in ("openreg", "cpu"):
            s = torch.tensor([0.5], device=where)
            z = torch.tensor([3], device=where)
            self.assertSame(qd.quantize_per_tensor.tensor(d, s, z, -128, 127, torch.int8), want, where)
            lo, hi = torch.tensor(-128, device=where), torch.tensor(127, device=where)
            self.assertSame(qd.quantize_per_tensor.tensor2(d, s, z, lo, hi, torch.int8), want, where)
            q = want.to("openreg")
            deq = qd.dequantize_per_tensor(want, 0.5, 3, -128, 127, torch.int8)
            self.assertSame(qd.dequantize_per_tensor.tensor(q, s, z, -128, 127, torch.int8), deq, where)
            self.assertSame(qd.dequantize_per_tensor.tensor2(q, s, z, lo, hi, torch.int8), deq, where)
        # float64 scale and a float zero point, as Tensor.item() gives them
        s, z = torch.tensor([0.0371], dtype=torch.float64), torch.tensor([2.5])
        want = qd.quantize_per_tensor.tensor(x, s, z, -128, 127, torch.int8)
        self.assertSame(qd.quantize_per_tensor.tensor(d, s.to("openreg"), z.to("openreg"), -128, 127, torch.int8), want)

    def test_dequantize_matches_decomposition(self):
        for q_dtype, (lo, hi) in BOUNDS.items():
            q = torch.randint(lo, hi + 1, (6, 40), dtype=torch.int64).to(q_dtype)
            for x in layouts(q):
                for out_dtype in (None, torch.float32, torch.bfloat16, torch.float16, torch.float64):
                    # a zero point that 16-bit floats cannot hold (the CPU rounds it to the output type)
                    big = {torch.uint16: 54185, torch.int16: -2049}.get(q_dtype, 101)
                    for scale, zp in ((0.0371, 3), (1.7e-3, -11), (0.0708, big)):
                        want = qd.dequantize_per_tensor(x, scale, zp, lo, hi, q_dtype, out_dtype=out_dtype)
                        got = qd.dequantize_per_tensor(x.to("openreg"), scale, zp, lo, hi, q_dtype, out_dtype=out_dtype)
                        self.assertSame(got, want, f"{q_dtype} {out_dtype} {x.stride()}")

    def test_other_dtypes_take_the_decomposition_in_the_kernel(self):
        # int32 and float8 are not in the fused loops: the kernel runs the decomposition's ops.
        x = ties(16) * 3
        for dtype in (torch.int32, torch.float8_e4m3fn, torch.float8_e5m2):
            lo, hi = (-(2**31), 2**31 - 1) if dtype == torch.int32 else (-448, 448)
            if dtype == torch.float8_e5m2:
                lo, hi = -57344, 57344
            want = qd.quantize_per_tensor(x, 0.25, 1, lo, hi, dtype)
            got = qd.quantize_per_tensor(x.to("openreg"), 0.25, 1, lo, hi, dtype)
            self.assertEqual(got.dtype, dtype)
            self.assertTrue(torch.equal(got.cpu().float(), want.float()), dtype)
            deq = qd.dequantize_per_tensor(want, 0.25, 1, lo, hi, dtype)
            self.assertSame(qd.dequantize_per_tensor(got, 0.25, 1, lo, hi, dtype), deq)

    def test_empty_input(self):
        e = torch.empty(0, 3, device="openreg")
        self.assertEqual(qd.quantize_per_tensor(e, 0.1, 0, -128, 127, torch.int8).shape, (0, 3))

    def test_bad_arguments(self):
        d = torch.randn(4, device="openreg")
        cases = [
            (
                lambda: qd.quantize_per_tensor(d.double(), 0.1, 0, -128, 127, torch.int8),
                "Expecting input to have dtype torch.float32, but got dtype: torch.float64",
            ),
            (
                lambda: qd.quantize_per_tensor(d, 0.1, 0, -129, 127, torch.int8),
                "quant_min out of bounds for dtype, quant_min_lower_bound: -128 quant_min: -129",
            ),
            (
                lambda: qd.quantize_per_tensor(d, 0.1, 0, 0, 256, torch.uint8),
                "quant_max out of bounds for dtype, quant_max_upper_bound: 255 quant_max: 256",
            ),
            (
                lambda: qd.quantize_per_tensor.tensor(
                    d, torch.ones(2, device="openreg"), torch.zeros(1, device="openreg"), 0, 255, torch.uint8
                ),
                "Expecting scale tensor to be one element, but received : 2",
            ),
            (
                lambda: qd.quantize_per_tensor.tensor(
                    d, torch.ones(1, device="openreg"), torch.zeros(3, device="openreg"), 0, 255, torch.uint8
                ),
                "Expecting zero_point tensor to be one element, but received : 3",
            ),
            (
                lambda: qd.dequantize_per_tensor(d.to(torch.int8), 0.1, 0, 0, 255, torch.uint8),
                "Expecting input to have dtype: torch.uint8, but got torch.int8",
            ),
            (
                lambda: qd.dequantize_per_tensor(
                    d.to(torch.int8), 0.1, 0, -128, 127, torch.int8, out_dtype=torch.int32
                ),
                "out_dtype must be a floating dtype, got torch.int32",
            ),
        ]
        # Parameters on another device than the input: the first one named (every one is wrong here).
        d1, q1 = torch.randn(4, device="openreg:1"), torch.zeros(4, dtype=torch.int8, device="openreg:1")
        one, zero = torch.ones(1, device="openreg"), torch.zeros(1, dtype=torch.long, device="openreg")
        lo, hi = torch.tensor(-128, device="openreg"), torch.tensor(127, device="openreg")
        wrong_device = r"scale must be on openreg:1 \(the input's device\), got a tensor on openreg:0"
        cases += [
            (lambda: qd.quantize_per_tensor.tensor(d1, one, zero, -128, 127, torch.int8), wrong_device),
            (lambda: qd.quantize_per_tensor.tensor2(d1, one, zero, lo, hi, torch.int8), wrong_device),
            (lambda: qd.dequantize_per_tensor.tensor(q1, one, zero, -128, 127, torch.int8), wrong_device),
            (lambda: qd.dequantize_per_tensor.tensor2(q1, one, zero, lo, hi, torch.int8), wrong_device),
            (
                lambda: qd.quantize_per_tensor.tensor2(
                    d1, one.to("openreg:1"), zero.to("openreg:1"), lo, hi, torch.int8
                ),
                r"quant_min must be on openreg:1 \(the input's device\), got a tensor on openreg:0",
            ),
        ]
        for call, message in cases:
            with self.assertRaisesRegex(RuntimeError, message):
                call()
        with self.assertRaisesRegex(ValueError, "Unsupported dtype: torch.int64"):
            qd.quantize_per_tensor(d, 0.1, 0, 0, 1, torch.int64)
        with self.assertRaisesRegex(ValueError, "Unsupported dtype in dequantize_per_tensor: torch.int64"):
            qd.dequantize_per_tensor(d.long(), 0.1, 0, 0, 1, torch.int64)
        # the same messages as the decomposition's
        with self.assertRaisesRegex(AssertionError, "quant_min out of bounds for dtype, quant_min_lower_bound: -128"):
            qd.quantize_per_tensor(d.cpu(), 0.1, 0, -129, 127, torch.int8)

    def test_device_bounds_are_checked_by_the_kernel(self):
        # .tensor2 bounds in device memory: checking them at the call would make the host wait, so
        # the kernel checks them and the next synchronising call reports the failure.
        d = torch.randn(4, device="openreg")
        one, zero = torch.ones(1, device="openreg"), torch.zeros(1, device="openreg")
        lo, hi = torch.tensor(-129, device="openreg"), torch.tensor(127, device="openreg")
        qd.quantize_per_tensor.tensor2(d, one, zero, lo, hi, torch.int8)
        with self.assertRaisesRegex(RuntimeError, "quant_min out of bounds for dtype"):
            torch.openreg.synchronize()

    def test_zero_scale_raises_as_the_decomposition_does(self):
        # `1.0 / scale` in the decomposition: ZeroDivisionError, even for an empty input.
        one_zero = (torch.tensor(0.0), torch.tensor(0))
        bounds = (torch.tensor(-128), torch.tensor(127))
        for x in (torch.randn(4, 3), torch.randn(0)):
            calls = {
                "default": lambda d: qd.quantize_per_tensor(x.to(d), 0.0, 0, -128, 127, torch.int8),
                "tensor": lambda d: qd.quantize_per_tensor.tensor(x.to(d), *one_zero, -128, 127, torch.int8),
                "tensor2": lambda d: qd.quantize_per_tensor.tensor2(x.to(d), *one_zero, *bounds, torch.int8),
            }
            for name, call in calls.items():
                for device in ("cpu", "openreg"):
                    with self.assertRaisesRegex(ZeroDivisionError, "^float division by zero$", msg=f"{name} {device}"):
                        call(device)

    def test_calls_that_launch_nothing_leave_no_kernel_size_behind(self):
        # A .tensor op counts its device parameters' bytes before it checks the input (or returns
        # early for an empty one): the count must not size the thread's next launch (a compiled
        # kernel's, which counts nothing and takes the host's thread count).
        from torch_openreg.utils.testing import raw_kernel_team_size

        scale, zp = torch.ones(1, device="openreg"), torch.zeros(1, dtype=torch.long, device="openreg")
        before = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            self.assertEqual(raw_kernel_team_size(), 2)
            with self.assertRaisesRegex(RuntimeError, "Expecting input to have dtype torch.float32"):
                qd.quantize_per_tensor.tensor(
                    torch.zeros(4, dtype=torch.float64, device="openreg"), scale, zp, -128, 127, torch.int8
                )
            self.assertEqual(raw_kernel_team_size(), 2)
            empty = torch.zeros(0, dtype=torch.int8, device="openreg")
            self.assertEqual(qd.dequantize_per_tensor.tensor(empty, scale, zp, -128, 127, torch.int8).shape, (0,))
            self.assertEqual(raw_kernel_team_size(), 2)
        finally:
            torch.set_num_threads(before)

    def test_zero_scale_in_device_memory_is_checked_by_the_kernel(self):
        # Reading it at the call would make the host wait: the next synchronising call reports it.
        x = torch.randn(4, device="openreg")
        scale, zp = torch.zeros(1, device="openreg"), torch.zeros(1, dtype=torch.long, device="openreg")
        qd.quantize_per_tensor.tensor(x, scale, zp, -128, 127, torch.int8)
        with self.assertRaisesRegex(RuntimeError, "float division by zero"):
            torch.openreg.synchronize()
        # An empty input too (the decomposition divides and checks the bounds whatever the input).
        empty = torch.randn(0, 3, device="openreg")
        low = torch.tensor(-200, device="openreg")
        cases = [
            (lambda: qd.quantize_per_tensor.tensor(empty, scale, zp, -128, 127, torch.int8), "float division by zero"),
            (
                lambda: qd.quantize_per_tensor.tensor2(empty, scale + 0.5, zp, low, low + 327, torch.int8),
                "quant_min out of bounds for dtype, quant_min_lower_bound: -128 quant_min: -200",
            ),
        ]
        for call, message in cases:
            self.assertEqual(call().shape, (0, 3))
            with self.assertRaisesRegex(RuntimeError, message):
                torch.openreg.synchronize()
        # A scale on the host with .tensor2's bounds in device memory: the decomposition checks the
        # bounds before it divides, so the kernel, which reads them, finds the zero scale too.
        lo, hi = torch.tensor(-128, device="openreg"), torch.tensor(127, device="openreg")
        qd.quantize_per_tensor.tensor2(x, torch.tensor(0.0), torch.tensor(0), lo, hi, torch.int8)
        with self.assertRaisesRegex(RuntimeError, "float division by zero"):
            torch.openreg.synchronize()
        # the device is usable afterwards
        self.assertSame(
            qd.quantize_per_tensor.tensor(x, scale + 0.5, zp, -128, 127, torch.int8),
            qd.quantize_per_tensor(x.cpu(), 0.5, 0, -128, 127, torch.int8),
        )


class TestPerChannel(QuantTestCase):
    def test_quantize_and_dequantize_every_axis(self):
        torch.manual_seed(0)
        base = ties(60).reshape(2, 3, 4, 10)
        for in_dtype in FLOATS:
            # every layout in float32; the 16-bit inputs (widened first) in one
            for x in layouts(base.to(in_dtype)) if in_dtype == torch.float32 else [base.to(in_dtype)[:, :, ::2]]:
                for axis in (0, 1, 2, 3, -1):
                    c = x.shape[axis]
                    for s_dtype, z_dtype in (
                        (torch.float32, torch.int64),
                        (torch.float64, torch.int32),
                        (torch.float32, torch.float32),
                    ):
                        scales = (torch.rand(c) * 0.1 + 0.01).to(s_dtype)
                        scales[0] = 0.5
                        zps = torch.randint(-7, 8, (c,)).to(z_dtype)
                        for out_dtype in (torch.int8, torch.uint8) if axis != 2 else (torch.int16,):
                            lo, hi = BOUNDS[out_dtype]
                            args = (axis, lo, hi, out_dtype)
                            want = qd.quantize_per_channel(x, scales, zps, *args)
                            got = qd.quantize_per_channel(
                                x.to("openreg"), scales.to("openreg"), zps.to("openreg"), *args
                            )
                            msg = f"{in_dtype} {x.stride()} axis={axis} {s_dtype} {z_dtype} {out_dtype}"
                            self.assertSame(got, want, msg)
                            for out_f in (None, torch.bfloat16):
                                for z in (zps, None):
                                    deq = qd.dequantize_per_channel(want, scales, z, *args, out_dtype=out_f)
                                    dz = None if z is None else z.to("openreg")
                                    self.assertSame(
                                        qd.dequantize_per_channel(
                                            got, scales.to("openreg"), dz, *args, out_dtype=out_f
                                        ),
                                        deq,
                                        msg,
                                    )

    def test_narrow_integer_zero_points_subtract_as_the_decomposition(self):
        # The decomposition subtracts an integer zero point in the type the values and it promote
        # to: uint8 3 - 128 wraps to 131 there (openreg's fused loop subtracted in float: -125).
        q, s = torch.tensor([[3, 200]], dtype=torch.uint8), torch.tensor([0.5, 0.5])
        z = torch.tensor([128, 128], dtype=torch.uint8)
        want = qd.dequantize_per_channel(q, s, z, 1, 0, 255, torch.uint8)
        self.assertEqual(want.tolist(), [[65.5, 36.0]])  # the wrap
        self.assertSame(qd.dequantize_per_channel(*(t.to("openreg") for t in (q, s, z)), 1, 0, 255, torch.uint8), want)
        qt, st, zt = (
            torch.tensor([[3, -100]], dtype=torch.int8),
            torch.tensor([[0.5]]),
            torch.tensor([[100]], dtype=torch.int8),
        )
        want = qd.dequantize_per_token(qt, st, zt, -128, 127, torch.int8, torch.float32)
        self.assertSame(
            qd.dequantize_per_token(*(t.to("openreg") for t in (qt, st, zt)), -128, 127, torch.int8, torch.float32),
            want,
        )
        # int64 zero points (the usual ones) do not wrap, and stay on the fused loop's result
        z64 = z.long()
        self.assertEqual(
            qd.dequantize_per_channel(*(t.to("openreg") for t in (q, s, z64)), 1, 0, 255, torch.uint8).cpu().tolist(),
            [[-62.5, 36.0]],
        )

    def test_wide_zero_points_subtract_as_the_decomposition(self):
        # The decomposition subtracts an integral zero point from the values in integers, in the
        # type the two promote to; the fused loop subtracts in the scales' type. Beyond 2^24 a
        # float32 cannot hold every integer (1 - 16777217 gave -16777215 for -16777216), and an
        # int32 subtraction wraps near 2^31 where a float64 one does not.
        big = 2**24 + 1
        q, s = torch.tensor([[1, 0], [3, -1]], dtype=torch.int8), torch.tensor([1.0, 0.5])
        z = torch.tensor([big, -big])
        want = qd.dequantize_per_channel(q, s, z, 1, -128, 127, torch.int8)
        self.assertEqual(want[0, 0].item(), -16777216.0)
        got = qd.dequantize_per_channel(*(t.to("openreg") for t in (q, s, z)), 1, -128, 127, torch.int8)
        self.assertSame(got, want)
        zt = torch.tensor([[big], [3]])
        want = qd.dequantize_per_token(q, s[:1].expand(2, 1), zt, -128, 127, torch.int8, torch.float32)
        got = qd.dequantize_per_token(
            *(t.to("openreg") for t in (q, s[:1].expand(2, 1), zt)), -128, 127, torch.int8, torch.float32
        )
        self.assertSame(got, want)
        # float64 scales hold them: the fused loop, with the same result
        want = qd.dequantize_per_channel(q, s.double(), z, 1, -128, 127, torch.int8)
        got = qd.dequantize_per_channel(*(t.to("openreg") for t in (q, s.double(), z)), 1, -128, 127, torch.int8)
        self.assertSame(got, want)
        # int32 zero points at the int32 limits wrap in the decomposition's subtraction
        z32 = torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32)
        want = qd.dequantize_per_channel(q, s.double(), z32, 1, -128, 127, torch.int8)
        self.assertEqual(want[0, 0].item(), -(2**31))  # 1 - (-2^31) wrapped
        got = qd.dequantize_per_channel(*(t.to("openreg") for t in (q, s.double(), z32)), 1, -128, 127, torch.int8)
        self.assertSame(got, want)

    def test_a_subtraction_pytorch_refuses_is_refused_for_an_empty_input_too(self):
        # What the decomposition's integer subtraction refuses, it refuses whatever the input's
        # size; openreg refuses it at the call with PyTorch's error.
        refused = (
            (torch.uint16, torch.long, RuntimeError, "^Promotion for uint16, uint32, uint64 types is not supported"),
            (
                torch.int8,
                torch.bool,
                RuntimeError,
                "^Subtraction, the `-` operator, with a bool tensor is not supported",
            ),
            (torch.uint16, torch.uint16, NotImplementedError, "not implemented for 'UInt16'"),
        )
        for q_dtype, z_dtype, error, message in refused:
            lo, hi = BOUNDS[q_dtype]
            for n in (2, 0):
                q, s, z = torch.zeros(n, 2, dtype=q_dtype), torch.ones(2), torch.zeros(2, dtype=z_dtype)
                calls = {
                    "per_channel": lambda d: qd.dequantize_per_channel(
                        *(t.to(d) for t in (q, s, z)), 1, lo, hi, q_dtype
                    ),
                    "per_token": lambda d: qd.dequantize_per_token(
                        *(t.to(d) for t in (q, s[:1].expand(n, 1), z[:1].expand(n, 1))), lo, hi, q_dtype, torch.float32
                    ),
                }
                for name, call in calls.items():
                    for device in ("cpu", "openreg"):
                        with self.assertRaisesRegex(error, message, msg=f"{q_dtype} {z_dtype} {name} {n} {device}"):
                            call(device)
        # Per tensor, the decomposition reads a zero point tensor as a number, but subtracts a bool
        # one, which PyTorch refuses: openreg read it as 1 (hunt33e).
        q, s, z = torch.tensor([0, 1, -3], dtype=torch.int8), torch.tensor(0.5), torch.tensor(True)
        for device in ("cpu", "openreg"):
            for call in (
                lambda d: qd.dequantize_per_tensor.tensor(*(t.to(d) for t in (q, s, z)), -128, 127, torch.int8),
                lambda d: qd.dequantize_per_tensor.tensor2(
                    *(t.to(d) for t in (q, s, z)), torch.tensor(-128), torch.tensor(127), torch.int8
                ),
            ):
                with self.assertRaisesRegex(RuntimeError, "^Subtraction, the `-` operator, with a bool tensor"):
                    call(device)
        # A 0-dim zero point per token takes no part in the promotion: uint8 values with a uint16
        # one stay uint8 (and wrap), as in the decomposition.
        q, s, z = (
            torch.tensor([[3, 200]], dtype=torch.uint8),
            torch.tensor([[0.5]]),
            torch.tensor(4, dtype=torch.uint16),
        )
        want = qd.dequantize_per_token(q, s, z, 0, 255, torch.uint8, torch.float32)
        self.assertEqual(want.tolist(), [[127.5, 98.0]])
        got = qd.dequantize_per_token(*(t.to("openreg") for t in (q, s, z)), 0, 255, torch.uint8, torch.float32)
        self.assertSame(got, want)

    def test_one_scale_for_all_channels(self):
        x = ties(6).reshape(4, 6)
        s, z = torch.tensor([0.5]), torch.tensor([3])
        want = qd.quantize_per_channel(x, s, z, 1, -128, 127, torch.int8)
        got = qd.quantize_per_channel(x.to("openreg"), s.to("openreg"), z.to("openreg"), 1, -128, 127, torch.int8)
        self.assertSame(got, want)
        deq = qd.dequantize_per_channel(want, s, z, 1, -128, 127, torch.int8)
        self.assertSame(qd.dequantize_per_channel(got, s.to("openreg"), z.to("openreg"), 1, -128, 127, torch.int8), deq)

    def test_bad_arguments(self):
        d = torch.randn(4, 6, device="openreg")
        s, z = torch.ones(6, device="openreg"), torch.zeros(6, dtype=torch.long, device="openreg")
        q = d.to(torch.int8)
        cases = [
            (lambda: qd.quantize_per_channel(d, s, z, 2, -128, 127, torch.int8), "Expecting axis to be < 2"),
            (
                lambda: qd.quantize_per_channel(d, s, z, 0, -128, 127, torch.int8),
                r"scales must hold one value per channel \(4 along axis 0\), got shape torch.Size\(\[6\]\)",
            ),
            (
                lambda: qd.quantize_per_channel(d, s, z[:5], 1, -128, 127, torch.int8),
                r"zero_points must hold as many values as scales \(6\), got 5",
            ),
            (
                lambda: qd.quantize_per_channel(d, s.cpu(), z, 1, -128, 127, torch.int8),
                r"scales must be on openreg:0 \(the input's device\), got a tensor on cpu",
            ),
            (
                lambda: qd.quantize_per_channel(d.half().double(), s, z, 1, -128, 127, torch.int8),
                "Expecting input to have dtype torch.float32, but got dtype: torch.float64",
            ),
            (
                lambda: qd.dequantize_per_channel(q, s, z, 1, 0, 255, torch.uint8),
                "Expecting input to have dtype: torch.uint8, but got dtype: torch.int8",
            ),
            (
                lambda: qd.dequantize_per_channel(q, s, z, 1, -128, 128, torch.int8),
                "quant_max out of bounds for dtype, quant_max_upper_bound: 127 quant_max: 128",
            ),
        ]
        for call, message in cases:
            with self.assertRaisesRegex(RuntimeError, message):
                call()


class TestPerToken(QuantTestCase):
    def test_symmetric_and_asymmetric_round_trip(self):
        torch.manual_seed(0)
        for in_dtype in FLOATS:
            base = (torch.randn(3, 5, 16) * 4).to(in_dtype)
            for x in (base, base.transpose(0, 1), base[:, :, ::2]):
                d = x.to("openreg")
                for choose in (qd.choose_qparams_per_token, qd.choose_qparams_per_token_asymmetric):
                    s, z = choose(x, torch.int8)
                    ds, dz = choose(d, torch.int8)
                    self.assertSame(ds, s, f"{choose} {in_dtype}")
                    self.assertSame(dz, z, f"{choose} {in_dtype}")
                    want = qd.quantize_per_token(x, s, z, -128, 127, torch.int8)
                    got = qd.quantize_per_token(d, ds, dz, -128, 127, torch.int8)
                    self.assertSame(got, want, f"{choose} {in_dtype} {x.stride()}")
                    for out_dtype in (torch.float32, torch.bfloat16):
                        deq = qd.dequantize_per_token(want, s, z, -128, 127, torch.int8, out_dtype)
                        self.assertSame(qd.dequantize_per_token(got, ds, dz, -128, 127, torch.int8, out_dtype), deq)

    def test_integer_scales_quantize_as_the_decomposition(self):
        # The decomposition takes integer scales (its reciprocal is floating point); openreg refused
        # them in quantize_per_token while dequantize_per_token took them (hunt33e).
        x = torch.tensor([[0.4, 1.6, -2.5], [3.0, -7.2, 9.9]], dtype=torch.float32)
        s, z = torch.tensor([[1], [2]]), torch.tensor([[0], [1]])
        want = qd.quantize_per_token(x, s, z, -128, 127, torch.int8)
        got = qd.quantize_per_token(*(t.to("openreg") for t in (x, s, z)), -128, 127, torch.int8)
        self.assertSame(got, want)
        with self.assertRaisesRegex(RuntimeError, "input must be floating point, got torch.int32"):
            qd.quantize_per_token(
                torch.ones(2, 3, dtype=torch.int32, device="openreg"),
                *(t.to("openreg") for t in (s, z)),
                -128,
                127,
                torch.int8,
            )

    def test_a_0_dim_input_is_one_token(self):
        # The decomposition's amax(-1, keepdim=True) gives 0-dim parameters; openreg refused the input.
        for x in (torch.tensor(2.5), torch.tensor(-0.75, dtype=torch.bfloat16)):
            for choose in (qd.choose_qparams_per_token, qd.choose_qparams_per_token_asymmetric):
                s, z = choose(x, torch.int8)
                ds, dz = choose(x.to("openreg"), torch.int8)
                self.assertEqual(ds.shape, torch.Size([]), f"{choose} {x.dtype}")
                self.assertSame(ds, s, f"{choose} {x.dtype}")
                self.assertSame(dz, z, f"{choose} {x.dtype}")

    def test_uint8_and_int16_outputs(self):
        # The parameters chosen for int8 (the only type the choose op takes), used with other ranges.
        torch.manual_seed(0)
        for in_dtype in FLOATS:
            x = (torch.randn(6, 16) * 4).to(in_dtype)
            d = x.to("openreg")
            s, z = qd.choose_qparams_per_token_asymmetric(x, torch.int8)
            ds, dz = s.to("openreg"), z.to("openreg")
            for dtype, (lo, hi) in ((torch.uint8, (0, 255)), (torch.int16, (-32768, 32767))):
                want = qd.quantize_per_token(x, s, z + 128, lo, hi, dtype)
                got = qd.quantize_per_token(d, ds, dz + 128, lo, hi, dtype)
                self.assertSame(got, want, f"{in_dtype} {dtype}")
                deq = qd.dequantize_per_token(want, s, z + 128, lo, hi, dtype, torch.float32)
                self.assertSame(qd.dequantize_per_token(got, ds, dz + 128, lo, hi, dtype, torch.float32), deq)

    def test_broadcast_parameters_take_the_decomposition_in_the_kernel(self):
        x = torch.randn(4, 8)
        s, z = torch.full((4, 1), 0.05, dtype=torch.bfloat16), torch.zeros(4, 1, dtype=torch.int64)
        want = qd.quantize_per_token(x, s, z, -128, 127, torch.int8)
        self.assertSame(
            qd.quantize_per_token(x.to("openreg"), s.to("openreg"), z.to("openreg"), -128, 127, torch.int8), want
        )

    def test_bad_arguments(self):
        d = torch.randn(4, 8, device="openreg")
        s, z = torch.ones(3, 1, device="openreg"), torch.zeros(4, 1, device="openreg")
        with self.assertRaisesRegex(RuntimeError, r"num_tokens: 4 scales: torch.Size\(\[3, 1\]\)"):
            qd.quantize_per_token(d, s, z, -128, 127, torch.int8)
        with self.assertRaisesRegex(RuntimeError, "unsupported dtype in choose_qparams_per_token: torch.uint8"):
            qd.choose_qparams_per_token(d, torch.uint8)
        # parameters that would broadcast the input to a larger shape: the output has the input's
        # shape (PyTorch's meta kernel), so they are refused at the call (the kernel failed)
        for x, shape in ((torch.tensor(0.5), (1,)), (torch.randn(2, 3), (1, 2, 1))):
            x, ps, pz = x.to("openreg"), torch.full(shape, 0.1, device="openreg"), torch.zeros(shape, device="openreg")
            wider = r"would broadcast the input torch.Size\(\[[0-9, ]*\]\) to torch.Size\(\[[0-9, ]+\]\)"
            with self.assertRaisesRegex(RuntimeError, "quantize_per_token: scales .* " + wider):
                qd.quantize_per_token(x, ps, pz, -128, 127, torch.int8)
            q = torch.zeros(x.shape, dtype=torch.int8, device="openreg")
            with self.assertRaisesRegex(RuntimeError, "dequantize_per_token: scales .* " + wider):
                qd.dequantize_per_token(q, ps, pz, -128, 127, torch.int8, torch.float32)
        torch.openreg.synchronize()  # nothing failed in a kernel


class TestChooseQParams(QuantTestCase):
    def test_matches_decomposition(self):
        torch.manual_seed(0)
        inputs = [torch.randn(7, 9) * 3, torch.rand(50) + 1, -torch.rand(50), torch.zeros(5)]
        for in_dtype in FLOATS:
            for x in inputs:
                x = x.to(in_dtype)
                for op in (qd.choose_qparams.tensor, qd.choose_qparams_symmetric.tensor):
                    for dtype, (lo, hi) in (
                        (torch.uint8, (0, 255)),
                        (torch.int8, (-128, 127)),
                        (torch.int16, (-32768, 32767)),
                    ):
                        s, z = op(x, lo, hi, 1e-5, dtype)
                        ds, dz = op(x.to("openreg"), lo, hi, 1e-5, dtype)
                        self.assertSame(ds, s, f"{op} {in_dtype} {dtype}")
                        self.assertSame(dz, z, f"{op} {in_dtype} {dtype}")

    def test_bad_arguments(self):
        d = torch.randn(4, device="openreg")
        cases = [
            (
                lambda: qd.choose_qparams.tensor(d.double(), -128, 127, 1e-5, torch.int8),
                "Expecting input to have dtype torch.float32/16/b16, but got dtype: torch.float64",
            ),
            (
                lambda: qd.choose_qparams.tensor(d, 1, 127, 1e-5, torch.int8),
                "Used-specified quantization range must include 0.",
            ),
            (lambda: qd.choose_qparams.tensor(d, 0, 0, 1e-5, torch.int8), "qmin must be strictly less than qmax"),
            (
                lambda: qd.choose_qparams.tensor(d, 0, 10, 1e-5, torch.int64),
                r"Expecting target dtype to be one of dict_keys\(\[torch.uint8",
            ),
        ]
        for call, message in cases:
            with self.assertRaisesRegex(RuntimeError, message):
                call()


class TestNativeAndAsynchronous(TestCase):
    def _calls(self):
        d = torch.randn(4, 8, device="openreg")
        s1, z1 = torch.tensor([0.05], device="openreg"), torch.tensor([3], device="openreg")
        sc, zc = torch.full((8,), 0.05, device="openreg"), torch.zeros(8, dtype=torch.long, device="openreg")
        st, zt = torch.full((4, 1), 0.05, device="openreg"), torch.zeros(4, 1, device="openreg")
        q = torch.zeros(4, 8, dtype=torch.int8, device="openreg")
        lo, hi = torch.tensor(-128, device="openreg"), torch.tensor(127, device="openreg")
        return [
            lambda: qd.quantize_per_tensor(d, 0.05, 3, -128, 127, torch.int8),
            lambda: qd.quantize_per_tensor.tensor(d, s1, z1, -128, 127, torch.int8),
            lambda: qd.quantize_per_tensor.tensor2(d, s1, z1, lo, hi, torch.int8),
            lambda: qd.dequantize_per_tensor(q, 0.05, 3, -128, 127, torch.int8),
            lambda: qd.dequantize_per_tensor.tensor(q, s1, z1, -128, 127, torch.int8),
            lambda: qd.dequantize_per_tensor.tensor2(q, s1, z1, lo, hi, torch.int8),
            lambda: qd.quantize_per_channel(d, sc, zc, 1, -128, 127, torch.int8),
            lambda: qd.dequantize_per_channel(q, sc, zc, 1, -128, 127, torch.int8),
            lambda: qd.quantize_per_token(d, st, zt, -128, 127, torch.int8),
            lambda: qd.dequantize_per_token(q, st, zt, -128, 127, torch.int8, torch.float32),
            lambda: qd.choose_qparams.tensor(d, -128, 127, 1e-5, torch.int8),
            lambda: qd.choose_qparams_symmetric.tensor(d, -128, 127, 1e-5, torch.int8),
            lambda: qd.choose_qparams_per_token(d, torch.int8),
            lambda: qd.choose_qparams_per_token_asymmetric(d, torch.int8),
        ]

    def test_one_native_launch_per_call_no_host_copy(self):
        calls = self._calls()
        torch.openreg.synchronize()
        torch.openreg.reset_fallback_op_counts()
        torch.openreg.set_strict_mode(True)  # an op without a native kernel would raise
        for i, call in enumerate(calls):
            before = torch.openreg._runtime_counters()
            call()
            after = torch.openreg._runtime_counters()
            self.assertEqual(after["kernels_launched"] - before["kernels_launched"], 1, f"call {i}")
            self.assertEqual(after["memcpy_d2h"] - before["memcpy_d2h"], 0, f"call {i}")
        torch.openreg.synchronize()
        self.assertEqual(torch.openreg.fallback_op_counts(), {})

    def test_no_host_wait(self):
        calls = self._calls()
        with StreamHold() as held:  # the device is busy until released
            results = [call() for call in calls]
            busy = not held.stream.query()
        self.assertTrue(busy, "a call waited for the device")
        torch.openreg.synchronize()
        self.assertEqual(len(results), len(calls))
