"""The Python wrapper for openreg graphs: Inductor's ``PythonWrapperCodegen`` plus the stream.

Generated ``call(args)`` functions allocate buffers with ``empty_strided`` on the buffer's
openreg device (openreg's caching allocator), enter a device guard for the device the graph
runs on, fetch the current raw stream once per device (``stream1 = get_raw_stream(1)``), and
call each kernel's launcher as ``kernel(stream1, buf0, arg0_1, ...)``. Inside a user stream
context (``with torch.openreg.stream(s)`` in the compiled region) the stream is fetched again
at that point, so the kernels go to the user's stream.
"""

from __future__ import annotations

from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.stream_constants import DEFAULT_STREAM_IDX
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


class OpenRegPythonWrapper(_LaunchOnStream, _torch213.WrapperFixes, PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return OpenRegSubgraphWrapper(subgraph_name, parent_wrapper, partition_signatures)
        return OpenRegPythonWrapper()

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline("from openreg_inductor.codegen.launch import load_kernel as openreg_kernel")


class OpenRegSubgraphWrapper(_LaunchOnStream, _torch213.WrapperFixes, SubgraphPythonWrapperCodegen):
    pass
