"""``openreg_onnx.verify``: the exported model against openreg eager.

- expected: the model run eagerly on its openreg device, in eval mode as it is exported (a model
  in train() mode is given back in that mode, its batch-norm statistics untouched), on copies of
  the inputs, with the buffers of the model or program given back as they were, results copied
  to the host;
- actual: the ONNX model in onnxruntime's CPU execution provider; where that provider has no
  kernel for a type (bfloat16 Gemm, float64 Erf, ...) or cannot take the inputs (bfloat16 arrays),
  the ONNX reference evaluator (``onnx.reference``) runs it instead, and the report says so;
- the comparison runs on the CPU in float64, with a tolerance per dtype (``TOLERANCES``); a float32
  or float64 value computed from a bfloat16 or float16 one carries only that precision (a bf16
  layer feeding a float32 head) and is compared at its tolerance (the report says so);
- ``intermediates=True`` also compares every value the ONNX graph names after an FX node of the
  exported program (the exporter keeps those names; the model is then exported unoptimized, as
  the optimizer fuses nodes), so a wrong translation shows at the first node whose value drifts,
  not only at the outputs;
- the result renders as a markdown report of what was compared and what mismatched.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import onnx
import torch

# dtype -> (rtol, atol). 16-bit types: the two sides round intermediate results differently.
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 2e-3),
    torch.bfloat16: (3e-2, 2e-2),
}
EXACT = (0.0, 0.0)


@dataclasses.dataclass
class Comparison:
    name: str
    kind: str  # "output" or "intermediate"
    dtype: str
    shape: Tuple[int, ...]
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    ok: bool
    detail: str = ""


@dataclasses.dataclass
class VerificationResult:
    backend: str  # "onnxruntime" or "onnx.reference"
    fallback_reason: str
    comparisons: List[Comparison]
    onnx_program: Any = None
    tolerance_note: str = ""  # which float32/float64 values were compared at a 16-bit tolerance

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.comparisons)

    @property
    def mismatches(self) -> List[Comparison]:
        return [c for c in self.comparisons if not c.ok]

    def report(self) -> str:
        """Markdown: the verdict, the backend, every mismatch, then the full table."""
        lines = [f"# openreg-onnx verification: {'PASS' if self.ok else 'FAIL'}", ""]
        lines.append(f"- actual values from: **{self.backend}**")
        if self.fallback_reason:
            lines.append(f"- onnxruntime's CPU EP was not used: {self.fallback_reason}")
        if self.tolerance_note:
            lines.append(f"- {self.tolerance_note}")
        lines.append(f"- compared: {len(self.comparisons)} values, {len(self.mismatches)} mismatched")
        lines.append("")

        def table(rows):
            out = ["| value | kind | dtype | shape | max abs diff | max rel diff | rtol / atol | result |"]
            out.append("|---|---|---|---|---|---|---|---|")
            for c in rows:
                result = "ok" if c.ok else f"**MISMATCH** {c.detail}".strip()
                out.append(
                    f"| `{c.name}` | {c.kind} | {c.dtype} | {list(c.shape)} | {c.max_abs:.3g} | {c.max_rel:.3g} "
                    f"| {c.rtol:g} / {c.atol:g} | {result} |"
                )
            return out

        if self.mismatches:
            lines += ["## Mismatches", ""] + table(self.mismatches) + [""]
            first = self.mismatches[0]
            lines += [f"First value that drifts: `{first.name}` ({first.kind}).", ""]
        lines += ["## All compared values", ""] + table(self.comparisons)
        return "\n".join(lines) + "\n"


# --- running the ONNX model -------------------------------------------------------------------


def _as_real(t: torch.Tensor) -> torch.Tensor:
    """A complex tensor as the exporter represents it, a real one with a last dimension of 2
    (real, imaginary), as torch's own verification converts it (``view_as_real``)."""
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = _as_real(t.detach().cpu())
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _from_numpy(a) -> torch.Tensor:
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    # np.ascontiguousarray returns at least 1-D: a 0-d output (x.sum(), a scalar loss) would
    # come back as shape [1] and be reported as a shape mismatch. Keep the array's own shape.
    return torch.from_numpy(np.ascontiguousarray(a).reshape(a.shape))


def _run_onnxruntime(model: onnx.ModelProto, feeds: Dict[str, np.ndarray], outputs: List[str]):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(outputs, feeds)


def _run_reference(model: onnx.ModelProto, feeds: Dict[str, np.ndarray], outputs: List[str]):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(outputs, feeds)


def run_onnx(model: onnx.ModelProto, feeds: Dict[str, np.ndarray], outputs: Optional[List[str]] = None):
    """Runs ``model`` in onnxruntime (CPU EP), else in the reference evaluator. Returns
    (values, backend, reason for the fallback)."""
    outputs = outputs or [o.name for o in model.graph.output]
    if any(a.dtype.name == "bfloat16" for a in feeds.values()):
        reason = "bfloat16 inputs (onnxruntime's Python API takes no bfloat16 arrays)"
        return _run_reference(model, feeds, outputs), "onnx.reference", reason
    try:
        return _run_onnxruntime(model, feeds, outputs), "onnxruntime", ""
    except Exception as e:  # NOT_IMPLEMENTED (no kernel for a type) and the like
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
        return _run_reference(model, feeds, outputs), "onnx.reference", reason


# --- comparing -------------------------------------------------------------------------------


# Significant digits that tell two different values of a dtype apart in a mismatch's detail.
_DIGITS = {torch.float64: 17, torch.float32: 9}


def _is_float(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def compare(name: str, kind: str, expected: torch.Tensor, actual: torch.Tensor, tolerances=None) -> Comparison:
    expected, actual = expected.detach().cpu(), actual.detach().cpu()
    rtol, atol = (tolerances or TOLERANCES).get(expected.dtype, EXACT)
    shape = tuple(expected.shape)
    squeezed = [d for d in shape if d != 1] == [d for d in actual.shape if d != 1]
    if kind == "intermediate" and squeezed and actual.numel() == expected.numel():
        actual = actual.reshape(shape)  # the exporter keeps some scalars as [1]: same values
    if tuple(actual.shape) != shape:
        return Comparison(name, kind, str(expected.dtype), shape, float("inf"), float("inf"), rtol, atol, False,
                          f"shape {list(actual.shape)} instead of {list(shape)}")  # fmt: skip
    # An output of another dtype is another result (an int64 count returned as float32). The
    # exporter may keep an intermediate value in a wider type: those are compared by value.
    if kind == "output" and actual.dtype != expected.dtype:
        return Comparison(name, kind, str(expected.dtype), shape, float("inf"), float("inf"), rtol, atol, False,
                          f"dtype {actual.dtype} instead of {expected.dtype}")  # fmt: skip
    if expected.numel() == 0:
        return Comparison(name, kind, str(expected.dtype), shape, 0.0, 0.0, rtol, atol, True)
    e, a = expected.to(torch.float64), actual.to(torch.float64)
    diff = (e - a).abs()
    same_nonfinite = (e == a) | (e.isnan() & a.isnan())
    diff = torch.where(same_nonfinite, torch.zeros_like(diff), diff)
    diff = torch.nan_to_num(diff, nan=float("inf"))
    rel = diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)
    nonfinite = ~(e.isfinite() & a.isfinite()) & ~same_nonfinite  # inf vs a number, NaN vs a number
    bad = (diff > atol + rtol * e.abs().nan_to_num(posinf=0.0)) | nonfinite
    if not _is_float(expected) and not _is_float(actual):
        # Integers exactly: float64 holds 53 bits, so 2**53 + 1 and 2**53 compared equal there.
        bad = expected.to(torch.int64) != actual.to(torch.int64)
        diff = torch.where(bad, diff.clamp_min(1.0), torch.zeros_like(diff))
    max_abs, max_rel = float(diff.max()), float(torch.where(diff > 0, rel, torch.zeros_like(rel)).max())
    detail = ""
    if bool(bad.any()):
        idx = tuple(int(i) for i in np.unravel_index(int(torch.argmax(torch.where(bad, diff, -1.0))), shape))
        if _is_float(expected):
            digits = _DIGITS.get(expected.dtype, 6)
            want, got = f"{e[idx]:.{digits}g}", f"{a[idx]:.{digits}g}"
        else:
            want, got = str(expected[idx].item()), str(actual[idx].item())
        detail = f"{int(bad.sum())}/{e.numel()} elements; worst at {list(idx)}: expected {want}, got {got}"
    return Comparison(name, kind, str(expected.dtype), shape, max_abs, max_rel, rtol, atol, not bool(bad.any()), detail)


def _flat_tensors(value) -> List[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


# Batch norm in a captured graph, and the position of its training flag: an ExportedProgram
# captured from a model in train() mode keeps training batch norm, which the ONNX exporter
# translates as inference (the running statistics).
_BATCH_NORM_TRAINING_ARG = {
    torch.ops.aten.batch_norm.default: 5,
    torch.ops.aten.native_batch_norm.default: 5,
    torch.ops.aten._native_batch_norm_legit_functional.default: 5,
    torch.ops.aten._native_batch_norm_legit.default: 5,
}
# Dropout (flag at 2), which the exporter keeps as it is: a Dropout in training mode drops at random.
_DROPOUT = (
    torch.ops.aten.dropout.default,
    torch.ops.aten.native_dropout.default,
    torch.ops.aten.feature_dropout.default,
    torch.ops.aten.alpha_dropout.default,
    torch.ops.aten.feature_alpha_dropout.default,
)


def _refuse_random_dropout(graph: torch.fx.Graph, what: str) -> None:
    """A captured graph with dropout in training mode (captured from a model in train() mode) drops
    at random, and so does its ONNX export: nothing to compare."""
    dropping = [
        n.name
        for n in graph.nodes
        if n.op == "call_function" and n.target in _DROPOUT and len(n.args) > 2 and n.args[2] is True and n.args[1]
    ]
    if dropping:
        raise ValueError(
            f"the {what} drops at random ({', '.join(dropping)}: dropout in training mode, captured from a "
            "model in train() mode) and so does its ONNX export; capture it from model.eval(), or pass the "
            "model itself (a model is exported and compared in eval mode)"
        )


def _inference_module(program: torch.export.ExportedProgram) -> torch.nn.Module:
    """``program.module()`` computing what its ONNX export computes. A program captured in
    train() mode runs as a copy with batch norm's training flag off, so the caller's statistics,
    which the program shares, are not updated either; one that drops at random is refused (its
    ONNX model drops at random too: nothing to compare)."""
    gm = program.module()
    _refuse_random_dropout(gm.graph, "program")
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]

    def trains(n):
        index = _BATCH_NORM_TRAINING_ARG.get(n.target) if n.op == "call_function" else None
        return index is not None and len(n.args) > index and n.args[index] is True

    if not any(trains(n) for n in calls):
        return gm
    gm = copy.deepcopy(gm)
    for node in gm.graph.nodes:
        if trains(node):
            node.update_arg(_BATCH_NORM_TRAINING_ARG[node.target], False)
    gm.recompile()
    return gm


def _node_values(program: torch.export.ExportedProgram, args, kwargs) -> Dict[str, torch.Tensor]:
    """Every FX node's tensor value when the program runs eagerly (on the program's device)."""
    gm = _inference_module(program)
    values: Dict[str, torch.Tensor] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if isinstance(out, torch.Tensor) and n.op == "call_function":
                values[n.name] = out.clone()  # a value may be a buffer, which the run's end restores
            return out

    Recorder(gm).run(*torch.utils._pytree.tree_leaves((args, kwargs)))
    return values


@contextlib.contextmanager
def _buffers_kept(*owners: object) -> Iterator[None]:
    """Gives the buffers of ``owners`` (modules, exported programs) back as they were after the
    block: the reference run is the model's real forward, and a forward that updates a buffer (a
    running counter, a cache) in place or rebinds it would otherwise leave the model changed by its
    verification (and the ONNX run, whose initializers may be those buffers, would start from the
    changed values). A program's buffers (``state_dict``, non-persistent ones in ``constants``) are
    the tensors of the model it was captured from, which its ``module()`` updates in place."""
    bound = []  # (module, name, tensor): a forward may rebind a module's buffer
    saved = {}  # id -> (tensor, its value before the block)
    for owner in owners:
        if isinstance(owner, torch.nn.Module):
            slots = [(m, name, b) for m in owner.modules() for name, b in m._buffers.items() if b is not None]
            bound += slots
            tensors = [b for _, _, b in slots]
        elif isinstance(owner, torch.export.ExportedProgram):
            tensors = [owner.state_dict.get(n, owner.constants.get(n)) for n in owner.graph_signature.buffers]
        else:
            tensors = []
        for t in tensors:
            if isinstance(t, torch.Tensor) and id(t) not in saved:
                saved[id(t)] = (t, t.detach().clone())
    try:
        yield
    finally:
        with torch.no_grad():
            for m, name, original in bound:
                m._buffers[name] = original
            for original, value in saved.values():
                original.copy_(value)


def verify(
    model_or_program,
    args: Tuple[Any, ...] = (),
    *,
    kwargs: Optional[Dict[str, Any]] = None,
    onnx_program=None,
    mode: str = "portable",
    dynamic_shapes=None,
    tolerances: Optional[Dict[torch.dtype, Tuple[float, float]]] = None,
    intermediates: bool = False,
    custom_translation_table=None,
    backend: str = "auto",
) -> VerificationResult:
    """Exports ``model_or_program`` (an ``nn.Module`` or ``ExportedProgram`` on openreg) unless
    ``onnx_program`` (an ``ONNXProgram``, a ``ModelProto`` or the path of a saved model) is given,
    runs it on ``args`` and compares with openreg eager. ``tolerances``: ``{dtype: (rtol, atol)}``
    for the dtypes it names, the defaults (``TOLERANCES``) for the others. ``backend``: "auto"
    (onnxruntime, else the reference evaluator), "onnxruntime" or "reference". Returns a
    ``VerificationResult`` (``.ok``, ``.mismatches``, ``.report()``)."""
    from . import _export

    if not isinstance(args, tuple):
        args = (args,)
    kwargs = kwargs or {}
    if isinstance(model_or_program, torch.export.ExportedProgram) and not args and not kwargs:
        args, kwargs = model_or_program.example_inputs or ((), {})  # as export(): the program's own inputs
    _export.check_devices(model_or_program, (args, kwargs))
    if isinstance(model_or_program, torch.export.ExportedProgram):
        run = _inference_module(model_or_program)  # before the export: it may refuse the program
    else:
        run = model_or_program
        for graph in _export.captured_graphs(run):  # ExportedProgram.module(), or a part of one
            _refuse_random_dropout(graph, "captured module")
    if onnx_program is None:
        onnx_program = _export.export(
            model_or_program,
            args,
            kwargs=kwargs,
            mode=mode,
            dynamic_shapes=dynamic_shapes,
            custom_translation_table=custom_translation_table,
            # The optimizer fuses nodes (Linear -> Gemm) and drops their names; per-node
            # comparison needs the graph as translated.
            optimize=not intermediates,
        )
    if isinstance(onnx_program, (str, os.PathLike)):  # a saved file, as the command line takes it
        onnx_program = onnx.load(os.fspath(onnx_program))
    model = onnx_program if isinstance(onnx_program, onnx.ModelProto) else onnx_program.model_proto
    inputs = _flat_tensors((args, kwargs))
    # A file saved with keep_initializers_as_inputs lists its weights among the inputs too; they
    # keep their stored values (as onnxruntime does when they are not fed).
    initializers = {i.name for i in model.graph.initializer}
    graph_inputs = [i.name for i in model.graph.input if i.name not in initializers]
    if len(graph_inputs) != len(inputs):
        raise ValueError(f"the ONNX model takes {len(graph_inputs)} inputs, the call gives {len(inputs)} tensors")
    # Host copies before any eager run, which runs on copies too: a forward that changes an input
    # in place (x.add_(1)) would feed onnxruntime the changed values, and change the caller's.
    feeds = {name: _to_numpy(t) for name, t in zip(graph_inputs, inputs)}

    def fresh_inputs():
        return torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, (args, kwargs))

    outputs = [o.name for o in model.graph.output]
    program = None
    if intermediates:
        # The program the ONNX exporter translated (its own decompositions: linear stays linear)
        # names the values; without it, the default decompositions are the best guess.
        program = getattr(onnx_program, "exported_program", None)
        if program is None:
            if isinstance(model_or_program, torch.export.ExportedProgram):
                program = model_or_program.run_decompositions()
            else:
                with _export.eval_mode(model_or_program):
                    program = torch.export.export(model_or_program, args, kwargs).run_decompositions()
    # The export is of inference (a model in train() mode is exported as in eval(); a program
    # captured in train() mode has its batch norm translated as inference): the eager reference
    # runs in the same mode, which also leaves batch-norm statistics alone; the model is given
    # back in the mode it had. Each eager run starts from the buffers as they were, and gives
    # them back so (the per-node run's program shares them with the model).
    node_values: Dict[str, torch.Tensor] = {}
    with torch.no_grad(), _export.eval_mode(model_or_program):
        with _buffers_kept(model_or_program):
            run_args, run_kwargs = fresh_inputs()
            # cloned: an output may be a buffer, which the reference run's end restores
            expected = [t.clone() for t in _flat_tensors(run(*run_args, **run_kwargs))]
        if program is not None:
            with _buffers_kept(model_or_program, program):
                node_values = _node_values(program, *fresh_inputs())
    if intermediates:
        model = _expose(model, [n for n in node_values if n not in outputs])
    names = [o.name for o in model.graph.output]
    if backend == "reference":
        values, used, reason = _run_reference(model, feeds, names), "onnx.reference", "backend='reference' requested"
    elif backend == "onnxruntime":
        values, used, reason = _run_onnxruntime(model, feeds, names), "onnxruntime", ""
    else:
        values, used, reason = run_onnx(model, feeds, names)
    actual = dict(zip(names, values))

    low = _computed_from_16_bit(model)
    comparisons = []
    if len(expected) != len(outputs):
        raise ValueError(f"the ONNX model has {len(outputs)} outputs, openreg eager gave {len(expected)} tensors")
    if intermediates:  # graph order: the first drifting node is the suspect
        for name in [n for n in node_values if n in actual and n not in outputs]:
            exp = _as_real(node_values[name])
            tol = _tolerance_of(name, exp, low, tolerances)
            comparisons.append(compare(name, "intermediate", exp, _from_numpy(actual[name]), tol))
    # A complex output is a real one with a last dimension of 2 in the ONNX model (_as_real).
    expected = [_as_real(t) for t in expected]
    for name, exp in zip(outputs, expected):
        comparisons.append(
            compare(name, "output", exp, _from_numpy(actual[name]), _tolerance_of(name, exp, low, tolerances))
        )
    kept = {"torch.float32", "torch.float64"} - {str(d) for d in tolerances or {}}  # not the caller's
    widened = [c for c in comparisons if c.name in low and c.dtype in kept]
    note = ""
    if widened:
        kinds = sorted({str(low[c.name]).removeprefix("torch.") for c in widened})
        note = (
            f"{len(widened)} float32/float64 values computed from {' and '.join(kinds)} values: compared at "
            "the tolerance of the 16-bit type they were computed from"
        )
    return VerificationResult(used, reason, comparisons, onnx_program, note)


_ONNX_16_BIT = {onnx.TensorProto.BFLOAT16: torch.bfloat16, onnx.TensorProto.FLOAT16: torch.float16}


def _computed_from_16_bit(model: onnx.ModelProto) -> Dict[str, torch.dtype]:
    """The values of the graph computed from a bfloat16 or float16 value, each with the loosest such
    type it depends on. A float32 value computed from a bfloat16 one (``layer(x.bfloat16()).float()``)
    holds bfloat16's precision only. 16-bit values are those typed so (inputs, initializers,
    value_info, outputs) or made by a Cast to a 16-bit type; the rest follows the nodes' inputs."""
    graph = model.graph
    low: Dict[str, torch.dtype] = {}

    def mark(name: str, dtype: torch.dtype) -> None:
        if name not in low or TOLERANCES[dtype] > TOLERANCES[low[name]]:
            low[name] = dtype

    for t in graph.initializer:
        if t.data_type in _ONNX_16_BIT:
            mark(t.name, _ONNX_16_BIT[t.data_type])
    for v in list(graph.input) + list(graph.value_info) + list(graph.output):
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in _ONNX_16_BIT:
            mark(v.name, _ONNX_16_BIT[v.type.tensor_type.elem_type])
    for node in graph.node:  # in topological order, as ONNX requires
        carried = [low[i] for i in node.input if i in low]
        if node.op_type == "Cast":
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            if to in _ONNX_16_BIT:
                carried.append(_ONNX_16_BIT[to])
        if carried:
            widest = max(carried, key=lambda d: TOLERANCES[d])
            for out in node.output:
                mark(out, widest)
    return low


def _tolerance_of(name: str, expected: torch.Tensor, low: Dict[str, torch.dtype], tolerances):
    """The tolerances for one value: the caller's for the dtypes it names, the defaults for the
    others (a dict naming float32 only compared float16 values exactly); a float32/float64 value
    computed from a 16-bit one gets the 16-bit type's, unless the caller named its dtype."""
    given = tolerances or {}
    merged = {**TOLERANCES, **given}
    if name in low and expected.dtype in (torch.float32, torch.float64) and expected.dtype not in given:
        merged[expected.dtype] = merged[low[name]]
    return merged


def _expose(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph also outputs the values ``names`` (those it computes)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    produced = {o for n in exposed.graph.node for o in n.output}
    typed = {v.name: v for v in list(exposed.graph.value_info) + list(exposed.graph.output)}
    for name in names:
        if name in produced and name in typed:
            exposed.graph.output.append(typed[name])
    return exposed
