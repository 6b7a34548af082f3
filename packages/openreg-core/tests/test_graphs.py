"""Device graphs: torch.accelerator.Graph captures the work launched on a stream and replays it."""

import os
import tempfile

import torch
from torch.testing._internal.common_utils import TestCase, run_tests


def warm_up(fn, stream):
    """As on CUDA: run the work once before capturing it (first calls of an op signature synchronise)."""
    with torch.openreg.stream(stream):
        fn()
    stream.synchronize()


class TestGraphs(TestCase):
    def test_capture_and_replay(self):
        x = torch.zeros(1000, device="openreg")
        s = torch.openreg.Stream()

        def step():
            x.add_(1)
            return x * 2

        warm_up(step, s)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            y = step()
            g.capture_end()
        s.synchronize()
        self.assertEqual(x.cpu(), torch.full((1000,), 1.0))  # capturing recorded the work, it did not run it
        for _ in range(3):
            g.replay()
        torch.openreg.synchronize()
        self.assertEqual(x.cpu(), torch.full((1000,), 4.0))
        self.assertEqual(y.cpu(), torch.full((1000,), 8.0))  # the captured output is rewritten by each replay
        g.reset()

    def test_context_manager_form(self):
        x = torch.ones(8, device="openreg")
        s = torch.Stream(device="openreg")
        warm_up(lambda: x.mul_(2), s)
        g = torch.accelerator.Graph()
        with s, g:
            x.mul_(2)
        g.replay()
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(x.cpu(), torch.full((8,), 8.0))

    def test_waiting_inside_capture_is_refused(self):
        x = torch.ones(4, device="openreg")
        s = torch.openreg.Stream()
        warm_up(lambda: x + 1, s)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            y = x + 1
            with self.assertRaisesRegex(RuntimeError, "captured into a graph"):
                y.cpu()
            g.capture_end()
        g.reset()
        self.assertEqual((x + 1).cpu(), torch.full((4,), 2.0))  # the device works on

    def test_captured_memory_is_kept_until_reset(self):
        s = torch.openreg.Stream()
        x = torch.ones(256 * 1024, device="openreg")
        warm_up(lambda: (x * 3) + 1, s)
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            tmp = x * 3
            out = tmp + 1
            g.capture_end()
        tmp_ptr = tmp.data_ptr()
        del tmp  # a replay still writes there
        with torch.openreg.stream(s):
            other = torch.empty(256 * 1024, device="openreg")
        self.assertNotEqual(other.data_ptr(), tmp_ptr)
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(out.cpu(), torch.full((256 * 1024,), 4.0))
        g.reset()
        del other, out

    def test_adjacent_captured_blocks_freed_before_the_graph(self):
        # Two blocks of one segment, both kept for the graph, released when it goes: neither may
        # be merged into the other while it is still kept (that freed one block twice).
        s = torch.openreg.Stream()
        x = torch.ones(4, device="openreg")
        warm_up(lambda: x * 2 + 1, s)
        torch.openreg.empty_cache()
        g = torch.accelerator.Graph()
        with torch.openreg.stream(s):
            g.capture_begin()
            y = x * 2 + 1  # the temporary x * 2 and y are neighbours
            g.capture_end()
        g.replay()
        torch.openreg.synchronize()
        self.assertEqual(y.cpu(), torch.full((4,), 3.0))
        del y
        allocated = torch.openreg.memory_allocated()
        g.reset()
        self.assertEqual(torch.openreg.memory_allocated(), allocated)
        torch.openreg.empty_cache()
        self.assertEqual([z.cpu().tolist() for z in (x * 2, x + 5)], [[2.0] * 4, [6.0] * 4])

    def test_graph_alive_at_interpreter_exit(self):
        from conftest import run_python

        r = run_python(
            """
            import torch
            s = torch.openreg.Stream()
            x = torch.ones(4, device="openreg")
            with torch.openreg.stream(s):
                x * 2 + 1
            s.synchronize()
            g = torch.accelerator.Graph()
            with torch.openreg.stream(s):
                g.capture_begin()
                y = x * 2 + 1
                g.capture_end()
            g.replay()
            torch.openreg.synchronize()
            print(y.cpu().tolist())
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "[3.0, 3.0, 3.0, 3.0]")

    def test_debug_dump_and_errors(self):
        g = torch.accelerator.Graph()
        with self.assertRaisesRegex(RuntimeError, "needs a captured graph"):
            g.replay()
        x = torch.zeros(4, device="openreg")
        s = torch.openreg.Stream()
        warm_up(lambda: x.add_(1), s)
        g.enable_debug_mode()
        with torch.openreg.stream(s):
            g.capture_begin()
            x.add_(1)
            g.capture_end()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "graph.txt")
            g.debug_dump(path)
            with open(path) as f:
                text = f.read()
        self.assertIn("1 work items", text)
        self.assertIn("aten::add", text)
        with torch.openreg.stream(s), self.assertRaisesRegex(RuntimeError, "already been captured"):
            g.capture_begin()
        g.reset()


if __name__ == "__main__":
    run_tests()
