"""An OpInfo-driven compile sweep: every pointwise (unary and binary ufunc) and reduction OpInfo of
PyTorch's op database that runs in float32 on the CPU, on its first sample input, compiled for
openreg and for the CPU and compared. Ops are compiled in groups (one graph per group) so the sweep
costs a handful of compiles; a failing group is split until the failing op is found.

Expected failures, each with its reason, are in EXPECTED_FAILURES and compiled on their own; one
that passes fails the test, so the list stays true."""

import torch
from torch.testing._internal.common_methods_invocations import binary_ufuncs, reduction_ops, unary_ufuncs
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.utils._pytree import tree_map
from torch_openreg.utils.testing import fast_opinfo_samples

fast_opinfo_samples()  # the same samples, without inspect.stack() per sample_inputs call

GROUP = 100
EXPECTED_FAILURES = {
    # The OpInfo wraps rrelu (random when training=True) in torch.testing's wrapper_set_seed, which
    # seeds and saves/restores the RNG state inside the compiled region: Dynamo cannot trace
    # torch.openreg.current_device() (torch_openreg._C._get_device, a pybind builtin), breaks the
    # graph there, and the RNG-state handling then stops at a FakeTensor assertion ("you set
    # no_dispatch() before calling into this function"). rrelu itself compiles and runs on openreg.
    "nn.functional.rrelu": "RNG state access in the compiled region",
}


def _cases():
    cases = []
    for op in (*unary_ufuncs, *binary_ufuncs, *reduction_ops):
        if op.variant_test_name or op.name.startswith(("_refs.", "jiterator")):  # refs repeat ops; jiterator is CUDA
            continue
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        for s in op.sample_inputs("cpu", torch.float32):
            if isinstance(s.input, torch.Tensor) and s.input.numel() > 1:
                cases.append((op.name, op.op, s.input, tuple(s.args), dict(s.kwargs)))
                break
    return cases


def _run(group):
    def f(inputs):
        return [op(x, *args, **kwargs) for (_, op, *_), (x, args, kwargs) in zip(group, inputs)]

    inputs = [(x, args, kwargs) for _, _, x, args, kwargs in group]
    torch._dynamo.reset()
    expected = torch.compile(f)(inputs)
    actual = torch.compile(f)(tree_map(lambda t: t.to("openreg") if isinstance(t, torch.Tensor) else t, inputs))
    failures = {}
    for (name, *_), a, e in zip(group, actual, expected):
        try:
            torch.testing.assert_close(
                tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, a), e, equal_nan=True
            )
        except AssertionError as err:
            failures[name] = f"mismatch: {str(err).splitlines()[0]}"
    return failures


class TestOpInfoSweep(TestCase):
    def test_pointwise_and_reductions_match_cpu_inductor(self):
        cases = _cases()
        self.assertGreater(len(cases), 150)
        sweep = [c for c in cases if c[0] not in EXPECTED_FAILURES]
        failures, todo = {}, [sweep[i : i + GROUP] for i in range(0, len(sweep), GROUP)]
        while todo:
            group = todo.pop()
            try:
                failures.update(_run(group))
            except Exception as err:
                if len(group) == 1:
                    failures[group[0][0]] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
                else:
                    todo += [group[: len(group) // 2], group[len(group) // 2 :]]
        self.assertEqual(failures, {}, "ops that fail on openreg but not on the CPU")

    def test_expected_failures_still_fail(self):
        for case in [c for c in _cases() if c[0] in EXPECTED_FAILURES]:
            with self.subTest(op=case[0]):
                try:
                    failed = bool(_run([case]))
                except Exception:
                    failed = True
                self.assertTrue(failed, f"{case[0]} passes now: remove it from EXPECTED_FAILURES")


if __name__ == "__main__":
    run_tests()
