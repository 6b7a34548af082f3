"""Soak: random eager operators and training steps across 2 devices and 4 streams, mirrored on the
CPU. After a warm-up, nothing may grow: memory_allocated() returns to its baseline, reserved memory
stays put, and the process keeps its thread and file-descriptor counts and its resident size.

The quick profile (here, in `nox -s core`) runs 1,000 operators and 100 training steps;
`nox -s soak` runs the full one (OPENREG_SOAK_SCALE=10: 10,000 operators, 1,000 steps). Host
counts come from psutil (every OS), or from /proc on Linux without it.
"""

import gc
import os
import random
from contextlib import nullcontext

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

MiB = 1 << 20
SCALE = float(os.environ.get("OPENREG_SOAK_SCALE", "1"))
OPS = int(1000 * SCALE)
STEPS = int(100 * SCALE)
SHAPES = [(0,), (1,), (7,), (64,), (16, 16), (33, 17), (128, 128), (4, 1, 32)]


def _unary(rng):
    return rng.choice(
        [
            lambda t: -t,
            lambda t: t.abs(),
            torch.tanh,
            torch.sigmoid,
            torch.relu,
            lambda t: t.clamp(-3, 3).exp(),
            lambda t: t * 2.5,
            lambda t: t.clone().mul_(0.5),
            lambda t: t.flip(0),
            lambda t: t[::2].contiguous(),
            lambda t: t.transpose(0, -1).contiguous(),
            lambda t: t.cumsum(0) / (t.shape[0] + 1),
            lambda t: t.softmax(-1),
            lambda t: t.sum(0, keepdim=True).expand_as(t).clone(),
            lambda t: torch.where(t > 0, t, t * 0.1),
        ]
    )


def _binary(rng):
    return rng.choice(
        [
            torch.add,
            torch.sub,
            torch.mul,
            torch.maximum,
            lambda a, b: torch.lerp(a, b, 0.3),
            lambda a, b: torch.stack([a, b]).amax(0),
            lambda a, b: (a @ b) / a.shape[-1] if a.dim() == 2 and a.shape[0] == a.shape[1] else a - b,
        ]
    )


class Pool:
    """Live tensors per device, each with its CPU mirror and the stream that made it."""

    def __init__(self, streams):
        self.streams = streams  # device -> its two streams
        self.items = {0: [], 1: []}

    def put(self, d, dev, ref, stream):
        items = self.items[d]
        items.append((dev, ref, stream))
        if len(items) > 12:  # dropping one frees it, maybe on another stream than it was made on
            items.pop(0)

    def pick(self, rng, d, shape=None):
        items = [x for x in self.items[d] if shape is None or tuple(x[0].shape) == shape]
        return rng.choice(items) if items else None


def _fresh(rng, d, shape):
    cpu = torch.randn(shape, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
    return cpu.to(f"openreg:{d}"), cpu


def random_ops(rng, pool, n, check_every=50):
    """Runs `n` random operators, each on a random device and stream, against the CPU."""
    for i in range(n):
        d = rng.randrange(2)
        stream = rng.choice(pool.streams[d])
        shape = rng.choice(SHAPES)
        with torch.openreg.stream(stream):
            kind = rng.random()
            src = pool.pick(rng, d, shape)
            if src is None or kind < 0.15:
                dev, ref = _fresh(rng, d, shape)
            elif kind < 0.25:  # across devices: the copy orders itself
                other = pool.pick(rng, 1 - d)
                if other is None:
                    continue
                # The copy waits for the source device's current stream: order that after the maker.
                torch.openreg.current_stream(1 - d).wait_stream(other[2])
                dev, ref = other[0].to(f"openreg:{d}"), other[1]
            else:
                inputs = [src]
                if kind < 0.6:
                    inputs.append(pool.pick(rng, d, shape))
                for x in inputs:
                    if x[2] != stream:  # made on another stream: order after it, and tell the allocator
                        stream.wait_stream(x[2])
                        x[0].record_stream(stream)
                if len(inputs) == 2:
                    op = _binary(rng)
                    dev, ref = op(inputs[0][0], inputs[1][0]), op(inputs[0][1], inputs[1][1])
                else:
                    op = _unary(rng)
                    dev, ref = op(inputs[0][0]), op(inputs[0][1])
            if i % check_every == 0:  # on the stream that made it
                torch.testing.assert_close(dev.cpu(), ref, equal_nan=True)
        pool.put(d, dev, ref, stream)


def train(models, pool, steps):
    """SGD steps of one small MLP per device, each step on one of the device's streams."""
    rng = random.Random(7)
    for step in range(steps):
        d = step % 2
        (dev_model, dev_opt), (cpu_model, cpu_opt) = models[d]
        stream = pool.streams[d][(step // 2) % 2]
        stream.wait_stream(pool.streams[d][1 - (step // 2) % 2])  # the previous step's parameters
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
        y = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(step))
        for model, opt, dev in ((dev_model, dev_opt, f"openreg:{d}"), (cpu_model, cpu_opt, "cpu")):
            with torch.openreg.stream(stream) if dev != "cpu" else nullcontext():
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
                loss.backward()
                opt.step()


def _mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def _start_workers(streams):
    """Every stream (and each device's default stream) runs a kernel large enough for the CPU's
    intra-op pool: stream workers and their OpenMP teams start now, before threads are counted."""
    for d in (0, 1):
        for s in [*streams[d], torch.openreg.default_stream(d)]:
            with torch.openreg.stream(s):
                a = torch.ones(256, 256, device=f"openreg:{d}")
                ((a @ a).sum() + (torch.ones(1 << 18, device=f"openreg:{d}") * 2).sum()).item()


def _host():
    """The process's OS threads, file descriptors (handles on Windows) and resident bytes."""
    try:
        import psutil
    except ImportError:  # Linux without psutil: the same numbers from /proc
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return {"threads": len(os.listdir("/proc/self/task")), "fds": len(os.listdir("/proc/self/fd")), "rss": rss}
    p = psutil.Process()
    fds = p.num_handles() if hasattr(p, "num_handles") else p.num_fds()
    return {"threads": p.num_threads(), "fds": fds, "rss": p.memory_info().rss}


class TestSoak(TestCase):
    def test_random_ops_and_training_leave_nothing_behind(self):
        gc.collect()
        for d in (0, 1):
            torch.openreg.synchronize(d)
        baseline = [torch.openreg.memory_allocated(d) for d in (0, 1)]
        streams = {d: [torch.openreg.Stream(device=d) for _ in range(2)] for d in (0, 1)}
        _start_workers(streams)
        pool = Pool(streams)
        models = {}
        for d in (0, 1):
            cpu_model = _mlp(d)
            dev_model = _mlp(d).to(f"openreg:{d}")
            models[d] = (
                (dev_model, torch.optim.SGD(dev_model.parameters(), lr=0.05, momentum=0.9)),
                (cpu_model, torch.optim.SGD(cpu_model.parameters(), lr=0.05, momentum=0.9)),
            )
        rng = random.Random(1234)

        def phase(ops, steps):
            random_ops(rng, pool, ops)
            train(models, pool, steps)
            for d in (0, 1):
                torch.openreg.synchronize(d)
            gc.collect()
            return [torch.openreg.memory_reserved(d) for d in (0, 1)], _host()

        # Warm-up: a tenth of the work sets up streams' workers, pools, autograd's device threads.
        reserved_warm, host_warm = phase(OPS // 10, STEPS // 10)
        reserved_half, _ = phase(OPS * 4 // 10, STEPS * 4 // 10)
        reserved_end, host_end = phase(OPS - OPS // 10 - OPS * 4 // 10, STEPS - STEPS // 10 - STEPS * 4 // 10)

        for d in (0, 1):  # the results, after everything
            dev_model, cpu_model = models[d][0][0], models[d][1][0]
            for p_dev, p_cpu in zip(dev_model.parameters(), cpu_model.parameters()):
                torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-4, atol=1e-5)
            for dev, ref, _ in pool.items[d]:
                torch.testing.assert_close(dev.cpu(), ref, equal_nan=True)
        pool.items.clear()
        models.clear()
        del dev_model, cpu_model, p_dev, p_cpu, dev, ref
        gc.collect()
        for d in (0, 1):
            torch.openreg.synchronize(d)
            self.assertEqual(torch.openreg.memory_allocated(d), baseline[d], f"memory_allocated({d})")
            # Reserved memory settles in the first half: the second half adds no segment.
            self.assertLessEqual(reserved_end[d], reserved_half[d], f"memory_reserved({d}) grew")
        self.assertEqual(host_end["threads"], host_warm["threads"], "threads")
        self.assertEqual(host_end["fds"], host_warm["fds"], "file descriptors")
        # Resident size: device memory is host memory here, and reserved segments are counted in
        # it; beyond them, a leak of a few bytes per operator would show over the run.
        grown = host_end["rss"] - host_warm["rss"] - sum(max(0, e - w) for e, w in zip(reserved_end, reserved_warm))
        self.assertLess(grown, 64 * MiB, f"host RSS grew by {grown / MiB:.1f} MiB")


if __name__ == "__main__":
    run_tests()
