"""openreg-onnx as a plugin: loaded lazily, attached to torch.onnx at its first use."""

import io
import warnings

import onnx
import onnxruntime as ort
import openreg_onnx
import torch
from conftest import run_python
from onnxscript import opset18 as op
from openreg_onnx import _hooks
from openreg_onnx._verify import _run_reference
from torch.testing._internal.common_utils import TestCase

HEAVY = ("onnx", "onnxscript", "onnxruntime", "onnx_ir")

LAZY = """
import sys, torch
info = torch.openreg.plugins()["onnx"]
import openreg_onnx
print(info["loaded"], info["error"], sorted(m for m in %r if m in sys.modules), openreg_onnx.hooks_status())
""" % (HEAVY,)

# The first dynamo export of the process, with no table passed: openreg's ops are translated.
FIRST_EXPORT = """
import sys, torch
import torch.nn.functional as F

class M(torch.nn.Module):
    def forward(self, x, q):
        y = torch.ops.openreg.scaled_square(torch.ops.openreg.custom_abs(x), 0.5)
        return y, F.scaled_dot_product_attention(q, q, q, is_causal=True)

x, q = torch.randn(3, 4, device="openreg"), torch.randn(1, 2, 5, 8, device="openreg")
program = torch.export.export(M(), (x, q)).run_decompositions()
onnx_program = torch.onnx.export(program, (x, q), dynamo=True, verbose=False)
import onnxruntime as ort
session = ort.InferenceSession(onnx_program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
got = session.run(None, {"x": x.cpu().numpy(), "q": q.cpu().numpy()})
want = M()(x, q)
print(all(torch.allclose(torch.from_numpy(g), w.cpu(), atol=1e-6) for g, w in zip(got, want)))
"""


class TestLoading(TestCase):
    def test_direct_import_loads_core_first(self):
        # `import openreg_onnx` before torch imports core, whose plugin discovery loads this module
        # while it is still importing (with autoload too, where `import torch` would load it).
        for autoload in ("0", "1"):
            r = run_python(
                """
                import openreg_onnx, torch
                model = torch.nn.Linear(4, 2).to("openreg").eval()
                result = openreg_onnx.verify(model, (torch.randn(3, 4, device="openreg"),))
                print(result.ok, openreg_onnx.__version__, torch.openreg.plugins()["onnx"]["loaded"])
                """,
                env={"TORCH_DEVICE_BACKEND_AUTOLOAD": autoload},
            )
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), "True 0.1.0 True", autoload)
            self.assertNotIn("openreg plugin", r.stderr)

    def test_loading_imports_no_onnx_package(self):
        r = run_python(LAZY)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(
            r.stdout.strip(),
            "True None [] {'installed': True, 'registry_patched': False, 'symbolics_registered': False}",
        )

    def test_torch_onnx_import_registers_symbolics_only(self):
        probe = LAZY.replace("import openreg_onnx", "import openreg_onnx, torch.onnx")
        # The watched module keeps its own loader.
        probe += "print(type(torch.onnx.__loader__).__name__, type(torch.onnx.__spec__.loader).__name__)\n"
        r = run_python(probe)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(
            r.stdout.strip().splitlines(),
            [
                "True None [] {'installed': True, 'registry_patched': False, 'symbolics_registered': True}",
                "SourceFileLoader SourceFileLoader",
            ],
        )

    def test_first_export_in_the_process_translates_openreg_ops(self):
        r = run_python(FIRST_EXPORT)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertEqual(r.stdout.strip(), "True")

    def test_without_the_plugin_the_export_fails(self):
        r = run_python(FIRST_EXPORT, env={"OPENREG_PLUGINS": "none"})
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("No ONNX function found for <OpOverload(op='openreg.custom_abs', overload='default')>", r.stderr)

    def test_registry_patch_is_version_gated(self):
        class FakeRegistration:
            class ONNXRegistry:
                @classmethod
                def from_torchlib(cls):
                    return "torchlib"

        saved = _hooks._torch_minor
        try:
            _hooks._torch_minor = lambda: (2, 14)
            with self.assertWarnsRegex(RuntimeWarning, r"openreg-onnx: torch .* is not a version whose exporter"):
                _hooks._patch_registry(FakeRegistration)
        finally:
            _hooks._torch_minor = saved
        self.assertEqual(FakeRegistration.ONNXRegistry.from_torchlib(), "torchlib")  # untouched

    def test_patch_point_exists_in_this_torch(self):
        # The source line the patch relies on (see _hooks' docstring).
        import inspect

        from torch.onnx._internal.exporter import _compat, _registration

        self.assertIn("_registration.ONNXRegistry().from_torchlib(", inspect.getsource(_compat.export_compat))
        self.assertTrue(getattr(_registration.ONNXRegistry.from_torchlib.__func__, "_openreg_onnx", False))


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.eval()

    def forward(self, x):
        return torch.ops.openreg.custom_abs(x) * 2


def _run(model_proto, x):
    session = ort.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.cpu().numpy()})[0])


class TestHooksInProcess(TestCase):
    def test_user_translation_wins(self):
        def negated_abs(input):
            return op.Neg(op.Abs(input))

        x = torch.randn(3, 4, device="openreg")
        table = {torch.ops.openreg.custom_abs.default: negated_abs}
        program = torch.onnx.export(M(), (x,), dynamo=True, custom_translation_table=table)
        self.assertEqual(_run(program.model_proto, x), -M()(x).cpu())
        self.assertEqual(_run(torch.onnx.export(M(), (x,), dynamo=True).model_proto, x), M()(x).cpu())

    def test_torchscript_exporter_gets_symbolics(self):
        class Ops(torch.nn.Module):
            def forward(self, x):
                y = torch.ops.openreg.scaled_square(torch.ops.openreg.custom_abs(x), 0.25)
                return torch.ops.openreg.custom_autograd_fn_returns_self(
                    torch.ops.openreg.custom_autograd_fn_aliasing(y)
                )

        ops = ["Abs", "Mul", "Mul", "Identity", "Identity"]
        # x * x * scale squares an integer x in its own type, then promotes it to float; a narrow
        # one squares in int64 and wraps back (int8 100 * 100 is 16)
        int_ops = ["Abs", "Mul", "Cast", "Mul", "Identity", "Identity"]
        int8_ops = ["Abs", "Cast", "Mul", "Cast", "Cast", "Mul", "Identity", "Identity"]
        for x, want_ops in (
            (torch.randn(3, 4, device="openreg"), ops),
            (torch.randint(-3, 4, (3, 4), device="openreg"), int_ops),
            (torch.tensor([[-100, 20, 3, 127]], dtype=torch.int8, device="openreg"), int8_ops),
        ):
            f = io.BytesIO()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                torch.onnx.export(Ops(), (x,), f, dynamo=False)
            model = onnx.load_from_string(f.getvalue())
            self.assertEqual([n.op_type for n in model.graph.node if n.op_type != "Constant"], want_ops)
            want = Ops()(x).cpu()
            self.assertEqual(want.dtype, torch.float32)
            self.assertEqual(_run(model, x), want)
        self.assertTrue(openreg_onnx.hooks_status()["symbolics_registered"])

    def test_torchscript_symbolic_applies_a_16_bit_scale_in_float32(self):
        # As the dynamo translation: a float16 constant of the scale was inf for 1e5.
        class Square(torch.nn.Module):
            def forward(self, x):
                return torch.ops.openreg.scaled_square(x, 1e5)

        x = torch.tensor([0.01, 0.02, -0.03], dtype=torch.float16, device="openreg")
        f = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(Square(), (x,), f, dynamo=False)
        model = onnx.load_from_string(f.getvalue())
        (got,) = _run_reference(model, {model.graph.input[0].name: x.cpu().numpy()}, [model.graph.output[0].name])
        self.assertEqual(torch.from_numpy(got), Square()(x).cpu(), rtol=0, atol=0)
