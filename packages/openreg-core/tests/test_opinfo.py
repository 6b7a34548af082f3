"""The correctness suite: every operator of PyTorch's OpInfo database (op_db) that has a CPU
implementation, run on openreg and compared with the CPU.

Per operator: forward results for float32, int64 and bool samples; the same samples made
non-contiguous; the out= variant; and, for differentiable operators, the gradients of float32
samples. Random and uninitialised results are compared on their metadata (shape, dtype) only.
Operators expected to fail are listed with the reason, and their test asserts that they still
fail, so the list stays honest. A last test checks that at least 98 % of all samples pass.
"""

import math

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase, instantiate_parametrized_tests, parametrize, run_tests
from torch.testing._internal.opinfo.core import SampleInput
from torch.utils._pytree import tree_flatten, tree_map

DTYPES = (torch.float32, torch.int64, torch.bool)
FORWARD_SAMPLES = 6  # per dtype; keeps the suite within the CI budget on 2 cores
OUT_SAMPLES = 2
GRAD_SAMPLES = 3

# Random or uninitialised outputs: checked for shape and dtype, not values (openreg's generators
# are not the CPU generator, and uninitialised memory has no expected value).
RANDOM_OPS = {
    "bernoulli",
    "cauchy",
    "exponential",
    "geometric",
    "log_normal",
    "multinomial",
    "normal",
    "normal.in_place",
    "normal.number_mean",
    "uniform",
    "rand_like",
    "randn_like",
    "randint_like",
    "randint",
    "rand",
    "randn",
    "nn.functional.rrelu",
    "nn.functional.dropout",
    "nn.functional.dropout2d",
    "nn.functional.dropout3d",
    "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.feature_alpha_dropout.without_train",
    "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d",
    "pca_lowrank",
    "svd_lowrank",
    "empty",
    "empty_like",
    "empty_strided",
    "empty_permuted",
    "new_empty",
    "new_empty_strided",
}
# Deterministic ops whose samples are random for some arguments.
RANDOM_SAMPLES = {
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
    # args[9] is dropout_p; dropout only applies in training mode
    "nn.functional.multi_head_attention_forward": lambda s: s.kwargs.get("training", True) and s.args[9] > 0,
}
# Ops whose result depends on the storage layout behind a view (not only on values): a device copy
# of a strided CPU tensor is laid out differently, so the non-contiguous variant compares nothing real.
STORAGE_DEPENDENT = {"as_strided", "as_strided_copy", "as_strided_scatter", "as_strided.partial_views"}
EXPECTED_FAILURES = {
    "tensor_split": "tensor_indices_or_sections must stay a CPU tensor (as on CUDA); the suite moves every "
    "tensor to the device",
    "as_strided.partial_views": "the sample is a view into a larger CPU tensor; moving it to the device copies "
    "only the view, so as_strided over the storage reads other memory (an artefact of the sample transform)",
    "sparse.sampled_addmm": "sparse layouts are not supported on openreg",
    "sparse.mm.reduce": "sparse layouts are not supported on openreg",
    "to_sparse": "sparse layouts are not supported on openreg",
}

OPS = [op for op in op_db if any(dt in op.supported_dtypes("cpu") for dt in DTYPES)]
RESULTS: dict = {}  # op name -> [passed, failed]


def op_name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def to_openreg(x):
    return x.to("openreg") if isinstance(x, torch.Tensor) else x


def to_device(sample):
    """The sample on openreg: its tensors moved, and a factory's `device` argument pointed at openreg."""
    d = sample.transform(to_openreg)
    if "device" in d.kwargs:
        d = SampleInput(d.input, args=d.args, kwargs={**d.kwargs, "device": "openreg"})
    return d


def to_cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def same_metadata(got, expected) -> None:
    got_leaves, _ = tree_flatten(got)
    exp_leaves, _ = tree_flatten(expected)
    assert len(got_leaves) == len(exp_leaves), f"{len(got_leaves)} results, expected {len(exp_leaves)}"
    for g, e in zip(got_leaves, exp_leaves):
        if isinstance(e, torch.Tensor):
            assert (g.shape, g.dtype) == (e.shape, e.dtype), f"{(g.shape, g.dtype)} != {(e.shape, e.dtype)}"


def compare(got, expected, random: bool, atol=1e-4, rtol=1e-4) -> None:
    got = tree_map(to_cpu, got)
    if random:
        same_metadata(got, expected)
    else:
        torch.testing.assert_close(got, expected, equal_nan=True, atol=atol, rtol=rtol, check_device=False)


class Tally:
    def __init__(self):
        self.passed, self.failures = 0, []

    def run(self, what: str, fn) -> None:
        try:
            fn()
            self.passed += 1
        except Exception as e:  # noqa: BLE001  (every failure is reported with its kind)
            self.failures.append(f"{what}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")


def check_forward(op, name: str, tally: Tally) -> None:
    for dtype in DTYPES:
        if dtype not in op.supported_dtypes("cpu"):
            continue
        try:
            samples = list(op.sample_inputs("cpu", dtype))[:FORWARD_SAMPLES]
        except Exception:  # noqa: BLE001  (an op without samples for this dtype)
            continue
        for i, sample in enumerate(samples):
            random = name in RANDOM_OPS or RANDOM_SAMPLES.get(name, lambda s: False)(sample)
            variants = [("", sample, lambda: to_device(sample))]
            if name not in STORAGE_DEPENDENT:  # made non-contiguous on each side, with device ops on openreg
                try:
                    cpu_noncontiguous = sample.noncontiguous()
                except Exception:  # noqa: BLE001  (layouts without strides, e.g. sparse)
                    cpu_noncontiguous = None
                if cpu_noncontiguous is not None:
                    variants.append((" non-contiguous", cpu_noncontiguous, lambda: to_device(sample).noncontiguous()))
            for variant, s, device_sample in variants:
                try:
                    torch.manual_seed(0)
                    expected = op(s.input, *s.args, **s.kwargs)
                except Exception:  # noqa: BLE001  (the CPU rejects this sample: nothing to compare)
                    continue

                def run(device_sample=device_sample, expected=expected):
                    # The first call of a signature runs synchronously (it checks the meta kernel
                    # against the CPU kernel); the second, on a fresh copy of the same sample,
                    # takes the asynchronous path. Both must give the CPU's result.
                    for _ in range(2):
                        d = device_sample()
                        compare(op(d.input, *d.args, **d.kwargs), expected, random)

                tally.run(f"{dtype} sample {i}{variant}", run)
            if op.supports_out and i < OUT_SAMPLES and not random:
                check_out(op, sample, dtype, i, tally)


def check_out(op, s, dtype, i: int, tally: Tally) -> None:
    try:
        expected = op(s.input, *s.args, **s.kwargs)
    except Exception:  # noqa: BLE001
        return
    if not isinstance(expected, torch.Tensor):  # multi-output out= signatures vary too much to build here
        return

    def run():
        out = torch.empty_like(expected, device="openreg")
        d = to_device(s)
        op(d.input, *d.args, out=out, **d.kwargs)
        compare(out, expected, random=False)

    tally.run(f"{dtype} sample {i} out=", run)


def check_backward(op, name: str, tally: Tally) -> None:
    if not op.supports_autograd or name in RANDOM_OPS or torch.float32 not in op.supported_backward_dtypes("cpu"):
        return
    try:
        samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=True))[:GRAD_SAMPLES]
    except Exception:  # noqa: BLE001
        return
    for i, s in enumerate(samples):
        if RANDOM_SAMPLES.get(name, lambda s: False)(s):
            continue
        leaves = [
            t for t in tree_flatten((s.input, s.args, s.kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        try:
            expected_grads = gradients(op, s, leaves)
        except Exception:  # noqa: BLE001  (no usable gradient on the CPU either)
            continue
        if expected_grads is None:
            continue

        def run():
            mapping = {}

            def move(t):
                if not isinstance(t, torch.Tensor):
                    return t
                m = t.detach().to("openreg").requires_grad_(t.requires_grad)
                mapping[id(t)] = m
                return m

            d = s.transform(move)
            dev_leaves = [mapping[id(t)] for t in leaves]
            got = gradients(op, d, dev_leaves)
            compare(got, expected_grads, random=False, atol=1e-3, rtol=1e-3)

        tally.run(f"float32 sample {i} backward", run)


def gradients(op, s, leaves):
    out = op(s.input, *s.args, **s.kwargs)
    outs = [
        o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()
    ]
    if not outs or not leaves:
        return None
    loss = sum(o.sum() for o in outs)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [g if g is not None else torch.zeros(0) for g in grads]


@instantiate_parametrized_tests
class TestOpInfo(TestCase):
    @parametrize("op", OPS, name_fn=op_name)
    def test_matches_cpu(self, op):
        name = op_name(op)
        tally = Tally()
        check_forward(op, name, tally)
        check_backward(op, name, tally)
        RESULTS[name] = [tally.passed, len(tally.failures)]
        torch.openreg.synchronize()
        if name in EXPECTED_FAILURES:
            self.assertTrue(tally.failures, f"{name} passes now: remove it from EXPECTED_FAILURES")
        else:
            self.assertEqual(
                tally.failures, [], f"{name}: {len(tally.failures)} of {tally.passed + len(tally.failures)} failed"
            )


class TestOpInfoSummary(TestCase):
    def test_pass_rate(self):
        self.assertEqual(len(RESULTS), len(OPS), "run the whole file: the summary needs every operator's result")
        passed = sum(p for p, _ in RESULTS.values())
        total = passed + sum(f for _, f in RESULTS.values())
        self.assertGreaterEqual(passed / total, 0.98, f"{passed} of {total} samples passed")
        self.assertFalse(math.isnan(passed / total))


if __name__ == "__main__":
    run_tests()
