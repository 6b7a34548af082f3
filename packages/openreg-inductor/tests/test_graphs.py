"""Compiled code inside openreg graphs (torch.accelerator.Graph): the launchers capture like any
openreg kernel, so a compiled step replays without Python, the basis of a reduce-overhead mode."""

import torch
from torch._dynamo.utils import counters
from torch.testing._internal.common_utils import TestCase, run_tests


class TestCapture(TestCase):
    def test_capture_and_replay_a_compiled_step(self):
        w = torch.randn(32, 32, device="openreg")
        x = torch.zeros(16, 32, device="openreg")  # the static input

        @torch.compile
        def step(x, w):
            x.add_(1)  # input mutation: each replay advances x
            return torch.softmax(x @ w, dim=-1).sum(0)

        s = torch.openreg.Stream()
        with torch.openreg.stream(s):  # warm up on the capture stream (first calls are synchronous)
            step(x, w)
            step(x, w)
        s.synchronize()
        x.zero_()
        graph = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            graph.capture_begin()
            out = step(x, w)
            graph.capture_end()
        s.synchronize()
        self.assertEqual(x.cpu(), torch.zeros(16, 32))  # captured, not run
        before = torch.openreg._runtime_counters()
        for _ in range(3):
            graph.replay()
        after = torch.openreg._runtime_counters()
        torch.openreg.synchronize()
        self.assertEqual(after["memcpy_h2d"] - before["memcpy_h2d"], 0)
        self.assertEqual(after["memcpy_d2h"] - before["memcpy_d2h"], 0)
        expected_x = torch.full((16, 32), 3.0)
        self.assertEqual(x.cpu(), expected_x)
        expected = torch.softmax(expected_x @ w.cpu(), dim=-1).sum(0)
        self.assertEqual(out.cpu(), expected, atol=1e-5, rtol=1e-5)
        graph.reset()


class TestModes(TestCase):
    def test_reduce_overhead_and_max_autotune_record_graphs(self):
        """Both modes turn on Inductor's graph mode; torch's CUDA graph trees skip openreg graphs,
        and openreg-inductor's policy (openreg_inductor/graphs.py) records them as openreg graphs."""

        def f(x, w):
            return torch.relu(x @ w) + 1

        x, w = torch.randn(64, 64), torch.randn(64, 64)
        for mode in ("reduce-overhead", "max-autotune"):
            with self.subTest(mode=mode):
                torch._dynamo.reset()
                counters.clear()
                compiled = torch.compile(f, mode=mode)
                for _ in range(3):
                    out = compiled(x.to("openreg"), w.to("openreg"))
                self.assertEqual(out.cpu(), torch.compile(f, mode=mode)(x, w), atol=1e-5, rtol=1e-5)
                self.assertEqual(counters["openreg_graphs"]["recorded"], 1)
                self.assertEqual(counters["openreg_graphs"]["replayed"], 2)


if __name__ == "__main__":
    run_tests()
