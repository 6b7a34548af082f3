"""``openreg_onnx.export``: torch.onnx.export for openreg models, with checks and provenance.

On top of a plain ``torch.onnx.export(dynamo=True)`` (which, with the plugin loaded, already
translates openreg's operators):

- the chosen mode's table goes in as ``custom_translation_table`` (the caller's own entries,
  passed the same way, are merged over it and win);
- vendor mode: the ``com.openreg`` function bodies are attached to the finished model;
- every dimension the caller asked to be dynamic is checked in the ONNX inputs: one that came
  out as a fixed number fails the export, naming the input, the axis and the size (the exporter
  itself only warns, or not at all, when a device kernel specialised on a size);
- ``metadata_props`` record the provenance: openreg-onnx, torch, onnx, onnxscript versions, the
  opsets, the mode and the device the model came from.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import onnx
import torch

from . import _table, _vendor

METADATA_PREFIX = "openreg_onnx."


class DynamicDimError(RuntimeError):
    """A dimension requested as dynamic came out static in the exported model."""


class UnsupportedOperatorError(RuntimeError):
    """An operator in the graph has no ONNX translation: not in torch's torchlib, not in
    openreg-onnx's table, not in the caller's ``custom_translation_table``."""


class DeviceMismatchError(ValueError):
    """The model's parameters, buffers and inputs are not all on one device."""


def _tensors_by_place(model, inputs) -> Dict[str, str]:
    """``{"parameter fc.weight": "openreg:0", "input 0": "cpu", ...}``."""
    places = {}
    if isinstance(model, torch.nn.Module):
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            places[f"parameter {name}"] = str(t.device)
    elif isinstance(model, torch.export.ExportedProgram):
        for name, t in model.state_dict.items():
            if isinstance(t, torch.Tensor):
                places[f"parameter {name}"] = str(t.device)
    leaves = torch.utils._pytree.tree_leaves(inputs)
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            places[f"input {i}"] = str(leaf.device)
    return places


def check_devices(model, inputs) -> str:
    """The one device the model and its inputs live on; ``DeviceMismatchError`` naming the
    tensors on each device when there are several."""
    places = _tensors_by_place(model, inputs)
    devices = sorted(set(places.values()))
    if len(devices) > 1:
        groups = "; ".join(f"{d}: {', '.join(sorted(k for k, v in places.items() if v == d)[:6])}" for d in devices)
        raise DeviceMismatchError(
            f"the model and its inputs are on different devices ({groups}): move them to one device, "
            "e.g. model.to('openreg') and the inputs with .to('openreg'), before exporting"
        )
    return devices[0] if devices else "none"


def _unsupported(error: BaseException) -> Optional[str]:
    """The operator a DispatchError in ``error``'s chain names (torch's "No ONNX function found")."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        match = re.search(r"No ONNX function found for <OpOverload\(op='([^']+)', overload='([^']+)'\)>", str(error))
        if match:
            namespace, _, name = match.group(1).partition(".")
            return f"{namespace}::{name}.{match.group(2)}"
        error = error.__cause__ or error.__context__
    return None


def attach_functions(model):
    """Adds the ``com.openreg`` bodies to an ``ONNXProgram`` or an ``onnx.ModelProto``."""
    if isinstance(model, onnx.ModelProto):
        return _vendor.attach_functions(model)
    import onnx_ir as ir

    proto = _vendor.attach_functions(ir.serde.serialize_model(model.model))
    model.model = ir.serde.deserialize_model(proto)
    return model


def _requested_dynamic(dynamic_shapes, input_names: List[str]) -> List[Tuple[str, int]]:
    """(input name, axis) for every axis the caller asked to be dynamic."""
    from torch.export import Dim

    if dynamic_shapes is None:
        return []
    if isinstance(dynamic_shapes, dict):
        items = list(dynamic_shapes.items())
    else:
        items = list(zip(input_names, dynamic_shapes))
    wanted = []
    for name, spec in items:
        if spec is None:
            continue
        if isinstance(spec, dict):
            pairs = list(spec.items())
        elif isinstance(spec, (list, tuple)):
            pairs = list(enumerate(spec))
        else:
            continue
        # Dim.AUTO / Dim.STATIC ask for nothing: the exporter may keep the size.
        axes = [a for a, d in pairs if d is not None and d is not Dim.AUTO and d is not Dim.STATIC]
        wanted += [(str(name), int(a)) for a in axes]
    return wanted


def check_dynamic_dims(model: onnx.ModelProto, wanted: Sequence[Tuple[str, int]]) -> None:
    """Raises ``DynamicDimError`` listing every requested (input, axis) whose ONNX dim is a number."""
    inputs = {i.name: i for i in model.graph.input}
    order = [i.name for i in model.graph.input]
    static = []
    for name, axis in wanted:
        value = inputs.get(name)
        if value is None and name.isdigit() and int(name) < len(order):  # positional
            value = inputs[order[int(name)]]
        if value is None:
            continue
        dims = value.type.tensor_type.shape.dim
        if axis < len(dims) and dims[axis].HasField("dim_value"):
            static.append(f"{value.name}[{axis}] = {dims[axis].dim_value}")
    if static:
        raise DynamicDimError(
            "dimensions requested as dynamic came out static in the ONNX model: "
            + ", ".join(static)
            + " (a kernel or a shape check specialised on the example size; run torch.export.export with the "
            "same dynamic_shapes to see where)"
        )


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def provenance(model: onnx.ModelProto, mode: str, device: str) -> Dict[str, str]:
    from . import __version__

    opsets = ",".join(f"{o.domain or 'ai.onnx'}:{o.version}" for o in model.opset_import)
    return {
        METADATA_PREFIX + "version": __version__,
        METADATA_PREFIX + "torch": torch.__version__,
        METADATA_PREFIX + "onnx": onnx.__version__,
        METADATA_PREFIX + "onnxscript": _version("onnxscript"),
        METADATA_PREFIX + "opsets": opsets,
        METADATA_PREFIX + "mode": mode,
        METADATA_PREFIX + "source_device": device,
    }


def _set_metadata(model: onnx.ModelProto, props: Dict[str, str]) -> None:
    existing = {p.key: p for p in model.metadata_props}
    for k, v in props.items():
        if k in existing:
            existing[k].value = v
        else:
            model.metadata_props.add(key=k, value=v)


def export(
    model,
    args: Tuple[Any, ...] = (),
    f: Optional[str] = None,
    *,
    kwargs: Optional[Dict[str, Any]] = None,
    mode: str = "portable",
    dynamic_shapes=None,
    input_names: Optional[Sequence[str]] = None,
    output_names: Optional[Sequence[str]] = None,
    custom_translation_table: Optional[Dict] = None,
    opset_version: Optional[int] = None,
    optimize: bool = True,
    verbose: bool = False,
    **export_kwargs,
):
    """Exports ``model`` (an ``nn.Module`` or ``ExportedProgram`` on openreg) with openreg's
    table in ``mode``; returns the ``torch.onnx.ONNXProgram`` (saved to ``f`` if given).
    Raises ``DynamicDimError`` when a dimension in ``dynamic_shapes`` came out static."""
    import onnx_ir as ir

    if not isinstance(args, tuple):
        args = (args,)
    table = dict(_table.translation_table(mode))
    table.update(custom_translation_table or {})
    device = check_devices(model, (args, kwargs or {}))
    if isinstance(model, torch.nn.Module) and model.training:
        model.eval()  # dropout and batch-norm statistics are training behaviour: export inference
    try:
        program = torch.onnx.export(
            model,
            args,
            kwargs=kwargs,
            dynamo=True,
            custom_translation_table=table,
            dynamic_shapes=dynamic_shapes,
            input_names=input_names,
            output_names=output_names,
            optimize=optimize,
            verbose=verbose,
            **({"opset_version": opset_version} if opset_version is not None else {}),
            **export_kwargs,
        )
    except torch.onnx.OnnxExporterError as e:
        op = _unsupported(e)
        if op is None:
            raise
        covered = ", ".join(_table.translated_op_names())
        raise UnsupportedOperatorError(
            f"{op} has no ONNX translation: torch's exporter (torchlib) has none, and neither has "
            f"openreg-onnx's table (openreg_onnx.translation_table({mode!r}), which covers {covered}). "
            f"Pass custom_translation_table={{torch.ops.{op.replace('::', '.')}: your_onnxscript_function}}."
        ) from e
    proto = ir.serde.serialize_model(program.model)
    names = list(input_names) if input_names else [i.name for i in proto.graph.input]
    check_dynamic_dims(proto, _requested_dynamic(dynamic_shapes, names))
    if mode == "vendor":
        _vendor.attach_functions(proto)
    _set_metadata(proto, provenance(proto, mode, device))
    program.model = ir.serde.deserialize_model(proto)
    if f is not None:
        program.save(f)
    return program
