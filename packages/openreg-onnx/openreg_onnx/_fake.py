"""``openreg_onnx.export_without_weights``: export a model on openreg that was never materialised.

The model and its example inputs are built under ``FakeTensorMode`` with openreg as the default
device (``.to("openreg")`` inside the mode fails, so they must be created there), exported
unoptimized (the optimizer folds constants, which needs real initializers), then given the real
weights (``ONNXProgram.apply_weights``) and optimized. Nothing touches device memory: the fake
tensors only carry shapes, dtypes and the device. The weights come as a state dict on any device;
they are copied to the host, where an ONNX file keeps them anyway.

What must be supplied is every initializer the export left fake: the parameters and buffers in
the state dict, and also what ``state_dict()`` leaves out, non-persistent buffers
(``register_buffer(..., persistent=False)``) and plain tensor attributes, by the same dotted
name. A tensor ``forward`` makes from data (``torch.tensor([...])``) is a real constant of the
program (torch.export lifts it with its values), so nothing needs to be supplied for it. A fake
initializer left without a value is named in a ``KeyError`` before the optimizer runs (it would
fail on the fake tensor).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

from . import _export


def _fake_initializers(program) -> List[str]:
    """The initializers of ``program`` without a real value (a fake tensor, or none at all):
    parameters and buffers, persistent or not, and tensor attributes; in graph order."""
    fake = []
    for name, value in program.model.graph.initializers.items():
        if value.const_value is None:
            fake.append(name)
            continue
        tensor = getattr(value.const_value, "raw", None)
        if isinstance(tensor, torch.Tensor) and is_fake(tensor):
            fake.append(name)
    return fake


def _kinds(program) -> Dict[str, str]:
    """Initializer name -> what it is in the model, for the error message."""
    from torch.export.graph_signature import InputKind

    kinds = {}
    for spec in program.exported_program.graph_signature.input_specs:
        if spec.kind == InputKind.BUFFER and spec.persistent is False:
            kinds[spec.target] = "a non-persistent buffer, not in state_dict()"
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            kinds[spec.target] = "a tensor attribute, not in state_dict()"
    return kinds


def export_without_weights(
    build_model: Callable[[], torch.nn.Module],
    build_args: Callable[[], Tuple[Any, ...]],
    weights: Optional[Dict[str, torch.Tensor]] = None,
    f: Optional[str] = None,
    *,
    device: str = "openreg",
    mode: str = "portable",
    dynamic_shapes=None,
    custom_translation_table=None,
    **export_kwargs,
):
    """Builds ``build_model()`` and ``build_args()`` on fake ``device`` tensors, exports them
    with openreg's table in ``mode``, then applies ``weights`` (a state dict with every parameter
    and buffer the graph uses, non-persistent buffers and tensor attributes included: every
    initializer left fake) and optimizes; without ``weights`` the program keeps fake
    initializers (save it with ``include_initializers=False``, or pass ``f`` with
    ``export_params=False``). ``f`` is written with ``external_data``, ``export_params`` and
    ``keep_initializers_as_inputs`` as in ``torch.onnx.export``. Returns the ``ONNXProgram``."""
    save_options = _export.pop_save_options(export_kwargs, f)
    if weights is None and f is not None and save_options.get("include_initializers", True):
        raise ValueError(
            "without weights the initializers are fake and cannot be written to f: pass weights, or "
            "export_params=False to write the graph without its initializers"
        )
    with FakeTensorMode(), torch.device(device):
        model = build_model().eval()
        args = build_args()
        if not isinstance(args, tuple):
            args = (args,)
        where = _export.check_devices(model, args)
        program = _export._torch_export(
            model,
            args,
            mode,
            custom_translation_table,
            dynamic_shapes=dynamic_shapes,
            optimize=False,
            verbose=False,
            **export_kwargs,
        )
    _export._finish(program, mode, where, model, args, {}, dynamic_shapes)
    program.model.metadata_props[_export.METADATA_PREFIX + "weights"] = "none (fake at export)"
    if weights is None:
        if f is not None:
            program.save(f, **save_options)  # the graph alone (export_params=False)
        return program
    # Every initializer still fake: parameters and buffers the graph uses, whether or not
    # state_dict() lists them, and tensor attributes. Constants the exporter or forward made
    # from data are real already.
    expected = _fake_initializers(program)
    missing = sorted(k for k in expected if k not in weights)
    if missing:
        kinds = _kinds(program)
        named = ", ".join(f"{k} ({kinds[k]})" if k in kinds else k for k in missing[:8])
        raise KeyError(
            f"weights lack {len(missing)} of the model's initializers: {named}"
            + ("; pass those outside state_dict() by the same dotted names (named_buffers(), the attribute's path)"
               if any(k in kinds for k in missing) else "")
        )  # fmt: skip
    # What the model's own load_state_dict refuses, refused here: onnxruntime would broadcast a
    # bias of the wrong shape, and refuse a file whose weight changed dtype.
    declared = program.exported_program.state_dict | dict(program.exported_program.constants)
    wrong = [
        f"{k}: {tuple(weights[k].shape)} {weights[k].dtype} instead of {tuple(declared[k].shape)} {declared[k].dtype}"
        for k in expected
        if k in declared and (weights[k].shape != declared[k].shape or weights[k].dtype != declared[k].dtype)
    ]
    if wrong:
        raise ValueError(f"weights do not fit the model's initializers: {'; '.join(wrong[:8])}")
    program.apply_weights({k: weights[k].detach().cpu() for k in expected})
    program.model.metadata_props[_export.METADATA_PREFIX + "weights"] = "applied after a fake-tensor export"
    program.optimize()
    if f is not None:
        program.save(f, **save_options)
    return program
