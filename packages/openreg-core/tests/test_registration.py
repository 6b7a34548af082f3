"""Each operator registration form openreg shows, one test class per form (see csrc/aten/)."""

import re

import torch
from conftest import run_python
from torch.testing._internal.common_utils import TEST_WITH_TORCHDYNAMO, TestCase, run_tests


class TestNativeKernel(TestCase):
    """OpenRegNativeOps.cpp: TORCH_LIBRARY_IMPL(aten, PrivateUse1) kernels, no generic path."""

    def test_native_ops_skip_generic_path(self):
        x = torch.arange(6.0).to("openreg")
        torch.openreg.reset_fallback_op_counts()
        y = x.view(2, 3).t().to("cpu")
        self.assertEqual(y, torch.arange(6.0).view(2, 3).t())
        self.assertEqual(torch.openreg.fallback_op_counts(), {})


class TestDispatchStub(TestCase):
    """OpenRegDispatchStub.cpp: abs.out is ATen's device-generic kernel plus openreg's abs_stub."""

    def test_abs_through_stub(self):
        torch.openreg.reset_fallback_op_counts()
        x = torch.randn(7, 3)
        self.assertEqual(torch.abs(x.to("openreg")).cpu(), x.abs())
        self.assertEqual(x.to("openreg").t().abs().cpu(), x.t().abs())  # strided input
        self.assertNotIn("aten::abs.out", torch.openreg.fallback_op_counts())
        z = torch.randn(4, dtype=torch.complex64)
        self.assertEqual(torch.abs(z.to("openreg")).cpu(), z.abs())

    def test_unsupported_dtype_raises_at_the_call(self):
        # The CPU kernel's dtype check used to run on the device: torch.abs(bool) returned, and the
        # error surfaced at some later, unrelated synchronising call. The error's type is the CPU's,
        # NotImplementedError (it was a RuntimeError; found by tests/fuzz).
        with self.assertRaisesRegex(NotImplementedError, "\"abs_cpu\" not implemented for 'Bool'"):
            torch.abs(torch.ones(2, dtype=torch.bool))
        for op in (torch.abs, torch.ops.openreg.custom_abs):
            with self.assertRaisesRegex(NotImplementedError, "\"abs_cpu\" not implemented for 'Bool'"):
                op(torch.ones(2, dtype=torch.bool, device="openreg"))
            torch.openreg.synchronize()  # nothing left to report
        self.assertEqual(torch.abs(torch.tensor([-3], dtype=torch.uint8, device="openreg")).cpu().tolist(), [253])


class TestStructuredKernel(TestCase):
    """OpenRegStructured.cpp: mm via at::meta::structured_mm and an openreg implementation."""

    def test_mm_functional_and_out(self):
        torch.openreg.reset_fallback_op_counts()
        a, b = torch.randn(5, 4), torch.randn(4, 6)
        self.assertEqual((a.to("openreg") @ b.to("openreg")).cpu(), a @ b)
        out = torch.empty(0, device="openreg")
        torch.mm(a.to("openreg"), b.to("openreg"), out=out)
        self.assertEqual(out.cpu(), a @ b)
        self.assertEqual(torch.openreg.fallback_op_counts(), {})

    def test_meta_checks_run_on_host(self):
        with self.assertRaisesRegex(RuntimeError, "cannot be multiplied"):
            torch.mm(torch.ones(2, 3, device="openreg"), torch.ones(2, 3, device="openreg"))
        with self.assertRaisesRegex(RuntimeError, "Expected out tensor to have dtype"):
            torch.mm(
                torch.ones(2, 2, device="openreg"),
                torch.ones(2, 2, device="openreg"),
                out=torch.empty(2, 2, dtype=torch.float64, device="openreg"),
            )

    def test_implementation_checks_raise_at_the_call(self):
        # The CPU implementation's own checks (operand dtypes, dtypes it has no kernel for) ran only
        # in the kernel, so the error came at a later synchronising call (found by tests/fuzz).
        bool_ = {"dtype": torch.bool}
        calls = {
            "mixed dtypes": lambda d: torch.mm(
                torch.ones(2, 2, device=d), torch.ones(2, 2, dtype=torch.int64, device=d)
            ),
            "bool": lambda d: torch.mm(torch.ones(2, 2, **bool_, device=d), torch.ones(2, 2, **bool_, device=d)),
            "bool, out=": lambda d: torch.mm(
                torch.ones(2, 2, **bool_, device=d),
                torch.ones(2, 2, **bool_, device=d),
                out=torch.empty(0, **bool_, device=d),
            ),
        }
        for name, call in calls.items():
            with self.assertRaises(Exception) as cpu:
                call("cpu")
            with self.assertRaisesRegex(type(cpu.exception), re.escape(str(cpu.exception).splitlines()[0]), msg=name):
                call("openreg")
            torch.openreg.synchronize()  # nothing left to report
        # As on the CPU, an empty inner dimension or result needs no kernel for the dtype.
        for shapes in (((2, 0), (0, 2)), ((0, 2), (2, 2))):
            got = torch.mm(*(torch.ones(s, **bool_, device="openreg") for s in shapes))
            self.assertEqual(got.cpu(), torch.mm(*(torch.ones(s, **bool_) for s in shapes)))


class TestGlobalFallback(TestCase):
    """OpenRegFallback.cpp: every other op through the generic path (more in test_operators.py)."""

    def test_generic_path_counts(self):
        z = torch.zeros(2, device="openreg")
        torch.openreg.reset_fallback_op_counts()
        self.assertEqual(torch.erf(z).cpu(), torch.zeros(2))
        self.assertEqual(torch.openreg.fallback_op_counts(), {"aten::erf": 1})


class TestPerOpFallback(TestCase):
    """OpenRegPerOpFallback.cpp: a boxed kernel registered for named data-dependent ops."""

    def test_data_dependent_ops(self):
        torch.openreg.reset_fallback_op_counts()
        x = torch.tensor([0.0, 1.5, 0.0, -2.0])
        d = x.to("openreg")
        self.assertEqual(torch.nonzero(d).cpu(), torch.nonzero(x))
        self.assertEqual(torch.masked_select(d, d != 0).cpu(), torch.masked_select(x, x != 0))
        self.assertEqual(torch.unique(d).cpu(), torch.unique(x))
        counts = torch.openreg.fallback_op_counts()
        self.assertEqual(counts["aten::nonzero"], 1)
        self.assertEqual(counts["aten::masked_select"], 1)


class TestFallthrough(TestCase):
    """OpenRegFallthrough.cpp: AutocastPrivateUse1 falls through, so autocast regions run."""

    def test_ops_run_under_autocast(self):
        x = torch.ones(3, device="openreg")
        with torch.autocast("openreg", dtype=torch.bfloat16):
            y = torch.exp(x) + 1
        self.assertEqual(y.cpu(), torch.exp(torch.ones(3)) + 1)

    def test_autocast_without_the_amp_plugin_says_so_once(self):
        probe = (
            "import warnings, torch\n"
            "warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    for _ in range(2):\n"
            "        with torch.autocast('openreg', dtype=torch.float16):\n"
            "            t = torch.ones(2, 2, device='openreg') @ torch.ones(2, 2, device='openreg')\n"
            "print(sum('has no effect without the openreg-amp plugin' in str(x.message) for x in w), t.dtype)\n"
        )
        r = run_python(probe, env={"OPENREG_PLUGINS": "none"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["1", "torch.float32"])


class TestCustomOps(TestCase):
    """OpenRegCustomOps.cpp (C++) and torch_openreg/openreg/ops.py (torch.library)."""

    def test_cpp_custom_op_with_meta_kernel(self):
        x = torch.randn(3, 4)
        self.assertEqual(torch.ops.openreg.custom_abs(x.to("openreg")).cpu(), x.abs())
        self.assertEqual(torch.ops.openreg.custom_abs(x), x.abs())
        m = torch.ops.openreg.custom_abs(torch.empty(3, 4, device="meta"))
        self.assertEqual((m.shape, m.device.type), (torch.Size([3, 4]), "meta"))
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            fake = torch.ops.openreg.custom_abs(torch.empty(2, 5, device="openreg"))
        self.assertEqual((fake.shape, fake.device), (torch.Size([2, 5]), torch.device("openreg:0")))

    def test_cpp_custom_op_backward(self):
        # Without an autograd kernel the op recorded no backward on openreg: the gradients of
        # everything before it were None (the CPU's, through at::abs, looked right by chance).
        torch.manual_seed(0)
        for device in ("cpu", "openreg"):
            fc = torch.nn.Linear(3, 3).to(device)
            x = torch.tensor([[1.0, -2.0, 3.0], [0.0, 0.5, -1.0]], device=device)
            y = torch.ops.openreg.custom_abs(fc(x))
            y.backward(torch.arange(6.0, device=device).view(2, 3))
            ref = fc.weight.detach().cpu().requires_grad_()
            torch.nn.functional.linear(x.cpu(), ref, fc.bias.detach().cpu()).abs().backward(
                torch.arange(6.0).view(2, 3)
            )
            self.assertEqual(fc.weight.grad.cpu(), ref.grad)
        # |z| is real, as torch.abs's (the openreg and meta kernels returned a complex tensor).
        z = torch.tensor([3 + 4j, -1 + 0j])
        for device in ("cpu", "openreg", "meta"):
            got = torch.ops.openreg.custom_abs(z.to(device))
            self.assertEqual(got.dtype, torch.float32)
            if device != "meta":
                self.assertEqual(got.cpu(), z.abs())
        x = torch.randn(4, dtype=torch.float64, device="openreg", requires_grad=True)
        torch.autograd.gradcheck(torch.ops.openreg.custom_abs, (x,))
        # opcheck's autograd-registration check knows CPU, CUDA and XPU only ("NYI devices other than
        # CPU/CUDA/XPU"): it runs on a CPU input; the others on the device's. Its AOTAutograd check
        # traces with make_fx, which refuses to run inside the Dynamo-wrapped test method of
        # `nox -s inductor` ("FX to symbolically trace a dynamo-optimized function"): there the
        # other checks run.
        op = torch.ops.openreg.custom_abs.default
        checks = ["test_schema", "test_faketensor"] + ([] if TEST_WITH_TORCHDYNAMO else ["test_aot_dispatch_dynamic"])
        torch.library.opcheck(
            op, (x.detach().cpu().requires_grad_(),), test_utils=checks + ["test_autograd_registration"]
        )
        torch.library.opcheck(op, (x.detach().requires_grad_(),), test_utils=checks)

    def test_python_custom_op_fake_kernel_promotes_as_the_op(self):
        # x * x * 2.0 is float for an integer x; the fake kernel said int64.
        x = torch.arange(4, device="openreg")
        self.assertEqual(torch.ops.openreg.scaled_square(x, 2.0).dtype, torch.float32)
        torch.library.opcheck(torch.ops.openreg.scaled_square.default, (x, 2.0))

    def test_python_custom_op_fake_and_autograd(self):
        x = torch.randn(5)
        d = x.to("openreg").requires_grad_(True)
        out = torch.ops.openreg.scaled_square(d, 3.0)
        self.assertEqual(out.cpu(), 3.0 * x * x)
        out.sum().backward()
        self.assertEqual(d.grad.cpu(), 6.0 * x)
        torch.library.opcheck(torch.ops.openreg.scaled_square.default, (torch.randn(4, device="openreg"), 2.0))

    def test_python_kernel_queued_at_exit_runs_before_the_interpreter_ends(self):
        # A Python kernel runs on the stream's worker and needs the interpreter. Queued when the
        # program ended, it used to crash the process (SIGSEGV, or abort on a swallowed thread exit).
        r = run_python(
            """
            import time, torch

            @torch.library.custom_op("exit_test::slow_double", mutates_args=(), device_types="cpu")
            def slow_double(x: torch.Tensor) -> torch.Tensor:
                time.sleep(0.2)
                print("kernel ran", flush=True)
                return x * 2

            @slow_double.register_fake
            def _(x):
                return torch.empty_like(x)

            x = torch.ones(3, device="openreg")
            slow_double(x).cpu()  # a signature's first call runs synchronously
            y = slow_double(x)  # queued; the program ends without waiting for it
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.count("kernel ran"), 2, r.stdout + r.stderr)

    def test_host_waits_let_queued_python_kernels_run(self):
        # A Python kernel queued on the stream needs the GIL. A host wait made with the GIL held
        # (torch's storage copy behind torch.save) never ended, nor did memory_stats() in one thread
        # while empty_cache() in another waited for the device under the allocator's lock.
        r = run_python(
            """
            import io, threading, time, torch

            @torch.library.custom_op("gil_test::slow", mutates_args=(), device_types="cpu")
            def slow(x: torch.Tensor, delay: float) -> torch.Tensor:
                time.sleep(delay)
                return x * 2 + 1

            @slow.register_fake
            def _(x, delay):
                return torch.empty_like(x)

            x = torch.arange(4.0, device="openreg")
            slow(x, 0.0)  # a signature's first call runs synchronously
            y = slow(x, 0.2)  # queued
            print(torch.empty(0).set_(y.untyped_storage().cpu()).tolist())
            torch.save(slow(x, 0.2), io.BytesIO())
            big = torch.empty(3_000_000, device="openreg")
            del big  # a cached segment for empty_cache to release
            y = slow(x, 0.5)
            t = threading.Thread(target=torch.openreg.empty_cache)
            t.start()
            time.sleep(0.1)  # empty_cache waits for the stream, holding the allocator's lock
            torch.openreg.memory_stats()
            t.join()
            print(y.cpu().tolist())
            """,
            timeout=60,
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split("\n")[:2], ["[1.0, 3.0, 5.0, 7.0]", "[1.0, 3.0, 5.0, 7.0]"], r.stdout)

    def test_python_custom_op_compiles(self):
        f = torch.compile(lambda t: torch.ops.openreg.scaled_square(t, 2.0) + 1, backend="aot_eager", fullgraph=True)
        x = torch.randn(6)
        self.assertEqual(f(x.to("openreg")).cpu(), 2.0 * x * x + 1)


class TestCustomOpGenerators(TestCase):
    def test_a_generator_argument_draws_from_the_openreg_generator(self):
        # `Generator` (not `Generator?`) in a custom op's schema was passed on to the CPU kernel as the
        # openreg generator, which it refused ("Expected a 'cpu' device type for generator ... (in
        # aten::normal_)"); `Generator?` got the kernel's per-launch CPU generator.
        lib = torch.library.Library("openreg_gen_test", "DEF")
        self.addCleanup(lib._destroy)
        for name in ("noise", "noise_opt"):
            lib.define(f"{name}(Tensor x, Generator{'?' if name == 'noise_opt' else ''} gen) -> Tensor")
            lib.impl(name, lambda x, gen: x + torch.randn(x.shape, generator=gen, dtype=x.dtype), "CPU")
            lib.impl(name, lambda x, gen: torch.empty_like(x), "Meta")
        ops = torch.ops.openreg_gen_test
        for op in (ops.noise, ops.noise_opt):
            x = torch.zeros(64, device="openreg")
            a = op(x, torch.Generator("openreg").manual_seed(3)).cpu()
            b = op(x, torch.Generator("openreg").manual_seed(3)).cpu()
            c = op(x, torch.Generator("openreg").manual_seed(4)).cpu()
            self.assertEqual(a, b)
            self.assertNotEqual(a, c)
            self.assertTrue(0.5 < a.std().item() < 1.5)
        self.assertEqual(
            ops.noise(x, torch.Generator("openreg").manual_seed(3)).cpu(),
            ops.noise_opt(x, torch.Generator("openreg").manual_seed(3)).cpu(),
        )


class TestResultsElsewhere(TestCase):
    def summary_op(self, namespace):
        """`namespace::summary(x, dev)`: x's min and max, on `dev` (a CPU kernel only)."""
        lib = torch.library.Library(namespace, "DEF")
        self.addCleanup(lib._destroy)
        lib.define("summary(Tensor x, Device dev) -> Tensor")
        lib.impl("summary", lambda x, dev: torch.stack([x.min(), x.max()]).to(dev), "CPU")
        lib.impl("summary", lambda x, dev: torch.empty(2, dtype=x.dtype, device=dev), "Meta")
        return getattr(torch.ops, namespace).summary

    def test_a_result_the_meta_kernel_puts_on_the_cpu_is_refused(self):
        # The generic path returns every result on openreg: an op whose fake kernel returns a CPU
        # tensor (its Device argument says "cpu") gave an openreg tensor, against FakeTensorMode and
        # torch.compile, which say CPU.
        op = self.summary_op("openreg_elsewhere_test")
        x = torch.arange(4.0, device="openreg")
        with self.assertRaisesRegex(
            NotImplementedError,
            "'openreg_elsewhere_test::summary' returns a tensor on cpu \\(its meta kernel says so\\), and openreg's "
            "generic path returns its results on openreg",
        ):
            op(x, torch.device("cpu"))
        got = op(x, torch.device("openreg"))  # on openreg: as before
        self.assertEqual((got.device, got.cpu().tolist()), (x.device, [0.0, 3.0]))

    def test_a_result_on_another_openreg_device_is_refused(self):
        # The call runs on its tensors' device and lands its results there: a Device argument naming
        # another openreg device (the fake kernel's device) gave a result on the tensors' device.
        op = self.summary_op("openreg_elsewhere_index_test")
        x = torch.arange(4.0, device="openreg:1")
        for _ in range(2):  # the first call of a signature and a later one
            with self.assertRaisesRegex(
                NotImplementedError,
                "'openreg_elsewhere_index_test::summary' names device openreg:0 and its tensors are on openreg:1: "
                "openreg's generic path runs an operator on its tensors' device",
            ):
                op(x, torch.device("openreg:0"))
        got = op(x, torch.device("openreg:1"))
        self.assertEqual((got.device, got.cpu().tolist()), (x.device, [0.0, 3.0]))


class TestListsOfViews(TestCase):
    def test_a_custom_op_returning_a_list_of_views(self):
        # `Tensor(a) x -> Tensor(a)[]` (split's form) of a custom op: the first call's synchronous run
        # read the list as one tensor ("Expected Tensor but got GenericList") at every call.
        lib = torch.library.Library("openreg_list_of_views_test", "DEF")
        self.addCleanup(lib._destroy)
        lib.define("halves(Tensor(a) x) -> Tensor(a)[]")
        lib.impl("halves", lambda x: list(x.chunk(2)), "CPU")
        lib.impl("halves", lambda x: list(x.chunk(2)), "Meta")
        for call in range(3):  # the first call runs synchronously, the later ones asynchronously
            x = torch.arange(6.0, device="openreg")
            halves = torch.ops.openreg_list_of_views_test.halves(x)
            self.assertEqual([h.cpu().tolist() for h in halves], [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
            self.assertTrue(all(h._base is x for h in halves))
            halves[1].fill_(9.0)  # views: the write shows in x
            self.assertEqual(x.cpu().tolist(), [0.0, 1.0, 2.0, 9.0, 9.0, 9.0])

    def test_a_custom_op_whose_list_of_views_is_fresh_after_all(self):
        # A kernel that declares views but returns new tensors: the results are copied to the device.
        lib = torch.library.Library("openreg_fresh_list_test", "DEF")
        self.addCleanup(lib._destroy)
        lib.define("halves(Tensor(a) x) -> Tensor(a)[]")
        lib.impl("halves", lambda x: [c.clone() for c in x.chunk(2)], "CPU")
        lib.impl("halves", lambda x: list(x.chunk(2)), "Meta")
        x = torch.arange(4.0, device="openreg")
        halves = torch.ops.openreg_fresh_list_test.halves(x)
        self.assertEqual([h.cpu().tolist() for h in halves], [[0.0, 1.0], [2.0, 3.0]])

    def test_an_alias_of_a_list_argument_is_refused_before_the_kernel_runs(self):
        # The paths place a returned alias on one tensor argument: for an alias of a list argument
        # they indexed the arguments at -1 (a read out of bounds) or read the list as a tensor, after
        # the kernel had written the arguments (a retry doubled them again).
        lib = torch.library.Library("openreg_list_alias_test", "DEF")
        self.addCleanup(lib._destroy)

        def double_all_(xs):
            for x in xs:
                x.mul_(2)
            return xs

        schemas = {
            "double_elements_": "(Tensor(a!)[] xs) -> Tensor(a!)[]",  # the alias on the element type
            "double_list_": "(Tensor[](a!) xs) -> Tensor[](a!)",  # on the list (all_reduce_coalesced_'s)
            "first_of": "(Tensor(a)[] xs) -> Tensor(a)",  # a view of an element
        }
        for name, schema in schemas.items():
            lib.define(name + schema)
            kernel = double_all_ if name != "first_of" else (lambda xs: xs[0][1:])
            lib.impl(name, kernel, "CPU")
            lib.impl(name, kernel if name == "first_of" else (lambda xs: xs), "Meta")
            a, b = torch.ones(3, device="openreg"), torch.ones(2, device="openreg")
            for _ in range(2):
                with self.assertRaisesRegex(
                    NotImplementedError,
                    f"'openreg_list_alias_test::{name}' returns an alias of (an element of )?"
                    "its list argument 'xs', which",
                ):
                    getattr(torch.ops.openreg_list_alias_test, name)([a, b])
            self.assertEqual((a.cpu().tolist(), b.cpu().tolist()), ([1.0] * 3, [1.0] * 2))  # not run


class TestCustomOperatorsOnTheGenericPath(TestCase):
    """Custom operators (torch.library) with CPU and fake kernels only, run on openreg tensors: each
    compared with the CPU over several calls (the first runs synchronously, the later ones not)."""

    def library(self, name):
        lib = torch.library.Library(name, "DEF")
        self.addCleanup(lib._destroy)
        return lib

    def test_a_result_in_another_dtype_than_the_fake_kernels_fails(self):
        # The fake kernel is right for odd lengths only: a wrong shape failed the kernel, naming the
        # operator, but a wrong dtype was cast into the meta kernel's (1.5 became 1, no error).
        lib = self.library("openreg_dtype_disagrees_test")
        lib.define("scale(Tensor x) -> Tensor")
        lib.impl("scale", lambda x: (x * 1.5) if x.shape[0] % 2 == 0 else x.clone(), "CPU")
        lib.impl("scale", lambda x: torch.empty_like(x), "Meta")
        op = torch.ops.openreg_dtype_disagrees_test.scale
        self.assertEqual(op(torch.arange(3, device="openreg")).cpu(), torch.arange(3))  # verifies the signature
        op(torch.arange(4, device="openreg"))
        with self.assertRaisesRegex(
            RuntimeError,
            "the CPU kernel of openreg_dtype_disagrees_test::scale produced results whose shapes or dtypes differ "
            "from its meta kernel's",
        ):
            torch.openreg.synchronize()

    def test_a_fake_kernel_with_an_expanded_result(self):
        # The asynchronous path laid the result out as the fake kernel did (stride 0), which the
        # kernel's copy cannot write ("more than one element of the written-to tensor refers to a
        # single memory location"), from the second call on.
        lib = self.library("openreg_expanded_fake_test")
        lib.define("ramp(Tensor x) -> Tensor")
        lib.impl("ramp", lambda x: torch.arange(x.numel(), dtype=x.dtype) + x, "CPU")
        lib.impl("ramp", lambda x: x.new_empty(1).expand(x.numel()), "Meta")
        for _ in range(3):
            got = torch.ops.openreg_expanded_fake_test.ramp(torch.ones(5, device="openreg"))
            self.assertEqual(got.cpu(), torch.arange(5.0) + 1)
        torch.openreg.synchronize()
        # A layout with gaps is kept as the fake kernel describes it (each element has its memory).
        lib.define("gapped(Tensor x) -> Tensor")
        lib.impl("gapped", lambda x: torch.empty(2 * x.numel(), dtype=x.dtype)[::2].copy_(x + 1), "CPU")
        lib.impl("gapped", lambda x: torch.empty(2 * x.numel(), dtype=x.dtype, device=x.device)[::2], "Meta")
        for _ in range(3):
            got = torch.ops.openreg_expanded_fake_test.gapped(torch.ones(5, device="openreg"))
            self.assertEqual((got.stride(), got.cpu()), ((2,), torch.full((5,), 2.0)))

    def test_an_in_place_write_counts_as_a_version_bump(self):
        # The CPU kernel's write through a kernel view counted nothing on the real tensor: autograd
        # used a saved output it had overwritten (no error, wrong gradient), and an inference tensor
        # was written outside inference mode. As on the CPU, where the kernel writes the tensor itself.
        lib = self.library("openreg_version_test")
        lib.define("bump_(Tensor(a!) x) -> ()")

        def bump_(x):
            x.add_(1)

        lib.impl("bump_", bump_, "CPU")
        lib.impl("bump_", lambda x: None, "Meta")
        op = torch.ops.openreg_version_test.bump_
        # The calls expected to raise run eagerly: under PYTORCH_TEST_WITH_DYNAMO (nox -s inductor),
        # an error of a traced call comes wrapped ("Unexpected exception when running generated
        # GraphModule").
        eager = torch._dynamo.disable(lambda f, *args: f(*args))
        for device in ("cpu", "openreg"):
            for _ in range(2):
                a = torch.ones(3, device=device, requires_grad=True)
                y = a.exp()
                before = y._version
                op(y)
                self.assertEqual(y._version, before + 1)
                with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
                    y.sum().backward()
            with torch.inference_mode():
                t = torch.zeros(3, device=device)
            with self.assertRaisesRegex(RuntimeError, "Inplace update to inference tensor outside InferenceMode"):
                eager(op, t)
            with torch.inference_mode():
                op(t)
            if device == "openreg":  # refused before the kernel ran (the CPU's kernel wrote, then refused)
                self.assertEqual(t.cpu(), torch.ones(3))

        # torch.library.custom_op's own ADInplaceOrView kernel bumps versions, but lets an inference
        # tensor be written outside inference mode (the CPU kernel's in-place op refuses it).
        @torch.library.custom_op("openreg_version_test::add_one_", mutates_args=("x",), device_types="cpu")
        def add_one_(x: torch.Tensor) -> None:
            x.add_(1)

        for device in ("cpu", "openreg"):
            with torch.inference_mode():
                t = torch.zeros(3, device=device)
            with self.assertRaisesRegex(RuntimeError, "Inplace update to inference tensor outside InferenceMode"):
                eager(add_one_, t)
            y = torch.ones(3, device=device, requires_grad=True).exp()
            add_one_(y)
            self.assertGreater(y._version, 0)  # (the CPU counts 2: its kernel's add_ and the custom op's)
        # A refused call counts nothing, as on the CPU (its kernel refused before writing).
        lib.define("scale_(Tensor(a!) x, int n) -> ()")

        def scale_(x, n):
            if n <= 0:
                raise ValueError(f"n must be positive, got {n}")
            x.mul_(n)

        lib.impl("scale_", scale_, "CPU")
        lib.impl("scale_", lambda x, n: scale_(torch.empty(0, device="meta"), n), "Meta")
        for device in ("cpu", "openreg"):
            y = torch.ones(3, device=device, requires_grad=True).exp()
            with self.assertRaisesRegex(ValueError, "n must be positive, got 0"):
                eager(torch.ops.openreg_version_test.scale_, y, 0)
            self.assertEqual(y._version, 0)
            y.sum().backward()

    def test_an_operator_with_no_kernel_to_run(self):
        # The dispatcher's error described the generic path's inner CPU call ("from the 'CPU' backend")
        # and listed PrivateUse1 as available, to a caller who passed openreg tensors.
        lib = self.library("openreg_no_kernel_test")
        lib.define("fake_only(Tensor x) -> Tensor")
        lib.impl("fake_only", lambda x: torch.empty_like(x), "Meta")
        with self.assertRaisesRegex(
            NotImplementedError,
            "'openreg_no_kernel_test::fake_only' has no openreg kernel, and no CPU kernel for openreg's generic path",
        ):
            torch.ops.openreg_no_kernel_test.fake_only(torch.ones(3, device="openreg"))
        lib.impl("fake_only", lambda x: x + 1, "CPU")  # registered after a refused call: it runs now
        self.assertEqual(torch.ops.openreg_no_kernel_test.fake_only(torch.ones(3, device="openreg")).cpu(), [2.0] * 3)


class TestRedefinedOperators(TestCase):
    def test_an_operator_defined_again_gets_fresh_state(self):
        # The generic path keyed what it learns of an operator (its facts, meta results, call count) by
        # the schema's address, which an operator removed (_scoped_library, as PyTorch's own tests
        # define theirs) and defined again often reuses: the new one ran with the old one's state.
        # A functional op then a mutating one: the mutation was never launched ([0, 0, 0]); the other
        # order: a segfault; the count of a removed op: read from its freed schema (bad_alloc).
        r = run_python(
            """
            import torch
            from torch.library import _scoped_library

            def functional():
                with _scoped_library("openreg_redef", "FRAGMENT") as lib:
                    lib.define("op(Tensor x) -> Tensor")
                    lib.impl("op", lambda x: x + 1, "CPU")
                    lib.impl("op", lambda x: torch.empty_like(x), "Meta")
                    x = torch.zeros(3, device="openreg")
                    torch.ops.openreg_redef.op(x)
                    return torch.ops.openreg_redef.op(x).cpu().tolist()

            def mutating():
                with _scoped_library("openreg_redef", "FRAGMENT") as lib:
                    lib.define("op(Tensor(a!) x) -> ()")
                    lib.impl("op", lambda x: [x.add_(5)] and None, "CPU")
                    lib.impl("op", lambda x: None, "Meta")
                    x = torch.zeros(3, device="openreg")
                    torch.ops.openreg_redef.op(x)
                    torch.ops.openreg_redef.op(x)
                    counts = torch.openreg.fallback_op_counts()
                    return x.cpu().tolist(), counts.get("openreg_redef::op")

            for run in (functional, mutating, functional, mutating):
                print(run())
            junk = [torch.library.Library(f"openreg_junk{j}", "DEF") for j in range(20)]  # reuses freed memory
            for j, lib in enumerate(junk):
                lib.define(f"some_long_operator_name_{j}(Tensor x, Tensor y) -> (Tensor, Tensor)")
            print(sorted(k for k in torch.openreg.fallback_op_counts() if not k.startswith("aten::")))
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(
            r.stdout.splitlines(),
            ["[1.0, 1.0, 1.0]", "([10.0, 10.0, 10.0], 2)", "[1.0, 1.0, 1.0]", "([10.0, 10.0, 10.0], 2)", "[]"],
        )


class TestOperatorsRemovedDuringACall(TestCase):
    def test_a_meta_kernel_that_removes_operators(self):
        # The generic path read the outer operator's facts through a reference into a thread-local map
        # that two removals of operators (each dropping the map) inside its meta kernel freed: the
        # mutation was skipped, then a segfault.
        r = run_python(
            """
            import torch
            from torch.library import Library, _scoped_library

            lib = Library("openreg_removing", "DEF")
            lib.define("bump(Tensor(a!) t) -> ()")
            lib.impl("bump", lambda t: [t.add_(5)] and None, "CPU")

            def churn():  # an operator that reached the generic path, removed
                with _scoped_library("openreg_removing_tmp", "FRAGMENT") as tmp:
                    tmp.define("f(Tensor x) -> Tensor")
                    tmp.impl("f", lambda x: x + 1, "CPU")
                    torch.ops.openreg_removing_tmp.f(torch.ones(2, device="openreg"))

            def meta(t):
                for op in (torch.sin, torch.cos):
                    churn()
                    op(torch.ones(3, device="openreg"))
                for k in range(40):
                    torch.exp(torch.ones(k + 1, device="openreg"))

            lib.impl("bump", meta, "Meta")
            churn()
            x = torch.zeros(3, device="openreg")
            for _ in range(2):
                torch.ops.openreg_removing.bump(x)
            print(x.cpu().tolist())
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split("\n")[0], "[10.0, 10.0, 10.0]")


class TestAutogradFunction(TestCase):
    """OpenRegAutogradFunctions.cpp: C++ torch::autograd::Function for AutogradPrivateUse1."""

    def check(self, op, compiled: bool):
        x = torch.randn(4, device="openreg", requires_grad=True)
        fn = (lambda t: op(t) * 2) if not compiled else torch.compile(lambda t: op(t) * 2, backend="aot_eager")
        fn(x).sum().backward()
        self.assertEqual(x.grad.cpu(), torch.full((4,), 1.0))  # 2 (from * 2) scaled by 0.5

    def test_returns_self(self):
        x = torch.randn(3, device="openreg")
        y = torch.ops.openreg.custom_autograd_fn_returns_self(x)
        self.assertEqual(y.data_ptr(), x.data_ptr())
        self.assertEqual(y.untyped_storage().data_ptr(), x.untyped_storage().data_ptr())
        self.check(torch.ops.openreg.custom_autograd_fn_returns_self, compiled=False)
        self.check(torch.ops.openreg.custom_autograd_fn_returns_self, compiled=True)

    def test_aliasing(self):
        x = torch.randn(3, device="openreg", requires_grad=True)
        y = torch.ops.openreg.custom_autograd_fn_aliasing(x)
        self.assertEqual(y.data_ptr(), x.data_ptr())  # a view of the input's memory
        self.assertTrue(y._is_view())
        self.assertIs(y._base, x)
        self.check(torch.ops.openreg.custom_autograd_fn_aliasing, compiled=False)
        self.check(torch.ops.openreg.custom_autograd_fn_aliasing, compiled=True)

    def test_aliasing_result_shares_the_version_counter(self):
        # The result used to alias its input without autograd knowing: an in-place change of the
        # input after the result was saved for backward went unnoticed and the gradient was wrong.
        a = torch.randn(3, device="openreg", requires_grad=True)
        b = a * 1
        y = torch.ops.openreg.custom_autograd_fn_aliasing(b)
        z = y.sin()  # saves y
        version = y._version
        b.add_(1)
        self.assertEqual(y._version, version + 1)
        with self.assertRaisesRegex(RuntimeError, "is a view and its base .* has been modified inplace"):
            z.sum().backward()


if __name__ == "__main__":
    run_tests()
