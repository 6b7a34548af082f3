"""Workarounds for torch 2.13 assumptions that break a device that is neither the CPU nor a
GPU with Triton. This is the plugin's only module that changes torch's behaviour; each entry
names the torch source it works around and the test that fails without it.

Inductor 2.13 sorts devices into "cpu" (C++ codegen) and ``GPU_TYPES`` (Triton, streams, device
guards). openreg generates C++ like the CPU and has streams and a device like a GPU; adding it
to ``GPU_TYPES`` would make Inductor require Triton (``TritonMissing``), so the few decisions that
go wrong are corrected here, for device type "openreg" only. Upstream, the RFC for PrivateUse1
backends in torch.compile (https://github.com/pytorch/pytorch/issues/189138: device capability
bits such as ``is_gpu`` / ``exposes_streams`` on ``DeviceInterface``) and its Inductor sub-RFC
(https://github.com/pytorch/pytorch/issues/189137: codegen registration without monkeypatching)
would replace each of these with a hook.

``apply()`` refuses other torch minor versions: the patched names may have moved.
"""

from __future__ import annotations

import functools
import importlib
import re

import torch

DEVICE = "openreg"
SUPPORTED = (2, 13)


def _version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


# 1. torch/_inductor/utils.py, get_current_backend(): any device other than cpu/mps/xpu/tpu gets
#    ``config.cuda_backend`` ("triton"), so C++ codegen of openreg kernels takes Triton-only
#    branches (codegen/common.py CSEProxy._default: "masked" dtype; upcast_compute_type), and
#    indirect indexing and rand then hit a dtype assert.
#    Test: tests/test_codegen.py::TestIndirect::test_gather_embedding, TestRandom.
def _get_current_backend(original, device_type=None):
    if device_type is None:
        from torch._inductor.virtualized import V

        device_type = V.graph.get_current_device_or_throw().type
    return "cpp" if device_type == DEVICE else original(device_type)


# 2. torch/_inductor/scheduler.py, BaseSchedulerNode.is_cpu(): it gates loop reindexing and
#    reordering (shared_data_after_reordering_loop, shared_data_after_inverting_indexing,
#    _try_reindex_for_reduction_fusion: "CPU reindexing is not validated yet"), which the C++
#    kernel cannot take: softmax fails with "can't multiply sequence by non-int of type 'tuple'".
#    Test: tests/test_codegen.py::TestReductions::test_softmax.
def _is_cpu(self) -> bool:
    device = self.get_device()
    return device is not None and device.type in ("cpu", DEVICE)


# 3. torch/_inductor/lowering.py, make_pointwise().inner(): the output device is the first
#    ``is_gpu`` input's, else ``inputs[0]``'s; ``cpu_scalar * x_openreg`` is then placed on the
#    CPU and the CPU kernel reads device memory on the host (a segfault).
#    Test: tests/test_codegen.py::TestMixedDevices::test_cpu_scalar_times_openreg.
def _lowering_is_gpu(original, device: str | None) -> bool:
    return device == DEVICE or original(device)


# 4. torch/_inductor/utils.py, device_need_guard() (used by Scheduler._codegen): only GPU_TYPES
#    get a device guard in the wrapper, so inputs on openreg:1 run and allocate on the current
#    device (openreg:0), and user-stream graphs reference an undefined ``default_stream``.
#    Test: tests/test_codegen.py::TestDevices::test_second_device.
def _device_need_guard(original, device: str) -> bool:
    return device == DEVICE or original(device)


# 6. torch/_inductor/lowering.py, use_two_step_variance(): only device type "cpu" gets the C++
#    backend's threshold (``config.cpp.use_two_step_variance_threshold``, 1024) below which a
#    variance takes two passes (mean, then squared deviations); other devices get
#    ``config.unroll_reductions_threshold`` (8). openreg's C++ kernels then computed a layer_norm
#    row of 1024 with Welford's algorithm where CPU Inductor's take two passes: other roundings,
#    and 1.6 times CPU Inductor's time (tools/bench/compile_bench.py, compile-layer-norm).
#    Test: tests/test_codegen.py::TestReductions::test_variance_takes_two_passes_as_on_the_cpu.
def _use_two_step_variance(original, x, *args, **kwargs) -> bool:
    device = x.get_device()
    if device is None or device.type != DEVICE:
        return original(x, *args, **kwargs)
    from torch._inductor import config

    # The CPU's branch of that function, for openreg: its threshold, no split check.
    with config.patch(unroll_reductions_threshold=config.cpp.use_two_step_variance_threshold):
        return original(x, *args, **kwargs)


# 7. torch/_inductor/lowering.py, _make_reduction_inner(): an argmax/argmin over several dims of a
#    permuted or non-contiguous input returns the *logical* (row-major) index only where
#    ``supports_logical_index_argreduce``: Triton, or device type "cpu" with the C++ backend. openreg
#    generates the CPU's C++ and, with workaround 2, gets the CPU's loop reordering, but not the
#    logical index: ``x.t().argmax()`` returned the index in memory order (29 where eager and CPU
#    Inductor give 9). openreg gets the CPU's branch: the loader also returns the row-major index
#    of the reduction position, as that function does for the CPU, and does so for every input:
#    the CPU's branch decides from the input's IR node, and a computed input whose loops Inductor
#    reorders (``(x.permute(2, 1, 0) * 1).argmax()``) gave the memory-order index on the CPU too
#    (pytorch/pytorch#193751, fixed after 2.13 by emitting the logical index unless the order is
#    known to be row-major; hunt36b). The row-major index costs one index expression.
#    Test: tests/test_codegen.py::TestReductions::test_argmax_of_a_permuted_input_is_a_logical_index.
_ARG_REDUCTIONS = ("argmax", "argmin", "argmax_value", "argmin_value", "argmax_with_value", "argmin_with_value")


def _make_reduction_inner(original, x, *, axis, keepdims, dtype, override_return_dtype, reduction_type=None):
    kwargs = original(
        x,
        axis=axis,
        keepdims=keepdims,
        dtype=dtype,
        override_return_dtype=override_return_dtype,
        reduction_type=reduction_type,
    )
    device = kwargs.get("device")
    reduced_sizes = kwargs["reduction_ranges"]
    if device is None or device.type != DEVICE or reduction_type not in _ARG_REDUCTIONS or len(reduced_sizes) <= 1:
        return kwargs
    import sympy
    from torch._inductor.virtualized import ops

    value_loader = kwargs["inner_fn"]

    def loader(index, reduction_index):
        rindex = [sympy.expand(i) for i in reduction_index]
        linear = rindex[0]
        for i in range(1, len(rindex)):
            linear = linear * reduced_sizes[i] + rindex[i]
        return (value_loader(index, reduction_index), ops.index_expr(linear, torch.int64))

    kwargs["inner_fn"] = loader
    return kwargs


# 8. torch/_inductor/utils.py, _use_template_for_cpu(): Inductor's C++ GEMM templates
#    (use_cpp_gemm_template, use_cpp_bmm_template) are offered for device type "cpu" only, so
#    max-autotune on openreg had the extern ATen kernel as its one choice and timed nothing.
#    openreg generates the CPU's C++, so it gets the CPU's templates (autotune.py).
#    Test: tests/test_autotune.py::TestTemplates::test_cpp_gemm_template_with_a_fused_epilogue.
def _use_template_for_cpu(original, layout) -> bool:
    if layout.device.type != DEVICE:
        return original(layout)
    from torch._inductor import config

    return bool(config.max_autotune or config.max_autotune_gemm)


# 9. torch/_inductor/autotune_process.py, GPUDeviceBenchmarkMixin.do_bench(): the benchmark device
#    is the first input's only if ``is_gpu``, else "cuda", so an extern kernel's benchmark on openreg
#    asked for CUDA ("Torch not compiled with CUDA enabled"). For openreg it is openreg: its
#    device interface and its benchmarker (autotune.benchmark_with_events).
#    Test: tests/test_autotune.py::TestChoices::test_both_choices_are_timed_with_openreg_events.
def _autotune_is_gpu(original, device: str | None) -> bool:
    return device == DEVICE or original(device)


# 10. torch/_inductor/codegen/cpp_template.py, CppTemplate.generate(): a C++ template's benchmark is
#     a ``CppBenchmarkRequest``, which calls the kernel on the host over ``data_ptr()``: on openreg
#     that reads device memory on the host (a segfault). openreg's request (autotune.py) launches
#     it on the stream. Test: the one of workaround 9 (it benchmarks a template on openreg).
#
# 11. torch/_inductor/select_algorithm.py, AlgorithmSelectorCache.__call__(): the choice between
#     templates is deferred to fusion time (``return_multi_template``, from
#     ``config.benchmark_epilogue_fusion``) except on the CPU with C++ code, and the deferred choice
#     benchmarks fusions with Triton ("No module named 'triton'"). openreg decides at once, as the
#     CPU does. Test: tests/test_autotune.py::TestChoices::test_bmm_with_an_epilogue_chooses_at_once.
def _selector_call(original):
    @functools.wraps(original)
    def call(self, name, choices, input_nodes, layout, *args, **kwargs):
        if layout is not None and layout.device.type == DEVICE:
            kwargs["return_multi_template"] = False
        return original(self, name, choices, input_nodes, layout, *args, **kwargs)

    return call


# 13. torch/_inductor/ir.py, is_cpu(): the C++ backend's heuristics for storing an intermediate
#     result instead of recomputing it in each user are for device type "cpu" only: a reused result
#     of a heavy op (exp, log, sigmoid, tanh...) is stored (StorageBox.should_realize_on_reuse), and
#     the C++ thresholds of op count and accumulated reads (Loops.has_large_inner_fn,
#     StorageBox.has_exceeded_max_reads) replace Triton's. openreg's softmax recomputed exp(x - max)
#     in its last pass where CPU Inductor's keeps it in a per-row local buffer: twice the CPU's
#     kernel time (tools/bench/compile_bench.py, compile-softmax). openreg takes the CPU's branches;
#     ir.is_cpu is read by nothing else.
#     Test: tests/test_codegen.py::TestReductions::test_softmax_stores_exp_once_as_on_the_cpu.
def _ir_is_cpu(original, get_device_type, x) -> bool:
    return original(x) or get_device_type(x) == DEVICE


# 14. torch/_inductor/codecache.py, FxGraphHashDetails.__init__(): the FX-graph cache key (and
#     AOTAutograd's, whose details subclass it) hashes a graph without its node meta, and the stream
#     each node runs on (``node.meta["custom"]["stream"]``, from a stream context in the compiled
#     region, which the wrapper turns into ``with stream1:`` blocks) is only there. The same operations
#     inside a stream context and outside one shared a key, so the second compile loaded the first's
#     code: outside after inside, it looked up a stream its caller never registered (AssertionError
#     "Index not registered in index_to_user_object_weakref"); inside after outside, its kernel ran on
#     the current stream instead of the side stream. Any device with streams has this; for graphs with
#     openreg values the annotations are recorded on the details, as torch records other node meta there.
#     Test: tests/test_streams.py::TestAsynchrony::test_a_stream_context_is_part_of_the_graph_cache_key.
def _hash_details_init(original):
    @functools.wraps(original)
    def init(self, gm, *args, **kwargs):
        original(self, gm, *args, **kwargs)
        if gm is None:
            return
        streams = []
        on_openreg = False
        for module in gm.modules():
            if isinstance(module, torch.fx.GraphModule):
                for n in module.graph.nodes:
                    if "stream" in n.meta.get("custom", {}):
                        streams.append((n.name, n.meta["custom"]["stream"]))
                    value = n.meta.get("val", n.meta.get("example_value"))  # AOT graphs / Dynamo graphs
                    on_openreg = on_openreg or getattr(getattr(value, "device", None), "type", "") == DEVICE
        if streams and on_openreg:
            self.openreg_node_streams = streams

    return init


# 15. torch/_inductor/codegen/common.py, Kernel.indirect_assert(), and codegen/cpp.py,
#     CppVecKernel.indirect_assert(): a masked index check is written ``(cond) | ~(mask)`` so that
#     masked-out elements pass. When the mask is a C++ ``bool`` (a scalar mask, or a vector mask
#     reduced with ``.all_masked()`` for a scalar index), ``~`` promotes it to int and gives -2 or -1,
#     never 0: the check always passes, and an out-of-bounds index under a mask (a gather that
#     ``F.pad`` masks) is read without a word, on the CPU too. In openreg's kernels a scalar index
#     under a vector mask is checked when any lane of the mask is set (``(mask).all_zero()`` passes;
#     ``all_masked()`` would skip vectors that are only partly set), the negation of a bool mask is
#     ``!``, and a vector mask's stays ``~`` (an overload picks it). A source fix of openreg's
#     kernels, no patching.
#     Test: tests/test_streams.py::TestKernelFailures::test_masked_index_out_of_bounds.
# 16. torch/_inductor/codegen/cpp_template_kernel.py, CppTemplateKernel.define_buffer() and
#     define_stack_allocated_buffer(): a C++ template's local accumulation buffer is laid out on
#     device "cpu" (it is memory of the kernel), and store_output() copies it to the output with
#     L.copy(), which for an openreg output sees two devices and builds a DeviceCopy over the
#     template's symbolic block sizes: max-autotune of a small bmm on openreg failed to lower
#     ("vr must not be None for symbol Nc_blocks"). The local buffer takes the output's device.
#     Test: tests/test_autotune.py::TestTemplates::test_small_bmm_template_with_a_local_buffer.
def _store_output(original):
    def store_output(self, dst, src, *args, **kwargs):
        device = dst.get_device()
        local = src.get_name() in self.local_buffers  # the template kernel's own memory
        if local and device is not None and device.type == DEVICE and src.get_device().type == "cpu":
            from torch._inductor import ir

            cpu = src.get_layout()
            src = ir.Buffer(name=src.get_name(), layout=ir.FixedLayout(device, cpu.dtype, cpu.size, cpu.stride))
        return original(self, dst, src, *args, **kwargs)

    return store_output


# 17. torch/_dynamo/variables/streams.py, SymbolicStreamState.cur_stream(device): Dynamo tracks the
#     streams of the stream contexts entered in the region on one stack, whose bottom is the current
#     device's current stream. Asked for another device's current stream (``torch.accelerator.
#     current_stream(1)`` with ``openreg:0`` current) and finding none of that device on the stack,
#     it answers the top of the stack: a ``wait_stream`` on it made ``openreg:0``'s stream wait, and
#     a kernel after it on ``openreg:1`` read a buffer its side stream had not written yet (zeros;
#     ``aot_eager`` runs everything on one stream and was right). CUDA would answer alike. For an
#     openreg device with an index, the answer is that device's current stream, registered like the
#     bottom of the stack (its value is looked up again at each call of the compiled code).
#     Test: tests/test_streams.py::TestAsynchrony::test_wait_stream_for_a_device_that_is_not_current.
def _peeked_stream(variable):
    """The ``torch.Stream`` of an unrealized lazy variable (the stack's bottom), read without making
    it real, which would add a graph node and a lookup at each call; None for any other variable."""
    from torch._dynamo.variables.lazy import LazyVariableTracker

    if isinstance(variable, LazyVariableTracker) and not variable.is_realized():
        return variable.peek_value()
    return None


def _stream_device(variable) -> torch.device:
    """The device of a stream on Dynamo's stack, read without making a lazily built variable (the
    stack's bottom) real, which would add a graph node and a lookup at each call. A stream from
    outside the region gets only a type guard, so its device is guarded here: a stream of another
    device at a later call recompiles."""
    from torch._dynamo.guards import GuardBuilder, install_guard
    from torch._dynamo.source import AttrSource, CurrentStreamSource

    peeked = _peeked_stream(variable)
    if peeked is not None:
        return peeked.device
    source = getattr(variable, "source", None)
    if source is not None and not isinstance(source, CurrentStreamSource):
        install_guard(AttrSource(source, "device").make_guard(GuardBuilder.EQUALS_MATCH))
    return variable.device


def _innermost_stream_of(state, device: torch.device):
    """The innermost stream of ``device`` on Dynamo's stack, or None; the streams looked at on the
    way (from the top) decide the answer, so their devices are guarded."""
    for stream in reversed(state.cur_stream_stack):
        if _stream_device(stream) == device:
            return stream
    return None


def _deciding_device_context(state):
    """Workaround 18: the device of the innermost device context, if no stream context was entered
    inside it (it then decides which stream a call without a device names), else None."""
    contexts = state.__dict__.get("_openreg_device_contexts")
    if contexts and contexts[-1][0] == len(state.cur_stream_stack):
        return torch.device(DEVICE, contexts[-1][1])
    return None


def _current_stream_object(state, index: int):
    """One ``torch.Stream`` per device and trace for a device's current stream: its variable's value,
    and the identity ``cur_stream_id`` answers before that variable exists."""
    objects = state.__dict__.setdefault("_openreg_current_stream_objects", {})
    if index not in objects:
        objects[index] = torch.accelerator.current_stream(torch.device(DEVICE, index))
    return objects[index]


def _cur_stream(original):
    @functools.wraps(original)
    def cur_stream(self, device=None):
        if device is not None and device.type == DEVICE and device.index is None:
            device = None  # names the current device, as no device does
        if device is None:
            device = _deciding_device_context(self)
            if device is None:
                return original(self, None)
        if device.type != DEVICE:
            return original(self, device)
        stream = _innermost_stream_of(self, device)
        if stream is not None:
            return stream
        known = self.__dict__.setdefault("_openreg_current_streams", {})
        if device.index not in known:
            from torch._dynamo.graph_bytecode_inputs import get_external_object_by_index, register_user_object
            from torch._dynamo.source import CurrentStreamSource
            from torch._dynamo.symbolic_convert import InstructionTranslator
            from torch._dynamo.utils import set_example_value
            from torch._dynamo.variables.streams import StreamVariable

            # Built here rather than by VariableBuilder, which gives any CurrentStreamSource the
            # bottom's index (0). The source looks the stream up again at each call.
            tx = InstructionTranslator.current_tx()
            stream = _current_stream_object(self, device.index)
            source = CurrentStreamSource(stream.device)
            index = register_user_object(stream, source)
            proxy = tx.output.create_proxy("call_function", get_external_object_by_index, (index,), {})
            set_example_value(proxy.node, stream)
            variable = StreamVariable(proxy, stream, source=source, user_object_index=index)
            known[device.index] = tx.output.side_effects.track_object_existing(stream, variable)
        return known[device.index]

    return cur_stream


def _cur_stream_id(original):
    """Workaround 18 for ``SymbolicStreamState.cur_stream_id``, which keys an input's mutation by the
    stream it runs on (so that an event recorded after it on that stream is refused): inside a
    deciding device context it is that device's stream, as ``cur_stream`` answers. Nothing is looked
    up: Dynamo calls it after every in-place operation."""

    @functools.wraps(original)
    def cur_stream_id(self):
        device = _deciding_device_context(self)
        if device is None:
            return original(self)
        stream = _innermost_stream_of(self, device)
        if stream is None:
            return id(_current_stream_object(self, device.index))
        peeked = _peeked_stream(stream)
        return id(peeked if peeked is not None else stream.value)

    return cur_stream_id


# 18. torch/_dynamo/variables/ctx_manager.py, GenericDeviceVariable.enter()/exit(), which
#     AcceleratorDeviceIndexVariable inherits (the traced ``torch.accelerator.device_index(i)``): the
#     context switches the device during the trace but leaves the stream stack of workaround 17
#     alone. Without a device, ``torch.accelerator.current_stream()`` (and openreg's stand-in)
#     inside ``with torch.accelerator.device_index(1):`` answered the stream of the device current
#     outside (openreg:0's), where eager code answers openreg:1's current stream. CUDA's
#     ``torch.cuda.device`` has the same gap. The context now notes its device and the depth of the
#     stack at its entry; asked without a device, ``cur_stream`` answers that device's stream
#     (workaround 17's answer) when no stream context was entered inside it, and ``cur_stream_id``
#     (the stream an input mutation is keyed by) answers the same. Nothing is looked up until a
#     stream is asked for: a device context alone adds no graph node. (``torch.openreg.device(i)``'s
#     variable, registered by polyfills.py, subclasses AcceleratorDeviceIndexVariable.)
#     Test: tests/test_streams.py::TestDeviceContexts::test_nested_contexts_answer_as_eagerly,
#     tests/test_streams.py::TestDeviceContexts::test_a_device_context_alone_adds_no_stream_lookup,
#     tests/test_streams.py::TestDeviceContexts::test_an_input_mutation_inside_a_device_context_is_keyed_by_its_stream.
def _device_context_enter(original):
    @functools.wraps(original)
    def enter(self, tx, *args):
        result = original(self, tx, *args)
        index = self.target_values[0]
        accelerator = torch.accelerator.current_accelerator()
        noted = isinstance(index, int) and index >= 0 and accelerator is not None and accelerator.type == DEVICE
        if noted:
            state = tx.symbolic_stream_state
            state.__dict__.setdefault("_openreg_device_contexts", []).append((len(state.cur_stream_stack), int(index)))
        self._openreg_noted_context = noted
        return result

    return enter


def _device_context_exit(original):
    @functools.wraps(original)
    def exit(self, tx, *args):
        if getattr(self, "_openreg_noted_context", False):
            tx.symbolic_stream_state.__dict__["_openreg_device_contexts"].pop()
            self._openreg_noted_context = False
        return original(self, tx, *args)

    return exit


# 19. torch/_dynamo/variables/streams.py, StreamVariable.var_getattr(): a traced stream's ``device``
#     is a graph attribute (GetAttrVariable), not a constant, so code that picks a device from a
#     stream fails to trace (``torch.accelerator.synchronize(stream.device)``: "StreamVariable() is
#     not a constant"). A stream's device never changes. It is now a constant, guarded for a stream
#     that comes from outside the region (streams get only a TYPE_MATCH guard; a stream of another
#     device at a later call recompiles) and fixed by the source of the current stream's lookup.
#     polyfills.py reads it: ``torch.openreg.synchronize()`` and ``current_device()`` without a device
#     follow the innermost context, as eagerly (inside ``with s1:`` they answered the device current
#     outside).
#     Test: tests/test_streams.py::TestDeviceContexts::test_current_device_and_synchronize_inside_a_stream_context.
def _stream_var_getattr(original):
    @functools.wraps(original)
    def var_getattr(self, tx, name):
        if name != "device" or self.device.type != DEVICE:
            return original(self, tx, name)
        from torch._dynamo.guards import GuardBuilder, install_guard
        from torch._dynamo.source import AttrSource, CurrentStreamSource
        from torch._dynamo.variables.constant import ConstantVariable

        if self.source is not None and not isinstance(self.source, CurrentStreamSource):
            install_guard(AttrSource(self.source, "device").make_guard(GuardBuilder.EQUALS_MATCH))
        return ConstantVariable.create(self.device)

    return var_getattr


# 25. torch/_dynamo/variables/streams.py, StreamVariable.call_method() and EventVariable.call_method(),
#     ``name == "query"``: the call becomes a graph node wrapped as a ConstantVariable, whose value is
#     the one the query gave while Dynamo traced. Code after it branches on that constant, and every
#     later call of the compiled region returned it: a region that returned ``s.query()`` answered
#     True for a stream still busy (CUDA's streams take the same path; no upstream issue found). A
#     query is a question to the device at that moment, so an openreg stream's or event's query breaks
#     the graph and runs eagerly, between the two graphs (an error under ``fullgraph=True``, naming it).
#     Test: tests/test_streams.py::TestQuery::test_query_answers_at_each_call.
def _query_breaks_the_graph(original, device_of):
    @functools.wraps(original)
    def call_method(self, tx, name, args, kwargs):
        device = device_of(self)
        if name == "query" and device is not None and torch.device(device).type == DEVICE:
            from torch._dynamo.exc import unimplemented

            unimplemented(
                gb_type="openreg stream or event query",
                context=f"{type(self.value).__name__}.query()",
                explanation="An openreg stream's or event's query() answers for the moment it is "
                "called; traced, it would give every call the answer of the trace.",
                hints=["Call query() outside the compiled region, or allow the graph break."],
            )
        return original(self, tx, name, args, kwargs)

    return call_method


# 20. torch/_subclasses/fake_tensor.py, FakeTensorMode._prep_args_for_hash(): FakeTensorMode's
#     dispatch cache is shared by every fake mode, and its key holds a device argument as written.
#     A factory without an index (``torch.ones(2, device="openreg")``) traced inside
#     ``with torch.accelerator.device_index(1):`` left a fake tensor on openreg:1 under the key of the
#     same call outside any context: a later, unrelated compile of ``x + torch.ones(2,
#     device="openreg")`` with openreg:0 current failed ("Tensor device mismatch"), and in the other
#     order the factory inside the context landed on openreg:0. A ``set_device`` between two
#     compiles did the same. CUDA's ``"cuda"`` takes the same path; upstream pins the index in the key after
#     2.13 (https://github.com/pytorch/pytorch/pull/197583). Here an openreg device argument without
#     an index adds the index its fake output gets to the key.
#     Test: tests/test_streams.py::TestDeviceContexts::test_a_factory_inside_a_device_context_is_cached_apart.
def _prep_args_for_hash(original, normalize_fake_device):
    # Runs for every cache key of every fake operation: nothing is imported or looked up here.
    @functools.wraps(original)
    def prep(self, result, args, state, id_hashed_objects):
        original(self, result, args, state, id_hashed_objects)
        for arg in args.values() if isinstance(args, dict) else args:
            if isinstance(arg, torch.device) and arg.type == DEVICE and arg.index is None:
                # The index the fake output gets: the current device once openreg is initialised,
                # else 0 (reading the current device would start the runtime).
                result.append(("openreg device", normalize_fake_device(arg).index))

    return prep


MASK_NOT = """
#ifndef OPENREG_MASK_NOT
#define OPENREG_MASK_NOT
inline bool openreg_mask_not(bool mask) { return !mask; }
template <typename Mask>
inline auto openreg_mask_not(const Mask& mask) { return ~mask; }
#endif
"""


_ALL_MASKED = re.compile(r"\| ~\(\((\w+)\)\.all_masked\(\)\)")


def fix_masked_index_asserts(source: str) -> str:
    """``source`` with the masked index checks' negation as the mask's type needs (see 15)."""
    lines = source.split("\n")
    fixed = [
        _ALL_MASKED.sub(r"| (\1).all_zero()", line).replace("| ~(", "| openreg_mask_not(")
        if "TORCH_CHECK(" in line
        else line
        for line in lines
    ]
    if fixed == lines:
        return source
    return MASK_NOT + "\n".join(fixed)


def _flush_deferred_kernels() -> None:
    """Writes the kernel call CppScheduling holds back (it defers each kernel group to a flush)."""
    from torch._inductor.virtualized import V

    scheduler = getattr(V.graph, "scheduler", None)
    if scheduler is not None:
        for backend in scheduler.backends.values():
            backend.flush()


class WrapperFixes:
    """Fixes that live in openreg's wrapper classes (subclass overrides, no patching).

    5. torch/_inductor/scheduler.py, Scheduler._codegen(): at the end of a graph the last device
       guard is exited *before* the final ``self.flush()``, and CppScheduling defers its kernel
       call to that flush, so the last kernel call lands after the ``with`` block (outside the
       device guard). Flushing the scheduler's backends when the guard exits keeps every call
       inside; without it, a graph whose last kernel runs in a user stream context launches it
       on the default stream. Test: tests/test_streams.py::TestAsynchrony::test_stream_context_inside_the_region.

    12. The same function flushes the deferred kernel before an extern call only when the extern
        node has a device. The ``streams`` ops that ``torch.accelerator.synchronize()`` and event
        calls in a compiled region become (``torch.ops.streams.synchronize_device``,
        ``record_event``, ``wait_event``: fallback kernels without tensor arguments) have none,
        so their call was written before the kernel that precedes them, and the inputs that kernel
        reads were freed before its call (``UnboundLocalError`` at run time; an event recorded
        before the kernel it should follow). Fallback calls flush first. CPU Inductor has the same
        defect (with openreg as the accelerator, a CPU graph calling ``torch.accelerator.synchronize()``
        fails the same way); Triton's scheduling does not defer. Test:
        tests/test_streams.py::TestDeviceCallsInTheRegion::test_synchronize_between_kernels.
    """

    def codegen_device_guard_exit(self) -> None:
        _flush_deferred_kernels()
        super().codegen_device_guard_exit()

    def generate_fallback_kernel(self, node) -> None:
        _flush_deferred_kernels()
        super().generate_fallback_kernel(node)

    def generate_fallback_kernel_with_runtime_lookup(self, *args, **kwargs) -> None:
        _flush_deferred_kernels()
        super().generate_fallback_kernel_with_runtime_lookup(*args, **kwargs)


# 22. torch/_inductor/codegen/cpp.py, CppKernelProxy.aggregate_reduction_buffers(): asserts
#     ``isinstance(main_loop_kernel, self.vec_kernel_cls)``, and the main loop of a kernel with a
#     transposed access is a 2-D tile kernel: torch's CppTile2DKernel is a CppVecKernel, openreg's
#     tile kernel class (codegen/scheduling.py, a subclass for its integer division) was not one of
#     openreg's vector kernel class, so the backward of LayerNorm -> h @ h^T failed to compile
#     (AssertionError). It derives from both now (a class relationship, no patching).
#     Test: tests/test_codegen.py::TestTiledKernels::test_tile_with_a_reduction.
# 23. torch/_inductor/codegen/cpp.py, CppKernel.codegen_conditions(): the scalar block for a 2-D
#     tile's tail rows is narrowed to one pass over the columns only when ``type(self) is
#     CppKernel``; openreg's scalar kernel class (a subclass) got ``x1 < <columns>``, so the block
#     ran once per tile of columns, and an in-place update was applied that many times to those
#     rows (with ``cpp.enable_loop_tail_vec=False``; with the default the repeated stores write the
#     same values). openreg's class runs that method as a CppKernel (codegen/scheduling.py).
#     Test: tests/test_codegen.py::TestTiledKernels::test_the_tail_rows_of_a_tile_run_once.
# 24. torch/_inductor/lowering.py, where(): a 0-dim CPU view (``cpu_vector[i]``) next to openreg
#     tensors becomes a CPU scalar buffer (``maybe_copy_cpu_scalar``) only in the lowerings that
#     promote types (``transform_args``); ``where`` broadcasts its arguments itself, so the view
#     reached openreg's kernel as the whole CPU vector, which the launcher refuses ("openreg kernel
#     argument ... is a CPU tensor of 4 elements"): ``torch.where(x > 0, v[1], x)``, and
#     ``masked_fill``, which decomposes to it, failed to compile where CPU Inductor and eager run
#     them. The lowering copies such views first when an argument is on openreg. (``lerp`` with such
#     a weight is still refused: its decomposition computes a CPU value from the view inside the
#     graph, which no lowering copies; compiler.md.)
#     Test: tests/test_codegen.py::TestMixedDevices::test_a_cpu_scalar_view_in_where.
def _where_copies_cpu_scalars(original, maybe_copy_cpu_scalar, tensor_box):
    @functools.wraps(original)
    def where(*args, **kwargs):
        boxes = [a for a in args if isinstance(a, tensor_box)]
        target = next((d for d in (b.get_device() for b in boxes) if d is not None and d.type == DEVICE), None)
        if target is not None:
            args = tuple(maybe_copy_cpu_scalar(a, target) if isinstance(a, tensor_box) else a for a in args)
        return original(*args, **kwargs)

    return where


# 26. torch/_inductor/codegen/wrapper.py, buffer_reuse_key(): the key that pairs a freed buffer with
#     a later allocation (AllocateLine/FreeIfNotReusedLine.plan) holds the buffer's stream as
#     ``Scheduler.get_buf_stream`` gives it, through ``mutation_renames``; Dynamo orders a join
#     (``cur.wait_stream(s)``) by having ``streams.wait_stream`` "mutate" the buffers it orders, so a
#     buffer made and last read on one stream was keyed as the other's. In a fork/join region the
#     current stream's freed temporary became ``buf6 = buf4  # reuse`` inside ``with stream1:``, and
#     s wrote into it while the current stream's kernel was still to read it (hunt32a: 9 to 25 wrong
#     results of 30 calls; none with allow_buffer_reuse=False). CUDA's streams take the same path.
#     An openreg buffer of a graph with user streams is keyed by the stream it was allocated on
#     (``codegen/wrapper.py::_home_stream``), so a block is reused on its own stream only.
#     Test: tests/test_streams.py::TestCrossStreamBuffers::test_a_temporary_is_not_reused_across_a_join.
def _buffer_reuse_key(original):
    @functools.wraps(original)
    def buffer_reuse_key(node):
        key = original(node)
        from torch._inductor.virtualized import V

        scheduler = V.graph.scheduler
        if key[0].type != DEVICE or not scheduler._has_multi_stream_nodes():
            return key
        from .codegen.wrapper import _home_stream

        return (*key[:-1], _home_stream(node.get_name(), scheduler))

    return buffer_reuse_key


# 21. torch/utils/_config_module.py, ConfigModule.__setattr__(): an assignment to an Inductor option
#     is a user override held in a ContextVar, so it holds in the assigning thread only (a new
#     thread starts without it). The graph policy graphs.install() assigned at import then held in
#     the importing thread only: mode="reduce-overhead" in any other thread ran without openreg
#     graphs, and without a warning. The policy becomes the option's default, which every thread
#     reads (each gets its own copy: torch deep-copies a default that is not immutable).
#     Test: tests/test_reduce_overhead.py::TestReplay::test_graphs_in_another_thread.
def set_inductor_default(name: str, value) -> None:
    from torch._inductor import config

    config._config[name].default = value


_applied = False
_applied_dynamo = False


def apply() -> None:
    """Installs workarounds 1-4, 6-11, 13, 14, 16 and 26 (5 and 12 are in the wrapper classes; 15 is a source fix
    that OpenRegScheduling.define_kernel applies to each kernel). Idempotent."""
    global _applied
    if _applied:
        return
    if _version() != SUPPORTED:
        raise RuntimeError(
            f"openreg-inductor's workarounds are for torch {SUPPORTED[0]}.{SUPPORTED[1]}, "
            f"not {torch.__version__}: review openreg_inductor/_torch213.py"
        )
    # Inductor in its own import order first: codegen.cpp_template imported on its own is circular.
    importlib.import_module("torch._inductor.compile_fx")
    import torch._inductor.autotune_process as autotune_process
    import torch._inductor.codecache as codecache
    import torch._inductor.codegen.common as common
    import torch._inductor.codegen.cpp_template as cpp_template
    import torch._inductor.codegen.cpp_template_kernel as cpp_template_kernel
    import torch._inductor.codegen.wrapper as wrapper
    import torch._inductor.ir as ir
    import torch._inductor.kernel.mm_common as mm_common
    import torch._inductor.lowering as lowering
    import torch._inductor.scheduler as scheduler
    import torch._inductor.select_algorithm as select_algorithm
    import torch._inductor.utils as utils

    from . import autotune

    backend = functools.partial(_get_current_backend, utils.get_current_backend)
    # Modules that did ``from ..utils import get_current_backend`` hold their own reference.
    for module in (utils, common, scheduler, mm_common):
        module.get_current_backend = backend
    scheduler.BaseSchedulerNode.is_cpu = _is_cpu
    lowering.is_gpu = functools.partial(_lowering_is_gpu, utils.is_gpu)
    scheduler.device_need_guard = functools.partial(_device_need_guard, utils.device_need_guard)
    lowering.use_two_step_variance = functools.partial(_use_two_step_variance, lowering.use_two_step_variance)
    lowering._make_reduction_inner = functools.partial(_make_reduction_inner, lowering._make_reduction_inner)
    utils._use_template_for_cpu = functools.partial(_use_template_for_cpu, utils._use_template_for_cpu)
    autotune_process.is_gpu = functools.partial(_autotune_is_gpu, utils.is_gpu)
    cpp_template.CppBenchmarkRequest = autotune.benchmark_request
    selector = select_algorithm.AlgorithmSelectorCache
    selector.__call__ = _selector_call(selector.__call__)
    ir.is_cpu = functools.partial(_ir_is_cpu, ir.is_cpu, ir.get_device_type)
    # AllocateLine/FreeIfNotReusedLine and the scheduler look it up in the module at each call.
    wrapper.buffer_reuse_key = _buffer_reuse_key(wrapper.buffer_reuse_key)
    codecache.FxGraphHashDetails.__init__ = _hash_details_init(codecache.FxGraphHashDetails.__init__)
    template_kernel = cpp_template_kernel.CppTemplateKernel
    template_kernel.store_output = _store_output(template_kernel.store_output)
    where = _where_copies_cpu_scalars(lowering.where, lowering.maybe_copy_cpu_scalar, lowering.TensorBox)
    for key, fn in list(lowering.lowerings.items()):  # aten.where and its overloads
        if fn is lowering.where:
            lowering.lowerings[key] = where
    _applied = True


def apply_dynamo() -> None:
    """Installs workarounds 17 to 20 and 25, Dynamo's: at Dynamo's import, because Dynamo traces a frame before
    Inductor (and ``apply()``) is first imported. Idempotent. On another torch it does nothing
    rather than fail Dynamo's import: only Inductor runs a region's streams apart, and ``apply()``
    refuses that torch at the first Inductor compile."""
    global _applied_dynamo
    if _applied_dynamo or _version() != SUPPORTED:
        return
    import torch._dynamo.variables.ctx_manager as dynamo_contexts
    import torch._dynamo.variables.streams as dynamo_streams
    import torch._subclasses.fake_tensor as fake_tensor

    state = dynamo_streams.SymbolicStreamState
    state.cur_stream = _cur_stream(state.cur_stream)
    state.cur_stream_id = _cur_stream_id(state.cur_stream_id)
    # AcceleratorDeviceIndexVariable inherits enter/exit from GenericDeviceVariable.
    device_context = dynamo_contexts.AcceleratorDeviceIndexVariable
    device_context.enter = _device_context_enter(dynamo_contexts.GenericDeviceVariable.enter)
    device_context.exit = _device_context_exit(dynamo_contexts.GenericDeviceVariable.exit)
    stream = dynamo_streams.StreamVariable
    stream.var_getattr = _stream_var_getattr(stream.var_getattr)
    stream.call_method = _query_breaks_the_graph(stream.call_method, lambda v: v.device)
    event = dynamo_streams.EventVariable
    event.call_method = _query_breaks_the_graph(event.call_method, lambda v: getattr(v.value, "device", None))
    fake_mode = fake_tensor.FakeTensorMode
    fake_mode._prep_args_for_hash = _prep_args_for_hash(
        fake_mode._prep_args_for_hash, fake_tensor.FakeTensor._normalize_fake_device
    )
    _applied_dynamo = True
