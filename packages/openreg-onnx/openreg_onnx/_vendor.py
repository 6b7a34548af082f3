"""The ``com.openreg`` ONNX domain: op schemas, and a reference body for each op.

Vendor mode emits one node per openreg operator in this domain instead of spelling it out in
standard ONNX ops. Two things make such a model usable anywhere:

- an ``onnx.defs`` schema per op (``register_schemas``): onnxscript needs it to build the node
  while tracing a translation, and ``onnx.checker`` / shape inference read it;
- a model-local ``FunctionProto`` per op (``attach_functions``): a runtime with no kernel for
  the op (onnxruntime's CPU EP, the ONNX reference evaluator) inlines the body; a vendor's
  execution provider registers a kernel for ``com.openreg::<op>`` and runs its own instead.

The exporter inlines every function it produces itself, so the bodies are attached after
export, to the finished model.
"""

from __future__ import annotations

from typing import Dict, Iterable, List

import onnx
import onnx.defs
import onnx.parser
from onnx import TensorProto

DOMAIN = "com.openreg"
# The domain's version: a schema's change is a new version, so that a runtime that registered the
# earlier schemas (a vendor's kernels) does not meet nodes it was not written for.
# 2 (2026-12-06): scaled_square's SCALE is float32 for 16-bit X (it was X's type).
VERSION = 2
# The lowest standard opset the bodies are valid in (they take the model's own opset).
BODY_OPSET = 18

_FLOAT_TYPES = ["tensor(float16)", "tensor(bfloat16)", "tensor(float)", "tensor(double)"]
_NUMERIC_TYPES = _FLOAT_TYPES + [
    f"tensor({t})" for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
]
_ALL_TYPES = _NUMERIC_TYPES + ["tensor(bool)"]


def _header(opset: int) -> str:
    return f'<domain: "{DOMAIN}", opset_import: ["": {opset}]>\n'


# scores S (in Q's type) -> causal mask -> softmax in `softmax_dtype` (rows with no position
# left give zeros, not NaN) -> O = P V; LSE = logsumexp(S). Same math as core's fused kernel
# (csrc/aten/OpenRegAttention.cpp) and as the portable translation in _table.py.
_ATTENTION_TAIL = """
    C = Constant <value_int: int = @is_causal> ()
    CB = Cast <to = 9> (C)
    NC = Not (CB)
    QS = Shape <start = -2, end = -1> (Q)
    KS = Shape <start = -2, end = -1> (K)
    LQ = Squeeze (QS)
    LK = Squeeze (KS)
    I0 = Constant <value_int = 0> ()
    I1 = Constant <value_int = 1> ()
    AX = Constant <value_ints = [-1]> ()
    ROWS = Range (I0, LQ, I1)
    ROWS2 = Unsqueeze (ROWS, AX)
    COLS = Range (I0, LK, I1)
    TRIL = LessOrEqual (COLS, ROWS2)
    KEEP = Or (NC, TRIL)
    NEGINF = Constant <value_float = -inf> ()
    NI = CastLike (NEGINF, S1)
    S2 = Where (KEEP, S1, NI)
    S = Cast <to: int = @softmax_dtype> (S2)
    M = ReduceMax <keepdims = 1> (S, AX)
    MINF = IsInf <detect_positive = 0> (M)
    ZERO = Constant <value_float = 0.0> ()
    ZF = CastLike (ZERO, M)
    MS = Where (MINF, ZF, M)
    D = Sub (S, MS)
    E = Exp (D)
    SUM = ReduceSum <keepdims = 1> (E, AX)
    LOGSUM = Log (SUM)
    LSE1 = Add (LOGSUM, MS)
    LSE = Squeeze (LSE1, AX)
    P0 = Div (E, SUM)
    EMPTY = Equal (SUM, ZF)
    P1 = Where (EMPTY, ZF, P0)
    P = CastLike (P1, Q)
    O = MatMul (P, V)
}
"""

_SCORES = """
    KT = Transpose <perm = [0, 1, 3, 2]> (K)
    QK = MatMul (Q, KT)
    S0 = Mul (QK, SCALE)
"""

_BODIES = {
    "custom_abs": "custom_abs (X) => (Y) {\n    Y = Abs (X)\n}\n",
    # X * X in X's type, * SCALE in SCALE's type (float for 16-bit X, as eager's opmath), rounded
    # once to X's type; the casts are no-ops when the two types agree.
    "scaled_square": """scaled_square (X, SCALE) => (Y) {
    XX = Mul (X, X)
    XS = CastLike (XX, SCALE)
    YS = Mul (XS, SCALE)
    Y = CastLike (YS, X)
}
""",
    "custom_autograd_fn_returns_self": "custom_autograd_fn_returns_self (X) => (Y) {\n    Y = Identity (X)\n}\n",
    "custom_autograd_fn_aliasing": "custom_autograd_fn_aliasing (X) => (Y) {\n    Y = Identity (X)\n}\n",
    "sdpa": "sdpa <is_causal, softmax_dtype> (Q, K, V, SCALE) => (O, LSE) {"
    + _SCORES
    + "    S1 = Identity (S0)\n"
    + _ATTENTION_TAIL,
    "sdpa_masked": "sdpa_masked <is_causal, softmax_dtype> (Q, K, V, SCALE, B) => (O, LSE) {"
    + _SCORES
    + "    BC = CastLike (B, S0)\n    S1 = Add (S0, BC)\n"
    + _ATTENTION_TAIL,
}


def _param(name: str, type_str: str, doc: str) -> onnx.defs.OpSchema.FormalParameter:
    return onnx.defs.OpSchema.FormalParameter(name, type_str, doc)


def _attr(name: str, kind, doc: str) -> onnx.defs.OpSchema.Attribute:
    return onnx.defs.OpSchema.Attribute(name, kind, doc, required=True)


# Factors are 0-d inputs, not attributes: ONNX float attributes are 32-bit, and a float64 model
# must keep torch's double ``scale``. They have the data's type, except scaled_square's for 16-bit
# data: float32, the type eager multiplies by it in.
_SCALE_DOC = "0-d factor, same type as the data"


def _schemas() -> List[onnx.defs.OpSchema]:
    A = onnx.defs.OpSchema.AttrType
    unary = [
        ("custom_abs", "|X| (openreg::custom_abs)", _NUMERIC_TYPES, []),
        (
            "scaled_square",
            "X * X * SCALE (openreg::scaled_square): the square in X's type, the product in SCALE's, "
            "rounded once to X's type (integer inputs are translated to standard ops)",
            _FLOAT_TYPES,
            [_param("SCALE", "S", "0-d factor: float for 16-bit X (eager's opmath), else X's type")],
        ),
        ("custom_autograd_fn_returns_self", "X itself (openreg::custom_autograd_fn_returns_self)", _ALL_TYPES, []),
        ("custom_autograd_fn_aliasing", "a view of X (openreg::custom_autograd_fn_aliasing)", _ALL_TYPES, []),
    ]
    out = []
    for name, doc, types, extra in unary:
        constraints = [("T", types, "element type")]
        if any(p.type_str == "S" for p in extra):
            constraints.append(("S", _FLOAT_TYPES, "type the factor is applied in"))
        out.append(
            onnx.defs.OpSchema(
                name,
                DOMAIN,
                VERSION,
                doc,
                inputs=[_param("X", "T", "input"), *extra],
                outputs=[_param("Y", "T", "output")],
                type_constraints=constraints,
            )
        )
    attention_attrs = [
        _attr("is_causal", A.INT, "1: position i attends to positions <= i only"),
        _attr("softmax_dtype", A.INT, "TensorProto element type the softmax runs in (float for 16-bit inputs)"),
    ]
    for name, extra, doc in (
        ("sdpa", [], "softmax(SCALE Q K^T) V over [B, H, L, E] inputs, and the rows' logsumexp"),
        (
            "sdpa_masked",
            [_param("B", "T", "additive mask, broadcast to [B, H, L, S] (boolean masks become 0 / -inf)")],
            "softmax(SCALE Q K^T + B) V over [B, H, L, E] inputs, and the rows' logsumexp",
        ),
    ):
        out.append(
            onnx.defs.OpSchema(
                name,
                DOMAIN,
                VERSION,
                doc + " (aten::_scaled_dot_product_fused_attention_overrideable on openreg)",
                inputs=[
                    _param("Q", "T", "query"),
                    _param("K", "T", "key"),
                    _param("V", "T", "value"),
                    _param("SCALE", "T", _SCALE_DOC + ": the factor of Q K^T"),
                    *extra,
                ],
                outputs=[_param("O", "T", "attention output"), _param("LSE", "U", "logsumexp of the scores")],
                type_constraints=[("T", _FLOAT_TYPES, "element type"), ("U", _FLOAT_TYPES[2:], "softmax type")],
                attributes=attention_attrs,
            )
        )
    return out


OPS = tuple(_BODIES)


def register_schemas() -> None:
    """Registers the ``com.openreg`` schemas with onnx (once per process)."""
    for schema in _schemas():
        if not onnx.defs.has(schema.name, schema.since_version, schema.domain):
            onnx.defs.register_schema(schema)


def function_protos(names: Iterable[str] = OPS, opset: int = BODY_OPSET) -> Dict[str, onnx.FunctionProto]:
    """The reference bodies, as model-local functions importing standard opset ``opset`` (a
    function must import the model's own version of a domain)."""
    if opset < BODY_OPSET:
        raise ValueError(f"the com.openreg function bodies need standard opset >= {BODY_OPSET}, not {opset}")
    return {name: onnx.parser.parse_function(_header(opset) + _BODIES[name]) for name in names}


def used_ops(model: onnx.ModelProto) -> List[str]:
    """The ``com.openreg`` op types a model's graph (and its subgraphs) uses."""
    found = set()

    def walk(graph):
        for node in graph.node:
            if node.domain == DOMAIN:
                found.add(node.op_type)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    return sorted(found)


def attach_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Adds the body of every ``com.openreg`` op the model uses as a model-local function (in
    place; returns the model). Ops that already have a function keep it."""
    used = used_ops(model)
    if not used:
        return model
    imports = {o.domain: o.version for o in model.opset_import}
    if "" not in imports:
        model.opset_import.append(onnx.helper.make_opsetid("", BODY_OPSET))
        imports[""] = BODY_OPSET
    if DOMAIN not in imports:
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, VERSION))
    present = {(f.domain, f.name) for f in model.functions}
    for name, fn in function_protos(used, imports[""]).items():
        if (DOMAIN, name) not in present:
            model.functions.append(fn)
    return model


def attach_functions_ir(model) -> None:
    """``attach_functions`` for an ``onnx_ir.Model`` (what ``ONNXProgram.model`` holds), without
    serializing it: its initializers may be fake or large."""
    import onnx_ir as ir

    used = sorted({n.op_type for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.domain == DOMAIN})
    if not used:
        return
    model.opset_imports.setdefault("", BODY_OPSET)
    model.opset_imports.setdefault(DOMAIN, VERSION)
    for proto in function_protos(used, model.opset_imports[""]).values():
        fn = ir.serde.deserialize_function(proto)
        model.functions.setdefault(fn.identifier(), fn)


def softmax_dtype(elem_type: int) -> int:
    """The type core's kernel runs the softmax in: float for 16-bit inputs, else the input's."""
    return TensorProto.FLOAT if elem_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16) else elem_type
