"""``mode="reduce-overhead"`` on openreg: compiled graphs replayed as openreg device graphs.

``mode="reduce-overhead"`` turns on ``torch._inductor.config.triton.cudagraphs``; torch 2.13
then wraps each compiled graph with CUDA graph trees, which are CUDA-only: for any other device
the graph is skipped ("multiple devices") and runs as ordinary compiled code. Inductor has one
hook for another graph runtime: ``config.cudagraph_policy`` (``torch._inductor.cudagraph_utils.
CUDAGraphPolicy``). ``OpenRegGraphPolicy`` leaves graphs of other devices to the default policy,
declines torch's wrapping of openreg graphs (``should_wrap``) and wraps them itself after
post-compile (``wrap_output``) in a ``GraphedCallable``:

- per input signature (the shapes, strides and dtypes of the tensor inputs, the values of int
  inputs) and addresses of the inputs used in place: the first call of a signature runs the
  compiled code as is (the warm-up: an operator signature's first call on openreg is synchronous,
  which a capture refuses), the next records it in a ``torch.accelerator.Graph`` on a side stream
  (captures are refused on a default stream) over static input buffers, and every call replays it:
  one ``orGraphLaunch``;
- Inductor's static inputs (``fx_kwargs["static_input_idxs"]``) are used in place, keyed by
  address. Besides parameters, buffers and ``mark_static_address`` tensors, Inductor calls a
  backward graph's saved activations static (CUDA graph trees keep them in the graph pool, at fixed
  addresses) and an optimizer graph's gradients; here they move every step. A static input other
  than an ``nn.Parameter`` seen at another address than at its signature's first call is copied
  from then on and the graphs are recorded again, so recordings and memory stay bounded; another
  set of parameters records another graph;
- other inputs are copied into the static buffers before the launch, mutated ones copied back
  after it, outputs copied out of the graph's memory (a next replay overwrites it; CUDA graph trees
  hand the graph's memory out and track its liveness instead): outputs sharing a storage once, into
  one storage, so they still alias each other; an output in an input's memory is the same view of
  the caller's tensor, as the ordinary compiled code returns;
- the capture takes no random numbers (core's capture leaves the generator alone, as CUDA's does;
  the replay after it draws them), so the recording call draws what every other call draws;
- replays of one recording share its buffers, so they are ordered: each waits for an event the
  previous one recorded after its copy-out, on whichever stream it ran;
- a new signature records a new graph (``config.triton.cudagraph_dynamic_shape_warn_limit``
  bounds how many before a warning, which names the cause: input signatures or parameter sets);
- graph-unsafe graphs run as ordinary compiled code, with a warning that says why
  (``config.triton.cudagraph_or_error`` raises instead): graphs that touch CPU tensors (a CPU
  scalar is read when a kernel is launched, so a replay would reuse the captured value), several
  devices, inputs other than tensors and ints, a reason Inductor found while lowering, or a
  capture the runtime refused (an operation that waits for the device inside the graph).

Counters (``torch._dynamo.utils.counters["openreg_graphs"]``): ``recorded``, ``replayed``,
``skipped``.
"""

from __future__ import annotations

import threading
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

from . import _torch213

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

    def __init__(self, model, inputs, static_idxs, capture_stream, signature):
        self.in_place = static_idxs
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
        # Random ops captured take no numbers from the device's generator (core's capture leaves its
        # offset alone, as CUDA's does); the replay that follows takes them, so the recording call
        # draws what a replay or an ordinary call draws.
        with torch.openreg.stream(capture_stream):
            self.graph.capture_begin()
            try:
                outputs = model(list(self.static_inputs))  # the compiled code clears the list it gets
            except BaseException:
                self.graph.reset()  # an abandoned capture: the stream stops capturing, its memory goes back
                raise
            self.graph.capture_end()
        self.outputs = outputs
        self.signature = signature
        self.done: torch.Event | None = None  # recorded after the last replay's copy-out

    def release(self) -> None:
        if self.done is not None:
            self.done.synchronize()  # a replay on another stream may still use the graph's memory
        self.outputs, self.static_inputs = None, []
        self.graph.reset()


class GraphedCallable:
    """A compiled openreg graph's callable, replayed as openreg graphs (see the module docstring)."""

    def __init__(
        self, model: Callable, static_input_idxs: Sequence[int], mutated_input_idxs: Sequence[int], device_index: int
    ):
        self.model = model
        # Inputs used in place and keyed by address: Inductor's static inputs, less those seen to move.
        self.in_place = set(static_input_idxs)
        self.mutated_idxs = tuple(mutated_input_idxs)
        self.device_index = device_index
        self.warmed_up: set[tuple] = set()
        self.first_addresses: dict[tuple, dict[int, int]] = {}  # per signature, of the in-place inputs
        self.recordings: dict[tuple, _Recording] = {}
        self.disabled: str | None = None
        # Threads share the recordings: a replay's wait, copies, launch and event go in one piece.
        self._lock = threading.Lock()

    def _signature(self, inputs: Sequence[Any]) -> tuple | None:
        key = []
        for x in inputs:
            if isinstance(x, torch.Tensor):
                if x.device != torch.device(DEVICE, self.device_index):
                    return None
                key.append((tuple(x.size()), tuple(x.stride()), x.dtype))
            elif isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool):
                key.append(int(x))
            elif x is None or isinstance(x, (bool, float)):
                key.append(x)
            else:
                # An opaque object (openreg-quant's packed weight, a torchbind object): the graph
                # captures what it holds, so the object is part of the key, by identity; the
                # recording keeps it (static_inputs), so its id names it while the recording lives.
                # It turned graphs off for the whole function.
                key.append(("object", id(x)))
        return tuple(key)

    def _in_place(self, inputs: Sequence[Any]) -> list[int]:
        return sorted(i for i in self.in_place if isinstance(inputs[i], torch.Tensor))

    def _moved(self, signature: tuple, inputs: Sequence[Any]) -> set[int]:
        """In-place inputs other than parameters found at another address than at the signature's
        first call. Inductor calls a backward graph's saved activations static (CUDA graph trees keep
        them in the graph pool, at fixed addresses); here the forward's outputs are fresh copies, so
        they move every step, as do gradients set to None between steps."""
        in_place = self._in_place(inputs)
        first = self.first_addresses.setdefault(signature, {i: inputs[i].data_ptr() for i in in_place})
        return {
            i
            for i in in_place
            if i in first
            and inputs[i].data_ptr() != first[i]
            and not isinstance(inputs[i], torch.nn.Parameter)  # another module's parameters: another graph
        }

    def _copy_from_now_on(self, moved: set[int]) -> None:
        """Moving inputs are copied into the graph's buffers from now on; graphs that used them in
        place are recorded again (at most once per input, so the number of recordings stays bounded)."""
        self.in_place -= moved
        for recording in self.recordings.values():
            recording.release()
        self.recordings.clear()

    def __call__(self, inputs: list[Any]) -> Any:
        if self.disabled is not None:
            return self.model(inputs)
        signature = self._signature(inputs)
        if signature is None:
            self.disabled = "a tensor input is not on the graph's device"
            _skip(self.disabled)
            return self.model(inputs)
        with self._lock:
            moved = self._moved(signature, inputs)
            if moved:
                self._copy_from_now_on(moved)
            key = (signature, tuple((i, inputs[i].data_ptr()) for i in self._in_place(inputs)))
            recording = self.recordings.get(key)
            if recording is None and signature in self.warmed_up:
                recording = self._record(key, inputs)
            if recording is not None:
                return self._replay(recording, inputs)
            self.warmed_up.add(signature)
        # First call of this signature (or a refused capture): run as is.
        return self.model(inputs)

    def _record(self, key: tuple, inputs: list[Any]) -> _Recording | None:
        with torch.openreg.device(self.device_index):
            try:
                stream = _capture_stream(self.device_index)
                in_place = frozenset(i for i, _ in key[1])  # the key's addresses are the in-place inputs'
                recording = _Recording(self.model, inputs, in_place, stream, key[0])
            except RuntimeError as e:
                self.disabled = f"the capture failed: {str(e).splitlines()[0]}"
                _skip(self.disabled)
                return None
        self.recordings[key] = recording
        counters["openreg_graphs"]["recorded"] += 1
        limit = config.triton.cudagraph_dynamic_shape_warn_limit
        if limit is not None and len(self.recordings) == limit + 1:
            warnings.warn(self._many_recordings_message(), stacklevel=3)
        return recording

    def _many_recordings_message(self) -> str:
        signatures = len({r.signature for r in self.recordings.values()})
        causes = []
        if signatures > 1:
            causes.append(
                f"{signatures} input signatures (shapes, strides, dtypes or int values; "
                "mark dynamic dimensions or use the default mode)"
            )
        if len(self.recordings) > signatures:
            causes.append(
                "other parameter tensors (parameters are used in place, so each set of them has its own graph)"
            )
        return (
            f"openreg-inductor: this graph has {len(self.recordings)} recordings, each keeping its own memory, "
            f"for {' and '.join(causes)}"
        )

    def _replay(self, recording: _Recording, inputs: list[Any]) -> Any:
        with torch.openreg.device(self.device_index):
            stream = torch.openreg.current_stream()
            if recording.done is not None:
                # One set of static buffers for every replay: the last replay, maybe on another
                # stream, must have copied its results out before this one's inputs go in.
                stream.wait_event(recording.done)
            for i, dims in recording.copied:
                index_expanded_dims(recording.static_inputs[i], dims).copy_(index_expanded_dims(inputs[i], dims))
            recording.graph.replay()
            counters["openreg_graphs"]["replayed"] += 1
            for i in self.mutated_idxs:
                if i not in recording.in_place:
                    dims = get_expanded_dims(inputs[i])
                    index_expanded_dims(inputs[i], dims).copy_(index_expanded_dims(recording.static_inputs[i], dims))
            outputs = _copy_outputs(recording, inputs)
            recording.done = stream.record_event()
        inputs.clear()
        return outputs if isinstance(recording.outputs, list) else type(recording.outputs)(outputs)


def _copy_outputs(recording: _Recording, inputs: Sequence[Any]) -> list[Any]:
    """The outputs handed to the caller, aliasing as the ordinary compiled code's do: an output in an
    input's memory (the input itself, a view of it) is rebuilt on the caller's tensor, outputs that
    share one storage of the graph's memory (a view of another output) are copied out together into
    one new storage, any other output is copied out on its own."""
    by_input = {
        x.untyped_storage().data_ptr(): i
        for i, x in enumerate(recording.static_inputs)
        if isinstance(x, torch.Tensor) and x.untyped_storage().nbytes() > 0
    }
    groups: dict[int, list[int]] = {}  # graph storage -> the outputs in it
    outputs = list(recording.outputs)
    for k, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            continue
        storage = out.untyped_storage()
        if storage.nbytes() == 0:
            outputs[k] = _copy_out(out)
        elif storage.data_ptr() in by_input:
            i = by_input[storage.data_ptr()]
            outputs[k] = _view_on_input(out, recording.static_inputs[i], inputs[i])
        else:
            groups.setdefault(storage.data_ptr(), []).append(k)
    for ks in groups.values():
        if len(ks) == 1:
            outputs[ks[0]] = _copy_out(outputs[ks[0]])
            continue
        # One copy of the storage up to the last byte an output reads, each output a view on it at
        # its own offset: an in-place change to one shows in the others, as without graphs.
        views = [outputs[k] for k in ks]
        end = max(_end_byte(o) for o in views)
        device = views[0].device
        source = torch.empty(0, dtype=torch.uint8, device=device).set_(views[0].untyped_storage(), 0, (end,), (1,))
        storage = torch.empty(end, dtype=torch.uint8, device=device).copy_(source).untyped_storage()
        for k, o in zip(ks, views, strict=True):
            outputs[k] = _view(storage, o.storage_offset(), o)
    return outputs


def _end_byte(t: torch.Tensor) -> int:
    """One past the last byte of its storage a tensor reads."""
    if t.numel() == 0:
        return t.storage_offset() * t.element_size()
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.size(), t.stride(), strict=True))
    return (last + 1) * t.element_size()


def _view_on_input(out: torch.Tensor, static: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``out``, a view of the graph's input ``static``, as the same view of the caller's ``x``: the ordinary
    compiled code returns the caller's memory there (AOTAutograd may rebuild the view with as_strided
    from this output's storage offset, so it must be the offset in ``x``'s storage)."""
    position = out.storage_offset() * out.element_size() - static.storage_offset() * static.element_size()
    position += x.storage_offset() * x.element_size()
    if position % out.element_size():
        return _copy_out(out)
    return _view(x.untyped_storage(), position // out.element_size(), out)


def _view(storage: torch.UntypedStorage, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``like``'s dtype, size and strides on ``storage`` at ``offset``."""
    return torch.empty(0, dtype=like.dtype, device=like.device).set_(storage, offset, like.size(), like.stride())


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
    """Makes ``OpenRegGraphPolicy`` Inductor's graph policy (keeping a policy already set as its base),
    in every thread (``_torch213.set_inductor_default``)."""
    current = config.cudagraph_policy
    if not isinstance(current, OpenRegGraphPolicy):
        policy = OpenRegGraphPolicy(current)
        _torch213.set_inductor_default("cudagraph_policy", policy)
        config.cudagraph_policy = policy  # this thread's own override, if it had one
