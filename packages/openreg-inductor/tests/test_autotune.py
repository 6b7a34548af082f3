"""max-autotune on openreg: the ATen extern kernel and Inductor's C++ GEMM templates are both
offered, each timed on the device with openreg events, and the chosen template runs as an openreg
launcher (openreg_inductor/autotune.py, workarounds 8 to 11 in openreg_inductor/_torch213.py)."""

import contextlib
import math
import time
from unittest import mock

import openreg_inductor
import torch
from conftest import release
from test_streams import call_while_held, launches_in
from torch._dynamo.utils import counters
from torch._inductor import config
from torch._inductor.runtime import benchmarking
from torch._inductor.utils import run_and_get_code
from torch.testing._internal.common_utils import TestCase, run_tests


def setUpModule():
    openreg_inductor.register()  # before any compile: the tests reach the benchmarker directly


MODE = "max-autotune-no-cudagraphs"  # the graph mode of "max-autotune" is tested in test_graphs.py


@torch.library.custom_op("openreg_inductor_test::sleep_on_device", mutates_args=(), device_types="cpu")
def sleep_on_device(x: torch.Tensor, ms: float) -> torch.Tensor:
    time.sleep(ms / 1000)
    return x.clone()


@sleep_on_device.register_fake
def _(x, ms):
    return torch.empty_like(x)


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 40)).eval()


class TimedChoices:
    """Wraps openreg's registered benchmarker: records what each timed choice launched."""

    def __init__(self):
        self.real = benchmarking._BENCHMARK_DISPATCH["openreg"]
        self.launches = []

    def __call__(self, benchmarker, fn, **kwargs):
        before = torch.openreg._runtime_counters()["kernels_launched"]
        ms = self.real(benchmarker, fn, **kwargs)
        self.launches.append(torch.openreg._runtime_counters()["kernels_launched"] - before)
        assert ms > 0
        return ms

    def patch(self):
        return mock.patch.dict(benchmarking._BENCHMARK_DISPATCH, {"openreg": self})


@contextlib.contextmanager
def recorded_timings():
    """Each autotuned choice's time (ms) by name, from Inductor's feedback hook."""
    from torch._inductor import select_algorithm

    timings = {}

    def save(choice_timings, *args):
        timings.update({choice.name: ms for choice, ms in choice_timings.items()})

    select_algorithm.add_feedback_saver(save)
    try:
        yield timings
    finally:
        select_algorithm.clear_feedback_savers()


def frozen_inference(model, x, backends):
    """``model(x)`` compiled for inference with frozen weights (constants: what the GEMM templates
    of mm/addmm need, as on the CPU)."""
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad(), config.patch(freezing=True, max_autotune_gemm_backends=backends):
        return torch.compile(model, mode=MODE)(x)


class TestChoices(TestCase):
    def test_both_choices_are_timed_with_openreg_events(self):
        model, x = mlp(), torch.randn(32, 64)
        with torch.no_grad():
            expected = model(x)
        timed = TimedChoices()
        with timed.patch(), recorded_timings() as timings:
            out = frozen_inference(model.to("openreg"), x.to("openreg"), "ATEN,CPP")
        # Two products, each with two choices (extern addmm, C++ template), each run on the device.
        self.assertEqual(counters["inductor"]["select_algorithm_autotune"], 2)
        self.assertEqual(len(timed.launches), 4)
        self.assertTrue(all(n > 0 for n in timed.launches), timed.launches)
        self.assertTrue(all(0 < ms < math.inf for ms in timings.values()), timings)
        self.assertEqual(out.cpu(), expected, atol=1e-5, rtol=1e-5)

    def test_bmm_with_an_epilogue_chooses_at_once(self):
        # bmm gets the C++ template for any operands (no freezing); its relu is a fusable epilogue,
        # which torch would choose at fusion time by benchmarking Triton kernels (workaround 11).
        def f(a, b):
            return torch.bmm(a, b).relu() + 1

        a, b = torch.randn(4, 24, 40), torch.randn(4, 40, 48)
        torch._dynamo.reset()
        with config.patch(max_autotune_gemm_backends="ATEN,CPP"):
            expected = torch.compile(f, mode=MODE)(a, b)
            torch._dynamo.reset()
            counters.clear()
            timed = TimedChoices()
            with timed.patch():
                out = torch.compile(f, mode=MODE)(a.to("openreg"), b.to("openreg"))
        self.assertEqual(counters["inductor"]["select_algorithm_autotune"], 1)
        self.assertEqual(len(timed.launches), 2)
        self.assertEqual(out.cpu(), expected, atol=1e-5, rtol=1e-5)
        self.assertEqual(out.cpu(), f(a, b), atol=1e-5, rtol=1e-5)

    def test_templates_are_timed_in_a_tuning_process(self):
        # autotune_in_subproc: the template's benchmark request is pickled to a tuning process,
        # which has loaded the device but not this backend (autotune.OpenRegCppBenchmarkRequest.do_bench).
        def f(a, b):
            return torch.bmm(a, b) * 2

        a, b = torch.randn(3, 16, 56), torch.randn(3, 56, 32)
        torch._dynamo.reset()
        subproc = config.patch(autotune_in_subproc=True, max_autotune_gemm_backends="ATEN,CPP")
        with subproc, recorded_timings() as timings:
            out = torch.compile(f, mode=MODE)(a.to("openreg"), b.to("openreg"))
        self.assertEqual(len(timings), 2, timings)
        self.assertTrue(all(0 < ms < math.inf for ms in timings.values()), timings)  # inf: the choice failed
        self.assertEqual(out.cpu(), f(a, b), atol=1e-5, rtol=1e-5)

    def test_events_time_the_device_not_the_host(self):
        # Each run enqueues a kernel that sleeps 5 ms on the stream's worker and returns: a host
        # timer would read microseconds, the events read the sleep.
        x = torch.zeros(4, device="openreg")
        sleep_on_device(x, 1.0)  # an op's first call is synchronous
        torch.openreg.synchronize()
        ms = benchmarking.benchmarker.benchmark(lambda: sleep_on_device(x, 5.0), device="openreg", warmup=1, rep=20)
        self.assertGreaterEqual(ms, 5.0)


class TestTemplates(TestCase):
    def tearDown(self):
        release.set()
        super().tearDown()

    def test_cpp_gemm_template_with_a_fused_epilogue(self):
        model, x = mlp(), torch.randn(32, 64)
        with torch.no_grad():
            expected, expected_twice = model(x), model(x * 2)
        model.to("openreg")
        x, x2 = x.to("openreg"), x.to("openreg") * 2
        torch._dynamo.reset()
        counters.clear()
        with torch.no_grad(), config.patch(freezing=True, max_autotune_gemm_backends="CPP"):  # the templates only
            compiled = torch.compile(model, mode=MODE)
            out, (code,) = run_and_get_code(compiled, x)
            self.assertEqual(counters["inductor"]["cpp_templated_kernel_counter"], 2)
            self.assertEqual(counters["inductor"]["cpp_epilogue_fusion_counter"], 1)  # bias + relu
            self.assertNotIn("extern_kernels.addmm", code)
            self.assertIn("micro_gemm", code)
            self.assertIn("orLaunchKernel(", code)
            self.assertEqual(out.cpu(), expected, atol=1e-5, rtol=1e-5)
            # The compiled call only launches its kernels: it returns while the stream is held.
            out, busy, counted = call_while_held(compiled, x2)
        self.assertTrue(busy, "the compiled call waited for the device")
        self.assertEqual(counted["memcpy_h2d"], 0)
        self.assertEqual(counted["memcpy_d2h"], 0)
        self.assertEqual(counted["kernels_launched"], launches_in(code))
        self.assertEqual(out.cpu(), expected_twice, atol=1e-5, rtol=1e-5)

    def test_small_bmm_template_with_a_local_buffer(self):
        # At this size the bmm template accumulates in a buffer local to its kernel, laid out on
        # "cpu" by Inductor; copied to the openreg output it made a DeviceCopy over the
        # template's symbolic block sizes, which failed to lower (workaround 16).
        a, b = torch.randn(2, 8, 16), torch.randn(2, 16, 12)
        torch._dynamo.reset()
        counters.clear()
        with config.patch(max_autotune_gemm_backends="CPP"):  # the template only
            out = torch.compile(torch.bmm, mode=MODE)(a.to("openreg"), b.to("openreg"))
        self.assertEqual(counters["inductor"]["cpp_templated_kernel_counter"], 1)
        self.assertEqual(out.device, torch.device("openreg", 0))
        self.assertEqual(out.cpu(), torch.bmm(a, b), atol=1e-5, rtol=1e-5)

    def test_benchmark_request_refuses_code_without_its_entry(self):
        from openreg_inductor.autotune import OpenRegCppBenchmarkRequest

        with self.assertRaisesRegex(RuntimeError, r"no entry cpp_gemm\(\.\.\.\)"):
            OpenRegCppBenchmarkRequest("cpp_gemm", [], [], (), 'extern "C" void other(float* Y) {}')


if __name__ == "__main__":
    run_tests()
