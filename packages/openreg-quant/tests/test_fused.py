"""The fused int8 ops (csrc/fused/QLinearConv.cpp): torch.ops.openreg_quant.qlinear / qconv2d against
the CPU's own oneDNN kernels (bit-exact; on CPUs where oneDNN's products saturate, against the exact
integer products for the activations that would) and the dequantize -> float op -> quantize reference
(within one quantum); the packed weight (PackedWeight: owned copies, freed with it, pickling, meta);
argument errors; meta kernels; native, one launch, no wait."""

import copy
import io

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
    return torch.round(y * (1.0 / os) + oz).clamp(lo, hi).to(x_dtype)


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
    """The CPU's int8 conv2d (channels-last): oneDNN's, or the exact products where oneDNN saturates
    or, for int8 activations, refuses ("Input tensor should have uint8 (unsigned char) or fp8 data type")."""
    x = x.contiguous(memory_format=torch.channels_last)
    if onednn_is_exact_for(x) and x.dtype == torch.uint8:
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


def outputs(x_dtype):
    """The output types the fused ops are checked with: (output_dtype, output_scale, output_zero_point)
    of a quantized output of the activations' dtype, float32 and bfloat16."""
    return ((None, 0.05, 100 if x_dtype == torch.uint8 else 3), (torch.float32, 1.0, 0), (torch.bfloat16, 1.0, 0))


def symmetric_weights(*shape):
    """weights() within [-127, 127], so that negating them is exact."""
    w, ws, wz = weights(*shape)
    return w.clamp(-127, 127), ws, wz


def qlinear(x, xs, xz, w, ws, wz, bias, os, oz, out_dtype, post):
    """openreg's qlinear from an unpacked weight: packed on the device, then called."""
    return oq.qlinear(x, xs, xz, oq.qlinear_prepack(w, ws, wz), bias, os, oz, out_dtype, post)


def qconv2d(x, xs, xz, w, ws, wz, bias, geo, os, oz, out_dtype, post):
    """openreg's qconv2d from an unpacked weight: packed on the device for x's qparams and `geo`, then called."""
    return oq.qconv2d(x, xs, xz, oq.qconv2d_prepack(w, ws, wz, xs, xz, *geo), bias, os, oz, out_dtype, post)


class TestQLinear(TestCase):
    def test_matches_cpu_onednn_and_reference(self):
        w, ws, wz = weights(24, 40)
        bias = torch.randn(24)
        for x_dtype in (torch.uint8, torch.int8):
            for shape in ((1, 40), (7, 40), (2, 3, 40)):
                xq, xs, xz, lo, hi = activations(*shape, dtype=x_dtype)
                for b in (bias, None):
                    for post in ("none", "relu"):
                        for out_dtype, os, oz in outputs(x_dtype):
                            msg = f"{x_dtype} {shape} bias={b is not None} {post} {out_dtype}"
                            got = qlinear(*dev(xq, xs, xz, w, ws, wz, b), os, oz, out_dtype, post)
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

    def test_ties_round_the_same_on_both_paths(self):
        # y / output_scale on a half with an odd output zero point: oneDNN adds the zero point before
        # rounding half to even; the exact path rounded first, so a row's result depended on whether
        # another row of the batch had an activation above 127 (which sends the whole call to the
        # exact path where oneDNN's products saturate), and int8 activations disagreed with oneDNN.
        w = torch.tensor([[1, 0], [0, 1]], dtype=torch.int8)
        ws, wz = torch.ones(2), torch.zeros(2, dtype=torch.long)
        packed = oq.qlinear_prepack(*dev(w, ws, wz))
        cpu_packed = torch.ops.onednn.qlinear_prepack(w, None)
        row = torch.tensor([[1, 3]], dtype=torch.uint8)  # y = [1, 3], / 2: 0.5 and 1.5, ties
        for oz in (101, 3, 0):
            want = torch.ops.onednn.qlinear_pointwise(
                row, 1.0, 0, cpu_packed, ws, wz, None, 2.0, oz, None, "none", [], ""
            )
            alone = oq.qlinear(row.to("openreg"), 1.0, 0, packed, None, 2.0, oz, None, "none")
            batch = torch.cat([row, torch.tensor([[200, 0]], dtype=torch.uint8)]).to("openreg")
            beside = oq.qlinear(batch, 1.0, 0, packed, None, 2.0, oz, None, "none")[:1]
            signed = oq.qlinear(row.to(torch.int8).to("openreg"), 1.0, 0, packed, None, 2.0, oz, None, "none")
            self.assertEqual(want.tolist(), [[oz + 0, oz + 2]] if oz % 2 == 0 else [[oz + 1, oz + 1]])
            for got in (alone, beside, signed.to(torch.uint8)):
                self.assertEqual(got.cpu(), want, atol=0, rtol=0, msg=f"oz={oz}")
        # the same for a 1x1 convolution, pixel by pixel
        conv = oq.qconv2d_prepack(*dev(w.view(2, 2, 1, 1), ws, wz), 1.0, 0, [1, 1], [0, 0], [1, 1], 1)
        x = torch.tensor([1, 1, 3, 200], dtype=torch.uint8).view(1, 2, 1, 2)  # pixel 0 = the row above
        out = oq.qconv2d(x.to("openreg"), 1.0, 0, conv, None, 2.0, 101, None, "none")
        self.assertEqual(out.cpu()[0, :, 0, 0].tolist(), [102, 102])

    def test_non_contiguous_input(self):
        packed = oq.qlinear_prepack(*dev(*weights(16, 32)))
        xq, xs, xz, _, _ = activations(6, 32)
        column_major = xq.t().contiguous().to("openreg").t()  # same values, transposed layout
        self.assertFalse(column_major.is_contiguous())
        want = oq.qlinear(xq.to("openreg"), xs, xz, packed, None, 1.0, 0, torch.float32, "none")
        got = oq.qlinear(column_major, xs, xz, packed, None, 1.0, 0, torch.float32, "none")
        self.assertEqual(got.cpu(), want.cpu(), atol=0, rtol=0)

    def test_bad_arguments(self):
        w, ws, wz = dev(*weights(8, 16))
        packed = oq.qlinear_prepack(w, ws, wz)
        xq = dev(activations(4, 16)[0])[0]
        cases = [
            (
                lambda: oq.qlinear(xq.float(), 0.1, 0, packed, None, 1.0, 0, None, "none"),
                "openreg_quant::qlinear: x must be uint8 or int8 .quantized activations., got torch.float32",
            ),
            (
                lambda: oq.qlinear(xq, 0.1, 0, packed, None, 1.0, 0, None, "gelu"),
                "post_op must be 'none' or 'relu', got 'gelu'",
            ),
            (
                lambda: oq.qlinear(xq, 0.1, 0, packed, None, 1.0, 0, torch.int32, "none"),
                "output_dtype must be None .quantized output., torch.float32 or torch.bfloat16, got torch.int32",
            ),
            (
                lambda: oq.qlinear(xq[:, :8], 0.1, 0, packed, None, 1.0, 0, None, "none"),
                r"x's last dimension \(8\) must equal in_features \(16\)",
            ),
            (
                lambda: oq.qlinear(xq, 0.1, 0, packed, ws[:4], 1.0, 0, None, "none"),
                r"bias must be float32 with one value per output channel \(8\)",
            ),
            (
                lambda: oq.qlinear(xq, 0.1, 0, packed, ws.cpu(), 1.0, 0, None, "none"),
                r"bias must be on openreg:0 \(the input's device\), got a tensor on cpu",
            ),
            # a packed weight cannot move: the message names the input as the tensor to move
            (
                lambda: oq.qlinear(xq.to("openreg:1"), 0.1, 0, packed, None, 1.0, 0, None, "none"),
                "the input must be on openreg:0, where the packed weight is, got a tensor on openreg:1",
            ),
            (
                lambda: oq.qlinear(xq.cpu(), 0.1, 0, packed, ws, 1.0, 0, None, "none"),
                "openreg_quant::qlinear: the input must be on openreg:0, where the packed weight is, got a tensor on "
                "cpu",
            ),
            (
                # no openreg tensor among the arguments: the ops' CPU kernel is their host checks
                lambda: oq.qlinear(xq.cpu(), 0.1, 0, packed, None, 1.0, 0, None, "none"),
                "openreg_quant::qlinear: the input must be on openreg:0, where the packed weight is, got a tensor on "
                "cpu",
            ),
            # oneDNN's zero points are 32-bit (the exact path's are not: the two would disagree)
            (
                lambda: oq.qlinear(xq, 0.1, 0, packed, None, 1.0, 2**31, None, "none"),
                "openreg_quant::qlinear: output_zero_point must fit in 32 bits, got 2147483648",
            ),
            (
                lambda: oq.qlinear(xq, 0.1, -(2**40), packed, None, 1.0, 0, None, "none"),
                "openreg_quant::qlinear: x_zero_point must fit in 32 bits, got -1099511627776",
            ),
        ]
        for call, message in cases:
            with self.assertRaisesRegex(RuntimeError, message):
                call()

    def test_meta(self):
        packed = oq.qlinear_prepack(*(t.to("meta") for t in weights(8, 16)))
        self.assertEqual(packed.unpack()[0].device.type, "meta")
        x = torch.empty(2, 5, 16, dtype=torch.uint8, device="meta")
        self.assertEqual(oq.qlinear(x, 0.1, 0, packed, None, 1.0, 0, None, "relu").shape, (2, 5, 8))
        self.assertEqual(oq.qlinear(x, 0.1, 0, packed, None, 1.0, 0, torch.float32, "none").dtype, torch.float32)
        with self.assertRaisesRegex(RuntimeError, r"x's last dimension \(4\) must equal in_features \(16\)"):
            oq.qlinear(x[..., :4], 0.1, 0, packed, None, 1.0, 0, None, "none")


class TestQConv2d(TestCase):
    def test_matches_cpu_onednn_and_reference(self):
        for groups, stride, padding, dilation in ((1, 1, 0, 1), (2, 2, 1, 1), (4, 1, 2, 2)):
            w, ws, wz = weights(8, 8 // groups, 3, 3, seed=groups)
            bias = torch.randn(8)
            geo = ([stride] * 2, [padding] * 2, [dilation] * 2, groups)
            for x_dtype in (torch.uint8, torch.int8):
                xq, xs, xz, lo, hi = activations(2, 8, 9, 9, dtype=x_dtype)
                for x in (xq, xq.contiguous(memory_format=torch.channels_last)):
                    for b in (bias, None):
                        for post in ("none", "relu"):
                            for out_dtype, os, oz in outputs(x_dtype):
                                msg = (
                                    f"groups={groups} stride={stride} padding={padding} dilation={dilation} "
                                    f"{x_dtype} bias={b is not None} {post} {out_dtype}"
                                )
                                got = qconv2d(*dev(x, xs, xz, w, ws, wz, b), geo, os, oz, out_dtype, post)
                                want = int8_conv2d(x, xs, xz, w, ws, wz, b, geo, os, oz, out_dtype, post)
                                self.assertEqual(got.dtype, want.dtype, msg=msg)
                                self.assertTrue(got.is_contiguous(memory_format=torch.channels_last), msg)
                                self.assertEqual(got.cpu(), want, atol=0, rtol=0, msg=msg)
                                ref = F.conv2d(
                                    qd.dequantize_per_tensor(x, xs, xz, lo, hi, x_dtype),
                                    qd.dequantize_per_channel(w, ws, wz, 0, -128, 127, torch.int8),
                                    b,
                                    stride,
                                    padding,
                                    dilation,
                                    groups,
                                )
                                ref = F.relu(ref) if post == "relu" else ref
                                if out_dtype is None:
                                    ref = qd.quantize_per_tensor(ref, os, oz, lo, hi, x_dtype)
                                    self.assertLessEqual((got.cpu().int() - ref.int()).abs().max().item(), 1, msg)
                                else:
                                    atol, rtol = (1e-4, 1e-3) if out_dtype == torch.float32 else (0.05, 0.01)
                                    self.assertEqual(got.cpu().float(), ref, atol=atol, rtol=rtol, msg=msg)

    def test_bad_arguments_and_meta(self):
        w, ws, wz = dev(*weights(8, 4, 3, 3))
        packed = oq.qconv2d_prepack(w, ws, wz, 0.1, 0, [1, 1], [0, 0], [1, 1], 1)
        packed_s2 = oq.qconv2d_prepack(w, ws, wz, 0.1, 0, [2, 2], [0, 0], [1, 1], 1)
        x = dev(activations(1, 6, 5, 5)[0])[0]
        cases = [
            (
                lambda: oq.qconv2d(x, 0.1, 0, packed, None, 1.0, 0, None, "none"),
                r"x has 6 channels; weight \[8, 4, 3, 3\] with groups=1 expects 4",
            ),
            (
                lambda: oq.qconv2d(x[:, :4, :2, :2], 0.1, 0, packed, None, 1.0, 0, None, "none"),
                "is larger than the padded input",
            ),
            (
                lambda: oq.qconv2d(x[0, :4], 0.1, 0, packed, None, 1.0, 0, None, "none"),
                r"x must be 4-D \(NCHW\), got 3-D\.",
            ),
            (
                # oneDNN packs a conv weight for the activations' quantization
                lambda: oq.qconv2d(x[:, :4], 0.2, 3, packed, None, 1.0, 0, None, "none"),
                "the weight was packed for activations of scale 0.1 and zero point 0, got 0.2 and 3",
            ),
            (
                lambda: oq.qconv2d(
                    x[:, :4], 0.1, 0, oq.qlinear_prepack(w[:, :, 0, 0], ws, wz), None, 1.0, 0, None, "none"
                ),
                "openreg_quant::qconv2d: weight was packed by openreg_quant::qlinear_prepack; pack it with "
                "openreg_quant::qconv2d_prepack",
            ),
            (
                lambda: oq.qlinear(x[:, :4, 0, 0], 0.1, 0, packed, None, 1.0, 0, None, "none"),
                "openreg_quant::qlinear: weight was packed by openreg_quant::qconv2d_prepack",
            ),
            (
                # 2 - 3 = -1 rows of room: C++'s division by the stride truncated it to an output row
                lambda: oq.qconv2d(x[:, :4, :2, :2], 0.1, 0, packed_s2, None, 1.0, 0, None, "none"),
                r"the kernel \(3 with dilation\) is larger than the padded input",
            ),
            (
                lambda: oq.qconv2d(x[:, :4], 0.1, 0, packed, None, 1.0, -(2**31) - 1, None, "none"),
                "openreg_quant::qconv2d: output_zero_point must fit in 32 bits, got -2147483649",
            ),
            (
                lambda: oq.qconv2d_prepack(w, ws, wz, 0.1, 2**32, [1, 1], [0, 0], [1, 1], 1),
                "openreg_quant::qconv2d_prepack: x_zero_point must fit in 32 bits, got 4294967296",
            ),
        ]
        for call, message in cases:
            with self.assertRaisesRegex(RuntimeError, message):
                call()
        meta = oq.qconv2d_prepack(*(t.to("meta") for t in (w, ws, wz)), 0.1, 0, [2, 2], [1, 1], [1, 1], 1)
        out = oq.qconv2d(
            torch.empty(2, 4, 7, 7, dtype=torch.uint8, device="meta"), 0.1, 0, meta, None, 1.0, 0, None, "none"
        )
        self.assertEqual(out.shape, (2, 8, 4, 4))
        self.assertTrue(out.is_contiguous(memory_format=torch.channels_last))


class TestFakeKernels(TestCase):
    """The fake (and meta) kernels (openreg_quant/fake.py) refuse what the ops refuse, with the same
    messages: torch.export and torch.compile trace with them, so a call they let through exported
    and failed only when run."""

    def _packed(self, device):
        w, ws, wz = (t.to(device) for t in weights(8, 4, 3, 3))
        conv = oq.qconv2d_prepack(w, ws, wz, 0.1, 0, [1, 1], [1, 1], [1, 1], 1)
        return conv, oq.qlinear_prepack(w.reshape(8, 36).contiguous(), ws, wz)

    def test_same_refusals_as_the_ops(self):
        f32 = torch.float32
        # (op, x shape, x_zero_point, bias (shape, dtype), output_zero_point)
        cases = {
            "bias of 5 values": ((5,), f32, 0, 0),
            "bias float16": ((8,), torch.float16, 0, 0),
            "bias 2-D": ((8, 1), f32, 0, 0),
            "output_zero_point 2**40": (None, None, 0, 2**40),
            "x_zero_point -2**33": (None, None, -(2**33), 0),
        }
        for op, shape in (("qlinear", (3, 36)), ("qconv2d", (2, 4, 5, 5))):
            for case, (b_shape, b_dtype, xz, oz) in cases.items():

                def call(device, packed):
                    x = torch.zeros(shape, dtype=torch.uint8, device=device)
                    bias = None if b_shape is None else torch.zeros(b_shape, dtype=b_dtype, device=device)
                    return getattr(oq, op)(x, 0.1, xz, packed[1 if op == "qlinear" else 0], bias, 0.1, oz, None, "none")

                with self.assertRaises(RuntimeError, msg=f"{op} {case}") as real:
                    call("openreg", self._packed("openreg"))
                message = str(real.exception).splitlines()[0]
                self.assertTrue(message.startswith(f"openreg_quant::{op}: "), message)
                with self.assertRaises(RuntimeError, msg=f"{op} {case} on meta") as meta:
                    call("meta", self._packed("meta"))
                self.assertEqual(str(meta.exception).splitlines()[0], message)
        # wrong twice (3-D and another x_scale): the device kernel's first check answers on meta too
        for device in ("openreg", "meta"):
            x = torch.zeros(4, 5, 5, dtype=torch.uint8, device=device)
            with self.assertRaisesRegex(
                RuntimeError, r"^openreg_quant::qconv2d: the weight was packed for activations of scale 0\.1"
            ):
                oq.qconv2d(x, 0.2, 0, self._packed(device)[0], None, 0.1, 0, None, "none")

    def test_export_refuses_what_the_op_refuses(self):
        conv, linear = self._packed("openreg")

        class M(torch.nn.Module):
            def __init__(self, bias):
                super().__init__()
                self.packed, self.bias = linear, bias

            def forward(self, x):
                return oq.qlinear(x, 0.1, 0, self.packed, self.bias, 0.1, 0, None, "none")

        x = torch.zeros(3, 36, dtype=torch.uint8, device="openreg")
        cases = [
            (torch.zeros(5, device="openreg"), x, r"bias must be float32 with one value per output channel \(8\)\."),
            # a packed weight cannot move: the input is named as the tensor to move
            (None, x.cpu(), "the input must be on openreg:0, where the packed weight is, got a tensor on cpu"),
        ]
        for bias, x, message in cases:
            with self.assertRaisesRegex(RuntimeError, "openreg_quant::qlinear: " + message):
                M(bias)(x)
            with self.assertRaisesRegex(RuntimeError, "openreg_quant::qlinear: " + message):
                torch.export.export(M(bias), (x,))


class TestOutputRange(TestCase):
    """output_quant_min/max: a quantized output clamped to a narrower range as the kernel writes it
    (what lower_pt2e gives the ops for a reduce_range quantize), on oneDNN's path and on the exact
    one, equal to the whole-range output clamped."""

    def test_narrower_range_equals_the_clamped_output(self):
        w, ws, wz = dev(*weights(8, 16))
        packed_linear = oq.qlinear_prepack(w, ws, wz)
        cw, cws, cwz = dev(*weights(8, 4, 3, 3, seed=2))
        for x_dtype, (qmin, qmax) in ((torch.uint8, (0, 127)), (torch.uint8, (10, 200)), (torch.int8, (-64, 63))):
            xq, xs, xz, _, _ = activations(6, 16, dtype=x_dtype)
            cx, cxs, cxz, _, _ = activations(2, 4, 7, 7, dtype=x_dtype, seed=3)
            packed_conv = oq.qconv2d_prepack(cw, cws, cwz, cxs, cxz, [1, 1], [1, 1], [1, 1], 1)
            # 7-bit uint8 activations stay on oneDNN where int8 products saturate; 8-bit ones take the
            # exact path there
            for x, cxv in ((xq, cx), (xq.clamp(max=127), cx.clamp(max=127))):
                x, cxv = dev(x, cxv)
                calls = (
                    lambda *r: oq.qlinear(x, xs, xz, packed_linear, None, 0.004, 5, None, "none", *r),
                    lambda *r: oq.qconv2d(cxv, cxs, cxz, packed_conv, None, 0.004, 5, None, "relu", *r),
                )
                for call in calls:
                    whole, narrow = call().cpu(), call(qmin, qmax).cpu()
                    self.assertEqual(narrow, whole.clamp(qmin, qmax), atol=0, rtol=0)
                    self.assertEqual(narrow.dtype, x_dtype)
                    self.assertTrue(bool((whole < qmin).any() or (whole > qmax).any()))  # the clamp acts
                    # one bound alone: the other is the dtype's
                    self.assertEqual(call(None, qmax).cpu(), whole.clamp(max=qmax), atol=0, rtol=0)

    def test_bad_ranges(self):
        w, ws, wz = weights(8, 16)
        for device in ("openreg", "meta"):
            packed = oq.qlinear_prepack(w.to(device), ws.to(device), wz.to(device))
            x = activations(4, 16)[0].to(device)
            cases = [
                (
                    lambda: oq.qlinear(x, 0.1, 0, packed, None, 1.0, 0, torch.float32, "none", 0, 127),
                    "output_quant_min/output_quant_max apply to a quantized output only "
                    r"\(output_dtype None\), got output_dtype torch.float32",
                ),
                (
                    lambda: oq.qlinear(x, 0.1, 0, packed, None, 1.0, 0, None, "none", -1, 127),
                    r"the output range \[-1, 127\] must lie inside torch.uint8's \[0, 255\] with min <= max",
                ),
                (
                    lambda: oq.qlinear(x, 0.1, 0, packed, None, 1.0, 0, None, "none", 100, 50),
                    r"the output range \[100, 50\] must lie inside",
                ),
            ]
            # a float output is not quantized: other output parameters are refused (oneDNN refused
            # them in the kernel and the exact path ignored them: which one ran depended on the values)
            cw, cws, cwz = (t.to(device) for t in weights(8, 16, 1, 1))
            conv = oq.qconv2d_prepack(cw, cws, cwz, 0.1, 0, [1, 1], [0, 0], [1, 1], 1)
            cx = activations(1, 16, 2, 2)[0].to(device)
            for out_dtype in (torch.float32, torch.bfloat16):
                for scale, zp in ((0.37, 0), (1.0, 9)):
                    cases += [
                        (
                            lambda s=scale, z=zp, t=out_dtype: oq.qlinear(x, 0.1, 0, packed, None, s, z, t, "none"),
                            rf"qlinear: a float output \(output_dtype {out_dtype}\) takes output_scale 1.0 and "
                            "output_zero_point 0, got",
                        ),
                        (
                            lambda s=scale, z=zp, t=out_dtype: oq.qconv2d(cx, 0.1, 0, conv, None, s, z, t, "none"),
                            r"qconv2d: a float output .* takes output_scale 1.0 and output_zero_point 0, got",
                        ),
                    ]
            for call, message in cases:
                with self.assertRaisesRegex(RuntimeError, message, msg=device):
                    call()


class TestPackedWeight(TestCase):
    """torch.classes.openreg_quant.PackedWeight, what the prepack ops return."""

    def test_owns_copies_of_its_tensors(self):
        # The object packs device copies: writes to the tensors it was made from, or to what unpack()
        # returns, cannot leave its oneDNN form stale.
        w, ws, wz = symmetric_weights(8, 16)
        xq, xs, xz, _, _ = activations(3, 16)
        x, weight, scales, zps = dev(xq, w, ws, wz)
        packed = oq.qlinear_prepack(weight, scales, zps)
        self.assertEqual(packed.kind(), "qlinear")
        first = oq.qlinear(x, xs, xz, packed, None, 1.0, 0, torch.float32, "none").cpu()
        self.assertEqual(first, cpu_qlinear(xq, xs, xz, w, ws, wz), atol=0, rtol=0)
        with torch.no_grad():
            weight.neg_()
            scales.mul_(2)
        unpacked = packed.unpack()
        for got, source, want in zip(unpacked, (weight, scales, zps), (w, ws, wz)):
            self.assertEqual(got.device, weight.device)
            self.assertNotEqual(got.data_ptr(), source.data_ptr())
            self.assertEqual(got.cpu(), want, atol=0, rtol=0)
        unpacked[0].zero_()
        second = oq.qlinear(x, xs, xz, packed, None, 1.0, 0, torch.float32, "none").cpu()
        self.assertEqual(second, first, atol=0, rtol=0)
        # a weight packed again from the written tensors computes with the new values
        again = oq.qlinear(x, xs, xz, oq.qlinear_prepack(weight, scales, zps), None, 1.0, 0, torch.float32, "none")
        self.assertEqual(again.cpu(), cpu_qlinear(xq, xs, xz, -w, ws * 2, wz), atol=0, rtol=0)

    def test_device_memory_is_freed_with_it(self):
        w, ws, wz = dev(*weights(64, 128))
        torch.openreg.synchronize()
        before = torch.openreg.memory_allocated()
        packed = oq.qconv2d_prepack(w.view(64, 8, 4, 4), ws, wz, 0.03, 128, [1, 1], [0, 0], [1, 1], 2)
        torch.openreg.synchronize()
        self.assertGreaterEqual(torch.openreg.memory_allocated() - before, w.numel() + ws.numel() * 4 + wz.numel() * 8)
        del packed
        self.assertEqual(torch.openreg.memory_allocated(), before)

    def test_dropped_while_a_kernel_of_another_stream_is_queued(self):
        # Its tensors are private (the caller cannot record_stream them): a call on another stream
        # records that stream for them, so dropping the object while the call's kernel is queued
        # does not hand their memory to new tensors of the stream they were made on.
        w, ws, wz = weights(8, 16)
        xq = torch.randint(0, 256, (3, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
        x4 = xq.view(3, 16, 1, 1)
        calls = {
            "qlinear": (
                lambda: oq.qlinear_prepack(*dev(w, ws, wz)),
                lambda x, p: oq.qlinear(x, 0.03, 64, p, None, 1.0, 0, torch.float32, "none"),
                xq,
            ),
            "qconv2d": (
                lambda: oq.qconv2d_prepack(*dev(w.view(8, 16, 1, 1), ws, wz), 0.03, 64, [1, 1], [0, 0], [1, 1], 1),
                lambda x, p: oq.qconv2d(x, 0.03, 64, p, None, 1.0, 0, torch.float32, "none"),
                x4,
            ),
        }
        for name, (prepack, call, x) in calls.items():
            packed = prepack()
            want = call(x.to("openreg"), packed).cpu()
            side, x = torch.openreg.Stream(), x.to("openreg")
            with torch.openreg.stream(side), StreamHold() as held:
                got = call(x, packed)  # queued on the held side stream
                del packed
                with torch.openreg.stream(torch.openreg.default_stream()):
                    # New tensors on the stream the weight was made on, written there at once.
                    junk = [torch.full((n,), 1e6, device="openreg") for n in (2, 8, 8, 32, 128) for _ in range(4)]
                    junk += [torch.full((n,), 100, dtype=torch.int8, device="openreg") for n in (128, 128, 512)]
                    torch.openreg.current_stream().synchronize()
                self.assertFalse(held.stream.query())  # the call has not run yet
            side.synchronize()
            self.assertEqual(got.cpu(), want, atol=0, rtol=0, msg=name)
            del junk

    def test_a_call_racing_its_prepack_does_not_spoil_later_calls(self):
        # A call on another stream that runs before the prepack's kernel (a missing wait_stream) reads
        # a weight not copied yet: that call is wrong, as a racing read of any tensor is, but the
        # oneDNN form it made was kept, and every later, ordered call used it.
        w, ws, wz = symmetric_weights(8, 16)
        xq, xs, xz, _, _ = activations(4, 16)
        x, weight, scales, zps = dev(xq, w, ws, wz)
        want = cpu_qlinear(xq, xs, xz, w, ws, wz)
        side = torch.openreg.Stream()
        with torch.openreg.stream(side), StreamHold():
            packed = oq.qlinear_prepack(weight, scales, zps)  # queued behind the hold
            with torch.openreg.stream(torch.openreg.default_stream()):
                oq.qlinear(x, xs, xz, packed, None, 1.0, 0, torch.float32, "none").cpu()  # the racing call
        side.synchronize()
        for _ in range(2):
            got = oq.qlinear(x, xs, xz, packed, None, 1.0, 0, torch.float32, "none")
            self.assertEqual(got.cpu(), want, atol=0, rtol=0)

    def test_a_cpu_weight_is_named(self):
        # The prepacks' CPU kernels reach the host check: it named the scales' device as the culprit,
        # and with everything on the CPU the dispatcher said "Could not run ... 'CPU' backend".
        w, ws, wz = symmetric_weights(8, 16)
        conv = (w.view(8, 16, 1, 1), ws, wz, 0.03, 128, [1, 1], [0, 0], [1, 1], 1)
        for name, call in (
            ("qlinear_prepack", lambda *a: oq.qlinear_prepack(*a)),
            ("qconv2d_prepack", lambda *a: oq.qconv2d_prepack(*a, *conv[3:])),
        ):
            args = (w, ws, wz) if name == "qlinear_prepack" else conv[:3]
            for params_on_openreg in (False, True):
                params = dev(*args[1:]) if params_on_openreg else args[1:]
                with self.assertRaisesRegex(
                    RuntimeError, f"openreg_quant::{name}: the weight must be on openreg, got a tensor on cpu"
                ):
                    call(args[0], *params)

    def test_pickle_and_deepcopy(self):
        w, ws, wz = dev(*weights(8, 4, 3, 3))
        x = dev(activations(2, 4, 6, 6)[0])[0]
        geo = ([2, 2], [1, 1], [1, 1], 1)
        packed = oq.qconv2d_prepack(w, ws, wz, 0.03, 128, *geo)
        want = oq.qconv2d(x, 0.03, 128, packed, None, 0.05, 100, None, "relu").cpu()
        buffer = io.BytesIO()
        torch.save(packed, buffer)
        buffer.seek(0)
        for copied in (copy.deepcopy(packed), torch.load(buffer, weights_only=False)):
            self.assertEqual(copied.kind(), "qconv2d")
            for got, original in zip(copied.unpack(), packed.unpack()):
                self.assertEqual(got.device, original.device)
                self.assertEqual(got.cpu(), original.cpu(), atol=0, rtol=0)
            # the geometry and the activations' qparams come along: the same call gives the same result
            got = oq.qconv2d(x, 0.03, 128, copied, None, 0.05, 100, None, "relu")
            self.assertEqual(got.cpu(), want, atol=0, rtol=0)
            with self.assertRaisesRegex(RuntimeError, "packed for activations of scale 0.03 and zero point 128"):
                oq.qconv2d(x, 0.03, 0, copied, None, 0.05, 100, None, "relu")

    def test_bad_arguments(self):
        w, ws, wz = dev(*weights(8, 16))
        cw, cs, cz = dev(*weights(8, 4, 3, 3))
        geo = ([1, 1], [0, 0], [1, 1], 1)
        linear = "openreg_quant::qlinear_prepack: "
        conv = "openreg_quant::qconv2d_prepack: "
        cases = [
            (lambda: oq.qlinear_prepack(w.to(torch.uint8), ws, wz), linear + "weight must be int8, got torch.uint8"),
            (
                lambda: oq.qlinear_prepack(w[None], ws, wz),
                linear + r"weight must be 2-D \[out_features, in_features\], got 3-D",
            ),
            (
                lambda: oq.qlinear_prepack(w, ws[:4], wz),
                linear
                + r"w_scales must be float32 with one value per output channel \(8\), got torch.float32 of shape \[4\]",
            ),
            (
                lambda: oq.qlinear_prepack(w, ws, wz.int()),
                linear + r"w_zero_points must be int64 with one value per output channel \(8\), "
                r"got torch.int32 of shape \[8\]\.",
            ),
            (
                lambda: oq.qlinear_prepack(w, ws, wz[:, None]),
                r"w_zero_points must be int64 with one value per output channel \(8\), "
                r"got torch.int64 of shape \[8, 1\]\.",
            ),
            (
                lambda: oq.qlinear_prepack(w, ws.cpu(), wz),
                linear + r"w_scales must be on openreg:0 \(the input's device\), got a tensor on cpu",
            ),
            (
                # K = 0: oneDNN has no empty reduction (the CPU's qlinear_pointwise dies with SIGFPE)
                lambda: oq.qlinear_prepack(w[:, :0], ws, wz),
                linear + r"in_features must be at least 1, got weight of shape \[8, 0\]\.",
            ),
            (lambda: oq.qconv2d_prepack(cw[0], cs, cz, 0.1, 0, *geo), conv + r"weight must be 4-D \[out_channels,"),
            (
                # no input channel (the CPU's qconv_prepack: "could not create a primitive descriptor")
                lambda: oq.qconv2d_prepack(cw[:, :0], cs, cz, 0.1, 0, *geo),
                conv + r"weight must have at least one output channel, one input channel per group and a non-empty "
                r"kernel, got weight of shape \[8, 0, 3, 3\]\.",
            ),
            (
                # no output channel: the pack failed in oneDNN, reported by the next synchronising call
                lambda: oq.qconv2d_prepack(cw[:0], cs[:0], cz[:0], 0.1, 0, *geo),
                r"at least one output channel(.|\n)*, got weight of shape \[0, 4, 3, 3\]\.",
            ),
            (
                lambda: oq.qconv2d_prepack(cw[:, :, :0], cs, cz, 0.1, 0, *geo),
                r"a non-empty kernel, got weight of shape \[8, 4, 0, 3\]\.",
            ),
            (
                lambda: oq.qconv2d_prepack(cw, cs, cz, 0.1, 0, [1], [0, 0], [1, 1], 1),
                conv + "stride, padding and dilation must have two values each",
            ),
            (
                lambda: oq.qconv2d_prepack(cw, cs, cz, 0.1, 0, [0, 1], [0, 0], [1, 1], 1),
                conv + r"stride and dilation must be at least 1 and padding at least 0, got stride \[0, 1\]",
            ),
            (
                lambda: oq.qconv2d_prepack(cw, cs, cz, 0.1, 0, [1, 1], [0, 0], [1, 1], 3),
                conv + r"groups \(3\) must be at least 1 and divide the output channels \(8\)",
            ),
        ]
        for call, message in cases:
            with self.assertRaisesRegex(RuntimeError, message):
                call()
        # the same checks on the meta device
        with self.assertRaisesRegex(RuntimeError, linear + "in_features must be at least 1"):
            oq.qlinear_prepack(*(t.to("meta") for t in (w[:, :0], ws, wz)))
        # a CPU weight is not packed for openreg (see test_a_cpu_weight_is_named)
        with self.assertRaisesRegex(RuntimeError, linear + "the weight must be on openreg, got a tensor on cpu"):
            oq.qlinear_prepack(w.cpu(), ws.cpu(), wz.cpu())

    def test_non_zero_zero_points_fail_in_the_kernel(self):
        # Symmetric weights only. The zero points are in device memory: the prepack's kernel checks
        # them (the host never waits) and the next synchronising call reports the failure; every
        # kernel that uses the weight fails the same way.
        w, ws, wz = dev(*weights(8, 16))
        xq = dev(activations(4, 16)[0])[0]
        packed = oq.qlinear_prepack(w, ws, wz + 3)
        with self.assertRaisesRegex(
            RuntimeError, "openreg_quant::qlinear_prepack: w_zero_points must be all zero: the op takes symmetric"
        ):
            torch.openreg.synchronize()
        oq.qlinear(xq, 0.03, 128, packed, None, 1.0, 0, torch.float32, "none")
        with self.assertRaisesRegex(RuntimeError, "openreg_quant::qlinear: w_zero_points must be all zero"):
            torch.openreg.synchronize()
        cw, cs, cz = dev(*weights(8, 4, 3, 3))
        oq.qconv2d_prepack(cw, cs, cz - 1, 0.03, 128, [1, 1], [0, 0], [1, 1], 1)
        with self.assertRaisesRegex(RuntimeError, "openreg_quant::qconv2d_prepack: w_zero_points must be all zero"):
            torch.openreg.synchronize()
        want = cpu_qlinear(xq.cpu(), 0.03, 128, w.cpu(), ws.cpu(), wz.cpu())
        got = qlinear(xq, 0.03, 128, w, ws, wz, None, 1.0, 0, torch.float32, "none")
        self.assertEqual(got.cpu(), want, atol=0, rtol=0)


class TestNativeAndAsynchronous(TestCase):
    def test_one_native_launch_no_host_copy_no_wait(self):
        w, ws, wz = dev(*weights(8, 16))
        cw, cs, cz = dev(*weights(8, 4, 3, 3))
        xq = dev(activations(4, 16)[0])[0]
        xc = dev(activations(1, 4, 6, 6)[0])[0]
        geo = ([1, 1], [1, 1], [1, 1], 1)
        linear, conv = oq.qlinear_prepack(w, ws, wz), oq.qconv2d_prepack(cw, cs, cz, 0.03, 128, *geo)
        calls = [  # (call, kernels it launches)
            (lambda: oq.qlinear(xq, 0.03, 128, linear, None, 0.05, 100, None, "relu"), 1),
            (lambda: oq.qconv2d(xc, 0.03, 128, conv, None, 1.0, 0, torch.float32, "none"), 1),
            # the prepacks: three copies (weight, scales, zero points) and the packing
            (lambda: oq.qlinear_prepack(w, ws, wz), 4),
            (lambda: oq.qconv2d_prepack(cw, cs, cz, 0.03, 128, *geo), 4),
        ]
        for call, _ in calls:
            call()
        torch.openreg.synchronize()
        torch.openreg.reset_fallback_op_counts()
        torch.openreg.set_strict_mode(True)
        try:
            for call, kernels in calls:
                before = torch.openreg._runtime_counters()
                call()
                after = torch.openreg._runtime_counters()
                launched = after["kernels_launched"] - before["kernels_launched"]
                launched += after["memcpy_d2d"] - before["memcpy_d2d"]
                self.assertEqual(launched, kernels)
                self.assertEqual(after["memcpy_d2h"] - before["memcpy_d2h"], 0)
            self.assertEqual(torch.openreg.fallback_op_counts(), {})
        finally:
            torch.openreg.set_strict_mode(False)
        with StreamHold() as held:  # the device is busy until released
            results = [call() for call, _ in calls]
            busy = not held.stream.query()
        self.assertTrue(busy, "a call waited for the device")
        torch.openreg.synchronize()
        self.assertEqual(len(results), 4)
