"""onnxruntime sessions whose ``com.openreg`` nodes run openreg's own kernels.

A vendor-mode model carries a reference body for each ``com.openreg`` op; onnxruntime's CPU EP
inlines it. ``openreg_session`` shows the other route, the one a vendor's execution provider
takes natively: the node runs the device's kernel. onnxruntime's Python custom operators
(onnxruntime-extensions' ``onnx_op``) exist only in the ``ai.onnx.contrib`` domain, so the
session helper

1. registers, once per process, a Python custom op per (openreg op, element type) in that
   domain; each one moves its inputs to the openreg device, calls the openreg operator
   (``torch.ops.openreg.*``, or ``aten._scaled_dot_product_fused_attention_overrideable`` for
   attention), counts the call, and returns the results to the host;
2. rewrites a copy of the model: every ``com.openreg`` node whose input type has a kernel moves
   to ``ai.onnx.contrib`` under that op's name; any other keeps its reference body;
3. opens an ``onnxruntime.InferenceSession`` on it with the extensions library loaded.

A real execution provider does the same without the host round trip: it claims the
``com.openreg`` nodes (``GetCapability``) and runs them on the device, next to its own kernels
for the standard ops.
"""

from __future__ import annotations

import collections
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np
import onnx
import torch
from onnx import TensorProto

from . import _vendor
from ._verify import _from_numpy

CONTRIB = "ai.onnx.contrib"
_lock = threading.Lock()
_state = {"registered": False, "device": "openreg"}
_calls: collections.Counter = collections.Counter()

# ONNX element type -> onnxruntime-extensions type name. Its Python custom-op API takes float and
# double only (float16 aborts the process at run time: "Type float16 not supported by python
# customops api"); nodes of other types keep their reference body.
_TYPES = {TensorProto.FLOAT: "dt_float", TensorProto.DOUBLE: "dt_double"}


def _dev(a: np.ndarray) -> torch.Tensor:
    return _from_numpy(a).to(_state["device"])  # keeps a 0-d input 0-d (see _from_numpy)


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _attention(q, k, v, scale, bias, is_causal):
    out, lse, *_ = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        _dev(q), _dev(k), _dev(v), None if bias is None else _dev(bias), 0.0, bool(is_causal), False, scale=float(scale)
    )
    return _host(out), _host(lse)


# op -> (kernel(*inputs, **attrs), number of inputs, attributes, output types given the input type)
def _kernels():
    ops = torch.ops.openreg
    same = lambda t: [t]  # noqa: E731
    attention_attrs = ("is_causal", "softmax_dtype")
    return {
        "custom_abs": (lambda x: _host(ops.custom_abs(_dev(x))), 1, (), same),
        "scaled_square": (lambda x, s: _host(ops.scaled_square(_dev(x), float(s))), 2, (), same),
        "custom_autograd_fn_returns_self": (
            lambda x: _host(ops.custom_autograd_fn_returns_self(_dev(x))),
            1,
            (),
            same,
        ),
        "custom_autograd_fn_aliasing": (lambda x: _host(ops.custom_autograd_fn_aliasing(_dev(x))), 1, (), same),
        "sdpa": (
            lambda q, k, v, s, is_causal=0, softmax_dtype=0: _attention(q, k, v, s, None, is_causal),
            4,
            attention_attrs,
            lambda t: [t, t],  # O, and LSE in the softmax type: the input's for float and double
        ),
        "sdpa_masked": (
            lambda q, k, v, s, b, is_causal=0, softmax_dtype=0: _attention(q, k, v, s, b, is_causal),
            5,
            attention_attrs,
            lambda t: [t, t],  # O, and LSE in the softmax type: the input's for float and double
        ),
    }


def contrib_name(op: str, elem_type: int) -> str:
    """The ``ai.onnx.contrib`` op type that runs openreg's ``op`` for inputs of ``elem_type``."""
    return f"openreg_{op}_{TensorProto.DataType.Name(elem_type).lower()}"


def _register() -> None:
    """Registers every (op, type) Python custom op with onnxruntime-extensions, once."""
    from onnxruntime_extensions import PyCustomOpDef, onnx_op

    with _lock:
        if _state["registered"]:
            return
        for op, (kernel, n_inputs, attrs, outputs) in _kernels().items():
            for elem_type, dt_name in _TYPES.items():
                dt = getattr(PyCustomOpDef, dt_name)
                out_types = [getattr(PyCustomOpDef, _TYPES[t]) for t in outputs(elem_type)]

                def counted(*args, _kernel=kernel, _op=op, **kw):
                    _calls[_op] += 1
                    return _kernel(*args, **kw)

                onnx_op(
                    op_type=contrib_name(op, elem_type),
                    inputs=[dt] * n_inputs,
                    outputs=out_types,
                    attrs={a: PyCustomOpDef.dt_int64 for a in attrs},
                )(counted)
        _state["registered"] = True


def _elem_types(model: onnx.ModelProto) -> Dict[str, int]:
    types = {}
    for v in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        if v.type.HasField("tensor_type"):
            types[v.name] = v.type.tensor_type.elem_type
    for init in model.graph.initializer:
        types[init.name] = init.data_type
    return types


def rewrite(model: onnx.ModelProto) -> Tuple[onnx.ModelProto, List[str], List[str]]:
    """A copy of ``model`` with its ``com.openreg`` nodes in ``ai.onnx.contrib`` where openreg
    has a kernel for the input type. Returns (model, nodes moved, nodes left on their body)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    types = _elem_types(out)
    moved, kept = [], []
    for node in out.graph.node:
        if node.domain != _vendor.DOMAIN:
            continue
        elem_type = types.get(node.input[0])
        label = f"{node.name or node.output[0]} ({node.op_type})"
        if elem_type in _TYPES and node.op_type in _kernels():
            node.domain, node.op_type = CONTRIB, contrib_name(node.op_type, elem_type)
            moved.append(label)
        else:
            kept.append(label)
    if moved and CONTRIB not in {o.domain for o in out.opset_import}:
        out.opset_import.append(onnx.helper.make_opsetid(CONTRIB, 1))
    return out, moved, kept


class OpenRegSession:
    """An onnxruntime session (CPU EP) whose ``com.openreg`` nodes run openreg kernels.

    ``moved``: the nodes that run on openreg; ``kept``: those left on their reference body
    (no kernel for their input type). ``run`` takes and returns numpy arrays like onnxruntime."""

    def __init__(self, model, device: str = "openreg"):
        import onnxruntime as ort
        from onnxruntime_extensions import get_library_path

        proto = model if isinstance(model, onnx.ModelProto) else model.model_proto
        _register()
        self.device = str(torch.device(device))
        self.model, self.moved, self.kept = rewrite(proto)
        options = ort.SessionOptions()
        options.register_custom_ops_library(get_library_path())
        self.session = ort.InferenceSession(self.model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def run(self, output_names: Optional[List[str]], feeds: Dict[str, np.ndarray]):
        with _lock:  # the custom ops are process-wide: they take the device of the running session
            _state["device"] = self.device
            return self.session.run(output_names, feeds)


def openreg_session(model, device: str = "openreg") -> OpenRegSession:
    """An onnxruntime session for a vendor-mode model (``ONNXProgram`` or ``ModelProto``) whose
    ``com.openreg`` nodes run openreg's kernels on ``device``; see the module docstring."""
    return OpenRegSession(model, device)


def kernel_calls() -> Dict[str, int]:
    """How often each openreg op ran from an onnxruntime session in this process."""
    return dict(_calls)


def reset_kernel_calls() -> None:
    _calls.clear()
