"""PT2E on openreg (openreg_quant/pt2e.py): OpenRegQuantizer, convert_pt2e and lower_pt2e on a small
CNN and a 2-block transformer; accuracy against float32, the lowered graph against the unlowered one,
reduced-range (7-bit) activations, and QAT."""

import copy
import io
import os
from unittest import mock

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")  # torchao's CUDA-only libraries

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from conftest import run_recorded  # noqa: E402
from openreg_quant import OpenRegQuantizer, lower_pt2e, pt2e  # noqa: E402
from torch.testing._internal.common_utils import TestCase  # noqa: E402
from torch_openreg.utils.models import SmallCNN  # noqa: E402
from torchao.quantization.pt2e import move_exported_model_to_eval  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e  # noqa: E402
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (  # noqa: E402
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

qd = torch.ops.quantized_decomposed


class Block(nn.Module):
    """A pre-norm transformer block: attention and a relu MLP."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))


def transformer():
    return nn.Sequential(Block(), Block())


def calls(gm, name):
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and str(n.target).startswith(name))


def last_quantum(gm) -> float:
    """The scale of the last activation quantization before the output: one quantum."""
    scales = [n.args[1] for n in gm.graph.nodes if n.target == qd.quantize_per_tensor.default]
    return float(scales[-1])


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


class TestPTQ(TestCase):
    def _convert(self, model, shape, reduce_range=False):
        """The model on openreg, an input, and the model quantized by convert_pt2e (4 calibrations),
        with 8-bit activations unless `reduce_range` (None: the quantizer's default for this CPU)."""
        torch.manual_seed(0)
        model = model.eval().to("openreg")
        x = torch.randn(*shape, device="openreg")
        quantizer = OpenRegQuantizer(reduce_range=reduce_range)
        prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
        for _ in range(4):
            prepared(torch.randn(*shape, device="openreg"))
        return model, x, convert_pt2e(prepared)

    def _ptq(self, model, shape, convs, linears):
        model, x, converted = self._convert(model, shape)
        with torch.no_grad():
            want, unlowered = model(x), converted(x)
        quantum = last_quantum(converted)
        lowered = lower_pt2e(converted)
        lowered(x)  # first calls of each signature run synchronously: count the second forward
        got, ops, generic, copies = run_recorded(lambda: lowered(x))
        self.assertEqual(got.device.type, "openreg")
        # int8 products only, by the fused ops; the quantization ops run their native kernels, not
        # core's generic path; nothing is copied to the host
        float_products = {"convolution", "conv2d", "linear", "mm", "addmm", "bmm"}
        self.assertEqual({op for op in ops if op.split(".")[1] in float_products}, set())
        self.assertEqual({op for op in generic if op.startswith(("openreg_quant", "quantized_decomposed"))}, set())
        self.assertEqual(copies, 0)
        self.assertLess(rel_err(got, want), 0.05)
        self.assertLessEqual((got - unlowered).abs().max().item(), quantum)
        # the graph calls the fused ops; no weight dequantize and no float weight is left
        self.assertEqual(calls(lowered, "openreg_quant.qconv2d"), convs)
        self.assertEqual(calls(lowered, "openreg_quant.qlinear"), linears)
        self.assertEqual(calls(lowered, "quantized_decomposed.dequantize_per_channel"), 0)
        self.assertEqual(calls(lowered, "aten.clamp"), 0)  # full-range quantizes fold in whole
        self.assertEqual(calls(lowered, "aten.relu"), 0)  # each relu follows a conv or linear: fused
        # each fused op's weight is its own packed weight on the device, and no float or int8 weight is left
        weights = [n for n, t in [*lowered.named_parameters(), *lowered.named_buffers()] if t.dim() > 1]
        self.assertEqual(weights, [])
        packed = [
            getattr(lowered, n.args[3].target)
            for n in lowered.graph.nodes
            if str(n.target).startswith(("openreg_quant.qconv2d", "openreg_quant.qlinear"))
        ]
        self.assertEqual(len({id(p) for p in packed}), convs + linears)
        self.assertEqual(sorted(p.kind() for p in packed), sorted(["qconv2d"] * convs + ["qlinear"] * linears))
        self.assertTrue(all(t.device.type == "openreg" for p in packed for t in p.unpack()))
        return lowered

    def test_small_cnn(self):
        lowered = self._ptq(SmallCNN(), (4, 3, 16, 16), convs=2, linears=1)
        # a copy of the lowered model has copies of the packed weights and computes the same
        copied = copy.deepcopy(lowered)
        packed = [n.target for n in lowered.graph.nodes if n.op == "get_attr" and n.target.startswith("_openreg")]
        self.assertEqual(len(packed), 3)
        for name in packed:
            self.assertIsNot(getattr(copied, name), getattr(lowered, name))
        x = torch.randn(4, 3, 16, 16, device="openreg")
        self.assertEqual(copied(x).cpu(), lowered(x).cpu(), atol=0, rtol=0)

    def test_inplace_relu(self):
        # nn.ReLU(inplace=True) and F.relu(..., inplace=True) export as aten.relu_, which FX's dead code
        # elimination keeps (it mutates its input): lowering left the float conv/linear, the weight's
        # dequantize, the int8 weight and the relu_ running next to the fused op. _ptq checks that none
        # is left, and the lowered model against the unlowered one within one quantum.
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv, self.relu = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True)
                self.fc1, self.fc2 = nn.Linear(8 * 8 * 8, 16), nn.Linear(16, 4)

            def forward(self, x):
                x = torch.flatten(self.relu(self.conv(x)), 1)
                return self.fc2(F.relu(self.fc1(x), inplace=True))

        _, _, converted = self._convert(Net(), (2, 3, 8, 8))
        self.assertEqual(calls(converted, "aten.relu_"), 2)
        self._ptq(Net(), (2, 3, 8, 8), convs=1, linears=2)

    def test_state_dict_and_saving(self):
        # A lowered model's state_dict() holds the biases only (the packed weights are torchbind
        # objects, the activations' quantization is constants of the graph): load_state_dict from another
        # lowered model matched every key and kept the old weights, so it is refused. torch.export.save
        # keeps the whole program (test_lowered_model_exports_and_compiles checks the values).
        lowered, other = (lower_pt2e(self._convert(SmallCNN(), (2, 3, 16, 16))[2]) for _ in range(2))
        self.assertTrue(all(k.endswith("bias") for k in lowered.state_dict()))
        for target in (other, copy.deepcopy(other)):
            with self.assertRaisesRegex(
                RuntimeError, "lower_pt2e: a lowered model cannot load a state_dict.*torch.export.save"
            ):
                target.load_state_dict(lowered.state_dict())

    def test_flatten_runs_on_the_quantized_tensor(self):
        # Before the classifier the flatten of a channels-last conv output copies: it copies bytes,
        # not float32. SmallCNN's graph quantizes after the flatten (conv -> relu -> flatten ->
        # quantize: the quantize folds into the conv, the flatten moves after it); a Sequential with
        # nn.Flatten quantizes on both sides (quantize -> dequantize -> flatten -> quantize of the
        # same parameters: the flatten takes the first quantize's output). Either way the input's is
        # the only quantize left and no dequantize is. The conv's output is channels-last, so the
        # flatten is taken in (H, W, C) order, a view, with the classifier's weight columns permuted
        # to match: the same output, bit for bit, as flattening in (C, H, W) order.
        sequential = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(32 * 8 * 8, 10),
        )
        for model in (SmallCNN(), sequential):
            model, x, converted = self._convert(model, (4, 3, 16, 16))
            nchw_order = copy.deepcopy(converted)
            with torch.no_grad():
                unlowered = converted(x)
                lowered = lower_pt2e(converted)
                got = lowered(x)
                with mock.patch.object(pt2e, "_flatten_channels_last", lambda graph, x_q, x_dq, w: x_q):
                    want = lower_pt2e(nchw_order)(x)
            self.assertEqual(calls(lowered, "quantized_decomposed.quantize_per_tensor"), 1)
            self.assertEqual(calls(lowered, "quantized_decomposed.dequantize_per_tensor"), 0)
            (flatten,) = [n for n in lowered.graph.nodes if n.target == torch.ops.aten.flatten.using_ints]
            permute = flatten.args[0]
            self.assertEqual((permute.target, permute.args[1]), (torch.ops.aten.permute.default, [0, 2, 3, 1]))
            self.assertEqual(permute.args[0].target, torch.ops.openreg_quant.qconv2d.default)
            self.assertEqual(flatten.meta["val"].dtype, torch.uint8)
            self.assertEqual(flatten.meta["val"].shape, (4, 32 * 8 * 8))
            self.assertLessEqual((got - unlowered).abs().max().item(), last_quantum(converted))
            self.assertEqual(got.cpu(), want.cpu(), atol=0, rtol=0)
            self.assertEqual(calls(lowered, "aten.contiguous"), 0)  # no copy before the classifier

    def test_a_classifier_left_unlowered_keeps_its_input_order(self):
        # The (H, W, C) flatten before a classifier permutes the linear's weight only as it is
        # packed: a linear that then stays unlowered (its bias computed in the graph, not a
        # constant) must keep the (C, H, W) flatten its float weight expects. It got the permuted
        # input with the unpermuted weight: wrong by up to the output's own size.
        class ConvClassifier(nn.Module):
            def __init__(self):
                super().__init__()
                self.c, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8 * 4 * 4, 5)

            def forward(self, x):
                return self.fc(torch.flatten(torch.relu(self.c(x)), 1))

        model, x, converted = self._convert(ConvClassifier(), (2, 3, 4, 4))
        (linear,) = [n for n in converted.graph.nodes if n.target == torch.ops.aten.linear.default]
        with converted.graph.inserting_before(linear):
            bias = converted.graph.call_function(torch.ops.aten.mul.Tensor, (linear.args[2], 1.0))
        linear.replace_input_with(linear.args[2], bias)
        converted.recompile()
        with torch.no_grad():
            unlowered = converted(x)
            lowered = lower_pt2e(converted)
            got = lowered(x)
        self.assertEqual(calls(lowered, "openreg_quant.qconv2d"), 1)
        self.assertEqual(calls(lowered, "openreg_quant.qlinear"), 0)
        self.assertEqual(calls(lowered, "aten.permute"), 0)
        self.assertLessEqual((got - unlowered).abs().max().item(), last_quantum(converted))

    def test_a_view_moved_after_a_lowered_conv_views_a_contiguous_tensor(self):
        # conv -> relu -> view -> quantize: the view moves after the fused op, onto its channels-last
        # output, and must view a contiguous copy as every view after a lowered conv does. (The x86
        # annotations quantize on both sides of a view; the graph is edited to have one between the
        # relu and the quantize, as lower_pt2e may be given.)
        class OneConv(nn.Module):
            def __init__(self):
                super().__init__()
                self.c, self.fc = nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.Linear(8 * 8 * 8, 5)

            def forward(self, x):
                return self.fc(torch.flatten(torch.relu(self.c(x)), 1))

        model, x, converted = self._convert(OneConv(), (4, 3, 16, 16))
        graph = converted.graph
        (flatten,) = [n for n in graph.nodes if n.target == torch.ops.aten.flatten.using_ints]
        self.assertEqual(flatten.args[0].target, torch.ops.aten.relu.default)
        with graph.inserting_before(flatten):
            view = graph.call_function(torch.ops.aten.view.default, (flatten.args[0], [4, -1]))
        view.meta.update(flatten.meta)
        flatten.replace_all_uses_with(view)
        graph.erase_node(flatten)
        converted.recompile()
        with torch.no_grad():
            unlowered = converted(x)
            lowered = lower_pt2e(converted)
            got = lowered(x)
        (view,) = [n for n in lowered.graph.nodes if n.target == torch.ops.aten.view.default]
        self.assertEqual(view.args[0].target, torch.ops.aten.contiguous.default)
        self.assertEqual(view.args[0].args[0].target, torch.ops.openreg_quant.qconv2d.default)
        self.assertLessEqual((got - unlowered).abs().max().item(), last_quantum(converted))

    def test_requantize_after_a_reshape_needs_the_range(self):
        # quantize -> dequantize -> flatten -> quantize becomes the flatten of the first quantize's
        # output only when that output lies in the second quantize's range: with 0..255 first and
        # 0..127 after, the second quantize clamps 128..255, so it must stay.
        class Requantize(nn.Module):
            def __init__(self, first_max):
                super().__init__()
                self.first_max = first_max

            def forward(self, x):
                q = qd.quantize_per_tensor(x, 0.05, 3, 0, self.first_max, torch.uint8)
                d = qd.dequantize_per_tensor(q, 0.05, 3, 0, 127, torch.uint8)
                return qd.quantize_per_tensor(torch.flatten(d, 1), 0.05, 3, 0, 127, torch.uint8)

        x = torch.randn(4, 3, 5, 5, device="openreg") * 5  # quantizes to 0..255: half of it above 127
        for first_max, folds in ((127, True), (255, False)):
            exported = torch.export.export(Requantize(first_max), (x,)).module()
            want = exported(x)
            lowered = lower_pt2e(exported)
            self.assertEqual(calls(lowered, "quantized_decomposed.dequantize_per_tensor"), 0 if folds else 1)
            self.assertEqual(calls(lowered, "quantized_decomposed.quantize_per_tensor"), 1 if folds else 2)
            self.assertEqual(lowered(x).cpu(), want.cpu(), atol=0, rtol=0)
            self.assertEqual(int(want.max()), 127)

    def test_default_range_follows_the_cpu(self):
        # 7-bit activations where oneDNN's int8 products saturate (x86 without VNNI), so the fused
        # kernels never need their exact path; 8-bit elsewhere. Either way the lowered model is within
        # a quantum of the unlowered one, and each fused op with a quantized output is given the
        # narrower range.
        saturate = torch.ops.openreg_quant.int8_pairs_saturate()
        self.assertEqual(OpenRegQuantizer().reduce_range, saturate)
        self.assertEqual(OpenRegQuantizer(is_qat=True).reduce_range, saturate)
        model, x, converted = self._convert(SmallCNN(), (4, 3, 16, 16), reduce_range=None)
        ranges = {(n.args[3], n.args[4]) for n in converted.graph.nodes if n.target == qd.quantize_per_tensor.default}
        self.assertEqual(ranges, {(0, 127) if saturate else (0, 255)})
        with torch.no_grad():
            want, unlowered = model(x), converted(x)
            lowered = lower_pt2e(converted)
            got = lowered(x)
        self.assertLess(rel_err(got, want), 0.05)
        self.assertLessEqual((got - unlowered).abs().max().item(), last_quantum(converted))
        # each conv (the second's quantize comes after the flatten and folds in all the same)
        ranges = [n.args[9:] for n in lowered.graph.nodes if str(n.target).startswith("openreg_quant.qconv2d")]
        self.assertEqual(ranges, [(0, 127)] * 2 if saturate else [(), ()])
        self.assertEqual(calls(lowered, "aten.clamp"), 0)

    def test_lowered_model_exports_and_compiles(self):
        # The packed weights are torchbind constants: torch.export and torch.compile trace them with a
        # fake of them (openreg_quant/fake.py) and the fused ops with their fake kernels.
        _, x, converted = self._convert(SmallCNN(), (2, 3, 16, 16))
        lowered = lower_pt2e(converted)
        with torch.no_grad():
            want = lowered(x).cpu()
            exported = torch.export.export(lowered, (x,))
            self.assertEqual(calls(exported.graph_module, "openreg_quant.q"), 3)
            self.assertEqual(
                sorted(c.kind() for c in exported.constants.values() if isinstance(c, torch.ScriptObject)),
                ["qconv2d", "qconv2d", "qlinear"],
            )
            self.assertEqual(exported.module()(x).cpu(), want, atol=0, rtol=0)
            saved = io.BytesIO()
            torch.export.save(exported, saved)
            saved.seek(0)
            self.assertEqual(torch.export.load(saved).module()(x).cpu(), want, atol=0, rtol=0)
            compiled = torch.compile(lowered, backend="aot_eager", fullgraph=True)
            self.assertEqual(compiled(x).cpu(), want, atol=0, rtol=0)

    def test_a_model_off_openreg_is_refused(self):
        # A packed weight cannot move: lowering a model that is not on openreg raises before changing it.
        _, _, converted = self._convert(SmallCNN(), (2, 3, 16, 16))
        converted = converted.cpu()
        before = str(converted.graph)
        with self.assertRaisesRegex(
            ValueError, r"lower_pt2e: \S+ is on cpu; the fused ops' weights are packed on openreg"
        ):
            lower_pt2e(converted)
        self.assertEqual(str(converted.graph), before)

    def test_transformer(self):
        self._ptq(transformer(), (2, 8, 64), convs=0, linears=8)

    def test_pooling_and_add_are_quantized(self):
        """The annotations for max-pooling and add (as the x86 quantizer's: the pooling shares its
        input's parameters, the add is the second conv's binary post-op): after convert_pt2e the
        output of each is quantized; the lowered model stays within a quantum of the unlowered one."""

        class Residual(nn.Module):
            def __init__(self):
                super().__init__()
                self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
                self.fc = nn.Linear(8 * 4 * 4, 10)

            def forward(self, x):
                x = F.max_pool2d(torch.relu(self.c1(x)), 2)
                x = x + self.c2(x)
                return self.fc(torch.flatten(x, 1))

        self._ptq(Residual(), (2, 3, 8, 8), convs=2, linears=1)
        _, _, converted = self._convert(Residual(), (2, 3, 8, 8))
        for op in (torch.ops.aten.max_pool2d.default, torch.ops.aten.add.Tensor):
            nodes = [n for n in converted.graph.nodes if n.target == op]
            self.assertEqual(len(nodes), 1, op)
            users = [u.target for u in nodes[0].users]
            self.assertEqual(users, [qd.quantize_per_tensor.default], op)

    def test_unbatched_conv_stays_unlowered(self):
        # qconv2d takes NCHW only: a conv2d over one (C, H, W) image keeps its dq -> conv2d; the
        # linear after it is still lowered.
        class Unbatched(nn.Module):
            def __init__(self):
                super().__init__()
                self.c, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4, 5)

            def forward(self, x):
                return self.fc(torch.relu(self.c(x)).permute(1, 2, 0))

        torch.manual_seed(0)
        model = Unbatched().eval().to("openreg")
        x = torch.randn(3, 6, 6, device="openreg")
        prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), OpenRegQuantizer())
        for _ in range(3):
            prepared(torch.randn(3, 6, 6, device="openreg"))
        converted = convert_pt2e(prepared)
        with torch.no_grad():
            want, unlowered = model(x), converted(x)
        lowered = lower_pt2e(converted)
        self.assertEqual(calls(lowered, "openreg_quant.qconv2d"), 0)
        self.assertEqual(calls(lowered, "aten.conv2d"), 1)
        self.assertEqual(calls(lowered, "openreg_quant.qlinear"), 1)
        got = lowered(x)
        self.assertEqual(got.shape, (4, 4, 5))
        self.assertLessEqual((got - unlowered).abs().max().item(), last_quantum(converted))
        self.assertLess(rel_err(got, want), 0.05)

    def test_view_after_a_lowered_conv(self):
        # qconv2d's output is channels-last where conv2d's was contiguous: a classifier's
        # x.view(x.size(0), -1) after the conv (and a view as the model's output) failed with
        # "view size is not compatible with input tensor's size and stride" in the lowered model,
        # and so did the caller's view of a conv output the model returns.
        class ViewNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 1)
                self.fc = nn.Linear(8 * 6 * 6, 5)

            def forward(self, x):
                y = torch.relu(self.c1(x))
                z = self.c2(y)
                return self.fc(y.view(y.size(0), -1)), z.view(z.size(0), -1), z

        results = {}
        for device in ("cpu", "openreg"):
            torch.manual_seed(0)
            model = ViewNet().eval().to(device)
            data = [torch.randn(2, 3, 6, 6) for _ in range(4)]  # the same calibration on both devices
            prepared = prepare_pt2e(torch.export.export(model, (data[0].to(device),)).module(), OpenRegQuantizer())
            for x in data[1:]:
                prepared(x.to(device))
            converted = convert_pt2e(prepared)
            with torch.no_grad():
                results[device] = [t.cpu() for t in converted(data[0].to(device))]
            if device == "openreg":
                quantum = last_quantum(converted)
                with torch.no_grad():
                    want = [t.cpu() for t in model(data[0].to(device))]
                lowered = lower_pt2e(converted)
                self.assertEqual(calls(lowered, "openreg_quant.qconv2d"), 2)
                self.assertEqual(calls(lowered, "openreg_quant.qlinear"), 1)
                got = [t.cpu() for t in lowered(data[0].to(device))]
        self.assertEqual(got[2].view(2, -1), got[1], atol=0, rtol=0)  # the returned conv output views
        for g, unlowered_cpu, float_ref in zip(got, results["cpu"], want):
            self.assertEqual((g.shape, g.stride()), (unlowered_cpu.shape, unlowered_cpu.stride()))
            self.assertLessEqual((g - unlowered_cpu).abs().max().item(), quantum)  # the CPU's converted model
            self.assertLess(rel_err(g, float_ref), 0.05)

    def test_output_through_a_quantized_cat_of_lowered_convs_is_contiguous(self):
        # The model's output is a dequantize convert_pt2e inserted after a cat of two convs (the
        # annotations quantize the cat): it records no value, so its layout was not looked at and
        # the lowered model returned qconv2d's channels-last tensor; the caller's view failed.
        class ConvCat(nn.Module):
            def __init__(self):
                super().__init__()
                self.c1, self.c2 = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 6, 1)

            def forward(self, x):
                return torch.cat([self.c1(x), self.c2(x)], 1)

        torch.manual_seed(0)
        model = ConvCat().eval().to("openreg")
        data = [torch.randn(2, 4, 8, 8, device="openreg") for _ in range(3)]
        prepared = prepare_pt2e(torch.export.export(model, (data[0],)).module(), OpenRegQuantizer())
        for x in data:
            prepared(x)
        converted = convert_pt2e(prepared)
        quantum = last_quantum(converted)
        with torch.no_grad():
            want = converted(data[0])
            lowered = lower_pt2e(converted)
            got = lowered(data[0])
        self.assertEqual(calls(lowered, "openreg_quant.qconv2d"), 2)
        self.assertTrue(want.is_contiguous())
        self.assertEqual((got.shape, got.stride()), (want.shape, want.stride()))
        self.assertEqual(got.view(2, -1).shape, (2, 640))
        self.assertLessEqual((got - want).abs().max().item(), quantum)


class MLP(nn.Module):
    """linear -> relu -> linear -> linear: an output quantize after a relu and after none."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.c(self.b(torch.relu(self.a(x))))


class ConvNet(nn.Module):
    """conv -> relu -> conv -> conv."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 4, 3)

    def forward(self, x):
        return self.c(self.b(torch.relu(self.a(x))))


class TestReducedRange(TestCase):
    """x86's reduce_range (7-bit activations: quantize_per_tensor(..., 0, 127, torch.uint8)): the
    fused ops clamp a quantized output to 0..255 by default, so lower_pt2e must give them the
    quantize's own range."""

    def _converted(self, model_cls, shape, device):
        torch.manual_seed(0)
        model = model_cls().eval().to(device)
        quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(reduce_range=True))
        prepared = prepare_pt2e(torch.export.export(model, (torch.randn(*shape).to(device),)).module(), quantizer)
        for _ in range(3):
            prepared(torch.randn(*shape).to(device))  # the same calibration data on both devices
        return convert_pt2e(prepared)

    def _check(self, model_cls, shape, op):
        converted, on_cpu = self._converted(model_cls, shape, "openreg"), self._converted(model_cls, shape, "cpu")
        ranges = {(n.args[3], n.args[4]) for n in converted.graph.nodes if n.target == qd.quantize_per_tensor.default}
        self.assertEqual(ranges, {(0, 127)})
        torch.manual_seed(1)
        x = torch.randn(*shape) * 3  # beyond the calibration range: the activations hit quant_max
        with torch.no_grad():
            unlowered, want = converted(x.to("openreg")), on_cpu(x)
        self.assertEqual(unlowered.cpu(), want, atol=0, rtol=0)
        quantum = last_quantum(converted)
        lowered = lower_pt2e(converted)
        got = lowered(x.to("openreg")).cpu()
        self.assertLessEqual((got - want).abs().max().item(), quantum)
        # every conv/linear is lowered; each of the two folded quantizes gives its op the range 0..127
        self.assertEqual(calls(lowered, op), 3)
        ranges = [n.args[9:] for n in lowered.graph.nodes if str(n.target).startswith(op)]
        self.assertEqual(sorted(ranges), [(), (0, 127), (0, 127)])  # the last has a float output
        self.assertEqual(calls(lowered, "aten.clamp"), 0)
        self.assertEqual(calls(lowered, "quantized_decomposed.quantize_per_tensor"), 1)  # the input's

    def test_lowering_keeps_the_quantize_range_linear(self):
        self._check(MLP, (6, 8), "openreg_quant.qlinear")

    def test_lowering_keeps_the_quantize_range_conv(self):
        self._check(ConvNet, (2, 3, 8, 8), "openreg_quant.qconv2d")


class TestQAT(TestCase):
    def test_qat_on_openreg(self):
        results = {}
        for device in ("cpu", "openreg"):
            torch.manual_seed(0)
            model = SmallCNN().train().to(device)
            data = [torch.randn(4, 3, 16, 16) for _ in range(3)]
            prepared = prepare_qat_pt2e(
                torch.export.export(model, (data[0].to(device),)).module(), OpenRegQuantizer(is_qat=True)
            )
            opt = torch.optim.SGD(prepared.parameters(), lr=0.01)
            for x in data:
                loss = prepared(x.to(device)).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            move_exported_model_to_eval(prepared)
            converted = convert_pt2e(prepared)
            x = data[0].to(device)
            results[device] = (loss.item(), converted(x).cpu())
            if device == "openreg":
                unlowered = converted(x)
                lowered = lower_pt2e(converted)
                self.assertEqual(calls(lowered, "openreg_quant.q"), 3)
                self.assertLessEqual((lowered(x) - unlowered).abs().max().item(), last_quantum(converted))
        self.assertEqual(results["openreg"][0], results["cpu"][0], atol=1e-5, rtol=1e-4)
        self.assertEqual(results["openreg"][1], results["cpu"][1], atol=1e-4, rtol=1e-3)
