"""Nested tensors (torch.nested, strided layout) on openreg: the nested path runs the CPU's nested
kernels on the device (csrc/aten/OpenRegNested.cpp). Every result is compared with the same call
on CPU nested tensors."""

import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase, run_tests

warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")


def parts():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 4, generator=g), torch.randn(3, 4, generator=g)]


def nested(device):
    return torch.nested.nested_tensor(parts(), device=device)


def padded(t):
    return torch.nested.to_padded_tensor(t, 0.0).cpu()


class TestMoves(TestCase):
    def test_construction_and_round_trips(self):
        on_device = nested("openreg")
        self.assertTrue(on_device.is_nested)
        self.assertEqual(on_device.device, torch.device("openreg", 0))
        back = on_device.cpu()
        self.assertEqual((back.is_nested, back.device.type), (True, "cpu"))
        for got, want in zip(back.unbind(), parts(), strict=True):
            self.assertEqual(got, want)
        moved = nested("cpu").to("openreg:1")  # a CPU nested tensor to the device asked for
        self.assertEqual(moved.device, torch.device("openreg", 1))
        self.assertEqual(padded(moved), padded(nested("cpu")))

    def test_moves_and_copies_between_devices_go_where_asked(self):
        # On the nested path the result stayed on its source's device, and copy_ between two devices
        # was refused as a mix of devices; CUDA registers ATen's device-generic functions for them.
        x = nested("openreg:0")
        for target in ("openreg:1", "cpu"):
            moved = x.to(target)
            self.assertEqual(moved.device, torch.device(target))
            self.assertEqual(padded(moved), padded(nested("cpu")))
            self.assertEqual(torch.empty_like(x, device=target).device, torch.device(target))
            for like in (torch.ones_like, torch.zeros_like):
                made = like(x, device=target)
                self.assertEqual(made.device, torch.device(target), msg=like.__name__)
                self.assertEqual(padded(made), padded(like(nested("cpu"))), msg=like.__name__)
        self.assertEqual(x.to("openreg:1", torch.float64).dtype, torch.float64)
        with torch.openreg.device(1):
            self.assertEqual(x.to("openreg").device, torch.device("openreg", 1))
        with self.assertRaisesRegex(RuntimeError, "Invalid openreg device index 7"):
            x.to("openreg:7")
        for dst, src in (("openreg:1", "openreg:0"), ("openreg:0", "cpu"), ("cpu", "openreg:0")):
            target = torch.nested.nested_tensor([torch.zeros(2, 4), torch.zeros(3, 4)], device=dst)
            target.copy_(nested(src))
            self.assertEqual(padded(target), padded(nested("cpu")), msg=f"{src} -> {dst}")

    def test_save_and_load(self):
        import io

        buffer = io.BytesIO()
        torch.save(nested("openreg:1"), buffer)
        buffer.seek(0)
        loaded = torch.load(buffer)
        self.assertEqual((loaded.is_nested, loaded.device), (True, torch.device("openreg", 1)))
        self.assertEqual(padded(loaded), padded(nested("cpu")))

    def test_metadata_stays_on_the_host(self):
        # As on CUDA: sizes, strides and offsets are CPU tensors, read without a kernel.
        t = nested("openreg")
        self.assertEqual(t._nested_tensor_size().device.type, "cpu")
        self.assertEqual(t._nested_tensor_size(), torch.tensor([[2, 4], [3, 4]]))
        self.assertEqual(t._nested_tensor_strides(), torch.tensor([[4, 1], [4, 1]]))
        self.assertEqual(t._nested_tensor_storage_offsets(), torch.tensor([0, 8]))

    def test_printing(self):
        text = str(nested("openreg"))
        self.assertTrue(text.startswith("nested_tensor(["), text)
        self.assertIn("device='openreg:0'", text)


class TestOperators(TestCase):
    def check(self, fn):
        want = fn(nested("cpu"), "cpu")
        got = fn(nested("openreg"), "openreg")
        if want.is_nested:
            self.assertTrue(got.is_nested)
            self.assertEqual(got.device.type, "openreg")
            want, got = padded(want), padded(got)
        self.assertEqual(got.cpu(), want)

    def test_elementwise_and_reductions(self):
        self.check(lambda t, d: t.sin())
        self.check(lambda t, d: t + t * 3)
        self.check(lambda t, d: F.gelu(t))
        self.check(lambda t, d: F.softmax(t, -1))
        self.check(lambda t, d: t.sum(-1, keepdim=True))

    def test_matmul_linear_bmm(self):
        # linear and matmul have composite kernels that would outrank the nested fallback: routed by name.
        w = torch.randn(5, 4)
        self.check(lambda t, d: F.linear(t, w.to(d)))
        self.check(lambda t, d: torch.matmul(t, t.transpose(-1, -2)))
        self.check(lambda t, d: t.bmm(t.transpose(1, 2)))

    def test_in_place_and_views(self):
        self.check(lambda t, d: t.mul_(2).relu_())
        self.check(lambda t, d: t.transpose(1, 2).contiguous())
        self.check(lambda t, d: t[1])
        t = nested("openreg")
        first, second = t.unbind()  # views of the nested tensor's device storage
        self.assertEqual(first.device.type, "openreg")
        second.fill_(7.0)
        self.assertEqual(t.unbind()[1].cpu(), torch.full((3, 4), 7.0))
        self.assertEqual(t.unbind()[0].cpu(), parts()[0])

    def test_view_of_a_dense_buffer_shares_it(self):
        buffer = torch.arange(10.0, device="openreg")
        view = torch._nested_view_from_buffer(
            buffer, torch.tensor([[2], [3]]), torch.tensor([[1], [1]]), torch.tensor([0, 4])
        )
        self.assertEqual([v.cpu().tolist() for v in view.unbind()], [[0.0, 1.0], [4.0, 5.0, 6.0]])
        buffer.add_(100)
        self.assertEqual([v.cpu().tolist() for v in view.unbind()], [[100.0, 101.0], [104.0, 105.0, 106.0]])

    def test_autograd(self):
        grads = {}
        for d in ("cpu", "openreg"):
            x = nested(d).requires_grad_()
            torch.nested.to_padded_tensor(x.sin() * 2, 0.0).sum().backward()
            grads[d] = padded(x.grad)
        self.assertEqual(grads["openreg"], grads["cpu"])

    def test_dropout_draws_from_the_openreg_generator(self):
        # On the nested path the CPU's nested dropout ran on the device and drew its mask from the
        # CPU's global generator (native_dropout has no generator argument to substitute).
        x = torch.nested.nested_tensor([torch.ones(40), torch.ones(30)], device="openreg")
        masks = []
        for cpu_seed, openreg_seed in ((0, 1), (5, 1), (0, 2)):
            torch.manual_seed(cpu_seed)
            cpu_state = torch.get_rng_state()
            torch.openreg.manual_seed(openreg_seed)
            out, mask = torch.native_dropout(x, 0.5, True)
            self.assertTrue(out.is_nested and mask.is_nested and out.device == x.device)
            torch.openreg.synchronize()
            self.assertEqual(torch.get_rng_state(), cpu_state)  # the host's stream is left alone
            masks.append(torch.cat(mask.cpu().unbind()))
            self.assertEqual(torch.cat(out.cpu().unbind()), masks[-1].float() * 2)
        self.assertEqual(masks[0], masks[1])  # the CPU's seed does not decide it
        self.assertNotEqual(masks[0], masks[2])  # openreg's does
        self.assertEqual(torch.cat(F.dropout(x, 0.5, training=False).cpu().unbind()), torch.ones(70))
        empty = torch.nested.nested_tensor([torch.ones(0), torch.ones(0)], device="openreg")
        self.assertEqual([t.numel() for t in F.dropout(empty, 0.5).cpu().unbind()], [0, 0])

    def test_unsupported_operator_names_itself(self):
        with self.assertRaisesRegex(
            NotImplementedError, "'aten::cumsum' is not supported for nested tensors on openreg: openreg runs the CPU"
        ):
            nested("openreg").cumsum(-1)


class TestTransformerFastPath(TestCase):
    def test_encoder_inference_with_padding_mask(self):
        """nn.TransformerEncoder's inference fast path: _nested_tensor_from_mask (dense arguments, nested
        result), the fused encoder layer on nested tensors, to_padded_tensor. It failed with
        "NestedTensorImpl doesn't support sizes"."""
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        cpu_model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
        model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).to("openreg").eval()
        model.load_state_dict(cpu_model.state_dict())
        src = torch.randn(2, 5, 8)
        mask = torch.tensor([[False] * 5, [False, False, False, True, True]])
        torch.openreg.reset_fallback_op_counts()
        with torch.no_grad():
            want = cpu_model(src, src_key_padding_mask=mask)
            got = model(src.to("openreg"), src_key_padding_mask=mask.to("openreg"))
        self.assertEqual(got.cpu(), want, atol=1e-5, rtol=1e-5)
        counts = torch.openreg.fallback_op_counts()
        self.assertEqual(counts.get("aten::_nested_tensor_from_mask"), 1)  # the fast path ran
        self.assertEqual(counts.get("aten::_transformer_encoder_layer_fwd"), 2)

    def test_encoder_layer_inference_on_dense_input_runs_on_the_host(self):
        """Without a padding mask the fused layer gets dense tensors: ATen's device-generic composite
        runs on the host over openreg's operators (as on CPU and CUDA), so an autocast region reaches
        them (docs/mechanisms/amp.md); it was one generic-path kernel for the whole layer."""
        torch.manual_seed(0)
        for norm_first in (False, True):
            cpu_layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, norm_first=norm_first).eval()
            layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, norm_first=norm_first).to("openreg").eval()
            layer.load_state_dict(cpu_layer.state_dict())
            src = torch.randn(3, 5, 8)
            torch.openreg.reset_fallback_op_counts()
            with torch.no_grad():
                want = cpu_layer(src)
                got = layer(src.to("openreg"))
            self.assertEqual(got.cpu(), want, atol=1e-5, rtol=1e-5)
            counts = torch.openreg.fallback_op_counts()
            self.assertNotIn("aten::_transformer_encoder_layer_fwd", counts)
            self.assertEqual(counts.get("aten::_native_multi_head_attention"), 1)  # the fast path ran


if __name__ == "__main__":
    run_tests()
