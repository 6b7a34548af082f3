"""The Python wrapper for openreg graphs: Inductor's ``PythonWrapperCodegen`` plus the stream.

Generated ``call(args)`` functions allocate buffers with ``empty_strided_openreg`` (core's
``torch_openreg._C._empty_strided``: openreg's caching allocator on the buffer's device, without
the dispatcher), enter a device guard (``torch.openreg._DeviceGuard``) for the device the graph
runs on, fetch the current raw stream once per device (``stream1 = get_raw_stream(1)``), and
call each kernel's launcher as ``kernel(stream1, buf0, arg0_1, ...)``. Inside a user stream
context (``with torch.openreg.stream(s)`` in the compiled region) the stream is fetched again
at that point, so the kernels go to the user's stream.

Buffers shared between streams in the compiled region (``_CrossStreamBuffers``): a buffer or input
that a kernel on another stream than its own uses is never given to another buffer of the graph
(no ``buf4 = buf0  # reuse``, no in-place reuse), and its early free records it on the streams that
used it first (``buf0.record_stream(stream1); del buf0``), so openreg's caching allocator hands its
block out again only once those streams are done with it. See docs/mechanisms/compiler.md, "Stream
contexts in the compiled region".
"""

from __future__ import annotations

from torch._inductor import config, ir
from torch._inductor.codegen.wrapper import FreeLine, PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.dependencies import WeakDep
from torch._inductor.scheduler import NopKernelSchedulerNode
from torch._inductor.stream_constants import DEFAULT_STREAM_IDX
from torch._inductor.stream_utils import get_stream_name
from torch._inductor.virtualized import V

from .. import _torch213


class _LaunchOnStream:
    """Kernel calls of both the graph's wrapper and its subgraphs' (cond, while_loop bodies)."""

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if triton or device.type != "openreg":
            return super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)
        index = device.index if device.index is not None else 0
        stream_idx = kwargs.get("current_stream_idx")
        if stream_idx is not None and stream_idx != DEFAULT_STREAM_IDX:
            # A user stream is current here: fetch it now, not the graph's cached default.
            self.write_get_raw_stream_header()
            stream = "raw_stream"
            self.writeline(f"{stream} = get_raw_stream({index})")
        else:
            stream = self.write_get_raw_stream(index, kwargs.get("graph_name", V.graph.name))
        self.writeline(f"{kernel_name}({', '.join([stream, *map(str, call_args)])})")

    def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False):
        # Inductor's other devices get ``empty_strided(..., device='openreg', dtype=...)``: Python's
        # argument parser and the dispatcher, twice the cost of CPU Inductor's ``empty_strided_cpu``.
        if device.type != "openreg" or config.test_configs.track_memory_lifecycle:
            return super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
        shape_tuple = self.codegen_python_shape_tuple(shape)
        allocation_tuple = self.codegen_python_shape_tuple(shape if allocation_shape is None else allocation_shape)
        stride_tuple = self.codegen_python_shape_tuple(stride)
        index = device.index if device.index is not None else -1  # -1: the current device
        out = f"{name} = empty_strided_openreg({allocation_tuple}, {stride_tuple}, {dtype}, {index})"
        if shape_tuple != allocation_tuple:
            out += f".as_strided({shape_tuple}, {stride_tuple})"
        return out

    def codegen_device_guard_enter(self, device_idx, num_streams=1, stream_idx_to_user_obj_idx=None) -> None:
        super().codegen_device_guard_enter(device_idx, num_streams, stream_idx_to_user_obj_idx)
        # mode="reduce-overhead" captures one stream, the capture stream it makes current around
        # the call: kernels in a `with stream1:` block ran once during the capture, uncaptured, and
        # the streams.* operators address the streams Dynamo bound at the frame's entry (the
        # caller's), not the capture stream, so the capture was not refused: every replay returned
        # the capture's stale side-stream results. Such graphs must run without an openreg graph
        # (graphs.unsafe_reason reports this reason; it is kept in the FX-graph cache entry).
        reason = _stream_graph_reason()
        if reason is not None and not V.graph.disable_cudagraphs_reason:
            V.graph.disable_cudagraphs_reason = reason

    def codegen_cuda_stream_exit(self) -> None:
        # CppScheduling defers a kernel's call to the next flush, and Scheduler._codegen flushes on
        # a device change, an extern kernel or a full kernel group, not on a stream switch: nodes
        # of two streams were merged into one kernel that ran on the later stream. Flushing (and
        # freeing, as every flush does) before the context ends keeps each launch in its stream.
        V.graph.scheduler.flush()
        super().codegen_cuda_stream_exit()


def _stream_graph_reason() -> str | None:
    """Why a graph with user streams cannot be one openreg device graph, or None."""
    scheduler = getattr(V.graph, "scheduler", None)
    if scheduler is None:
        return None
    if scheduler._has_multi_stream_nodes():
        return "it runs kernels on a user stream inside the compiled region (a graph captures one stream)"
    for node in scheduler.nodes:
        if getattr(getattr(node.node, "op_overload", None), "namespace", None) == "streams":
            return "it calls stream or event operators inside the compiled region (a graph captures one stream)"
    return None


def _storage_names(name: str, scheduler) -> set[str]:
    """``name``, the buffer a mutation of it names, and the buffers it is a view of."""
    names, todo = set(), [name]
    while todo:
        current = todo.pop()
        for n in (current, scheduler.mutation_real_name.get(current, current)):
            if n in names:
                continue
            names.add(n)
            buf = V.graph.try_get_buffer(n)
            if isinstance(buf, ir.Buffer):
                todo.extend(buf.get_inputs_that_alias_output())
    return names


def _home_stream(name: str, scheduler) -> int:
    """The stream a buffer was allocated on: its producer's (inputs: the caller's, index 0).
    Not ``Scheduler.get_buf_stream``: that follows a mutation to the *new* name, and the stream
    operators "mutate" what they order (``wait_stream`` makes ``buf2`` out of ``buf0``), so a
    buffer made on a side stream would count as the default stream's."""
    real = scheduler.mutation_real_name.get(name, name)
    return scheduler.buff_to_stream.get(real, DEFAULT_STREAM_IDX)


def _accesses_memory(node) -> bool:
    """Not a no-op node or a stream operator (``torch.ops.streams.wait_stream``, ``record_event``,
    ...): those read and "mutate" buffers only to be ordered with their users."""
    if isinstance(node, NopKernelSchedulerNode):
        return False
    op = getattr(node.node, "op_overload", None)
    return getattr(op, "namespace", None) != "streams"


class _CrossStreamBuffers:
    """Buffers and inputs that kernels on another stream than their own use (their own: the
    stream of the node that produced them, for inputs the caller's stream), and the lifetime rules
    for them. Inductor frees a buffer right after its last use in program order and 2.13 plans
    reuse by the producer's stream only (``torch._inductor.codegen.wrapper.buffer_reuse_key``); an
    eager program keeps the tensor alive until the function returns."""

    def _cross_stream_uses(self) -> dict[str, set[int]]:
        scheduler = V.graph.scheduler
        cached = getattr(self, "_cross_stream_cache", None)
        if cached is not None and cached[0] is scheduler:
            return cached[1]
        uses: dict[str, set[int]] = {}
        # Inductor's pool planner (config.memory_planning, inference only, off by default) places
        # buffers in one allocation by live range and ignores streams: left as upstream.
        pools = config.memory_planning and V.graph.is_inference
        if scheduler is not None and scheduler._has_multi_stream_nodes() and not pools:
            for node in scheduler.nodes:
                stream = scheduler.node_to_stream.get(node)
                if stream is None or not _accesses_memory(node):
                    continue
                for dep in node.read_writes.reads_and_writes():
                    if isinstance(dep, WeakDep):  # an ordering edge, no access
                        continue
                    for name in _storage_names(dep.name, scheduler):
                        if _home_stream(name, scheduler) != stream:
                            uses.setdefault(name, set()).add(stream)
        self._cross_stream_cache = (scheduler, uses)
        return uses

    def can_reuse(self, input_buffer, output_buffer=None) -> bool:
        # Consulted for in-place reuse (decide_inplace_update) and before a free becomes a
        # candidate for reuse (codegen_free): a buffer another stream reads is neither.
        if input_buffer.get_name() in self._cross_stream_uses():
            return False
        return super().can_reuse(input_buffer, output_buffer)

    def codegen_free(self, buffer) -> None:
        name = buffer.get_name()
        streams = self._cross_stream_uses().get(name)
        if not streams or isinstance(buffer, ir.TorchBindObject):
            return super().codegen_free(buffer)
        is_input = isinstance(buffer, ir.InputBuffer)
        # Not freeable at all (a constant, an input Inductor keeps, already freed): as upstream.
        if not is_input and not super().can_reuse(buffer):
            return
        # The free is emitted after the buffer's last use in program order, so the allocator's
        # events, taken on these streams at the free, follow every kernel that used it there.
        names = [get_stream_name(s) for s in sorted(streams)]
        recorded = "; ".join(f"{name}.record_stream({stream})" for stream in names)
        self.writeline(f"{recorded}  # also used on {', '.join(names)}: its block waits for that")
        if is_input:
            return super().codegen_free(buffer)  # FreeLine: `del arg0_1`
        self.freed.add(name)
        self.writeline(FreeLine(self, buffer))  # `del buf0`, never a reuse candidate


class OpenRegPythonWrapper(_LaunchOnStream, _CrossStreamBuffers, _torch213.WrapperFixes, PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return OpenRegSubgraphWrapper(subgraph_name, parent_wrapper, partition_signatures)
        return OpenRegPythonWrapper()

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline("from openreg_inductor.codegen.launch import load_kernel as openreg_kernel")
        self.imports.writeline("from torch_openreg._C import _empty_strided as empty_strided_openreg")


class OpenRegSubgraphWrapper(
    _LaunchOnStream, _CrossStreamBuffers, _torch213.WrapperFixes, SubgraphPythonWrapperCodegen
):
    pass
