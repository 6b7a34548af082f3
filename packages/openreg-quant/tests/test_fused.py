"""The fused int8 ops (csrc/fused/QLinearConv.cpp): torch.ops.openreg_quant.qlinear / qconv2d against
the CPU's own oneDNN kernels (bit-exact; on CPUs where oneDNN's products saturate, against the exact
integer products for the activations that would) and the dequantize -> float op -> quantize reference
(within one quantum); argument errors; meta kernels; the packed-weight cache; native, one launch, no wait."""

import openreg_quant  # noqa: F401  (the ops)
import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase
from torch_openreg.utils.testing import StreamHold

oq = torch.ops.openreg_quant
qd = torch.ops.quantized_decomposed


def weights(*shape, seed=0):
    """int8 per-channel symmetric weights (axis 0), their float32 scales and int64 zero points."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, generator=g) * 0.1
    scales = w.abs().amax(dim=tuple(range(1, w.dim()))) / 127.5
    q = qd.quantize_per_channel(w, scales, torch.zeros(shape[0], dtype=torch.long), 0, -128, 127, torch.int8)
    return q, scales, torch.zeros(shape[0], dtype=torch.long)


def activations(*shape, dtype=torch.uint8, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    zp = 128 if dtype == torch.uint8 else 0
    lo, hi = (0, 255) if dtype == torch.uint8 else (-128, 127)
    return qd.quantize_per_tensor(x, 0.03, zp, lo, hi, dtype), 0.03, zp, lo, hi


def dev(*ts):
    return [t.to("openreg") if isinstance(t, torch.Tensor) else t for t in ts]


# On x86 CPUs without VNNI oneDNN sums u8 x s8 products in pairs into 16 bits, saturating: its results
# are then off by several quanta, and openreg's kernels take an exact path for such activations.
SATURATES = oq.int8_pairs_saturate()


def exact_int8(acc, xs, ws, bias, os, oz, out_dtype, post, x_dtype):
    """What oneDNN computes from exact integer sums `acc` ([M, N] or [N, C, H, W])."""
    per_channel = [1] * acc.dim()
    per_channel[1] = -1
    y = acc.float() * (ws.float() * xs).view(per_channel)
    if bias is not None:
        y = y + bias.float().view(per_channel)
    if post == "relu":
        y = y.relu()
    if out_dtype is not None:
        return y.to(out_dtype)
    lo, hi = (0, 255) if x_dtype == torch.uint8 else (-128, 127)
    return (torch.round(y * (1.0 / os)) + oz).clamp(lo, hi).to(x_dtype)


def onednn_is_exact_for(x):
    return not SATURATES or (x.dtype == torch.uint8 and int(x.max()) <= 127)


def int8_linear(x, xs, xz, w, ws, wz, bias, os, oz, out_dtype, post):
    """The CPU's int8 linear: oneDNN's, or the exact products where oneDNN saturates."""
    x2 = x.reshape(-1, x.shape[-1])
    if onednn_is_exact_for(x):
        packed = torch.ops.onednn.qlinear_prepack(w, None)
        out = torch.ops.onednn.qlinear_pointwise(x2, xs, xz, packed, ws, wz, bias, os, oz, out_dtype, post, [], "")
    else:
        acc = torch.mm(x2.double() - xz, w.double().t())
        out = exact_int8(acc, xs, ws, bias, os, oz, out_dtype, post, x.dtype)
    return out.reshape(*x.shape[:-1], w.shape[0])


def int8_conv2d(x, xs, xz, w, ws, wz, bias, geo, os, oz, out_dtype, post):
    """The CPU's int8 conv2d (channels-last): oneDNN's, or the exact products where oneDNN saturates."""
    x = x.contiguous(memory_format=torch.channels_last)
    if onednn_is_exact_for(x):
        packed = torch.ops.onednn.qconv_prepack(w, ws, xs, xz, *geo, None)
        return torch.ops.onednn.qconv2d_pointwise(
            x, xs, xz, packed, ws, wz, bias, *geo, os, oz, out_dtype, post, [], ""
        )
    acc = F.conv2d(x.double() - xz, w.double(), None, *geo)
    return exact_int8(acc, xs, ws, bias, os, oz, out_dtype, post, x.dtype).contiguous(memory_format=torch.channels_last)


def cpu_qlinear(x, xs, xz, w, ws, wz, bias=None):
    """The CPU's int8 qlinear, float32 output."""
    return int8_linear(x, xs, xz, w, ws, wz, bias, 1.0, 0, torch.float32, "none")


def cpu_qconv2d(x, xs, xz, w, ws, wz, geo):
    """The CPU's int8 qconv2d, float32 output."""
    return int8_conv2d(x, xs, xz, w, ws, wz, None, geo, 1.0, 0, torch.float32, "none")


def symmetric_weights(*shape):
    """weights() within [-127, 127], so that negating them is exact."""
    w, ws, wz = weights(*shape)
    return w.clamp(-127, 127), ws, wz


class TestQLinear(TestCase):
    def test_matches_cpu_onednn_and_reference(self):
        w, ws, wz = weights(24, 40)
        bias = torch.randn(24)
        for x_dtype in (torch.uint8, torch.int8):
            for shape in ((1, 40), (7, 40), (2, 3, 40)):
                xq, xs, xz, lo, hi = activations(*shape, dtype=x_dtype)
                for b in (bias, None):
                    for post in ("none", "relu"):
                        for out_dtype, os, oz in (
                            (None, 0.05, 100 if x_dtype == torch.uint8 else 3),
                            (torch.float32, 1.0, 0),
                            (torch.bfloat16, 1.0, 0),
                        ):
                            msg = f"{x_dtype} {shape} bias={b is not None} {post} {out_dtype}"
                            got = oq.qlinear(*dev(xq, xs, xz, w, ws, wz, b), os, oz, out_dtype, post)
                            want = int8_linear(xq, xs, xz, w, ws, wz, b, os, oz, out_dtype, post)
                            self.assertEqual(got.device.type, "openreg")
                            self.assertEqual(got.dtype, want.dtype, msg=msg)
                            self.assertEqual(got.cpu(), want, atol=0, rtol=0, msg=msg)
                            # the float reference: dequantize, linear, relu, [quantize]
                            ref = F.linear(
                                qd.dequantize_per_tensor(xq, xs, xz, lo, hi, x_dtype),
                                qd.dequantize_per_channel(w, ws, wz, 0, -128, 127, torch.int8),
                                b,
                            )
                            ref = F.relu(ref) if post == "relu" else ref
                            if out_dtype is None:
                                ref = qd.quantize_per_tensor(ref, os, oz, lo, hi, x_dtype)
                                self.assertLessEqual((got.cpu().int() - ref.int()).abs().max().item(), 1, msg)
                            else:
                                self.assertEqual(
                                    got.cpu().float(),
                                    ref,
                                    atol=1e-4 if out_dtype == torch.float32 else 0.05,
                                    rtol=0.01,
                                    msg=msg,
                                )

    def test_non_contiguous_input(self):
        w, ws, wz = dev(*weights(16, 32))
        xq, xs, xz, _, _ = activations(6, 32)
        column_major = xq.t().contiguous().to("openreg").t()  # same values, transposed layout
        self.assertFalse(column_major.is_contiguous())
        want = oq.qlinear(xq.to("openreg"), xs, xz, w, ws, wz, None, 1.0, 0, torch.float32, "none")
        got = oq.qlinear(column_major, xs, xz, w, ws, wz, None, 1.0, 0, torch.float32, "none")
        self.assertEqual(got.cpu(), want.cpu(), atol=0, rtol=0)

    def test_bad_arguments(self):
        w, ws, wz = dev(*weights(8, 16))
        xq = dev(activations(4, 16)[0])[0]
        cases = [
            (
                lambda: oq.qlinear(xq.float(), 0.1, 0, w, ws, wz, None, 1.0, 0, None, "none"),
                "x must be uint8 or int8 .quantized activations., got torch.float32",
            ),
            (
                lambda: oq.qlinear(xq, 0.1, 0, w.to(torch.uint8), ws, wz, None, 1.0, 0, None, "none"),
                "weight must be int8, got torch.uint8",
            ),
            (
                lambda: oq.qlinear(xq, 0.1, 0, w, ws[:4], wz, None, 1.0, 0, None, "none"),
                r"w_scales must be float32 with one value per output channel \(8\)",
            ),
            (
                lambda: oq.qlinear(xq, 0.1, 0, w, ws, wz, None, 1.0, 0, None, "gelu"),
                "post_op must be 'none' or 'relu', got 'gelu'",
            ),
            (
                lambda: oq.qlinear(xq, 0.1, 0, w, ws, wz, None, 1.0, 0, torch.int32, "none"),
                "output_dtype must be None .quantized output., torch.float32 or torch.bfloat16, got torch.int32",
            ),
            (
                lambda: oq.qlinear(xq[:, :8], 0.1, 0, w, ws, wz, None, 1.0, 0, None, "none"),
                r"x's last dimension \(8\) must equal in_features \(16\)",
            ),
            (
                lambda: oq.qlinear(xq, 0.1, 0, w.cpu(), ws, wz, None, 1.0, 0, None, "none"),
                r"weight and its qparams must be on openreg:0 \(the input's device\), got a tensor on cpu",
            ),
            (
                lambda: oq.qlinear(xq, 0.1, 0, w[None], ws, wz, None, 1.0, 0, None, "none"),
                r"weight must be 2-D \[out_features, in_features\], got 3-D",
            ),
            (
                lambda: oq.qlinear(xq, 0.1, 0, w, ws, wz.int(), None, 1.0, 0, None, "none"),
                r"w_zero_points must be int64 with one value per output channel \(8\), "
                r"got torch.int32 of shape \[8\]\.",
            ),
            (
                lambda: oq.qlinear(xq, 0.1, 0, w, ws, wz[:, None], None, 1.0, 0, None, "none"),
                r"w_zero_points must be int64 with one value per output channel \(8\), "
                r"got torch.int64 of shape \[8, 1\]\.",
            ),
            (
                # K = 0: oneDNN has no empty reduction (the CPU's qlinear_pointwise dies with SIGFPE)
                lambda: oq.qlinear(xq[:, :0], 0.1, 0, w[:, :0], ws, wz, None, 1.0, 0, None, "none"),
                r"in_features must be at least 1, got weight of shape \[8, 0\]\.",
            ),
        ]
        for call, message in cases:
            with self.assertRaisesRegex(RuntimeError, message):
                call()
        m = torch.empty(4, 0, dtype=torch.uint8, device="meta")
        with self.assertRaisesRegex(RuntimeError, "in_features must be at least 1"):
            oq.qlinear(m, 0.1, 0, w[:, :0].to("meta"), ws.to("meta"), wz.to("meta"), None, 1.0, 0, None, "none")

    def test_non_zero_weight_zero_points_fail_in_the_kernel(self):
        # Symmetric weights only. The zero points are in device memory: the kernel checks them
        # (the host never waits) and the next synchronising call reports the failure.
        w, ws, wz = dev(*weights(8, 16))
        xq = dev(activations(4, 16)[0])[0]
        oq.qlinear(xq, 0.03, 128, w, ws, wz + 3, None, 1.0, 0, torch.float32, "none")
        with self.assertRaisesRegex(
            RuntimeError, "openreg_quant::qlinear: w_zero_points must be all zero: the op takes symmetric"
        ):
            torch.openreg.synchronize()
        want = cpu_qlinear(xq.cpu(), 0.03, 128, w.cpu(), ws.cpu(), wz.cpu())
        got = oq.qlinear(xq, 0.03, 128, w, ws, wz, None, 1.0, 0, torch.float32, "none")
        self.assertEqual(got.cpu(), want, atol=0, rtol=0)

    def test_meta(self):
        w, ws, wz = (t.to("meta") for t in weights(8, 16))
        x = torch.empty(2, 5, 16, dtype=torch.uint8, device="meta")
        self.assertEqual(oq.qlinear(x, 0.1, 0, w, ws, wz, None, 1.0, 0, None, "relu").shape, (2, 5, 8))
        self.assertEqual(oq.qlinear(x, 0.1, 0, w, ws, wz, None, 1.0, 0, torch.float32, "none").dtype, torch.float32)

    def test_packed_weight_follows_the_weight_tensor(self):
        w, ws, wz = dev(*weights(8, 16))
        xq = dev(activations(3, 16)[0])[0]
        before = oq.packed_weight_count()
        oq.qlinear_prepack(w)
        self.assertEqual(oq.packed_weight_count(), before + 1)
        first = oq.qlinear(xq, 0.03, 128, w, ws, wz, None, 1.0, 0, torch.float32, "none").cpu()
        w.neg_()  # written in place: the next call packs again
        second = oq.qlinear(xq, 0.03, 128, w, ws, wz, None, 1.0, 0, torch.float32, "none").cpu()
        fresh = oq.qlinear(xq, 0.03, 128, w.clone(), ws, wz, None, 1.0, 0, torch.float32, "none").cpu()
        self.assertEqual(second, fresh, atol=0, rtol=0)
        self.assertNotEqual(second, first)
        del w
        torch.openreg.synchronize()
        self.assertEqual(oq.packed_weight_count(), before)  # the entry died with its weight

    def test_packed_weight_follows_writes_to_the_weight(self):
        # The packed form is keyed by what the host sees of the weight: its version (a write through
        # the tensor) and its storage and geometry (`.data = t` swaps the storage without moving the
        # version). The next call must compute with the new values.
        w, ws, wz = symmetric_weights(8, 16)
        xq, xs, xz, _, _ = activations(3, 16)
        x, ws_d, wz_d = dev(xq, ws, wz)
        for how in ("in place", "prepacked, then in place", "data ="):
            weight = w.to("openreg")
            if how.startswith("prepacked"):
                oq.qlinear_prepack(weight)
            first = oq.qlinear(x, xs, xz, weight, ws_d, wz_d, None, 1.0, 0, torch.float32, "none").cpu()
            entries = oq.packed_weight_count()
            if how == "data =":
                weight.data = (-weight).clone()
            else:
                with torch.no_grad():
                    weight.neg_()
            second = oq.qlinear(x, xs, xz, weight, ws_d, wz_d, None, 1.0, 0, torch.float32, "none").cpu()
            self.assertEqual(second, -first, atol=0, rtol=0, msg=how)
            self.assertEqual(second, cpu_qlinear(xq, xs, xz, -w, ws, wz), atol=0, rtol=0, msg=how)
            self.assertEqual(oq.packed_weight_count(), entries, msg=how)  # the same entry, packed again


class TestQConv2d(TestCase):
    def test_matches_cpu_onednn_and_reference(self):
        for groups, stride, padding, dilation in ((1, 1, 0, 1), (2, 2, 1, 1), (4, 1, 2, 2)):
            w, ws, wz = weights(8, 8 // groups, 3, 3, seed=groups)
            bias = torch.randn(8)
            xq, xs, xz, lo, hi = activations(2, 8, 9, 9)
            geo = ([stride] * 2, [padding] * 2, [dilation] * 2, groups)
            for x in (xq, xq.contiguous(memory_format=torch.channels_last)):
                for post in ("none", "relu"):
                    for out_dtype, os, oz in ((None, 0.05, 100), (torch.float32, 1.0, 0)):
                        msg = (
                            f"groups={groups} stride={stride} padding={padding} dilation={dilation} {post} {out_dtype}"
                        )
                        got = oq.qconv2d(*dev(x, xs, xz, w, ws, wz, bias), *geo, os, oz, out_dtype, post)
                        want = int8_conv2d(x, xs, xz, w, ws, wz, bias, geo, os, oz, out_dtype, post)
                        self.assertEqual(got.dtype, want.dtype, msg=msg)
                        self.assertTrue(got.is_contiguous(memory_format=torch.channels_last), msg)
                        self.assertEqual(got.cpu(), want, atol=0, rtol=0, msg=msg)
                        ref = F.conv2d(
                            qd.dequantize_per_tensor(x, xs, xz, lo, hi, torch.uint8),
                            qd.dequantize_per_channel(w, ws, wz, 0, -128, 127, torch.int8),
                            bias,
                            stride,
                            padding,
                            dilation,
                            groups,
                        )
                        ref = F.relu(ref) if post == "relu" else ref
                        if out_dtype is None:
                            ref = qd.quantize_per_tensor(ref, os, oz, lo, hi, torch.uint8)
                            self.assertLessEqual((got.cpu().int() - ref.int()).abs().max().item(), 1, msg)
                        else:
                            self.assertEqual(got.cpu(), ref, atol=1e-4, rtol=1e-3, msg=msg)

    def test_prepack(self):
        w, ws, wz = dev(*weights(8, 4, 3, 3))
        x = dev(activations(1, 4, 6, 6)[0])[0]
        geo = ([1, 1], [1, 1], [1, 1], 1)
        fresh = oq.qconv2d(x, 0.03, 128, w.clone(), ws, wz, None, *geo, 1.0, 0, torch.float32, "none").cpu()
        before = oq.packed_weight_count()
        oq.qconv2d_prepack(w, ws, 0.03, 128, *geo)
        self.assertEqual(oq.packed_weight_count(), before + 1)
        got = oq.qconv2d(x, 0.03, 128, w, ws, wz, None, *geo, 1.0, 0, torch.float32, "none")
        self.assertEqual(oq.packed_weight_count(), before + 1)  # the call used the prepacked entry
        self.assertEqual(got.cpu(), fresh, atol=0, rtol=0)

    def test_packed_weight_follows_writes_to_the_weight_and_scales(self):
        # qconv2d shares the cache; its packed form also takes the weight's scales.
        w, ws, wz = symmetric_weights(8, 4, 3, 3)
        xq, xs, xz, _, _ = activations(1, 4, 6, 6)
        geo = ([1, 1], [1, 1], [1, 1], 1)
        x, weight, scales, zps = dev(xq, w, ws, wz)
        first = oq.qconv2d(x, xs, xz, weight, scales, zps, None, *geo, 1.0, 0, torch.float32, "none").cpu()
        weight.data = (-weight).clone()
        second = oq.qconv2d(x, xs, xz, weight, scales, zps, None, *geo, 1.0, 0, torch.float32, "none").cpu()
        self.assertEqual(second, cpu_qconv2d(xq, xs, xz, -w, ws, wz, geo), atol=0, rtol=0)
        self.assertEqual(second, -first, atol=1e-4, rtol=1e-3)  # oneDNN's conv rounds its compensation
        with torch.no_grad():
            scales.mul_(2)
        third = oq.qconv2d(x, xs, xz, weight, scales, zps, None, *geo, 1.0, 0, torch.float32, "none").cpu()
        self.assertEqual(third, cpu_qconv2d(xq, xs, xz, -w, ws * 2, wz, geo), atol=0, rtol=0)

    def test_bad_arguments_and_meta(self):
        w, ws, wz = dev(*weights(8, 4, 3, 3))
        x = dev(activations(1, 6, 5, 5)[0])[0]
        with self.assertRaisesRegex(RuntimeError, r"x has 6 channels; weight \[8, 4, 3, 3\] with groups=1 expects 4"):
            oq.qconv2d(x, 0.1, 0, w, ws, wz, None, [1, 1], [0, 0], [1, 1], 1, 1.0, 0, None, "none")
        with self.assertRaisesRegex(RuntimeError, "is larger than the padded input"):
            oq.qconv2d(x[:, :4, :2, :2], 0.1, 0, w, ws, wz, None, [1, 1], [0, 0], [1, 1], 1, 1.0, 0, None, "none")
        geo = ([1, 1], [0, 0], [1, 1], 1)
        cases = [
            (
                lambda: oq.qconv2d(x[:, :4], 0.1, 0, w[0], ws, wz, None, *geo, 1.0, 0, None, "none"),
                r"x and weight must be 4-D \(NCHW\), got 4-D and 3-D\.",
            ),
            (
                lambda: oq.qconv2d(x[:, :4], 0.1, 0, w, ws, wz.to(torch.int8), None, *geo, 1.0, 0, None, "none"),
                r"w_zero_points must be int64 with one value per output channel \(8\), got torch.int8 of shape \[8\]\.",
            ),
            (
                # no input channel (the CPU's qconv_prepack: "could not create a primitive descriptor")
                lambda: oq.qconv2d(x[:, :0], 0.1, 0, w[:, :0], ws, wz, None, *geo, 1.0, 0, None, "none"),
                r"weight must have at least one input channel per group and a non-empty kernel, got \[8, 0, 3, 3\]\.",
            ),
            (
                lambda: oq.qconv2d(x[:, :4], 0.1, 0, w[:, :, :0], ws, wz, None, *geo, 1.0, 0, None, "none"),
                r"a non-empty kernel, got \[8, 4, 0, 3\]\.",
            ),
        ]
        for call, message in cases:
            with self.assertRaisesRegex(RuntimeError, message):
                call()
        oq.qconv2d(x[:, :4], 0.03, 128, w, ws, wz - 1, None, *geo, 1.0, 0, torch.float32, "none")
        with self.assertRaisesRegex(
            RuntimeError, "openreg_quant::qconv2d: w_zero_points must be all zero: the op takes symmetric"
        ):
            torch.openreg.synchronize()
        m = torch.empty(2, 4, 7, 7, dtype=torch.uint8, device="meta")
        out = oq.qconv2d(
            m, 0.1, 0, w.to("meta"), ws.to("meta"), wz.to("meta"), None, [2, 2], [1, 1], [1, 1], 1, 1.0, 0, None, "none"
        )
        self.assertEqual(out.shape, (2, 8, 4, 4))
        self.assertTrue(out.is_contiguous(memory_format=torch.channels_last))


class TestNativeAndAsynchronous(TestCase):
    def test_one_native_launch_no_host_copy_no_wait(self):
        w, ws, wz = dev(*weights(8, 16))
        cw, cs, cz = dev(*weights(8, 4, 3, 3))
        xq = dev(activations(4, 16)[0])[0]
        xc = dev(activations(1, 4, 6, 6)[0])[0]
        calls = [
            lambda: oq.qlinear(xq, 0.03, 128, w, ws, wz, None, 0.05, 100, None, "relu"),
            lambda: oq.qconv2d(
                xc, 0.03, 128, cw, cs, cz, None, [1, 1], [1, 1], [1, 1], 1, 1.0, 0, torch.float32, "none"
            ),
        ]
        for call in calls:
            call()
        torch.openreg.synchronize()
        torch.openreg.reset_fallback_op_counts()
        torch.openreg.set_strict_mode(True)
        for call in calls:
            before = torch.openreg._runtime_counters()
            call()
            after = torch.openreg._runtime_counters()
            self.assertEqual(after["kernels_launched"] - before["kernels_launched"], 1)
            self.assertEqual(after["memcpy_d2h"] - before["memcpy_d2h"], 0)
        self.assertEqual(torch.openreg.fallback_op_counts(), {})
        torch.openreg.set_strict_mode(False)
        with StreamHold() as held:  # the device is busy until released
            results = [call() for call in calls]
            busy = not held.stream.query()
        self.assertTrue(busy, "a call waited for the device")
        torch.openreg.synchronize()
        self.assertEqual(len(results), 2)
