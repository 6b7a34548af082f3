"""openreg_onnx.translation_table(): coverage of openreg's operators, and every translation in
both modes compared with openreg eager (onnxruntime for float32/float16, the ONNX reference
evaluator for bfloat16/float64)."""

import inspect
import typing

import numpy as np
import onnx
import onnxruntime as ort
import openreg_onnx
import pytest
import torch
from conftest import AllOps, all_ops_inputs, decomposed_program, run_python
from openreg_onnx import _table, _vendor
from openreg_onnx._verify import _from_numpy, _run_reference, _to_numpy
from torch.testing._internal.common_utils import TestCase

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
# Who computes the actual values: onnxruntime's Python API takes no bfloat16 arrays.
EXPECTED_BACKEND = {
    "float32": "onnxruntime",
    "float16": "onnxruntime",
    "bfloat16": "onnx.reference",
    "float64": "onnxruntime",
}


class TestCoverage(TestCase):
    def test_every_openreg_operator_has_a_translation_and_no_schema_drifted(self):
        self.assertEqual(_table.coverage_problems(), [])
        live = {n for n in torch._C._dispatch_get_all_op_names() if n.startswith("openreg::")}
        self.assertTrue(live)  # core's operators are registered at all
        self.assertLessEqual(live, set(_table.translated_op_names()))

    def test_a_new_openreg_operator_is_reported(self):
        r = run_python(
            """
            import torch
            from openreg_onnx import _table
            torch.library.define("openreg::drift_probe", "(Tensor x, int n) -> Tensor")
            print(_table.coverage_problems())
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("openreg::drift_probe: no translation in openreg_onnx._table (schema (Tensor x, int n)", r.stdout)

    def test_a_drifted_schema_is_reported(self):
        saved = dict(_table.SIGNATURES)
        try:
            _table.SIGNATURES["openreg::scaled_square"] = "(Tensor x) -> Tensor"
            self.assertEqual(
                _table.coverage_problems(),
                [
                    "openreg::scaled_square: schema drifted: the translation implements (Tensor x) -> Tensor, "
                    "the op is now (Tensor x, float scale) -> Tensor"
                ],
            )
        finally:
            _table.SIGNATURES.clear()
            _table.SIGNATURES.update(saved)

    def test_translation_parameters_follow_the_schema(self):
        # The exporter binds a node's arguments to the translation by name; annotated float/bool/int
        # parameters become ONNX attributes, unannotated ones inputs (a ScalarType arrives as an
        # int: the ONNX element type).
        for mode in _table.MODES:
            for op, fn in openreg_onnx.translation_table(mode).items():
                schema = op._schema
                params = inspect.signature(fn).parameters
                hints = typing.get_type_hints(fn)
                self.assertEqual(list(params), [a.name for a in schema.arguments], f"{mode} {op}")
                for arg in schema.arguments:
                    p = params[arg.name]
                    kind = str(arg.type)
                    if "Tensor" in kind:
                        self.assertNotIn(arg.name, hints, f"{op}: tensor {arg.name} must be an input")
                    else:
                        want = {
                            "float": float,
                            "bool": bool,
                            "int": int,
                            "ScalarType": int,
                            "Optional[int]": typing.Optional[int],  # ScalarType?
                            "Optional[float]": typing.Optional[float],
                        }[kind]
                        self.assertEqual(hints[arg.name], want, f"{op}: {arg.name}")
                    if arg.has_default_value():
                        self.assertEqual(p.default, arg.default_value, f"{op}: default of {arg.name}")

    def test_modes(self):
        portable, vendor = openreg_onnx.translation_table(), openreg_onnx.translation_table("vendor")
        self.assertEqual(set(portable), set(vendor))
        self.assertIn(torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default, portable)
        for overload in (
            torch.ops.quantized_decomposed.quantize_per_tensor.default,
            torch.ops.quantized_decomposed.quantize_per_tensor.tensor,
        ):
            self.assertIs(portable[overload], vendor[overload])  # standard ops in both modes
        self.assertTrue(all(isinstance(k, torch._ops.OpOverload) for k in portable))
        with self.assertRaisesRegex(ValueError, r"mode must be one of \('portable', 'vendor'\), not 'fast'"):
            openreg_onnx.translation_table("fast")


@pytest.fixture(scope="module", params=[(m, d) for m in _table.MODES for d in DTYPES], ids=lambda p: f"{p[0]}-{p[1]}")
def all_ops_result(request):
    mode, dtype_name = request.param
    args = all_ops_inputs(DTYPES[dtype_name])
    program = decomposed_program(AllOps(), args)
    targets = {str(n.target) for n in program.graph.nodes}
    # What makes the fused op's translation necessary: it is in the graph after decomposition.
    assert "aten._scaled_dot_product_fused_attention_overrideable.default" in targets, targets
    return mode, dtype_name, openreg_onnx.verify(program, args, mode=mode)


@pytest.mark.parametrize("index", range(len(AllOps.NAMES)), ids=AllOps.NAMES)
def test_each_op_matches_openreg_eager(all_ops_result, index):
    mode, dtype_name, result = all_ops_result
    c = result.comparisons[index]
    assert c.ok, result.report()
    assert result.backend == EXPECTED_BACKEND[dtype_name], result.fallback_reason
    name = AllOps.NAMES[index]
    # Integer inputs promote as torch does: the result takes the default float type.
    want = "torch.float32" if name == "scaled_square_int" else str(DTYPES[dtype_name])
    assert c.dtype == want


def test_vendor_model_uses_com_openreg_nodes_with_function_bodies(all_ops_result):
    mode, dtype_name, result = all_ops_result
    model = result.onnx_program.model_proto
    used = _vendor.used_ops(model)
    if mode == "portable":
        assert used == []
        assert {o.domain for o in model.opset_import} == {""}
        return
    assert used == ["custom_abs", "scaled_square", "sdpa", "sdpa_masked"]
    assert sorted(f.name for f in model.functions if f.domain == "com.openreg") == used
    assert {o.domain: o.version for o in model.opset_import}["com.openreg"] == _vendor.VERSION == 2
    onnx.checker.check_model(model, full_check=True)


def _trace_one(fn, inputs, **attrs):
    """A one-op ONNX model of the translation ``fn`` traced by the exporter's own recorder: for
    the aliasing ops, which torch.export turns into views before the ONNX exporter sees them."""
    import onnx_ir as ir
    import onnxscript
    from torch.onnx._internal.exporter import _building

    values = [ir.Value(name=f"in{i}", type=ir.TensorType(ir.DataType.from_numpy(a.dtype)), shape=ir.Shape(a.shape))
              for i, a in enumerate(inputs)]  # fmt: skip
    recorder = _building.OpRecorder(onnxscript.opset18, {})
    with onnxscript.evaluator.default_as(recorder):
        out = fn(*values, **attrs)
    out.name = "out"
    graph = ir.Graph(values, [out], nodes=recorder.nodes, opset_imports={"": 18})
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=10))
    return _vendor.attach_functions(proto)


@pytest.mark.parametrize("mode", _table.MODES)
@pytest.mark.parametrize("op", ["custom_autograd_fn_returns_self", "custom_autograd_fn_aliasing"])
def test_aliasing_ops(mode, op):
    # In an exported program these two are views already (functionalization); their translations
    # still exist for graphs that keep them, and are checked here on their own.
    overload = getattr(torch.ops.openreg, op).default
    x = torch.randn(3, 4, device="openreg")
    model = _trace_one(openreg_onnx.translation_table(mode)[overload], [x.cpu().numpy()])
    assert [(n.domain, n.op_type) for n in model.graph.node] == (
        [("com.openreg", op)] if mode == "vendor" else [("", "Identity")]
    )
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"in0": x.cpu().numpy()}
    )[0]
    np.testing.assert_array_equal(got, overload(x).cpu().numpy())


@pytest.mark.parametrize("mode", _table.MODES)
def test_integer_scaled_square_wraps_as_eager(mode):
    # Eager squares an integer x in its own type, so the square wraps before it becomes a float
    # (int8 -100: 10000 is 16 in int8); the translation used to cast x to float first.
    class Square(torch.nn.Module):
        def forward(self, x):
            return torch.ops.openreg.scaled_square(x, 1.5)

    for dtype, values in (
        (torch.int8, [3, 20, -100]),
        (torch.uint8, [3, 20, 200]),
        (torch.int16, [3, 300, -1000]),
        (torch.int32, [3, 50000, -70000]),
        (torch.int64, [3, -5]),
        (torch.bool, [True, False]),
    ):
        x = torch.tensor(values, dtype=dtype, device="openreg")
        result = openreg_onnx.verify(Square(), (x,), mode=mode)
        assert result.ok, result.report()
        assert result.backend == "onnxruntime", result.fallback_reason
        if dtype in (torch.int8, torch.uint8, torch.int16, torch.int32):  # the square does wrap here
            assert Square()(x).cpu().tolist() != [v * v * 1.5 for v in values]


@pytest.mark.parametrize("mode", _table.MODES)
def test_float64_attention_with_a_dynamic_head_dim_keeps_a_double_scale(mode):
    # With E symbolic the scale 1/sqrt(E) is computed in the graph: in double for a double query
    # (in float32 it was off by 1e-6, far beyond float64's tolerance).
    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 7, generator=g, dtype=torch.float64).to("openreg") for _ in range(3))
    e = torch.export.Dim("e", min=2)
    program = decomposed_program(Attention(), (q, k, v), dynamic_shapes=({3: e}, {3: e}, {3: e}))
    result = openreg_onnx.verify(program, (q, k, v), mode=mode)
    assert result.ok, result.report()
    assert result.comparisons[0].max_abs < 1e-12


def test_attention_exports_at_an_older_opset():
    # torch exports at 18 and converts down; onnx's version converter failed on the attention's
    # Constant(value_ints=...) and torch kept opset 18 with only a log line.
    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            F = torch.nn.functional
            return F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g).to("openreg") for _ in range(3))
    program = decomposed_program(Attention(), (q, k, v))
    onnx_program = openreg_onnx.export(program, (q, k, v), opset_version=17)
    assert {o.domain: o.version for o in onnx_program.model_proto.opset_import} == {"": 17}
    result = openreg_onnx.verify(program, (q, k, v), onnx_program=onnx_program)
    assert result.ok, result.report()


@pytest.mark.parametrize("mode", _table.MODES)
@pytest.mark.parametrize(
    "dtype, scale, values",
    [(torch.float16, 1e5, [0.01, 0.02, -0.03]), (torch.bfloat16, 1.01, [100.0, 3.0, -7.0])],
    ids=["float16", "bfloat16"],
)
def test_16_bit_scaled_square_applies_the_scale_in_float32(mode, dtype, scale, values):
    # Eager squares in x's type, multiplies by the scale in float32 (opmath) and rounds once. The
    # translation rounded the scale to x's type first: 1e5 is inf in float16, 1.01 is 1.0078125 in
    # bfloat16 (64 off on 10112).
    class Square(torch.nn.Module):
        def forward(self, x):
            return torch.ops.openreg.scaled_square(x, scale)

    x = torch.tensor(values, dtype=dtype, device="openreg")
    result = openreg_onnx.verify(Square(), (x,), mode=mode)
    assert result.ok, result.report()
    # Bit for bit in the reference evaluator (onnxruntime's CPU provider may run the float16
    # square in float32, one rounding fewer).
    model = result.onnx_program.model_proto
    (got,) = _run_reference(model, {"x": _to_numpy(x)}, [model.graph.output[0].name])
    torch.testing.assert_close(_from_numpy(got), Square()(x).cpu(), rtol=0, atol=0)
