"""``mode="reduce-overhead"`` on openreg: compiled graphs replayed as openreg device graphs.

``mode="reduce-overhead"`` turns on ``torch._inductor.config.triton.cudagraphs``; torch 2.13
then wraps each compiled graph with CUDA graph trees, which are CUDA-only: for any other device
the graph is skipped ("multiple devices") and runs as ordinary compiled code. Inductor has one
hook for another graph runtime: ``config.cudagraph_policy`` (``torch._inductor.cudagraph_utils.
CUDAGraphPolicy``). ``OpenRegGraphPolicy`` leaves graphs of other devices to the default policy,
declines torch's wrapping of openreg graphs (``should_wrap``) and wraps them itself after
post-compile (``wrap_output``) in a ``GraphedCallable``:

- per input signature (the shapes, strides and dtypes of the copied inputs, the addresses of the
  static ones, the values of int inputs): the first call runs the compiled code as is (the warm-up:
  an operator signature's first call on openreg is synchronous, which a capture refuses), the
  second records it in a ``torch.accelerator.Graph`` on a side stream (captures are refused on a
  default stream) over static input buffers, and every call replays it: one ``orGraphLaunch``;
- inputs that are not static (``fx_kwargs["static_input_idxs"]``: parameters, buffers,
  ``mark_static_address``) are copied into the static buffers before the launch, mutated ones
  copied back after it, outputs copied out of the graph's memory (a next replay overwrites it;
  CUDA graph trees hand the graph's memory out and track its liveness instead);
- a new signature records a new graph (``config.triton.cudagraph_dynamic_shape_warn_limit``
  bounds how many before a warning);
- graph-unsafe graphs run as ordinary compiled code, with a warning that says why
  (``config.triton.cudagraph_or_error`` raises instead): graphs that touch CPU tensors (a CPU
  scalar is read when a kernel is launched, so a replay would reuse the captured value), several
  devices, inputs other than tensors and ints, a reason Inductor found while lowering, or a
  capture the runtime refused (an operation that waits for the device inside the graph).

Counters (``torch._dynamo.utils.counters["openreg_graphs"]``): ``recorded``, ``replayed``,
``skipped``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.utils import counters
from torch._inductor import config
from torch._inductor.cudagraph_utils import CUDAGraphPolicy, format_default_skip_message
from torch._inductor.output_code import (
    CompiledFxGraph,
    get_expanded_dims,
    index_expanded_dims,
)
from torch._prims_common import is_non_overlapping_and_dense_or_false

DEVICE = "openreg"
WARNING_PREFIX = "openreg-inductor: mode='reduce-overhead' runs this graph without an openreg graph: "


def _is_openreg_graph(output_code: Any) -> bool:
    return isinstance(output_code, CompiledFxGraph) and DEVICE in output_code.device_types


def unsafe_reason(compiled: CompiledFxGraph) -> str | None:
    """Why a compiled openreg graph cannot be replayed as an openreg graph (known after lowering)."""
    others = sorted(t for t in compiled.device_types if t not in (DEVICE, "meta"))
    if others:
        return (
            f"it uses {', '.join(others)} tensors (a CPU scalar is read when a kernel is launched, "
            "so a replay would reuse the value it had when the graph was recorded)"
        )
    if len(compiled.device_idxs) > 1:
        return f"it uses several openreg devices {sorted(compiled.device_idxs)}"
    reason = compiled.disabled_cudagraphs_reason
    (index,) = compiled.device_idxs or (0,)
    # torch's CUDA-only device check says this for every openreg graph; anything else is a real reason.
    generic = format_default_skip_message(f"multiple devices: {torch.device(DEVICE, index)!r}")
    if reason and reason != generic:
        return reason
    return None


def _skip(message: str) -> None:
    counters["openreg_graphs"]["skipped"] += 1
    if config.triton.cudagraph_or_error:
        raise RuntimeError(WARNING_PREFIX + message)
    warnings.warn(WARNING_PREFIX + message, stacklevel=2)


class _Recording:
    """One captured graph: its static inputs and the outputs it writes."""

    def __init__(self, model, inputs, static_idxs, capture_stream):
        self.static_inputs: list[Any] = []
        self.copied: list[tuple[int, list[int]]] = []  # (input index, expanded dims) copied per call
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and i not in static_idxs:
                buf = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
                dims = get_expanded_dims(x)
                index_expanded_dims(buf, dims).copy_(index_expanded_dims(x, dims))
                self.static_inputs.append(buf)
                self.copied.append((i, dims))
            else:
                self.static_inputs.append(x.detach() if isinstance(x, torch.Tensor) else x)
        self.graph = torch.accelerator.Graph()
        with torch.openreg.stream(capture_stream):
            self.graph.capture_begin()
            try:
                outputs = model(list(self.static_inputs))  # the compiled code clears the list it gets
            except BaseException:
                self.graph.reset()  # an abandoned capture: the stream stops capturing, its memory goes back
                raise
            self.graph.capture_end()
        self.outputs = outputs


class GraphedCallable:
    """A compiled openreg graph's callable, replayed as openreg graphs (see the module docstring)."""

    def __init__(
        self, model: Callable, static_input_idxs: Sequence[int], mutated_input_idxs: Sequence[int], device_index: int
    ):
        self.model = model
        self.static_idxs = frozenset(static_input_idxs)
        self.mutated_idxs = tuple(mutated_input_idxs)
        self.device_index = device_index
        self.warmed_up: set[tuple] = set()
        self.recordings: dict[tuple, _Recording] = {}
        self.disabled: str | None = None

    def _key(self, inputs: Sequence[Any]) -> tuple | None:
        key = []
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                if x.device != torch.device(DEVICE, self.device_index):
                    return None
                # A static input is used in place: a different one needs a different graph.
                where = x.data_ptr() if i in self.static_idxs else None
                key.append((tuple(x.size()), tuple(x.stride()), x.dtype, where))
            elif isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool):
                key.append(int(x))
            elif x is None or isinstance(x, bool):
                key.append(x)
            else:
                return None
        return tuple(key)

    def __call__(self, inputs: list[Any]) -> Any:
        if self.disabled is not None:
            return self.model(inputs)
        key = self._key(inputs)
        if key is None:
            self.disabled = "an input is neither an openreg tensor of the graph's device nor an int"
            _skip(self.disabled)
            return self.model(inputs)
        recording = self.recordings.get(key)
        if recording is None:
            if key not in self.warmed_up:  # first call of this signature: run as is
                self.warmed_up.add(key)
                return self.model(inputs)
            with torch.openreg.device(self.device_index):
                try:
                    stream = _capture_stream(self.device_index)
                    recording = _Recording(self.model, inputs, self.static_idxs, stream)
                except RuntimeError as e:
                    self.disabled = f"the capture failed: {str(e).splitlines()[0]}"
                    _skip(self.disabled)
                    return self.model(inputs)
            self.recordings[key] = recording
            counters["openreg_graphs"]["recorded"] += 1
            limit = config.triton.cudagraph_dynamic_shape_warn_limit
            if limit is not None and len(self.recordings) == limit + 1:
                warnings.warn(
                    f"openreg-inductor: this graph has been recorded for {len(self.recordings)} input signatures "
                    "(each keeps its own memory); mark dynamic dimensions or use the default mode",
                    stacklevel=2,
                )
        return self._replay(recording, inputs)

    def _replay(self, recording: _Recording, inputs: list[Any]) -> Any:
        with torch.openreg.device(self.device_index):
            for i, dims in recording.copied:
                index_expanded_dims(recording.static_inputs[i], dims).copy_(index_expanded_dims(inputs[i], dims))
            recording.graph.replay()
            counters["openreg_graphs"]["replayed"] += 1
            for i in self.mutated_idxs:
                if i not in self.static_idxs:
                    dims = get_expanded_dims(inputs[i])
                    index_expanded_dims(inputs[i], dims).copy_(index_expanded_dims(recording.static_inputs[i], dims))
            outputs = [_copy_out(o) for o in recording.outputs]
        inputs.clear()
        return outputs if isinstance(recording.outputs, list) else type(recording.outputs)(outputs)


def _copy_out(out: Any) -> Any:
    if not isinstance(out, torch.Tensor):
        return out
    if is_non_overlapping_and_dense_or_false(out):  # keep the strides Inductor promised
        return torch.empty_strided(out.size(), out.stride(), dtype=out.dtype, device=out.device).copy_(out)
    return out.clone()


_capture_streams: dict[int, torch.Stream] = {}


def _capture_stream(device_index: int) -> torch.Stream:
    """One side stream per device for captures (the runtime refuses to capture a default stream)."""
    if device_index not in _capture_streams:
        _capture_streams[device_index] = torch.openreg.Stream(device=device_index)
    return _capture_streams[device_index]


class OpenRegGraphPolicy(CUDAGraphPolicy):
    """``config.cudagraph_policy`` installed by the plugin: openreg graphs are wrapped in
    ``GraphedCallable``; graphs of other devices get the default behaviour (``base``, or torch's
    own when there was no policy before)."""

    def __init__(self, base: CUDAGraphPolicy | None = None):
        self.base = base

    def cudagraphify(self, model, example_inputs, static_input_idxs, **kwargs):
        if self.base is not None:
            return self.base.cudagraphify(model, example_inputs, static_input_idxs, **kwargs)
        return super().cudagraphify(model, example_inputs, static_input_idxs, **kwargs)

    def should_wrap(self, compiled_graph) -> bool:
        if _is_openreg_graph(compiled_graph):
            return False  # torch's wrapping is for CUDA; wrap_output wraps openreg graphs
        return self.base.should_wrap(compiled_graph) if self.base is not None else True

    def wrap_output(self, output_code):
        if self.base is not None:
            output_code = self.base.wrap_output(output_code)
        if not (config.triton.cudagraphs and _is_openreg_graph(output_code)) or output_code.current_callable is None:
            return output_code
        if isinstance(output_code.current_callable, GraphedCallable):
            return output_code
        reason = unsafe_reason(output_code)
        if reason is not None:
            _skip(reason)
            return output_code
        (index,) = output_code.device_idxs or (torch.openreg.current_device(),)
        output_code.current_callable = GraphedCallable(
            output_code.current_callable,
            output_code.fx_kwargs.get("static_input_idxs") or (),
            sorted(output_code.mutated_input_idxs),
            index,
        )
        return output_code


def install() -> None:
    """Makes ``OpenRegGraphPolicy`` Inductor's graph policy (keeping a policy already set as its base)."""
    current = config.cudagraph_policy
    if not isinstance(current, OpenRegGraphPolicy):
        config.cudagraph_policy = OpenRegGraphPolicy(current)
