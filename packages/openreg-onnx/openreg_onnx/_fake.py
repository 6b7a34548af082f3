"""``openreg_onnx.export_without_weights``: export a model on openreg that was never materialised.

The model and its example inputs are built under ``FakeTensorMode`` with openreg as the default
device (``.to("openreg")`` inside the mode fails, so they must be created there), exported
unoptimized (the optimizer folds constants, which needs real initializers), then given the real
weights (``ONNXProgram.apply_weights``) and optimized. Nothing touches device memory: the fake
tensors only carry shapes, dtypes and the device. The weights come as a state dict on any device;
they are copied to the host, where an ONNX file keeps them anyway.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from . import _export


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
    and buffer of the model) and optimizes; without ``weights`` the program keeps fake
    initializers (save it with ``include_initializers=False``). Returns the ``ONNXProgram``."""
    with FakeTensorMode(), torch.device(device):
        model = build_model().eval()
        args = build_args()
        if not isinstance(args, tuple):
            args = (args,)
        where = _export.check_devices(model, args)
        state_keys = list(model.state_dict())
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
        return program
    # Parameters and buffers the graph uses (every state-dict key the exporter kept).
    expected = set(program.model.graph.initializers) & set(state_keys)
    given = {k: v.detach().cpu() for k, v in weights.items()}
    missing = sorted(k for k in expected if k not in given)
    if missing:
        raise KeyError(f"weights lack {len(missing)} of the model's initializers: {', '.join(missing[:8])}")
    program.apply_weights({k: v for k, v in given.items() if k in expected})
    program.model.metadata_props[_export.METADATA_PREFIX + "weights"] = "applied after a fake-tensor export"
    program.optimize()
    if f is not None:
        program.save(f)
    return program
