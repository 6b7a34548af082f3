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
    _vendor.attach_functions_ir(model.model)
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


def check_dynamic_dims(model, wanted: Sequence[Tuple[str, int]]) -> None:
    """Raises ``DynamicDimError`` listing every requested (input, axis) whose ONNX dim is a
    number. ``model``: an ``onnx.ModelProto`` or an ``onnx_ir.Model``."""
    if isinstance(model, onnx.ModelProto):
        inputs = [
            (i.name, [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim])
            for i in model.graph.input
        ]
    else:
        inputs = [
            (v.name, [d if isinstance(d, int) else None for d in (v.shape.dims if v.shape is not None else ())])
            for v in model.graph.inputs
        ]
    by_name = dict(inputs)
    static = []
    for name, axis in wanted:
        if name not in by_name and name.isdigit() and int(name) < len(inputs):  # positional
            name = inputs[int(name)][0]
        dims = by_name.get(name)
        if dims is not None and axis < len(dims) and dims[axis] is not None:
            static.append(f"{name}[{axis}] = {dims[axis]}")
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


def provenance(model, mode: str, device: str) -> Dict[str, str]:
    """The metadata ``export`` records (``model``: an ``onnx_ir.Model``)."""
    from . import __version__

    opsets = ",".join(f"{domain or 'ai.onnx'}:{v}" for domain, v in sorted(model.opset_imports.items()))
    return {
        METADATA_PREFIX + "version": __version__,
        METADATA_PREFIX + "torch": torch.__version__,
        METADATA_PREFIX + "onnx": onnx.__version__,
        METADATA_PREFIX + "onnxscript": _version("onnxscript"),
        METADATA_PREFIX + "opsets": opsets,
        METADATA_PREFIX + "mode": mode,
        METADATA_PREFIX + "source_device": device,
    }


def _finish(program, mode: str, device: str, dynamic_shapes, input_names) -> None:
    """What every export does after torch's: check the dynamic dims, attach the vendor bodies,
    record provenance; on the IR model, without serializing the weights."""
    model = program.model
    names = list(input_names) if input_names else [v.name for v in model.graph.inputs]
    check_dynamic_dims(model, _requested_dynamic(dynamic_shapes, names))
    if mode == "vendor":
        _vendor.attach_functions_ir(model)
    model.metadata_props.update(provenance(model, mode, device))


def _torch_export(model, args, mode, custom_translation_table, **kwargs):
    """torch.onnx.export with the mode's table under the caller's; "No ONNX function found"
    becomes an ``UnsupportedOperatorError`` that names the operator and the table."""
    table = dict(_table.translation_table(mode))
    table.update(custom_translation_table or {})
    try:
        return torch.onnx.export(model, args, dynamo=True, custom_translation_table=table, **kwargs)
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
    if not isinstance(args, tuple):
        args = (args,)
    device = check_devices(model, (args, kwargs or {}))
    if isinstance(model, torch.nn.Module) and model.training:
        model.eval()  # dropout and batch-norm statistics are training behaviour: export inference
    program = _torch_export(
        model,
        args,
        mode,
        custom_translation_table,
        kwargs=kwargs,
        dynamic_shapes=dynamic_shapes,
        input_names=input_names,
        output_names=output_names,
        optimize=optimize,
        verbose=verbose,
        **({"opset_version": opset_version} if opset_version is not None else {}),
        **export_kwargs,
    )
    _finish(program, mode, device, dynamic_shapes, input_names)
    if f is not None:
        program.save(f)
    return program
