"""Scenario: an input pipeline. A DataLoader with 2 worker processes and pin_memory=True feeds a
compiled model (openreg-inductor) on openreg:1; each batch is copied host-to-device with
non_blocking=True on a side stream while the model runs on the previous batch on the default stream,
the usual prefetch pattern. The runtime's activity tracing (torch.profiler with the PrivateUse1
activity) proves that the copies overlapped the model's kernels on the device; the outputs equal
the same model's on the CPU.
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
from report import report
from torch.profiler import ProfilerActivity, profile
from torch.testing._internal.common_utils import TestCase, run_tests
from workloads import Samples, make_mlp

BATCH, BATCHES, WORKERS = 256, 8, 2  # a batch keeps the model busy for milliseconds, a copy takes ~0.1 ms


def intervals(events, cat: str, device: str, default_stream: bool):
    """(start, end) in µs of the device activities of category `cat` on `device`'s default stream
    or on its other streams."""
    return [
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == cat
        and e["args"].get("device") == device
        and (e["args"].get("stream") == "default stream") == default_stream
    ]


class TestPinnedLoaderSideStream(TestCase):
    def test_loader_feeds_compiled_model_on_openreg1(self):
        device = torch.device("openreg", 1)
        cpu_model = make_mlp().eval()
        model = make_mlp().eval().to(device)
        compiled = torch.compile(model)
        loader = torch.utils.data.DataLoader(
            Samples(BATCH * BATCHES), batch_size=BATCH, num_workers=WORKERS, pin_memory=True
        )
        copies = torch.openreg.Stream(device=device)

        def upload(batch):
            """Queues the batch's H2D copies on the side stream; the event marks their end."""
            x, y = batch
            assert x.is_pinned(), "pin_memory=True gives pinned batches"
            with torch.openreg.stream(copies):
                xd, yd = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                done = torch.openreg.Event()
                done.record(copies)
            return (x, y), (xd, yd), done

        def run():
            outputs, host = [], []
            with torch.openreg.device(device), torch.no_grad():
                compute = torch.openreg.current_stream()
                batches = iter(loader)
                pending = upload(next(batches))
                for i in range(BATCHES):
                    cpu_batch, (xd, yd), done = pending
                    compute.wait_event(done)  # the model waits for its batch's copy ...
                    xd.record_stream(compute)  # ... and the allocator for the model's use of it
                    out = compiled(xd)
                    if i + 1 < BATCHES:
                        pending = upload(next(batches))  # copied while `out` is computed
                    outputs.append(out)
                    host.append(cpu_batch[0])
                torch.openreg.synchronize(device)
            return outputs, host

        run()  # compiles, and warms up the generic path's first calls
        with tempfile.TemporaryDirectory() as tmp:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
                outputs, inputs = run()
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]

        with torch.no_grad():
            expected = [cpu_model(x) for x in inputs]
        # Read back after the profile: the trace holds only the pipeline's own copies.
        self.assertEqual(torch.cat([o.cpu() for o in outputs]), torch.cat(expected), atol=1e-4, rtol=1e-4)

        name = str(device)
        copied = intervals(events, "gpu_memcpy", name, default_stream=False)
        kernels = intervals(events, "kernel", name, default_stream=True)
        self.assertGreaterEqual(len(copied), 2 * (BATCHES - 1), "the H2D copies ran on the side stream")
        self.assertEqual(
            intervals(events, "gpu_memcpy", name, default_stream=True), [], "no copy on the default stream"
        )
        self.assertGreater(len(kernels), 0, "the compiled model's kernels ran on openreg:1's default stream")
        overlapped = [c for c in copied if any(c[0] < k[1] and k[0] < c[1] for k in kernels)]
        self.assertGreater(len(overlapped), 0, f"no copy overlapped a kernel: copies {copied}, kernels {kernels}")
        report(
            f"dataloader ({WORKERS} workers, pinned) -> compiled MLP on {name}: {BATCHES} batches equal the CPU's, "
            f"{len(overlapped)}/{len(copied)} side-stream H2D copies overlapped the model's kernels"
        )


if __name__ == "__main__":
    run_tests()
