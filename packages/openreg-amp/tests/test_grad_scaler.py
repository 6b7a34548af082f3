"""GradScaler on openreg: the native kernels of GradScalerKernels.cpp and training loops."""

import torch
from torch.testing._internal.common_utils import TestCase
from torch_openreg.utils.testing import StreamHold

UNSCALE = torch._amp_foreach_non_finite_check_and_unscale_
UPDATE = torch._amp_update_scale_


def _grads(device: str):
    g = torch.Generator().manual_seed(0)
    out = [
        torch.randn(1000, generator=g),
        torch.randn(64, 33, generator=g).to(torch.float16),
        torch.randn(64, 33, generator=g).to(torch.bfloat16),
        torch.randn(40, 30, generator=g).t(),  # non-contiguous
        torch.randn(100_000, generator=g),  # split across threads
    ]
    return [t.to(device) for t in out]


class TestNativeKernels(TestCase):
    def _unscale(self, device, poison=None):
        grads = _grads(device)
        if poison is not None:
            index, value = poison
            grads[index][(7,) if grads[index].dim() == 1 else (1, 7)] = value
        found = torch.zeros(1, device=device)
        UNSCALE(grads, found, torch.full((1,), 0.25, device=device))
        return grads, found

    def test_unscale_matches_cpu(self):
        for poison in (None, (0, float("inf")), (1, float("nan")), (3, -float("inf")), (4, float("nan"))):
            got, found = self._unscale("openreg", poison)
            want, want_found = self._unscale("cpu", poison)
            self.assertEqual(found.cpu(), want_found, msg=f"poison={poison}")
            self.assertEqual(found.item(), 0.0 if poison is None else 1.0)
            for g, w in zip(got, want):
                self.assertEqual(g.dtype, w.dtype)
                self.assertEqual(g.stride(), w.stride())
                torch.testing.assert_close(g.cpu(), w, equal_nan=True)

    def test_found_inf_is_only_ever_set(self):
        found = torch.ones(1, device="openreg")
        UNSCALE([torch.ones(3, device="openreg")], found, torch.ones(1, device="openreg"))
        self.assertEqual(found.item(), 1.0)

    def test_update_scale_matches_cpu(self):
        # growth every 3 clean steps, backoff on inf steps, growth capped at a finite value
        steps = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0]
        results = {}
        for device in ("cpu", "openreg"):
            scale = torch.full((1,), 2.0**16, device=device)
            tracker = torch.zeros(1, dtype=torch.int32, device=device)
            seen = []
            for inf in steps:
                found = torch.full((1,), float(inf), device=device)
                out = UPDATE(scale, tracker, found, 2.0, 0.5, 3)
                self.assertIs(out, scale)
                seen.append((scale.item(), tracker.item()))
            results[device] = seen
        self.assertEqual(results["openreg"], results["cpu"])
        self.assertEqual(results["openreg"][2], (2.0**17, 0))
        self.assertEqual(results["openreg"][3], (2.0**16, 0))

    def test_update_scale_with_inexact_factors_matches_cpu(self):
        # Factors that are no power of two: the float scale times the double factor, rounded once,
        # as the CPU and CUDA compute it (the factors were rounded to float first, and 38 of 40
        # steps drifted from the CPU's schedule).
        rng = torch.Generator().manual_seed(0)
        steps = (torch.rand(40, generator=rng) < 0.3).tolist()
        results = {}
        for device in ("cpu", "openreg"):
            scale = torch.full((1,), 65536.0, device=device)
            tracker = torch.zeros(1, dtype=torch.int32, device=device)
            seen = []
            for inf in steps:
                UPDATE(scale, tracker, torch.full((1,), float(inf), device=device), 1.1, 0.3, 1)
                seen.append(scale.item())
            results[device] = seen
        self.assertEqual(results["openreg"], results["cpu"], atol=0, rtol=0)

    def test_update_scale_never_grows_to_inf(self):
        scale = torch.full((1,), torch.finfo(torch.float32).max, device="openreg")
        tracker = torch.zeros(1, dtype=torch.int32, device="openreg")
        UPDATE(scale, tracker, torch.zeros(1, device="openreg"), 2.0, 0.5, 1)
        self.assertEqual(scale.item(), torch.finfo(torch.float32).max)
        self.assertEqual(tracker.item(), 0)

    def test_kernels_are_native_not_generic_path(self):
        grads = _grads("openreg")
        found, inv = torch.zeros(1, device="openreg"), torch.ones(1, device="openreg")
        scale, tracker = torch.ones(1, device="openreg"), torch.zeros(1, dtype=torch.int32, device="openreg")
        torch.openreg.reset_fallback_op_counts()
        torch.openreg.set_strict_mode(True)  # an op without a native kernel would raise
        try:
            UNSCALE(grads, found, inv)
            UPDATE(scale, tracker, found, 2.0, 0.5, 10)
        finally:
            torch.openreg.set_strict_mode(False)
        self.assertEqual(torch.openreg.fallback_op_counts(), {})
        self.assertEqual(tracker.item(), 1)

    def test_unscale_of_a_view_whose_elements_share_memory_matches_cpu(self):
        # The overlap check cannot prove this view overlaps (base[1] is read twice), so the CPU and
        # openreg accept it; the CPU unscales it in place, element by element. openreg unscaled a
        # contiguous copy and wrote it back: the shared element was multiplied once, not twice.
        results = {}
        for device in ("cpu", "openreg"):
            base = torch.tensor([1.0, 2.0, 3.0, float("inf"), 5.0], device=device)
            found = torch.zeros(1, device=device)
            g = base.as_strided((2, 2), (1, 1))  # [[b0, b1], [b1, b2]]
            other = base[3:]  # the inf, contiguous: found either way
            UNSCALE([g], found, torch.full((1,), 0.5, device=device))
            first = (base.cpu().tolist(), found.item())
            UNSCALE([other], found, torch.full((1,), 0.5, device=device))
            results[device] = (first, base.cpu().tolist(), found.item())
        self.assertEqual(results["openreg"], results["cpu"])
        self.assertEqual(results["cpu"][0], ([0.5, 0.5, 1.5, float("inf"), 5.0], 0.0))

    def test_kernels_run_on_the_current_stream_without_host_sync(self):
        # Hold a side stream, then unscale there: the host returns before the side stream reaches
        # the unscale, and the default stream never sees the work.
        side = torch.openreg.Stream()
        found = torch.zeros(1, device="openreg")
        grads = [torch.full((4,), 8.0, device="openreg")]
        with torch.openreg.stream(side), StreamHold():  # a call that waited would block until the hold times out
            UNSCALE(grads, found, torch.full((1,), 0.5, device="openreg"))
            self.assertFalse(side.query())  # still held: the call did not wait
        side.synchronize()
        self.assertEqual(grads[0].cpu().tolist(), [4.0] * 4)

    def test_bad_arguments(self):
        dev = "openreg"
        g = [torch.ones(2, device=dev)]
        one, zero = torch.ones(1, device=dev), torch.zeros(1, device=dev)
        cases = [
            (lambda: UNSCALE(g, torch.zeros(1, dtype=torch.float16, device=dev), one), "found_inf must be a float"),
            (lambda: UNSCALE(g, torch.zeros(2, device=dev), one), "found_inf must be a 1-element tensor"),
            (lambda: UNSCALE(g, zero, torch.ones(2, device=dev)), "inv_scale must be a 1-element"),
            (lambda: UNSCALE(g, torch.zeros(1, device=dev), torch.ones(1)), "inv_scale must be an openreg tensor"),
            (lambda: UNSCALE([torch.ones(2, device="openreg:1")], zero, one), "must be on openreg:0"),
            (
                # written in place: an expanded grad is refused at the call, as on the CPU
                lambda: UNSCALE([torch.full((4,), 2.0, device=dev).expand(4, 4)], torch.zeros(1, device=dev), one),
                "more than one element of the written-to tensor refers to a single memory location",
            ),
            (
                lambda: UPDATE(one.clone(), torch.zeros(1, device=dev), one, 2.0, 0.5, 1),
                "growth_tracker must be an int tensor, got Float",  # the CPU's words; it said "a int"
            ),
            (
                lambda: UPDATE(
                    torch.ones(2, device=dev), torch.zeros(1, dtype=torch.int32, device=dev), one, 2.0, 0.5, 1
                ),
                "current_scale must be a 1-element",
            ),
            (
                # the device the others must share is current_scale's (it said "where found_inf is")
                lambda: UPDATE(
                    one.clone(),
                    torch.zeros(1, dtype=torch.int32, device=dev),
                    torch.zeros(1, device="openreg:1"),
                    2.0,
                    0.5,
                    1,
                ),
                r"found_inf must be on openreg:0 \(where current_scale is\), got openreg:1",
            ),
        ]
        for call, message in cases:
            with self.assertRaisesRegex(RuntimeError, message):
                call()
        # a type the kernel does not handle is refused at the call, with the CPU's error; float8
        # failed in the kernel and surfaced at a later, unrelated synchronisation, integer and
        # complex grads raised a RuntimeError of openreg's ("scaled grads must be floating point")
        for dtype, name in (
            (torch.float8_e4m3fn, "Float8_e4m3fn"),
            (torch.int64, "Long"),
            (torch.complex64, "ComplexFloat"),
        ):
            for device in ("cpu", dev):
                with self.assertRaisesRegex(NotImplementedError, f"not implemented for '{name}'"):
                    UNSCALE(
                        [torch.ones(2, device=device).to(dtype)],
                        torch.zeros(1, device=device),
                        torch.ones(1, device=device),
                    )
        found = torch.zeros(1, device=dev)
        UNSCALE(g, found, torch.full((1,), 0.5, device=dev))  # still usable
        self.assertEqual(g[0].cpu().tolist(), [0.5, 0.5])

    def test_a_refused_call_leaves_no_kernel_size_behind(self):
        # Kernel arguments count their bytes for the launch (a small kernel runs on one intra-op
        # thread, core's OpenRegStream.h): a call refused after a large grad was counted must not
        # hand that count to the next, unrelated launch, which would run on the whole team.
        import torch_openreg

        large = torch.zeros(torch_openreg._C._small_kernel_bytes() // 4, device="openreg")
        tiny = torch.zeros(1, device="openreg")
        before = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            self.assertEqual(_team_size(tiny).tolist(), [1])
            bad = torch.zeros(2, dtype=torch.int32, device="openreg")
            # The CPU's and CUDA's exception type (it was a RuntimeError).
            with self.assertRaisesRegex(
                NotImplementedError, "_amp_foreach_non_finite_check_and_unscale_\" not implemented for 'Int'"
            ):
                UNSCALE([large, bad], torch.zeros(1, device="openreg"), torch.ones(1, device="openreg"))
            self.assertEqual(_team_size(tiny).tolist(), [1])
            self.assertEqual(_team_size(large).tolist(), [2])  # the rule itself still applies
        finally:
            torch.set_num_threads(before)


@torch.library.custom_op("openreg_amp_test::team_size", mutates_args=(), device_types="cpu")
def _team_size(x: torch.Tensor) -> torch.Tensor:
    """On openreg, a kernel of the generic path: the intra-op thread count it runs with."""
    return torch.tensor([torch.get_num_threads()])


@_team_size.register_fake
def _(x):
    return x.new_empty(1, dtype=torch.int64)


def _train(device: str, amp: bool, steps: int, inject_inf_at=(), seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**12, growth_interval=5, enabled=amp)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(256, 16, generator=g)
    y = (x[:, :1] * 2 - x[:, 1:2]).to(device)
    x = x.to(device)
    losses, skipped, scales = [], [], []
    for step in range(steps):
        before = [p.detach().clone() for p in model.parameters()]
        with torch.autocast(device, dtype=torch.float16, enabled=amp):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        if step in inject_inf_at:
            next(model.parameters()).grad.view(-1)[0] = float("inf")
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        skipped.append(all(torch.equal(b, p) for b, p in zip(before, model.parameters())))
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, skipped, scales


class TestTraining(TestCase):
    def test_mixed_precision_reaches_fp32_loss(self):
        fp32, _, _ = _train("openreg", amp=False, steps=60)
        mixed, skipped, scales = _train("openreg", amp=True, steps=60)
        self.assertLess(fp32[-1], 0.2 * fp32[0])  # it learns
        # Stated tolerance: the fp16 loop ends within 5 % (relative) of the fp32 loop.
        self.assertLess(abs(mixed[-1] - fp32[-1]), 0.05 * fp32[-1] + 1e-4, (mixed[-1], fp32[-1]))
        # The scale grows every 5 clean steps until fp16 overflows; such a step is skipped and
        # the scale halves: a few skips, each one a backoff.
        skips = [i for i, s in enumerate(skipped) if s]
        self.assertLessEqual(len(skips), 6, skips)
        for i in skips:
            self.assertEqual(scales[i], (scales[i - 1] if i else 2.0**12) / 2)

    def test_same_as_cpu_grad_scaler(self):
        got = _train("openreg", amp=True, steps=10, inject_inf_at=(3,))
        want = _train("cpu", amp=True, steps=10, inject_inf_at=(3,))
        self.assertEqual(got[1], want[1])  # the same steps skipped
        self.assertEqual(got[2], want[2])  # the same scale schedule

    def test_steps_with_inf_gradients_are_skipped(self):
        losses, skipped, scales = _train("openreg", amp=True, steps=12, inject_inf_at=(2, 7))
        self.assertEqual([i for i, s in enumerate(skipped) if s], [2, 7])
        self.assertEqual(scales[1], 2.0**12)
        self.assertEqual(scales[2], 2.0**11)  # backoff after the inf step
        self.assertEqual(scales[6], 2.0**11)  # 4 clean steps since: not grown yet
        self.assertEqual(scales[7], 2.0**10)  # the second inf step backs off again
        self.assertLess(losses[-1], losses[0])
