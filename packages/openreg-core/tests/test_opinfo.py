"""The correctness suite: every operator of PyTorch's OpInfo database (op_db) that has a CPU
implementation, run on openreg and compared with the CPU.

Per operator and dtype, every OpInfo sample is checked (no sample cap):

* dtypes: float32, int64 and bool where the CPU supports them; an operator without int64 is also
  run in its first supported integer dtype (uint8 for interpolate), and one supporting none of the
  three in complex64 or else its first supported CPU dtype (float8 for torch._scaled_mm).
* forward: every result must be an openreg tensor equal to the CPU's (floats within 1e-4;
  integers, bool and float8 exactly). Each sample is called twice: a signature's first call runs
  synchronously, the second takes the asynchronous path. A factory sample without a device
  argument (arange(2)) is given device="openreg".
* non-contiguous: the sample made non-contiguous (OpInfo's noncontiguous()), called once. Samples
  reach the device with their exact strides and storage, so views and as_strided see the same
  memory as on the CPU; tensors op_db keeps on the CPU for a device (tensor_split's indices) stay.
* out=: for operators with an out= variant, tuple and list outputs included (sort, svd, ...),
  into outputs pre-filled with a sentinel; outputs and result must equal the CPU's own out= call
  (CPU_OUT_DIFFERS lists where that differs from the CPU's functional result).
* in place: for operators with an in-place variant (x.add_(y)), on a copy of the input; the
  mutated input and the return must equal the CPU's, in the same order of samples, so that a
  signature verified by one sample cannot carry a later one (an in-place self must never be
  resized: floor_divide_ once broadcast its self to a larger shape).
* backward: for differentiable operators, the gradients of every sample, in float32 or the
  operator's complex dtype, of a loss weighting every floating and complex output (real and
  imaginary parts) with fixed random weights, through OpInfo's gradcheck wrapper.
* A sample the CPU rejects must be rejected by openreg too: it is a check, never a skip.
* Random operators: a sample whose CPU result is the same for three seeds is deterministic and
  compared by value; otherwise only shape and dtype are compared. Uninitialised results (empty*)
  are compared on metadata only.

What cannot be compared is listed by name with its reason, and each list is checked to stay
true: EXPECTED_FAILURES (the checks that fail must still fail, and nothing else), NOT_TESTABLE
(the CPU must still reject every sample), CPU_OUT_DIFFERS. The last test checks that at least
98 % of all checks pass. Runtime: about 1.5 minutes in one process on 2 cores.
"""

import collections
import contextlib
import re
import threading
import unittest.mock

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase, instantiate_parametrized_tests, parametrize, run_tests
from torch.testing._internal.opinfo.core import SampleInput
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
from torch_openreg.utils.testing import fast_opinfo_samples

fast_opinfo_samples()  # the same samples, without inspect.stack() per sample_inputs call

DTYPES = (torch.float32, torch.int64, torch.bool)
SMALL_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32)
RANDOM_SEEDS = (1, 2)  # extra CPU runs that tell a deterministic sample of a random operator

# Random outputs: compared by value only when the CPU gives the same result for every seed
# (openreg's generator is not the CPU generator).
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
}
# Uninitialised outputs have no expected value (two CPU runs may even reuse the same memory).
UNINITIALISED_OPS = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}
# Deterministic ops whose samples are random for some arguments.
RANDOM_SAMPLES = {
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
    # args[9] is dropout_p; dropout only applies in training mode
    "nn.functional.multi_head_attention_forward": lambda s: s.kwargs.get("training", True) and s.args[9] > 0,
}
# Ops whose device samples keep some tensors on the CPU (op_db builds them so for CUDA too, e.g.
# tensor_split's tensor_indices_or_sections must be a CPU tensor): those tensors stay on the CPU.
CPU_TENSOR_ARGS = {"tensor_split", "narrow", "__getitem__", "index_put"}
# Operators whose CPU out= result differs from the functional one (upstream CPU bugs): openreg is
# compared with the CPU's out= call like every other operator; the test checks that the CPU
# still differs, so this list stays true.
CPU_OUT_DIFFERS = {
    "fft.ihfftn": "upstream: torch.fft.ihfftn(x, out=o) on the CPU leaves o unwritten for most shapes",
    "fft.ihfft2": "upstream: torch.fft.ihfft2(x, out=o) on the CPU leaves o unwritten for some shapes",
}
# name -> (regex over the failing checks' labels, reason); empty since sparse layouts work
EXPECTED_FAILURES: dict = {}
# Operators with CPU dtypes in op_db that no CPU call accepts; the test checks that it stays so.
NOT_TESTABLE = {
    name: "CUDA-only jiterator operator: the CPU rejects every sample, so there is no CPU result to compare"
    for name in (
        "jiterator_unary",
        "jiterator_binary",
        "jiterator_4inputs_with_extra_args",
        "jiterator_binary_return_by_ref",
        "jiterator_2inputs_2outputs",
    )
}

OPS = [op for op in op_db if op.supported_dtypes("cpu")]  # op_db's 3 others have no CPU implementation
RESULTS: dict = {}  # op name -> [passed, failed], summed up by conftest.py's report


def seed_cpu_and_openreg(seed: int) -> torch.Generator:
    """torch.manual_seed for the two devices compared here, which the tests put in its place. The
    real one also defers a seeding of CUDA, XPU and MTIA (none initialised here) and formats the
    caller's stack for each of them, on every call; OpInfo reseeds before every sample and so do
    these checks: that was a third of this suite's time (max_pool2d: 1440 samples, 20,000 calls)."""
    torch.default_generator.manual_seed(seed)
    torch.openreg.manual_seed_all(seed)
    return torch.default_generator


MANUAL_SEED = seed_cpu_and_openreg  # our_seed_only() patches torch.manual_seed, not this
CHECK_KINDS = ("non-contiguous", "out=", "in place", "backward", "CPU rejects", "random: metadata")
KINDS: collections.Counter = collections.Counter()  # checks per kind, printed by the summary


def op_name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def dtypes_for(op) -> list:
    supported = op.supported_dtypes("cpu")
    dtypes = [dt for dt in DTYPES if dt in supported]
    if torch.int64 not in supported:  # e.g. interpolate supports uint8 only among integers
        dtypes += [dt for dt in SMALL_INTEGER_DTYPES if dt in supported][:1]
    if not dtypes:  # e.g. view_as_real (complex), torch._scaled_mm (float8)
        dtypes = [torch.complex64] if torch.complex64 in supported else sorted(supported, key=str)[:1]
    return dtypes


def to_openreg(t: torch.Tensor) -> torch.Tensor:
    """t on openreg with the same strides and storage offset: a view keeps its whole storage."""
    t = t.detach()
    storage = t.untyped_storage() if t.layout == torch.strided else None
    if storage is None or t.is_conj() or t.is_neg():  # no plain storage to copy
        return t.to("openreg")
    if t.storage_offset() == 0 and storage.nbytes() == t.numel() * t.element_size():
        return t.to("openreg")  # dense: to() keeps the strides
    base = torch.empty(0, dtype=t.dtype).set_(storage, 0, (storage.nbytes() // t.element_size(),), (1,))
    return base.to("openreg").as_strided(t.shape, t.stride(), t.storage_offset())


def is_cpu_device(x) -> bool:
    return (isinstance(x, str) and x == "cpu") or (isinstance(x, torch.device) and x.type == "cpu")


def to_device(sample, keep_on_cpu=(), leaves_map=None, factory=False):
    """The sample on openreg: tensors moved (except the leaf positions in keep_on_cpu), device
    arguments pointed at openreg, and a factory call given device="openreg"."""
    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    moved = []
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor) and i not in keep_on_cpu:
            m = to_openreg(x).requires_grad_(x.requires_grad)
            if leaves_map is not None:
                leaves_map[id(x)] = m
            x = m
        elif is_cpu_device(x):
            x = "openreg"
        moved.append(x)
    inp, args, kwargs = tree_unflatten(moved, spec)
    if "device" in kwargs or factory:
        kwargs = {**kwargs, "device": "openreg"}  # else arange(2) etc. would run on the CPU again
    return SampleInput(inp, args=args, kwargs=kwargs, output_process_fn_grad=sample.output_process_fn_grad)


def cpu_leaf_positions(op, dtype, n: int) -> list:
    """Per sample, the leaf positions that op_db's own device samples keep on the CPU."""
    if op_name(op) not in CPU_TENSOR_ARGS:
        return [()] * n
    positions = []
    for s in op.sample_inputs("openreg", dtype):
        leaves = tree_flatten((s.input, s.args, s.kwargs))[0]
        positions.append({i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.device.type == "cpu"})
    assert len(positions) == n and any(positions), f"{op_name(op)}: update CPU_TENSOR_ARGS"
    return positions


def is_factory(sample, result) -> bool:
    """A call without tensor arguments that returns tensors (arange(2), ...), unlike broadcast_shapes."""
    has_tensor = lambda tree: any(isinstance(x, torch.Tensor) for x in tree_flatten(tree)[0])  # noqa: E731
    return not has_tensor((sample.input, sample.args, sample.kwargs)) and has_tensor(result)


def exact(t: torch.Tensor) -> bool:
    """Integers, bool and 1-byte floats (float8) are compared bit for bit."""
    return not (t.is_floating_point() or t.is_complex()) or t.element_size() == 1


def compare(got, expected, values=True, tol=1e-4) -> None:
    """got (openreg) against expected (CPU): same structure, devices, and values (or metadata only)."""
    got_leaves, exp_leaves = tree_flatten(got)[0], tree_flatten(expected)[0]
    assert len(got_leaves) == len(exp_leaves), f"{len(got_leaves)} results, expected {len(exp_leaves)}"
    for g, e in zip(got_leaves, exp_leaves):
        if not isinstance(e, torch.Tensor):
            if values:
                torch.testing.assert_close(g, e, equal_nan=True)
            continue
        assert isinstance(g, torch.Tensor), f"got {type(g).__name__}, expected a tensor"
        assert g.device.type == "openreg", f"result on {g.device}, expected openreg"
        g = g.cpu()
        if not values:
            assert (g.shape, g.dtype) == (e.shape, e.dtype), f"{(g.shape, g.dtype)} != {(e.shape, e.dtype)}"
        elif e.is_sparse or e.layout != torch.strided:
            torch.testing.assert_close(g, e, equal_nan=True)
        else:
            t = 0 if exact(e) else tol
            torch.testing.assert_close(g, e, equal_nan=True, atol=t, rtol=t)


def same_results(a, b, tol=0.0) -> bool:
    """Whether two CPU results are equal (within tol for floats)."""
    la, lb = tree_flatten(a)[0], tree_flatten(b)[0]
    try:
        assert len(la) == len(lb)
        for x, y in zip(la, lb):
            t = tol if isinstance(x, torch.Tensor) and not exact(x) else 0
            torch.testing.assert_close(x, y, equal_nan=True, atol=t, rtol=t)
        return True
    except (AssertionError, TypeError, ValueError):
        return False


def clone(x):
    return x.clone() if isinstance(x, torch.Tensor) else x


def call(op, s, seed=0):
    MANUAL_SEED(seed)
    return op(s.input, *s.args, **s.kwargs)


def fail(message: str):
    def run():
        raise AssertionError(message)

    return run


def must_raise(fn):
    def run():
        try:
            fn()
            torch.openreg.synchronize()  # an asynchronous kernel's error surfaces here
        except Exception:  # noqa: BLE001  (any error: the CPU's message need not be openreg's)
            return
        raise AssertionError("the CPU rejects this sample but openreg accepts it")

    return run


class Tally:
    def __init__(self):
        self.passed, self.failures, self.cpu_out_differs = 0, [], False

    def run(self, what: str, fn) -> None:
        KINDS.update(kind for kind in CHECK_KINDS if kind in what)
        KINDS["all"] += 1
        try:
            fn()
            self.passed += 1
        except Exception as e:  # noqa: BLE001  (every failure is reported with its kind)
            self.failures.append(f"{what}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")


def check_forward(op, name: str, tally: Tally) -> None:
    for dtype in dtypes_for(op):
        samples = list(op.sample_inputs("cpu", dtype))
        keep = cpu_leaf_positions(op, dtype, len(samples))
        for i, sample in enumerate(samples):
            label = f"{dtype} sample {i}"
            values = name not in UNINITIALISED_OPS
            if values and (name in RANDOM_OPS or RANDOM_SAMPLES.get(name, lambda s: False)(sample)):
                values = deterministic(op, sample)
                label += "" if values else " (random: metadata)"
            check_call(op, sample, keep[i], label, values, tally)
            try:
                noncontiguous = sample.noncontiguous()
            except Exception:  # noqa: BLE001
                noncontiguous = None  # a layout without strides (sparse): the contiguous sample is its only form
            if noncontiguous is not None:  # one call: the asynchronous path is covered by the contiguous sample
                check_call(op, noncontiguous, keep[i], f"{label} non-contiguous", values, tally, calls=1)
            if op.supports_out:
                check_out(op, name, sample, keep[i], label, values, tally)
            if op.inplace_variant is not None and isinstance(sample.input, torch.Tensor):
                check_inplace(op, sample, keep[i], label, values, tally)


def deterministic(op, s) -> bool:
    """Whether the CPU gives the same result for several seeds (e.g. dropout with p=0)."""
    try:
        with our_seed_only():  # clones: in-place ops (uniform, ...) return their mutated input
            first = tree_map(clone, call(op, s))
            return all(same_results(call(op, s, seed), first) for seed in RANDOM_SEEDS)
    except Exception:  # noqa: BLE001  (the CPU rejects the sample: check_call handles it)
        return False


@contextlib.contextmanager
def our_seed_only():
    """op_db wraps some random ops (dropout, svd_lowrank, ...) in wrapper_set_seed, which reseeds
    with 42 and so would make every sample look deterministic: ignore that reseeding here."""
    with unittest.mock.patch.object(torch, "manual_seed", lambda seed: None):
        yield


def check_call(op, s, keep, label: str, values: bool, tally: Tally, calls=2) -> None:
    devs = [to_device(s, keep) for _ in range(calls)]  # before the CPU call, which may mutate s
    try:
        expected = call(op, s)
    except Exception as e:  # noqa: BLE001
        tally.run(f"{label} (CPU rejects: {type(e).__name__})", must_raise(lambda: call(op, devs[0])))
        return
    if is_factory(s, expected):
        devs = [to_device(s, keep, factory=True) for _ in range(calls)]

    def run():
        for d in devs:  # first call synchronous (meta kernel checked), second asynchronous
            compare(call(op, d), expected, values)

    tally.run(label, run)


def check_inplace(op, s, keep, label: str, values: bool, tally: Tally) -> None:
    label += " in place"
    d = to_device(s, keep)  # before the CPU call
    if d.input.layout == torch.strided:
        d.input = d.input.clone()  # the sample's own input stays as it is for later checks
    cpu_input = s.input.clone() if s.input.layout == torch.strided else s.input
    try:
        MANUAL_SEED(0)
        expected = op.inplace_variant(cpu_input, *s.args, **s.kwargs)
    except Exception as e:  # noqa: BLE001
        dev_call = lambda: op.inplace_variant(d.input, *d.args, **d.kwargs)  # noqa: E731
        tally.run(f"{label} (CPU rejects: {type(e).__name__})", must_raise(dev_call))
        return

    def run():
        MANUAL_SEED(0)
        got = op.inplace_variant(d.input, *d.args, **d.kwargs)
        compare((got, d.input), (expected, cpu_input), values)

    tally.run(label, run)


def sentinel_like(e, device):
    """An out= tensor pre-filled with a value an unwritten output would keep."""
    if not isinstance(e, torch.Tensor):
        return e
    fill = True if e.dtype == torch.bool else 123 if not (e.is_floating_point() or e.is_complex()) else float("nan")
    return torch.full(e.shape, fill, dtype=e.dtype).to(device)


def make_out(expected, device):
    if isinstance(expected, list):  # e.g. split_with_sizes_copy
        return [sentinel_like(e, device) for e in expected]
    if isinstance(expected, tuple):  # a (named) tuple of outputs, e.g. sort, svd: out= takes a plain tuple
        return tuple(sentinel_like(e, device) for e in expected)
    return sentinel_like(expected, device)


def check_out(op, name: str, s, keep, label: str, values: bool, tally: Tally) -> None:
    label += " out="
    d = to_device(s, keep)  # before the CPU calls, which may mutate s
    try:
        functional = call(op, s)
    except Exception:  # noqa: BLE001  (rejected as a functional call: counted by check_call)
        return
    if is_factory(s, functional):
        d = to_device(s, keep, factory=True)
    cpu_out = make_out(functional, "cpu")
    try:
        cpu_ret = call_out(op, s, cpu_out)
    except Exception as e:  # noqa: BLE001
        dev_call = lambda: call_out(op, d, make_out(functional, "openreg"))  # noqa: E731
        tally.run(f"{label} (CPU rejects: {type(e).__name__})", must_raise(dev_call))
        return
    if values and not same_results(cpu_out, functional, tol=1e-4):
        tally.cpu_out_differs = True
        if name not in CPU_OUT_DIFFERS:
            tally.run(label, fail("the CPU's out= differs from its functional result: list the op in CPU_OUT_DIFFERS"))
            return

    def run():
        dev_out = make_out(functional, "openreg")
        ret = call_out(op, d, dev_out)
        compare((ret, dev_out), (cpu_ret, cpu_out), values)

    tally.run(label, run)


def call_out(op, s, out):
    MANUAL_SEED(0)
    return op(s.input, *s.args, out=out, **s.kwargs)


def grad_dtype(op):
    backward = op.supported_backward_dtypes("cpu")
    return next((dt for dt in dtypes_for(op) if dt in backward and (dt.is_floating_point or dt.is_complex)), None)


def check_backward(op, name: str, tally: Tally) -> None:
    dtype = grad_dtype(op)
    if not op.supports_autograd or dtype is None:
        return
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=True))
    keep = cpu_leaf_positions(op, dtype, len(samples))
    for i, s in enumerate(samples):
        label = f"{dtype} sample {i} backward"
        # Every tensor a leaf of its own, as on the device (a sample may pass a view of another
        # input that requires grad, e.g. istft's window[:8]).
        s = SampleInput(
            tree_map(as_leaf, s.input),
            args=tree_map(as_leaf, s.args),
            kwargs=tree_map(as_leaf, s.kwargs),
            output_process_fn_grad=s.output_process_fn_grad,
        )
        leaves = [
            t for t in tree_flatten((s.input, s.args, s.kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        random = name in RANDOM_OPS or RANDOM_SAMPLES.get(name, lambda s: False)(s)
        try:
            expected = gradients(op, s, leaves)
            values = not random or random_values_agree(op, s, leaves)
        except Exception as e:  # noqa: BLE001
            tally.run(
                f"{label} (CPU rejects: {type(e).__name__})",
                must_raise(lambda: device_gradients(op, s, leaves, keep[i])),
            )
            continue
        tally.run(
            label if values else f"{label} (random: metadata)",
            lambda: compare(device_gradients(op, s, leaves, keep[i]), expected, values, tol=1e-3),
        )


def as_leaf(x):
    return x.detach().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x


def random_values_agree(op, s, leaves) -> bool:
    with our_seed_only():
        first = gradients(op, s, leaves)
        return all(same_results(gradients(op, s, leaves, seed), first) for seed in RANDOM_SEEDS)


def device_gradients(op, s, leaves, keep):
    mapping = {}
    d = to_device(s, keep, mapping)
    return gradients(op, d, [mapping[id(t)] for t in leaves])


def gradients(op, s, leaves, seed=0):
    """Gradients of a loss weighting every floating and complex output with fixed random weights."""
    MANUAL_SEED(seed)
    out = s.output_process_fn_grad(op.gradcheck_wrapper(op, s.input, *s.args, **s.kwargs))
    outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    outs = [o for o in outs if o.is_floating_point() or o.is_complex()]
    if not outs or not leaves:
        return []  # nothing differentiable: openreg must agree
    g = torch.Generator().manual_seed(0)
    loss = 0
    for o in outs:
        parts = (o.real, o.imag) if o.is_complex() else (o,)
        for p in parts:  # real and imaginary parts both reach the gradient
            loss = loss + (p * torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device)).sum()
    return list(torch.autograd.grad(loss, leaves, allow_unused=True))


def check_not_testable(op, name: str) -> None:
    for dtype in dtypes_for(op):
        for i, s in enumerate(op.sample_inputs("cpu", dtype)):
            try:
                call(op, s)
            except Exception:  # noqa: BLE001
                continue
            raise AssertionError(f"{name}: the CPU accepts {dtype} sample {i} now: remove it from NOT_TESTABLE")


@instantiate_parametrized_tests
class TestOpInfo(TestCase):
    @parametrize("op", OPS, name_fn=op_name)
    def test_matches_cpu(self, op):
        name = op_name(op)
        if name in NOT_TESTABLE:
            check_not_testable(op, name)
            RESULTS[name] = [0, 0]
            return
        tally = Tally()
        with unittest.mock.patch.object(torch, "manual_seed", seed_cpu_and_openreg):
            check_forward(op, name, tally)
            check_backward(op, name, tally)
        RESULTS[name] = [tally.passed, len(tally.failures)]
        torch.openreg.synchronize()
        if name in CPU_OUT_DIFFERS:
            self.assertTrue(
                tally.cpu_out_differs, f"{name}: the CPU's out= is right now: remove it from CPU_OUT_DIFFERS"
            )
        if name in EXPECTED_FAILURES:
            pattern, _ = EXPECTED_FAILURES[name]
            self.assertTrue(tally.failures, f"{name} passes now: remove it from EXPECTED_FAILURES")
            unexpected = [f for f in tally.failures if not re.search(pattern, f)]
            self.assertEqual(unexpected, [], f"{name}: failures beyond the expected ones")
        else:
            self.assertEqual(
                tally.failures, [], f"{name}: {len(tally.failures)} of {tally.passed + len(tally.failures)} failed"
            )


class TestSampleGeneration(TestCase):
    """fast_opinfo_samples (torch_openreg.utils.testing) replaces PyTorch's stack inspection in
    OpInfo sample generation: it must find the same test function, hence give the same samples."""

    def test_finds_the_test_function_inspect_finds(self):
        from torch.testing._internal import common_utils
        from torch_openreg.utils import testing

        self.assertIs(common_utils.extract_test_fn, testing._extract_test_fn_by_frames)
        by_stack = testing._extract_test_fn_by_stack

        def nested():  # called from inside a helper, as sample_inputs is
            return testing._extract_test_fn_by_frames(), by_stack()

        fast, slow = nested()
        self.assertIs(fast, getattr(self, self._testMethodName).__func__)  # the running test (as TestCase wraps it)
        self.assertIs(fast, slow)
        outside = []  # a thread has no test frame: both find nothing
        thread = threading.Thread(target=lambda: outside.extend([testing._extract_test_fn_by_frames(), by_stack()]))
        thread.start()
        thread.join()
        self.assertEqual(outside, [None, None])

    def test_samples_are_the_same(self):
        from torch.testing._internal import common_utils
        from torch.testing._internal.opinfo import core as opinfo_core
        from torch_openreg.utils import testing

        op = next(o for o in op_db if o.name == "nn.functional.dropout")  # random samples: seeded per test

        def samples():
            return [tree_flatten((s.input, s.args, s.kwargs))[0] for s in op.sample_inputs("cpu", torch.float32)]

        fast = samples()
        with unittest.mock.patch.object(common_utils, "extract_test_fn", testing._extract_test_fn_by_stack):
            with unittest.mock.patch.object(opinfo_core, "extract_test_fn", testing._extract_test_fn_by_stack):
                slow = samples()
        self.assertGreater(len(fast), 3)
        self.assertEqual(fast, slow, atol=0, rtol=0)


if __name__ == "__main__":
    run_tests()
