"""``openreg_onnx.export``: torch.onnx.export for openreg models, with checks and provenance.

On top of a plain ``torch.onnx.export(dynamo=True)`` (which, with the plugin loaded, already
translates openreg's operators; ``dynamo=False`` is refused: the TorchScript exporter is
``torch.onnx.export(dynamo=False)`` itself):

- the chosen mode's table goes in as ``custom_translation_table`` (the caller's own entries,
  passed the same way, are merged over it and win);
- vendor mode: the ``com.openreg`` function bodies are attached to the finished model;
- every dimension the caller asked to be dynamic is checked in the ONNX inputs: one that came
  out as a fixed number fails the export, naming the input, the axis and the size (the exporter
  itself only warns, or not at all, when a device kernel specialised on a size);
- ``metadata_props`` record the provenance: openreg-onnx, torch, onnx, onnxscript versions, the
  opsets, the mode and the device the model came from;
- the options of ``torch.onnx.export`` that only shape the file written to ``f``
  (``external_data``, ``export_params``, ``keep_initializers_as_inputs``) are applied when the
  program is saved to ``f``; without ``f`` they would do nothing, and passing one is an error.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

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
    """``{"parameter fc.weight": "openreg:0", "buffer bn.running_mean": "openreg:0", "input 0": "cpu", ...}``."""
    places = {}
    if isinstance(model, torch.nn.Module):
        for name, t in model.named_parameters():
            places[f"parameter {name}"] = str(t.device)
        for name, t in model.named_buffers():
            places[f"buffer {name}"] = str(t.device)
    elif isinstance(model, torch.export.ExportedProgram):
        # Parameters and buffers, non-persistent ones (kept in ``constants``) included, as for a
        # module. Not the lifted tensor constants: a plain tensor attribute (which model.to() leaves
        # where it is) or a tensor forward builds from data, lifted on the CPU; the graph moves them.
        signature = model.graph_signature
        for kind, names in (("parameter", signature.parameters), ("buffer", signature.buffers)):
            for name in names:
                t = model.state_dict.get(name, model.constants.get(name))
                if isinstance(t, torch.Tensor):
                    places[f"{kind} {name}"] = str(t.device)
    leaves = torch.utils._pytree.tree_leaves(inputs)
    for i, leaf in enumerate(leaves):
        # A 0-dim CPU tensor is a scalar that eager code (CUDA's too) combines with any device's
        # tensors, and torch.onnx.export takes it as an input: not a mismatch.
        if isinstance(leaf, torch.Tensor) and not (leaf.dim() == 0 and leaf.device.type == "cpu"):
            places[f"input {i}"] = str(leaf.device)
    return places


def _some(names: list, shown: int = 6) -> str:
    """The first `shown` names, and how many more there are (the list was cut without saying so)."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def check_devices(model, inputs) -> str:
    """The one device the model and its inputs live on; ``DeviceMismatchError`` naming the
    tensors on each device when there are several."""
    places = _tensors_by_place(model, inputs)
    devices = sorted(set(places.values()))
    if len(devices) > 1:
        groups = "; ".join(f"{d}: {_some(sorted(k for k, v in places.items() if v == d))}" for d in devices)
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


def _asks_dynamic(spec) -> bool:
    """Whether one axis's entry in ``dynamic_shapes`` asks for a dynamic size: a ``Dim``, a name
    (torch.onnx's string form) or ``Dim.DYNAMIC``; not None, an int (a static size),
    ``Dim.AUTO`` or ``Dim.STATIC`` (those let the exporter keep the size)."""
    from torch.export.dynamic_shapes import _DimHint, _DimHintType

    if spec is None or isinstance(spec, (bool, int)):
        return False
    if isinstance(spec, _DimHint):
        return spec.type == _DimHintType.DYNAMIC
    return True


def _requested_dynamic(model, args, kwargs, dynamic_shapes, exported_program=None) -> List[Tuple[int, int]]:
    """(ONNX input position, axis) for every axis the caller asked to be dynamic.

    ``dynamic_shapes`` mirrors the inputs' pytree (keyed by argument name or positional, nested
    like the inputs); it is matched leaf by leaf the way torch.export does. The ONNX inputs are
    the tensor leaves of ``(args, kwargs)`` in flattening order (torch.export's user inputs,
    minus the constants), so a leaf's position there is its ONNX input, whatever its name."""
    from torch.export import dynamic_shapes as ds
    from torch.utils import _pytree

    if not dynamic_shapes:
        return []
    kwargs = kwargs or {}
    if isinstance(model, torch.export.ExportedProgram) and not args and not kwargs and model.example_inputs:
        args, kwargs = model.example_inputs  # exported without inputs: the program's own
    if hasattr(dynamic_shapes, "dynamic_shapes"):  # ShapesCollection, AdditionalInputs
        dynamic_shapes = dynamic_shapes.dynamic_shapes(model, args, kwargs)
    combined = ds._combine_args(model, args, kwargs)
    if isinstance(dynamic_shapes, (tuple, list)):
        combined = type(dynamic_shapes)(combined.values())

    # Tensors are matched by identity: the spec tree follows the signature's order, the ONNX
    # inputs the call's (keyword arguments in the order given).
    axes_of: Dict[int, List[int]] = {}

    def collect(path, leaf, spec):
        if not isinstance(leaf, torch.Tensor) or spec is None:
            return
        pairs = spec.items() if isinstance(spec, dict) else enumerate(spec)
        axes = axes_of.setdefault(id(leaf), [])
        axes += [int(a) for a, d in pairs if _asks_dynamic(d) and int(a) not in axes]

    ds._tree_map_with_path(collect, combined, dynamic_shapes, tree_name="inputs")

    leaves = _pytree.tree_leaves((args, kwargs))
    if exported_program is not None:
        # A constant user input (an int, None) gets no ONNX input; a dynamic int would.
        from torch.export.graph_signature import ConstantArgument, InputKind

        specs = [s for s in exported_program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
        takes_input = [not isinstance(s.arg, ConstantArgument) for s in specs]
    else:
        takes_input = [isinstance(leaf, torch.Tensor) for leaf in leaves]
    wanted, position = [], 0
    for leaf, takes in zip(leaves, takes_input):
        if not takes:
            continue
        if isinstance(leaf, torch.Tensor):
            wanted += [(position, axis) for axis in sorted(axes_of.get(id(leaf), []))]
        position += 1
    return wanted


def check_dynamic_dims(model, wanted: Sequence[Tuple[Union[int, str], int]]) -> None:
    """Raises ``DynamicDimError`` listing every requested (input, axis) whose ONNX dim is a
    number; the input is its position among the ONNX inputs (an int, or a digit string) or its
    name. ``model``: an ``onnx.ModelProto`` or an ``onnx_ir.Model``."""
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
        if isinstance(name, int) or (name not in by_name and name.isdigit()):  # positional
            if int(name) >= len(inputs):
                continue
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


def _finish(program, mode: str, device: str, module, args, kwargs, dynamic_shapes) -> None:
    """What every export does after torch's: check the dynamic dims, attach the vendor bodies,
    record provenance; on the IR model, without serializing the weights."""
    model = program.model
    wanted = _requested_dynamic(module, args, kwargs, dynamic_shapes, getattr(program, "exported_program", None))
    check_dynamic_dims(model, wanted)
    if mode == "vendor":
        _vendor.attach_functions_ir(model)
    model.metadata_props.update(provenance(model, mode, device))


@contextlib.contextmanager
def eval_mode(model):
    """``model`` in eval mode for the duration; afterwards every submodule is back in the mode it
    had (a frozen eval() part of a training model stays in eval), also on an error. Dropout and
    batch-norm statistics are training behaviour: the export, and the eager reference it is
    compared with, are of inference. Anything but an ``nn.Module`` is left alone."""
    modes = {m: m.training for m in model.modules()} if isinstance(model, torch.nn.Module) else {}
    if any(modes.values()):
        try:
            model.eval()
        except NotImplementedError:
            # A module from torch.export (ExportedProgram.module(), PT2E's prepare/convert_pt2e),
            # or one that holds one, refuses eval() there: such a graph holds the mode it was
            # captured in, which no flag changes (torchao's move_exported_model_to_eval rewrites
            # it), and is exported as captured, as torch.onnx.export does; eval() made every such
            # export fail. The flags of every module are still set, as eval() would have: it
            # stopped at the captured one, and a dropout after it kept training.
            for module in modes:
                module.training = False
    try:
        yield model
    finally:
        for module, training in modes.items():
            module.training = training


# torch.onnx.export's options that only shape the file it writes to ``f`` (torch applies them in
# ``ONNXProgram.save(f, ...)``; without ``f`` it ignores them), with their ``save`` names.
SAVE_OPTIONS = {
    "external_data": "external_data",
    "export_params": "include_initializers",
    "keep_initializers_as_inputs": "keep_initializers_as_inputs",
}


def pop_save_options(export_kwargs: Dict[str, Any], f) -> Dict[str, Any]:
    """Takes the save-only options out of ``export_kwargs`` (they must not reach
    ``torch.onnx.export`` without ``f``, where they have no effect); returns them as
    ``ONNXProgram.save`` keywords. Raises ``TypeError`` when one is given without ``f``.
    There ``external_data=True`` writes the weights to ``<f>.data`` next to the model (a file
    object, such as ``io.BytesIO``, gets them inline, as from ``torch.onnx.export``); ``False``
    (and the default, None) inlines them unless they exceed protobuf's 2 GB, as ``ONNXProgram.save``
    does (torch.onnx.export's own default is True)."""
    given = {k: export_kwargs.pop(k) for k in list(SAVE_OPTIONS) if k in export_kwargs}
    if given and f is None:
        raise TypeError(
            f"{', '.join(sorted(given))} only shape{'s' if len(given) == 1 else ''} the file written to f, and no f "
            "was given: pass f, or save the returned program with program.save(path, external_data=..., "
            "include_initializers=..., keep_initializers_as_inputs=...)"
        )
    if f is not None and not isinstance(f, (str, os.PathLike)):
        # A file object (io.BytesIO) takes the model in one piece, weights inline, as
        # torch.onnx.export writes it there; ONNXProgram.save refused external_data for it.
        given.pop("external_data", None)
    return {SAVE_OPTIONS[k]: v for k, v in given.items()}


def captured_graphs(model) -> List[torch.fx.Graph]:
    """The FX graphs ``model`` runs as captured: an ``ExportedProgram``'s, or those of every
    ``GraphModule`` in a module (``ExportedProgram.module()``, PT2E models, a module holding one)."""
    if isinstance(model, torch.export.ExportedProgram):
        return [model.graph_module.graph]
    if isinstance(model, torch.nn.Module):
        return [m.graph for m in model.modules() if isinstance(m, torch.fx.GraphModule)]
    return []


def _refuse_fused_quantized_ops(model, table) -> None:
    """A model lowered by ``openreg_quant.lower_pt2e`` calls openreg's fused int8 kernels on packed
    weights (torchbind objects), which have no ONNX form: torch's exporter failed on them with an
    internal error ("unhashable type: 'CustomObjArgument'", "create an issue in PyTorch"). Named
    here, with what to export instead, unless the caller's table translates them."""
    for node in (n for graph in captured_graphs(model) for n in graph.nodes):
        target = node.target
        if node.op == "call_function" and getattr(target, "namespace", None) == "openreg_quant" and target not in table:
            name = f"openreg_quant::{target._opname}.{target._overloadname}"
            raise UnsupportedOperatorError(
                f"{name} has no ONNX translation: it is a fused int8 kernel of openreg-quant on a packed weight "
                "(a model lowered by openreg_quant.lower_pt2e). Export the model before lower_pt2e (the convert_pt2e "
                "model, whose quantize/dequantize nodes become ONNX QuantizeLinear/DequantizeLinear), or pass "
                f"custom_translation_table={{torch.ops.openreg_quant.{target._opname}.{target._overloadname}: ...}}."
            )


def _torch_export(model, args, mode, custom_translation_table, **kwargs):
    """torch.onnx.export with the mode's table under the caller's; "No ONNX function found"
    becomes an ``UnsupportedOperatorError`` that names the operator and the table."""
    if not kwargs.pop("dynamo", True):  # it is passed to torch.onnx.export as True below
        raise ValueError(
            "openreg_onnx exports with the dynamo exporter only (dynamo=True); for the TorchScript exporter call "
            "torch.onnx.export(model, args, dynamo=False) itself, which finds openreg's symbolic functions once "
            "openreg_onnx is imported"
        )
    table = dict(_table.translation_table(mode))
    table.update(custom_translation_table or {})
    _refuse_fused_quantized_ops(model, table)
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
    table in ``mode``; returns the ``torch.onnx.ONNXProgram`` (saved to ``f`` if given, with
    ``external_data``, ``export_params`` and ``keep_initializers_as_inputs`` as in
    ``torch.onnx.export``; those need ``f``). Raises ``DynamicDimError`` when a dimension in
    ``dynamic_shapes`` came out static."""
    if not isinstance(args, tuple):
        args = (args,)
    save_options = pop_save_options(export_kwargs, f)
    device = check_devices(model, (args, kwargs or {}))
    # Export inference, then give the caller back every submodule in the mode it had.
    with eval_mode(model):
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
    _finish(program, mode, device, model, args, kwargs, dynamic_shapes)
    if f is not None:
        program.save(f, **save_options)
    return program
