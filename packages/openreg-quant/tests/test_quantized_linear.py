"""quantized::linear / linear_relu on quantized openreg tensors with weights packed on openreg
(csrc/qtensor/QLinear.cpp): equal to the CPU's quantized::linear, through the ops and through
torch.ao.nn.quantized.Linear; CPU-packed weights given openreg inputs (and the other way round) raise,
naming the op; one launch, no host wait; deepcopy and torch.save/torch.load of openreg-packed weights."""

import copy
import io
import re

import torch
import torch.ao.nn.quantized as nnq
from torch.testing._internal.common_utils import TestCase
from torch_openreg.utils.testing import StreamHold

ops = torch.ops.quantized


def weight(n, k, per_channel, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.2
    if per_channel:
        return torch.quantize_per_channel(w, w.abs().amax(1) / 127, torch.zeros(n, dtype=torch.long), 0, torch.qint8)
    return torch.quantize_per_tensor(w, float(w.abs().max()) / 127, 0, torch.qint8)


def activation(*shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.quantize_per_tensor(torch.randn(*shape, generator=g), 0.03, 128, torch.quint8)


class TestQuantizedLinear(TestCase):
    def assertSameQ(self, got, want, msg=None):
        self.assertEqual(got.device.type, "openreg", msg=msg)
        self.assertEqual(
            (got.dtype, got.shape, got.q_scale(), got.q_zero_point()),
            (want.dtype, want.shape, want.q_scale(), want.q_zero_point()),
            msg=msg,
        )
        self.assertTrue(torch.equal(got.int_repr().cpu(), want.int_repr()), msg)

    def test_linear_matches_cpu(self):
        b = torch.randn(24)
        for per_channel in (False, True):
            w = weight(24, 40, per_channel)
            for bias in (b, None):
                packed_cpu = ops.linear_prepack(w, bias)
                packed = ops.linear_prepack(w.to("openreg"), None if bias is None else bias.to("openreg"))
                for shape in ((1, 40), (7, 40), (2, 3, 40)):
                    x = activation(*shape)
                    for op in (ops.linear, ops.linear_relu):
                        msg = f"per_channel={per_channel} bias={bias is not None} {shape} {op}"
                        self.assertSameQ(op(x.to("openreg"), packed, 0.05, 100), op(x, packed_cpu, 0.05, 100), msg)
                # a strided input
                x = activation(40, 5).t()
                self.assertSameQ(ops.linear(x.to("openreg"), packed, 0.05, 100), ops.linear(x, packed_cpu, 0.05, 100))
                w_back, b_back = ops.linear_unpack(packed)
                self.assertEqual(w_back.device.type, "openreg")
                self.assertTrue(torch.equal(w_back.int_repr().cpu(), w.int_repr()))
                self.assertEqual(b_back is None, bias is None)

    def test_a_bias_changed_in_place_after_packing_is_used(self):
        # The CPU's packed parameters keep the bias tensor itself: a change in place shows in later
        # calls. openreg packed a copy, so its calls kept the old bias while unpack() gave the new one.
        w, b = weight(4, 8, False), torch.zeros(4)
        packed_cpu = ops.linear_prepack(w, b)
        bd = b.to("openreg")
        packed = ops.linear_prepack(w.to("openreg"), bd)
        x = activation(3, 8)
        self.assertSameQ(ops.linear(x.to("openreg"), packed, 0.05, 100), ops.linear(x, packed_cpu, 0.05, 100))
        b.add_(1.0)
        bd.add_(1.0)
        want = ops.linear(x, packed_cpu, 0.05, 100)
        self.assertSameQ(ops.linear(x.to("openreg"), packed, 0.05, 100), want)
        self.assertEqual(ops.linear_unpack(packed)[1].cpu(), b)
        # A bias given new memory: the CPU's form follows its tensor there. openreg's read the old
        # memory, freed and handed to the next tensor of its size.
        b.data = torch.full((4,), -2.0)
        bd.data = torch.full((4,), -2.0, device="openreg")
        reused = torch.full((4,), 1000.0, device="openreg")  # may take the old bias's block
        want = ops.linear(x, packed_cpu, 0.05, 100)
        self.assertSameQ(ops.linear(x.to("openreg"), packed, 0.05, 100), want)
        del reused

    def test_two_streams_packing_again_for_their_own_bias_memory(self):
        # Kernels of two streams on one packed weight whose bias is given new memory before each call:
        # each kernel packs again for the bias it was given. packed() returned the form by reference:
        # one stream's kernel freed the form the other's was applying (a segfault in the CPU's kernel).
        n, k = 512, 512
        w, b = weight(n, k, True), {1: torch.randn(n), 2: torch.randn(n)}
        x = activation(256, k)
        want = {i: ops.linear(x, ops.linear_prepack(w, b[i]), 0.05, 7) for i in b}
        on_device = {i: b[i].to("openreg") for i in b}
        bias = on_device[1].clone()
        packed = ops.linear_prepack(w.to("openreg"), bias)
        xd = x.to("openreg")
        streams = {i: torch.openreg.Stream() for i in b}
        torch.openreg.synchronize()
        outs = []
        for _ in range(100):
            for i in b:
                bias.data = on_device[i]
                with torch.openreg.stream(streams[i]):
                    outs.append((i, ops.linear(xd, packed, 0.05, 7)))
        torch.openreg.synchronize()
        for n_call, (i, out) in enumerate(outs):
            self.assertSameQ(out, want[i], f"call {n_call} (stream {i})")

    def test_the_engine_refuses_a_weight_at_the_call_as_on_the_cpu(self):
        # oneDNN packs only symmetric weights: the CPU refuses a per-tensor zero point of 2 at the call;
        # openreg refused it in the packing kernel, reported by the next synchronising call.
        w = torch.quantize_per_tensor(torch.randn(8, 16) * 0.1, 0.01, 2, torch.qint8)
        engine = torch.backends.quantized.engine
        self.addCleanup(setattr, torch.backends.quantized, "engine", engine)
        refused = 0
        for name in torch.backends.quantized.supported_engines:
            torch.backends.quantized.engine = name
            try:
                ops.linear_prepack(w, None)
            except RuntimeError as e:
                refused += 1
                message = str(e).splitlines()[0]
                with self.assertRaisesRegex(RuntimeError, "^" + re.escape(message)):
                    ops.linear_prepack(w.to("openreg"), None)
            else:
                packed = ops.linear_prepack(w.to("openreg"), None)
                x = activation(3, 16)
                self.assertSameQ(
                    ops.linear(x.to("openreg"), packed, 0.05, 7),
                    ops.linear(x, ops.linear_prepack(w, None), 0.05, 7),
                    name,
                )
        self.assertEqual(refused, int("onednn" in torch.backends.quantized.supported_engines))

    def test_nn_quantized_linear_on_openreg(self):
        torch.manual_seed(0)
        layer = nnq.Linear(40, 24)
        layer.set_weight_bias(weight(24, 40, True), torch.randn(24))
        layer.scale, layer.zero_point = 0.07, 60
        dev = nnq.Linear(40, 24)
        dev.set_weight_bias(layer.weight().to("openreg"), layer.bias().to("openreg"))
        dev.scale, dev.zero_point = layer.scale, layer.zero_point
        x = activation(5, 40)
        self.assertSameQ(dev(x.to("openreg")), layer(x))
        self.assertEqual(dev.weight().device.type, "openreg")
        relu = torch.ao.nn.intrinsic.quantized.LinearReLU(40, 24)
        relu.set_weight_bias(layer.weight().to("openreg"), layer.bias().to("openreg"))
        relu.scale, relu.zero_point = layer.scale, layer.zero_point
        self.assertSameQ(relu(x.to("openreg")), ops.linear_relu(x, layer._packed_params._packed_params, 0.07, 60))

    def test_mismatched_packed_weights_raise(self):
        x = activation(2, 4)
        # nn.quantized.Linear's .to() moves no packed parameters: its weight stays CPU-packed
        layer = nnq.Linear(4, 3).to("openreg")
        self.assertEqual(layer(x).device.type, "cpu")
        with self.assertRaisesRegex(
            RuntimeError, "quantized::linear: the input is on openreg:0 but the weight was packed by the CPU"
        ):
            layer(x.to("openreg"))
        with self.assertRaisesRegex(RuntimeError, "quantized::linear_relu: the input is on openreg:0 but the weight"):
            ops.linear_relu(x.to("openreg"), layer._packed_params._packed_params, 0.1, 0)
        packed = ops.linear_prepack(weight(3, 4, False).to("openreg"), None)
        with self.assertRaisesRegex(
            RuntimeError, "quantized::linear: the weight was packed on openreg:0 but the input is on cpu"
        ):
            ops.linear(x, packed, 0.1, 0)
        with self.assertRaisesRegex(
            NotImplementedError, "quantized::linear_dynamic: not supported with openreg packed"
        ):
            ops.linear_dynamic(torch.randn(2, 4), packed)
        self.assertEqual((torch.ones(2, device="openreg") + 1).cpu(), torch.full((2,), 2.0))

    def test_deepcopy_and_pickling_keep_openreg_packed_weights(self):
        # torch's __setstate__ packs unpickled weights with the CPU engine, which read the openreg weight as
        # host memory and killed the process; openreg-quant sends openreg weights to quantized::linear_prepack
        w, b = weight(24, 40, True), torch.randn(24)
        cpu_layer = nnq.Linear(40, 24)
        cpu_layer.set_weight_bias(w, b)
        cpu_layer.scale, cpu_layer.zero_point = 0.07, 60
        layer = nnq.Linear(40, 24)
        layer.set_weight_bias(w.to("openreg"), b.to("openreg"))
        layer.scale, layer.zero_point = 0.07, 60
        x = activation(5, 40)
        want = cpu_layer(x)
        saved = io.BytesIO()
        torch.save(layer, saved)
        saved.seek(0)
        loaded = torch.load(saved, weights_only=False)
        saved.seek(0)
        on_cpu = torch.load(saved, map_location="cpu", weights_only=False)
        for name, other in (("deepcopy", copy.deepcopy(layer)), ("torch.load", loaded)):
            packed = other._packed_params._packed_params
            self.assertIsNot(packed, layer._packed_params._packed_params, name)
            w_back, b_back = ops.linear_unpack(packed)
            self.assertEqual((w_back.device.type, b_back.device.type), ("openreg", "openreg"), name)
            self.assertTrue(torch.equal(w_back.int_repr().cpu(), w.int_repr()), name)
            self.assertEqual(w_back.q_per_channel_scales().cpu(), w.q_per_channel_scales(), msg=name)
            self.assertEqual(b_back.cpu(), b, msg=name)
            self.assertSameQ(other(x.to("openreg")), want, msg=name)
        # map_location="cpu" unpickles CPU weights, packed by torch's own __setstate__
        self.assertEqual(on_cpu.weight().device.type, "cpu")
        self.assertTrue(torch.equal(on_cpu(x).int_repr(), want.int_repr()))
        # CPU-packed modules still copy through torch's path
        self.assertTrue(torch.equal(copy.deepcopy(cpu_layer)(x).int_repr(), want.int_repr()))

    def test_bad_arguments(self):
        w = weight(3, 4, False).to("openreg")
        packed = ops.linear_prepack(w, None)
        cases = [
            (lambda: ops.linear_prepack(w, torch.randn(3)), "quantized::linear_prepack: bias must be on openreg:0"),
            (lambda: ops.linear_prepack(w, torch.randn(2, device="openreg")), "one value per output channel \\(3\\)"),
            (lambda: ops.linear_prepack(w[0:1, 0:2].reshape(2), None), "the weight must be 2-D"),
            (
                lambda: ops.linear_prepack(
                    torch.quantize_per_tensor(torch.randn(3, 4), 0.1, 0, torch.quint8).to("openreg"), None
                ),
                "the weight must be torch.qint8, got QUInt8",
            ),
            (lambda: ops.linear(activation(2, 5).to("openreg"), packed, 0.1, 0), "last dimension \\(5\\) must equal"),
            (lambda: ops.linear(activation(4).to("openreg"), packed, 0.1, 0), "at least 2 dimensions"),
            (
                lambda: ops.linear(
                    torch.quantize_per_tensor(torch.randn(2, 4, device="openreg"), 0.1, 0, torch.qint8), packed, 0.1, 0
                ),
                "per-tensor quantized torch.quint8 tensor",
            ),
            (
                # an empty reduction: it failed in the kernel, naming empty_strided (the CPU's kernel
                # returns uninitialised memory)
                lambda: ops.linear(
                    torch.quantize_per_tensor(torch.zeros(4, 0, device="openreg"), 0.05, 10, torch.quint8),
                    ops.linear_prepack(
                        torch.quantize_per_tensor(torch.zeros(8, 0, device="openreg"), 0.01, 0, torch.qint8), None
                    ),
                    0.1,
                    3,
                ),
                r"quantized::linear: in_features must be at least 1, got a weight of shape \[8, 0\]",
            ),
        ]
        for call, message in cases:
            with self.assertRaisesRegex(RuntimeError, message):
                call()

    def test_one_launch_no_host_wait(self):
        w = weight(24, 40, True).to("openreg")
        b = torch.randn(24, device="openreg")
        x = activation(8, 40).to("openreg")
        packed = ops.linear_prepack(w, b)
        torch.openreg.synchronize()
        torch.openreg.reset_fallback_op_counts()
        torch.openreg.set_strict_mode(True)
        before = torch.openreg._runtime_counters()
        ops.linear(x, packed, 0.05, 100)
        after = torch.openreg._runtime_counters()
        self.assertEqual(after["kernels_launched"] - before["kernels_launched"], 1)
        self.assertEqual(after["memcpy_d2h"] - before["memcpy_d2h"], 0)
        torch.openreg.synchronize()
        self.assertEqual(torch.openreg.fallback_op_counts(), {})
        torch.openreg.set_strict_mode(False)
        with StreamHold() as held:
            p = ops.linear_prepack(w, b)
            y = ops.linear_relu(x, p, 0.05, 100)
            busy = not held.stream.query()
        self.assertTrue(busy, "a call waited for the device")
        self.assertEqual(y.shape, (8, 24))
