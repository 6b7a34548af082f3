"""PT2E quantization for openreg: a torchao ``Quantizer`` and a lowering pass to openreg's fused ops.

Flow (all on openreg)::

    m = torch.export.export(model.to("openreg"), (x,)).module()
    m = prepare_pt2e(m, OpenRegQuantizer())        # or prepare_qat_pt2e(m, OpenRegQuantizer(is_qat=True))
    m(x)                                           # calibrate
    m = convert_pt2e(m)
    m = lower_pt2e(m)                              # dq -> conv/linear -> [relu] -> [q] become fused ops

``lower_pt2e`` is a pure FX pass: it never runs the model. Weights are quantized (when
``convert_pt2e`` left them in float) and packed on the device at lowering time (each fused op's
weight is a ``torch.classes.openreg_quant.PackedWeight``, an attribute of the module), and the float
and int8 weights that no node uses any more are dropped from the module.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional

# torchao's own libraries are CUDA-only; loading them fails with a harmless message.
os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")

import torch  # noqa: E402
import torch.fx  # noqa: E402
from torchao.quantization.pt2e.fake_quantize import FakeQuantize  # noqa: E402
from torchao.quantization.pt2e.observer import MovingAveragePerChannelMinMaxObserver  # noqa: E402
from torchao.quantization.pt2e.quantizer import Quantizer  # noqa: E402
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (  # noqa: E402
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

__all__ = ["OpenRegQuantizer", "lower_pt2e"]

qd = torch.ops.quantized_decomposed
aten = torch.ops.aten


class OpenRegQuantizer(Quantizer):
    """Annotates an exported model for openreg's int8 kernels: uint8 per-tensor affine activations,
    int8 per-channel symmetric weights (axis 0), float bias.

    The annotations are the x86 quantizer's (conv/linear with relu and binary post-ops, add,
    max-pooling, cat, and the ops that propagate quantization such as flatten and adaptive
    pooling): openreg's fused kernels run oneDNN's int8 kernels underneath, so the patterns the x86
    quantizer chooses are the ones that pay off. What openreg adds is the device: the graph is
    prepared, calibrated and converted on openreg tensors, and ``lower_pt2e`` maps the result to
    ``torch.ops.openreg_quant``.

    ``reduce_range`` quantizes activations to 7 bits (uint8 0..127), as PyTorch's x86 configs do on
    CPUs whose int8 products saturate. None (the default) chooses by the CPU under the device: True
    where oneDNN's u8 x s8 products saturate (``torch.ops.openreg_quant.int8_pairs_saturate()``, x86
    without VNNI), where 8-bit activations above 127 would make the fused kernels take their exact
    but slow path (measured: a small CNN's lowered forward 249 ms with 8-bit activations, 14 ms with
    7-bit, 48 ms in float32); False elsewhere.

    With ``is_qat=True`` the weights' fake quantization is ``FakeQuantize`` over a per-channel
    moving-average observer instead of x86's ``FusedMovingAvgObsFakeQuantize``: that one calls
    ``aten::fused_moving_avg_obs_fake_quant``, which resizes its scale and zero-point arguments to
    one per channel inside the kernel. Core's generic path carries such a resize back to the device
    only on its synchronous path, so every training step would wait for the device there (before
    core 14:28 the scale silently stayed one element). ``FakeQuantize`` runs as ordinary native and
    generic ops, asynchronously, with the CPU's numbers.
    """

    def __init__(self, is_qat: bool = False, reduce_range: Optional[bool] = None):
        super().__init__()
        self.is_qat = is_qat
        if reduce_range is None:
            reduce_range = bool(torch.ops.openreg_quant.int8_pairs_saturate())
        self.reduce_range = reduce_range
        config = get_default_x86_inductor_quantization_config(is_qat=is_qat, reduce_range=reduce_range)
        if is_qat:
            weight = dataclasses.replace(
                config.weight,
                observer_or_fake_quant_ctr=FakeQuantize.with_args(
                    observer=MovingAveragePerChannelMinMaxObserver, eps=2**-12
                ),
            )
            config = dataclasses.replace(config, weight=weight)
        self._x86 = X86InductorQuantizer()
        self._x86.set_global(config)

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return self._x86.annotate(model)

    def validate(self, model: torch.fx.GraphModule) -> None:
        self._x86.validate(model)

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return self._x86.transform_for_annotation(model)


# ---- lowering ----

_DQ_TENSOR = (qd.dequantize_per_tensor.default,)
_Q_TENSOR = (qd.quantize_per_tensor.default,)
_CONV = (aten.conv2d.default,)
_LINEAR = (aten.linear.default,)
_RELU = (aten.relu.default, aten.relu_.default)
# Views that need strides compatible with the new shape (a channels-last input can fail them).
_STRIDED_VIEWS = (aten.view.default, aten._unsafe_view.default)
# Ops that only reshape: between a dequantize and a quantize of the same parameters they can reshape
# the quantized tensor instead (_requantize_views).
_RESHAPES = (aten.flatten.using_ints, aten.view.default, aten.reshape.default, aten._unsafe_view.default)
# The range qlinear/qconv2d clamp a quantized output to by default: the whole of its dtype's.
_FULL_RANGE = {torch.uint8: (0, 255), torch.int8: (-128, 127)}


def _attr(gm: torch.fx.GraphModule, node: Any) -> Optional[torch.Tensor]:
    """The tensor a get_attr node names (None for anything else)."""
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
        return None
    obj: Any = gm
    for part in node.target.split("."):
        obj = getattr(obj, part)
    return obj if isinstance(obj, torch.Tensor) else None


def _int8_weight(gm: torch.fx.GraphModule, node: Any) -> Optional[Dict[str, torch.Tensor]]:
    """int8 weight, scales and zero points of a per-channel (axis 0) symmetric weight dequantize:
    from a folded int8 constant, or quantized now from a float constant (convert_pt2e with
    fold_quantize=False)."""
    if not isinstance(node, torch.fx.Node) or node.target is not qd.dequantize_per_channel.default:
        return None
    q, scales, zps, axis, qmin, qmax, dtype = node.args[:7]
    scales, zps = _attr(gm, scales), _attr(gm, zps)
    if axis != 0 or dtype != torch.int8 or scales is None or zps is None or bool((zps != 0).any()):
        return None
    weight = _attr(gm, q)
    if weight is None and isinstance(q, torch.fx.Node) and q.target is qd.quantize_per_channel.default:
        float_w = _attr(gm, q.args[0])
        if float_w is None:
            return None
        weight = qd.quantize_per_channel(float_w, scales, zps, 0, qmin, qmax, torch.int8)
    if weight is None or weight.dtype != torch.int8 or scales.numel() != weight.shape[0]:
        return None
    return {"weight": weight, "w_scales": scales.float(), "w_zero_points": zps.long()}


def _rank(*nodes: Any) -> Optional[int]:
    """The rank of the first of ``nodes`` whose example value (meta "val") is a tensor."""
    for node in nodes:
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(val, torch.Tensor):
            return val.dim()
    return None


def _packed(gm: torch.fx.GraphModule, name: str, packed: torch.ScriptObject) -> torch.fx.Node:
    """A get_attr node for a packed weight, an attribute of the module. It is not a buffer (a
    torchbind object, not a tensor): ``.to()`` and ``state_dict()`` do not see it; ``copy.deepcopy``
    of the module copies it, and ``torch.export.save`` of the module's export keeps it. (The packed
    weight pickles on its own, but a lowered module does not: exported GraphModules do not pickle.)
    The node is made as torch.export makes those of its torchbind constants: ``graph.get_attr`` warns
    about any attribute that is not a module, parameter or buffer."""
    setattr(gm, name, packed)
    return gm.graph.create_node("get_attr", name)


def _refuse_load_state_dict(module, state_dict, prefix, *args) -> None:
    """load_state_dict pre-hook of a lowered model: its state_dict() holds the biases only (the packed
    weights are not tensors, and the activations' scales and zero points are constants of the graph),
    so a load from another lowered model matched every key and kept the old weights."""
    raise RuntimeError(
        "lower_pt2e: a lowered model cannot load a state_dict: its state_dict() holds only the biases, "
        "not the packed weights or the activations' quantization. Save and load the whole program with "
        "torch.export.save / torch.export.load, or load the float model's state_dict before quantizing."
    )


def _drop_dead_tensors(gm: torch.fx.GraphModule) -> List[str]:
    """Deletes the parameters and buffers (of the module and its submodules) that no get_attr node
    names: the float weights convert_pt2e replaced by int8 constants, and the int8 constants and
    qparams the fused ops replaced. In a GraphModule state reaches the graph only through get_attr."""
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    dead = [
        name
        for name, _ in [*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False)]
        if name not in used
    ]
    for name in dead:
        owner, _, leaf = name.rpartition(".")
        module = gm.get_submodule(owner) if owner else gm
        if leaf in module._parameters:
            del module._parameters[leaf]
        elif leaf in module._buffers:
            del module._buffers[leaf]
    return dead


def _narrower_range(q: torch.fx.Node, dtype: torch.dtype) -> Any:
    """How an output quantize folds into qlinear/qconv2d, whose quantized output is clamped to the
    whole of ``dtype``'s range unless given a narrower one: None when the quantize's
    quant_min/quant_max are that range (the fused op is the quantize); (quant_min, quant_max) when
    they are a narrower range inside it, as the x86 quantizer's reduce_range / 7-bit activations give
    (uint8 0..127): the fused op then takes them as its output_quant_min/output_quant_max; False
    when they are anything else (not plain ints, or not inside the dtype's range), so the quantize
    must stay as it is."""
    lo, hi = _FULL_RANGE[dtype]
    qmin, qmax = q.args[3], q.args[4]
    if type(qmin) is not int or type(qmax) is not int or not lo <= qmin <= qmax <= hi:
        return False
    return None if (qmin, qmax) == (lo, hi) else (qmin, qmax)


def _retype_meta(node: torch.fx.Node, like: torch.fx.Node, dtype: torch.dtype) -> None:
    """Gives ``node`` the metadata of ``like`` with its example value (meta "val", a fake tensor) in
    ``dtype``: a reshape or fused op that now runs on the quantized tensor."""
    node.meta.update(like.meta)
    node.meta.pop("tensor_meta", None)  # describes the old dtype
    val = like.meta.get("val")
    mode = getattr(val, "fake_mode", None)
    if mode is not None:
        with mode:
            node.meta["val"] = val.to(dtype)


def _requantize_views(graph: torch.fx.Graph) -> None:
    """Replaces quantize(reshape(dequantize(q))) by reshape(q) where the quantize has the
    dequantize's parameters (scale, zero point, range, dtype) and q comes from a quantize whose range
    lies inside that one: the flatten before a classifier, which the x86 annotations give its input's
    quantization. Exact: for an integer k in the range, (k - zp) * scale * (1 / scale) rounds back to
    k - zp in float32 (the relative error is a few ulps, far below half a quantum), and the clamp
    leaves k alone. The float round trip wrote and read four times the bytes and cost two kernels."""
    for q in [n for n in graph.nodes if n.target in _Q_TENSOR]:
        chain, node = [], q.args[0]
        while isinstance(node, torch.fx.Node) and node.target in _RESHAPES:
            chain.append(node)
            node = node.args[0]
        dq = node
        if not chain or not (isinstance(dq, torch.fx.Node) and dq.target in _DQ_TENSOR):
            continue
        if tuple(dq.args[1:6]) != tuple(q.args[1:6]) or dq.kwargs.get("out_dtype") not in (None, torch.float32):
            continue
        src = dq.args[0]
        if not (isinstance(src, torch.fx.Node) and src.target in _Q_TENSOR and src.args[5] == q.args[5]):
            continue
        lo, hi = q.args[3], q.args[4]
        if not (type(lo) is int and type(hi) is int and lo <= src.args[3] and src.args[4] <= hi):
            continue
        with graph.inserting_before(q):
            for op in reversed(chain):
                src = graph.call_function(op.target, (src, *op.args[1:]), dict(op.kwargs))
                _retype_meta(src, op, q.args[5])
        q.replace_all_uses_with(src)


def _flatten_channels_last(
    graph: torch.fx.Graph, x_q: torch.fx.Node, x_dq: torch.fx.Node, w: Dict[str, torch.Tensor]
) -> torch.fx.Node:
    """The classifier after a lowered conv: flatten(qconv2d(...), 1) -> linear. The conv's output is
    channels-last, so flattening it in (C, H, W) order is a transposing copy; flattened in (H, W, C)
    order it is a view. That order is taken when the flatten feeds only this linear: the weight's
    columns are permuted to match (w["weight"], before it is packed), which leaves every output's
    integer dot product the same sum in another order, so the result is the same. Returns the
    linear's new input, or ``x_q`` where the pattern does not hold."""
    if not (x_q.target is aten.flatten.using_ints and tuple(x_q.args[1:]) in ((1,), (1, -1))):
        return x_q
    src, val = x_q.args[0], x_q.args[0].meta.get("val")
    if src.target is not torch.ops.openreg_quant.qconv2d.default or len(x_q.users) != 1 or len(x_dq.users) != 1:
        return x_q
    if not isinstance(val, torch.Tensor) or val.dim() != 4 or not all(type(d) is int for d in val.shape):
        return x_q
    _, c, h, wd = val.shape
    weight = w["weight"]
    if weight.dim() != 2 or weight.shape[1] != c * h * wd:
        return x_q
    w["weight"] = weight.view(-1, c, h, wd).permute(0, 2, 3, 1).reshape(weight.shape[0], -1)
    with graph.inserting_before(x_q):
        nhwc = graph.call_function(aten.permute.default, (src, [0, 2, 3, 1]))
        flat = graph.call_function(aten.flatten.using_ints, (nhwc, 1))
    for node, like in ((nhwc, src), (flat, x_q)):
        node.meta.update(like.meta)
    with val.fake_mode:
        nhwc.meta["val"] = val.permute(0, 2, 3, 1)
    x_q.replace_all_uses_with(flat)
    return flat


def _recorded_val(node: Any) -> Any:
    """The value the graph recorded for ``node`` (its meta "val"). The quantize/dequantize pairs
    ``convert_pt2e`` inserts record none; they keep their input's layout, so their input's is used
    (an output that was a dequantize of a lowered conv's ``cat`` was left channels-last)."""
    while isinstance(node, torch.fx.Node):
        if "val" in node.meta:
            return node.meta["val"]
        if node.op != "call_function" or node.target not in (*_DQ_TENSOR, *_Q_TENSOR) or not node.args:
            return None
        node = node.args[0]
    return None


def _contiguous_where_needed(graph: torch.fx.Graph, lowered_convs: List[torch.fx.Node]) -> None:
    """qconv2d's output is channels-last (as oneDNN's quantized conv gives it) where the conv2d it
    replaces gave a contiguous one for a contiguous input; layout-preserving ops (dequantize, relu,
    add) carry that on. A ``view`` downstream (``x.view(x.size(0), -1)`` before the classifier)
    then failed ("view size is not compatible with input tensor's size and stride"), and so did
    the caller's own ``view`` of an output the unlowered model returned contiguous. So every view
    reachable from a lowered conv views ``aten.contiguous(input)`` (no copy when the input is
    contiguous already), and every such output the graph recorded as contiguous (its meta "val")
    is made contiguous again. Other consumers keep the channels-last tensor: the next qconv2d
    takes it without a copy."""
    seen, todo = set(), list(lowered_convs)
    while todo:
        node = todo.pop()
        for user in list(node.users):
            if user in seen:
                continue
            seen.add(user)
            todo.append(user)
            if user.op == "call_function" and user.target in _STRIDED_VIEWS:
                src = user.args[0]
                with graph.inserting_before(user):
                    contiguous = graph.call_function(aten.contiguous.default, (src,))
                if "val" in src.meta:
                    contiguous.meta["val"] = src.meta["val"]
                user.replace_input_with(src, contiguous)
    seen.update(lowered_convs)
    for output in [n for n in graph.nodes if n.op == "output"]:
        for leaf in dict.fromkeys(torch.utils._pytree.tree_leaves(output.args)):
            val = _recorded_val(leaf)
            if leaf not in seen or not isinstance(val, torch.Tensor) or val.dim() != 4 or not val.is_contiguous():
                continue
            with graph.inserting_before(output):
                contiguous = graph.call_function(aten.contiguous.default, (leaf,))
            contiguous.meta["val"] = val
            output.replace_input_with(leaf, contiguous)


def lower_pt2e(model: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replaces dequantize -> conv2d/linear -> [relu] -> [quantize] patterns of a ``convert_pt2e``
    model with ``torch.ops.openreg_quant.qconv2d`` / ``qlinear`` (quantized output when the pattern
    ends in a quantize, float output otherwise), packs the int8 weights on the device (the model
    must be on openreg: ValueError otherwise) and drops the dead float and int8 weights. A quantize
    whose quant_min/quant_max are narrower than its dtype's range (reduce_range) becomes the fused
    op's output_quant_min/output_quant_max. Views after a lowered conv, and the outputs it
    feeds, get a contiguous tensor as before (``_contiguous_where_needed``: qconv2d's output is
    channels-last). A dequantize -> flatten/view/reshape -> quantize of the same parameters becomes
    the reshape of the quantized tensor (``_requantize_views``). Patterns it does not recognise stay
    as they are (they still run natively: the
    decomposed q/dq ops have openreg kernels).
    The lowered model's ``state_dict()`` holds the biases only, so it refuses ``load_state_dict``;
    save it with ``torch.export.save(torch.export.export(model, args), f)`` (exact, packed weights
    included). Returns the model, changed in place."""
    gm = model
    graph = gm.graph
    # Checked before the graph changes: a packed weight cannot move, so the model must be there first.
    for name, t in [*gm.named_parameters(), *gm.named_buffers()]:
        if t.device.type != "openreg":
            raise ValueError(
                f"lower_pt2e: {name} is on {t.device}; the fused ops' weights are packed on openreg, "
                "so move the model to openreg before quantizing it."
            )
    _requantize_views(graph)
    count = 0
    lowered_convs: List[torch.fx.Node] = []
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _CONV + _LINEAR:
            continue
        is_conv = node.target in _CONV
        x_dq = node.args[0]
        if not (isinstance(x_dq, torch.fx.Node) and x_dq.target in _DQ_TENSOR):
            continue
        x_q, x_scale, x_zp, _, _, x_dtype = x_dq.args[:6]
        if x_dtype not in (torch.uint8, torch.int8) or x_dq.kwargs.get("out_dtype") not in (None, torch.float32):
            continue
        w = _int8_weight(gm, node.args[1])
        if w is None:
            continue
        bias_node = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        if bias_node is not None and _attr(gm, bias_node) is None:
            continue
        # qconv2d takes batched NCHW only; an unbatched (C, H, W) conv2d, or one whose rank the
        # graph does not record, stays as it is. (conv2d's output has its input's rank.)
        if is_conv and _rank(node, x_dq) != 4:
            continue
        if is_conv:
            defaults = ([1, 1], [0, 0], [1, 1], 1)
            stride, padding, dilation, groups = (list(node.args[3:7]) + list(defaults[len(node.args[3:7]) :]))[:4]
            if isinstance(padding, str) or len(w["weight"].shape) != 4:
                continue
            stride, padding, dilation = (
                [v] * 2 if isinstance(v, int) else list(v) for v in (stride, padding, dilation)
            )
        else:  # after every check that leaves a pattern as it is: this rewires the linear's input
            x_q = _flatten_channels_last(graph, x_q, x_dq, w)
        # [relu], then [quantize] when the (relu) output feeds exactly one quantize of the same dtype.
        # The fused ops clamp a quantized output to the dtype's whole range unless told a narrower
        # one, so a quantize with a narrower quant_min/quant_max (reduce_range: uint8 0..127) folds in
        # as the op's output range, which is exact (rounding, then the clamp to the quantize's own
        # range, as the quantize does) and keeps the activations 8-bit; a float output followed by
        # the original quantize would be just as exact but writes and reads float32. The 7-bit range
        # also matters to the next fused op: on CPUs whose int8 products saturate, activations above
        # 127 take the slow exact path. The dequantize feeding the op needs no such care: its
        # quant_min/quant_max are metadata (neither it nor the fused kernels read them).
        last, post_op = node, "none"
        if len(node.users) == 1:
            (user,) = node.users
            if user.target in _RELU:
                last, post_op = user, "relu"
        # A quantize after reshapes (conv -> relu -> flatten -> quantize before a classifier) folds in
        # too: quantizing is elementwise, so the fused op quantizes and the reshapes move after it,
        # onto a quarter of the bytes.
        out_q, out_range, reshapes, tail = None, None, [], last
        while len(tail.users) == 1 and next(iter(tail.users)).target in _RESHAPES:
            tail = next(iter(tail.users))
            reshapes.append(tail)
        if len(tail.users) == 1:
            (user,) = tail.users
            if user.target in _Q_TENSOR and user.args[5] == x_dtype:
                out_q, out_range = user, _narrower_range(user, x_dtype)
                if out_range is False:
                    out_q, out_range = None, None
        if out_q is None:
            reshapes = []
        # The weight is packed now, on the device (one copy and one packing kernel, queued).
        if is_conv:
            packed = torch.ops.openreg_quant.qconv2d_prepack(
                *w.values(), x_scale, x_zp, stride, padding, dilation, groups
            )
        else:
            packed = torch.ops.openreg_quant.qlinear_prepack(*w.values())
        with graph.inserting_before(out_q or last):
            w_node = _packed(gm, f"_openreg_packed{count}", packed)
            out_scale, out_zp = (out_q.args[1], out_q.args[2]) if out_q is not None else (1.0, 0)
            out_dtype = None if out_q is not None else torch.float32
            op = torch.ops.openreg_quant.qconv2d.default if is_conv else torch.ops.openreg_quant.qlinear.default
            # A narrower range is the op's output_quant_min/max: it clamps as it writes its output.
            fused = graph.call_function(
                op,
                (x_q, x_scale, x_zp, w_node, bias_node, out_scale, out_zp, out_dtype, post_op, *(out_range or ())),
            )
            if out_q is not None:  # the relu's (or conv's) shape in the quantize's dtype
                _retype_meta(fused, last, x_dtype)
            else:
                fused.meta.update(last.meta)
            result = fused
            for reshape in reshapes:
                result = graph.call_function(reshape.target, (result, *reshape.args[1:]), dict(reshape.kwargs))
                _retype_meta(result, reshape, x_dtype)
        (out_q or last).replace_all_uses_with(result)
        # The replaced chain, erased now: eliminate_dead_code keeps an in-place relu (aten.relu_, from
        # nn.ReLU(inplace=True)) as impure, and with it the float conv/linear, the weight's
        # dequantize and the weights. It mutated only the conv/linear's own output (its one user).
        for dead in (out_q, *reversed(reshapes), last):
            if dead is not None and dead is not node and not dead.users:
                graph.erase_node(dead)
        if is_conv:
            lowered_convs.append(fused)  # its channels-last output reaches the moved reshapes too
        count += 1
    _contiguous_where_needed(graph, lowered_convs)
    graph.eliminate_dead_code()
    _drop_dead_tensors(gm)
    gm.register_load_state_dict_pre_hook(_refuse_load_state_dict)
    graph.lint()
    gm.recompile()
    return gm
