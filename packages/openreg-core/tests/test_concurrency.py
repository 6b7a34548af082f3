"""Concurrency: several Python threads launch eager work (forward and backward of shared models,
copies, in-place updates, events) into shared streams of both devices at once. Each thread's
results must equal the same work run serially, and the CPU's.

Eager code only: core's test session has no compiler plugin (compiled code on threads is
openreg-inductor's to test). Data races in the runtime itself are the business of the runtime's
ThreadSanitizer session (`nox -s runtime_tsan`, stress_threads_streams and
soak_random_work_under_faults in packages/openreg-core/libopenreg/tests/runtime_tests.cpp).
"""

import threading
from contextlib import nullcontext

import torch
from torch.testing._internal.common_utils import TestCase, run_tests
from torch_openreg.utils.testing import run_threads

THREADS = 4
STREAMS = 2  # per device, shared by every thread
ITERS = 12


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 8 * 8, 10),
    )


def inputs_of(t):
    g = torch.Generator().manual_seed(100 + t)
    return [torch.randn(4, 3, 8, 8, generator=g) for _ in range(ITERS)]


def work(model, x, device, stream=None):
    """One iteration: forward and backward (gradients by autograd.grad: the shared parameters'
    .grad is not touched), plus an in-place update and a reduction of the thread's own tensors."""
    ctx = torch.openreg.stream(stream) if stream is not None else nullcontext()
    with ctx:
        x = x.to(device).requires_grad_()
        y = model(x)
        loss = y.square().mean()
        grads = torch.autograd.grad(loss, [x, *model.parameters()])
        acc = grads[0].clone()
        acc.mul_(0.5).add_(x.detach())
        return [y.detach(), acc.sum(dim=(1, 2, 3)), *grads[1:]]


class TestConcurrency(TestCase):
    def test_threads_on_shared_streams_and_models_equal_serial_runs(self):
        # The shared parameters' gradient nodes are used from several streams on purpose.
        torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch(False)
        self.addCleanup(torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch, True)
        cpu_models = [make_model(d) for d in (0, 1)]
        models = [make_model(d).to(f"openreg:{d}") for d in (0, 1)]
        streams = [[torch.openreg.Stream(device=d) for _ in range(STREAMS)] for d in (0, 1)]
        for d in (0, 1):
            torch.openreg.synchronize(d)
        inputs = [inputs_of(t) for t in range(THREADS)]

        # Serial: one thread, the default streams.
        serial = [[work(models[t % 2], x, f"openreg:{t % 2}") for x in inputs[t]] for t in range(THREADS)]
        serial = [[[r.cpu() for r in it] for it in per] for per in serial]
        cpu = [[work(cpu_models[t % 2], x, "cpu") for x in inputs[t]] for t in range(THREADS)]

        results = [None] * THREADS
        start = threading.Barrier(THREADS)

        def run(t):
            d = t % 2
            torch.openreg.set_device(d)  # the current device is per thread
            start.wait()
            out = []
            for i, x in enumerate(inputs[t]):
                stream = streams[d][(t + i) % STREAMS]  # threads interleave in each stream
                out.append(work(models[d], x, f"openreg:{d}", stream))
                if i % 4 == 3:
                    ev = torch.openreg.Event()
                    ev.record(stream)
                    ev.synchronize()
            for s in streams[d]:
                s.synchronize()
            results[t] = [[r.cpu() for r in it] for it in out]

        run_threads(run, THREADS)
        for t in range(THREADS):
            for i in range(ITERS):
                self.assertEqual(results[t][i], serial[t][i], msg=f"thread {t}, iteration {i}: threaded != serial")
                self.assertEqual(serial[t][i], cpu[t][i], msg=f"thread {t}, iteration {i}: openreg != CPU")

    def test_threads_copy_between_devices_concurrently(self):
        # Cross-device copies order themselves against both devices' current streams: threads
        # doing them at once, in both directions, on their own streams.

        def run(t):
            src, dst = t % 2, 1 - t % 2
            s = torch.openreg.Stream(device=src)
            with torch.openreg.stream(s):
                for i in range(20):
                    host = torch.arange(1000.0) * (t + 1) + i
                    a = host.to(f"openreg:{src}")
                    b = (a * 2).to(f"openreg:{dst}")
                    self.assertEqual(b.cpu(), host * 2)

        run_threads(run, THREADS)


if __name__ == "__main__":
    run_tests()
