"""Quantized work captured into a device graph (torch.accelerator.Graph) and replayed with new data
copied into its static inputs: every replay equals the same calls run eagerly, prepacks included."""

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (quantized_decomposed ops)
from torch.testing._internal.common_utils import TestCase

oq, qd = torch.ops.openreg_quant, torch.ops.quantized_decomposed


def int8_weight(seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(24, 40, generator=g) * 0.1
    scales = w.abs().amax(1) / 127.5
    return qd.quantize_per_channel(w, scales, torch.zeros(24, dtype=torch.long), 0, -128, 127, torch.int8), scales


def qint8_weight(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.quantize_per_tensor(torch.randn(24, 40, generator=g) * 0.2, 0.002, 0, torch.qint8)


class TestPrepackInAGraph(TestCase):
    def capture(self, step, stream):
        stream.wait_stream(torch.openreg.current_stream())
        with torch.openreg.stream(stream):
            step()  # warm-up, as before a CUDA graph capture
        stream.synchronize()
        graph = torch.accelerator.Graph()
        with torch.openreg.stream(stream):
            graph.capture_begin()
            out = step()
            graph.capture_end()
        return graph, out

    def replay(self, graph, stream):
        stream.wait_stream(torch.openreg.current_stream())  # the new inputs were copied on it
        with torch.openreg.stream(stream):
            graph.replay()
        stream.synchronize()

    def test_a_captured_prepack_packs_each_replays_weight(self):
        # The prepack's kernel kept the form it made at the first replay: later replays computed with
        # the first replay's weight (max difference 1.4 from eager).
        s = torch.openreg.Stream()
        x = qd.quantize_per_tensor(torch.rand(5, 40), 0.03, 0, 0, 255, torch.uint8).to("openreg")
        w0, s0 = int8_weight(0)
        w, scales, zeros = w0.to("openreg"), s0.to("openreg"), torch.zeros(24, dtype=torch.long, device="openreg")

        def step():
            packed = oq.qlinear_prepack(w, scales, zeros)
            return oq.qlinear(x, 0.03, 0, packed, None, 1.0, 0, torch.float32, "none")

        graph, out = self.capture(step, s)
        for seed in (1, 2, 3):
            new_w, new_scales = int8_weight(seed)
            w.copy_(new_w)
            scales.copy_(new_scales)
            self.replay(graph, s)
            self.assertEqual(out.cpu(), step().cpu(), atol=0, rtol=0, msg=f"replay {seed}")
        graph.reset()

    def test_a_captured_quantized_linear_prepack_packs_each_replays_weight(self):
        s = torch.openreg.Stream()
        x = torch.quantize_per_tensor(torch.randn(5, 40), 0.03, 128, torch.quint8)
        xd, w = x.to("openreg"), qint8_weight(0).to("openreg")

        def step():
            return torch.ops.quantized.linear(xd, torch.ops.quantized.linear_prepack(w, None), 0.05, 100)

        graph, out = self.capture(step, s)
        for seed in (1, 2, 3):
            new_w = qint8_weight(seed)
            w.copy_(new_w.to("openreg"))
            self.replay(graph, s)
            want = torch.ops.quantized.linear(x, torch.ops.quantized.linear_prepack(new_w, None), 0.05, 100)
            self.assertTrue(torch.equal(out.int_repr().cpu(), want.int_repr()), f"replay {seed}")
        graph.reset()
