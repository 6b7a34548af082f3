"""Quantized tensors on openreg, core's part (csrc/aten/OpenRegQuantized.cpp): allocation in device
memory, copies to and from the CPU and between devices, views, metadata, torch.save/torch.load; every
operator without a kernel raises an error naming it. Values are checked on the CPU side (.cpu()),
so these tests hold with or without openreg-quant, which provides the kernels that compute."""

import copy
import io

import torch
from conftest import run_python
from torch.testing._internal.common_utils import TestCase, run_tests
from torch_openreg.utils.testing import assert_same_quantization

DOCS = "docs/mechanisms/quantization.md"


def cpu_qtensors():
    """CPU quantized tensors of each dtype and scheme (per-channel along two axes)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 5, generator=g) * 3
    out = {}
    for dtype, zp in ((torch.quint8, 120), (torch.qint8, -3), (torch.qint32, 7)):
        out[f"{dtype}"] = torch.quantize_per_tensor(x, 0.05, zp, dtype)
    for axis in (0, 2):
        n = x.shape[axis]
        scales = torch.linspace(0.02, 0.09, n, dtype=torch.float64)
        zps = torch.arange(n, dtype=torch.long) - 2
        out[f"per_channel_axis{axis}"] = torch.quantize_per_channel(x, scales, zps, axis, torch.qint8)
    return out


class QTestCase(TestCase):
    def assertSameQ(self, got: torch.Tensor, want: torch.Tensor, msg=None):
        """Two quantized tensors with the same dtype, scheme, parameters, geometry and integer values."""
        assert_same_quantization(self, got, want, msg)
        g = got.cpu() if got.device.type != "cpu" else got
        self.assertTrue(torch.equal(g.int_repr(), want.cpu().int_repr()), msg)


class TestQuantizedStorage(QTestCase):
    def test_to_openreg_and_back(self):
        for name, q in cpu_qtensors().items():
            d = q.to("openreg")
            self.assertEqual(d.device, torch.device("openreg", 0), name)
            self.assertTrue(d.is_quantized, name)
            self.assertSameQ(d, q, name)  # metadata on the device, values through .cpu()
            back = d.cpu()
            self.assertEqual(back.device.type, "cpu")
            self.assertSameQ(back, q, name)
            other = d.to("openreg:1")  # device to device
            self.assertEqual(other.device, torch.device("openreg", 1))
            self.assertSameQ(other, q, name)

    def test_views_share_storage_and_match_the_cpu(self):
        q = cpu_qtensors()["torch.quint8"]
        d = q.to("openreg")
        views = {
            "select": lambda t: t[1],
            "slice": lambda t: t[:, 1:4],
            "step": lambda t: t[..., ::2],
            "transpose": lambda t: t.transpose(0, 2),
            "permute": lambda t: t.permute(2, 0, 1),
            "view": lambda t: t.view(4, 30),
            "reshape": lambda t: t.reshape(-1),
            "unsqueeze": lambda t: t.unsqueeze(1),
            "narrow": lambda t: t.narrow(1, 2, 3),
            "unbind": lambda t: t.unbind(2)[3],
            "expand": lambda t: t[:1].expand(3, 6, 5),
        }
        for name, f in views.items():
            v = f(d)
            self.assertEqual(v.untyped_storage().data_ptr(), d.untyped_storage().data_ptr(), name)
            self.assertSameQ(v, f(q), name)
            self.assertSameQ(f(q).to("openreg"), f(q).contiguous(), name)  # to the device, dense or not

    def test_per_channel_views_slice_their_parameters(self):
        q = cpu_qtensors()["per_channel_axis0"]
        d = q.to("openreg")
        for name, f in {"rows": lambda t: t[1:3], "other dim": lambda t: t[:, 2], "one row": lambda t: t[2]}.items():
            self.assertSameQ(f(d), f(q), name)
        # setting strides needs one scale for the tensor, on the CPU and here
        with self.assertRaisesRegex(RuntimeError, "Setting strides is possible only on uniformly quantized tensor"):
            q.transpose(0, 1)
        with self.assertRaisesRegex(RuntimeError, "Setting strides is possible only on uniformly quantized tensor"):
            d.transpose(0, 1)

    def test_per_channel_squeeze_unsqueeze_unfold_and_empty_like_as_the_cpu(self):
        # The CPU's own kernels for these move a per-channel quantizer's axis (the composite path
        # refused: "Setting strides is possible only on uniformly quantized tensor"); empty_like
        # takes the source's quantizer (it called empty_strided, which refused).
        views = {
            "unsqueeze": lambda t: t.unsqueeze(0),
            "unsqueeze last": lambda t: t.unsqueeze(-1),
            "squeeze dim": lambda t: t[:1].squeeze(0),
            "squeeze": lambda t: t[:, :1].squeeze(),
            "squeeze dims": lambda t: t[:1, :, :1].squeeze((0, 2)),
            "unfold": lambda t: t.unfold(2, 2, 1),
        }
        for qname, q in cpu_qtensors().items():
            d = q.to("openreg")
            for name, f in views.items():
                if name == "unfold" and q.qscheme() != torch.per_tensor_affine:
                    with self.assertRaisesRegex(RuntimeError, "Setting strides is possible only on uniformly"):
                        f(q)
                    with self.assertRaisesRegex(RuntimeError, "Setting strides is possible only on uniformly"):
                        f(d)
                    continue
                v, want = f(d), f(q)
                self.assertEqual(v.untyped_storage().data_ptr(), d.untyped_storage().data_ptr(), (qname, name))
                self.assertSameQ(v, want, (qname, name))
            e, want = torch.empty_like(d), torch.empty_like(q)
            self.assertEqual(e.device, d.device)
            assert_same_quantization(self, e, want, qname)
            self.assertSameQ(torch.empty_like(d).copy_(d), q, qname)

    def test_clone_contiguous_and_copy(self):
        for name, q in cpu_qtensors().items():
            d = q.to("openreg")
            self.assertSameQ(d.clone(), q.clone(), name)
            if q.qscheme() == torch.per_tensor_affine:
                t, td = q.transpose(0, 1), d.transpose(0, 1)
                self.assertSameQ(td.contiguous(), t.contiguous(), name)
                self.assertSameQ(td.clone(), t.clone(), name)
                self.assertSameQ(td.cpu(), t.contiguous(), name)  # .cpu() of a dense view: contiguous, as on CUDA
                self.assertSameQ(d[..., ::2].cpu(), q[..., ::2].contiguous(), name)  # not dense
            # copy_ between quantized tensors: values and the source's quantizer, as on the CPU
            dst_cpu = torch.empty_like(q)
            dst = dst_cpu.to("openreg")
            dst_cpu.copy_(q)
            dst.copy_(q)
            self.assertSameQ(dst, dst_cpu, name)

    def test_metadata_and_empty(self):
        d = torch.quantize_per_tensor(torch.randn(3), 0.25, 9, torch.quint8).to("openreg")
        self.assertEqual((d.q_scale(), d.q_zero_point(), d.qscheme()), (0.25, 9, torch.per_tensor_affine))
        e = torch._empty_affine_quantized([2, 3], scale=0.5, zero_point=4, dtype=torch.qint8, device="openreg")
        self.assertEqual((e.device.type, e.shape, e.dtype, e.q_scale()), ("openreg", (2, 3), torch.qint8, 0.5))
        u = torch.empty(2, 3, dtype=torch.qint8, device="openreg")
        self.assertEqual((u.device.type, u.dtype, u.is_quantized), ("openreg", torch.qint8, True))
        self.assertGreater(torch.openreg.memory_allocated(), 0)

    def test_copy_errors(self):
        d = torch.quantize_per_tensor(torch.randn(3), 0.25, 9, torch.quint8).to("openreg")
        with self.assertRaisesRegex(
            RuntimeError, "Copying from quantized Tensor to non-quantized Tensor is not allowed"
        ):
            torch.empty(3, device="openreg").copy_(d)
        with self.assertRaisesRegex(NotImplementedError, "copying a non-quantized tensor into a quantized openreg:0"):
            d.copy_(torch.randn(3))
        sub_byte = torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.quint4x2)
        with self.assertRaisesRegex(NotImplementedError, "sub-byte dtype QUInt4x2 are not supported on openreg"):
            sub_byte.to("openreg")

    def test_save_and_load(self):
        qs = cpu_qtensors()
        payload = {k: v.to("openreg") for k, v in qs.items()}
        payload["view"] = payload["torch.qint8"][1:, 2:]
        reference = dict(qs, view=qs["torch.qint8"][1:, 2:])
        buf = io.BytesIO()
        torch.save(payload, buf)
        for map_location in (None, "cpu"):
            buf.seek(0)
            loaded = torch.load(buf, map_location=map_location)  # weights_only, the default
            for k, v in payload.items():
                self.assertEqual(loaded[k].device, v.device if map_location is None else torch.device("cpu"), k)
                self.assertEqual(loaded[k].storage_offset(), v.storage_offset(), k)
                self.assertSameQ(loaded[k], reference[k], k)
        buf.seek(0)
        loaded = torch.load(buf)
        self.assertEqual(
            loaded["view"].untyped_storage().data_ptr(), loaded["torch.qint8"].untyped_storage().data_ptr()
        )
        dup = copy.deepcopy(payload["per_channel_axis2"])
        self.assertNotEqual(dup.untyped_storage().data_ptr(), payload["per_channel_axis2"].untyped_storage().data_ptr())
        self.assertSameQ(dup, qs["per_channel_axis2"])


class TestQuantizedErrors(TestCase):
    def test_operators_without_a_kernel_name_themselves(self):
        d = torch.quantize_per_tensor(torch.randn(3), 0.25, 9, torch.quint8).to("openreg")
        for call, op in (
            (lambda: torch.ops.quantized.add(d, d, 0.1, 0), "quantized::add"),
            (lambda: d.resize_(5), "aten::resize_"),
            (lambda: torch.cat([d, d]), "aten::cat.out"),  # cat's composite kernel calls cat.out
        ):
            with self.assertRaisesRegex(
                NotImplementedError,
                f"{op}: openreg has no kernel for this operator on quantized tensors \\(QUInt8\\).*{DOCS}",
            ):
                call()
        x = torch.ones(3, device="openreg")
        self.assertEqual((x + 1).cpu(), torch.full((3,), 2.0))  # the device keeps working

    def test_operators_whose_composite_kernel_would_fail_inside_name_themselves(self):
        # Their composite kernels ran first and failed with upstream messages about something
        # else ("empty_strided not supported on quantized tensors", "mean(): could not infer
        # output dtype", "promoteTypes with quantized numbers"). The CPU computes each.
        cpu = torch.quantize_per_tensor(torch.randn(2, 3), 0.25, 9, torch.quint8)
        d = cpu.to("openreg")
        for call, op in (
            (lambda t: t.sort(), "aten::sort"),
            (lambda t: torch.sort(t, stable=True), "aten::sort.stable"),
            (lambda t: t.mean(), "aten::mean"),
            (lambda t: t.mean(1), "aten::mean.dim"),
            (lambda t: t == 0.5, "aten::eq.Scalar"),
            (lambda t: t != 0.5, "aten::ne.Scalar"),
            (lambda t: t < 0.5, "aten::lt.Scalar"),
            (lambda t: t <= 0.5, "aten::le.Scalar"),
            (lambda t: t > 0.5, "aten::gt.Scalar"),
            (lambda t: t >= 0.5, "aten::ge.Scalar"),
        ):
            call(cpu)
            with self.assertRaisesRegex(
                NotImplementedError,
                f"^{op}: openreg has no kernel for this operator on quantized tensors \\(QUInt8\\)",
            ):
                call(d)

    def test_without_the_plugin(self):
        # Only core: quantizing takes the generic path, which never makes a quantized result; a
        # quantized tensor moved to openreg has no kernel to compute with.
        r = run_python(
            """
            import torch
            x = torch.randn(4, device="openreg")
            msgs = []
            for call in (lambda: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8),
                         lambda: torch.quantize_per_tensor(x.cpu(), 0.1, 0, torch.quint8).to("openreg").dequantize()):
                try:
                    call()
                except NotImplementedError as e:
                    msgs.append(str(e).splitlines()[0])
            print("\\n".join(msgs))
            print((x + 1).cpu().equal(x.cpu() + 1))
            """,
            env={"OPENREG_PLUGINS": "none"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.strip().splitlines()
        self.assertEqual(len(lines), 3, r.stdout)
        for line, op, dtype in zip(lines, ("aten::quantize_per_tensor", "aten::dequantize.self"), ("QInt8", "QUInt8")):
            self.assertTrue(
                line.startswith(f"{op}: openreg has no kernel for this operator on quantized tensors ({dtype})."), line
            )
            self.assertIn("the openreg-quant plugin, which is not loaded", line)
            self.assertIn(DOCS, line)
        self.assertEqual(lines[2], "True")


if __name__ == "__main__":
    run_tests()
