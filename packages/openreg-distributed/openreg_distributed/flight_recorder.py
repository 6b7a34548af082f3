"""occl's flight recorder: the last operations of every occl group in this process.

PyTorch's ``c10d::FlightRecorder`` template, instantiated by occl over the start and end points of
each collective's kernel on its comm stream (``csrc/Trace.hpp``). Every occl operation is recorded
when it is enqueued (with the Python stack of the call), marked started and completed by its
kernel, and retired by the group's watchdog. ``TORCH_FR_BUFFER_SIZE`` (or
``TORCH_NCCL_TRACE_BUFFER_SIZE``) sets how many entries are kept (2000; 0 turns it off), as for
NCCL.

torch 2.13's ``torch._C._distributed_c10d._dump_fr_trace()`` reads an instance inside libtorch
that extensions cannot reach (it shows the Gloo transport's CPU operations, not occl's): use these
functions. The formats are torch's (``version`` 2.10: ``entries``, ``pg_config``, ``pg_status``),
so torch's trace analyser (``python -m torch.distributed.flight_recorder.fr_trace``) reads the
pickled dumps.
"""

from __future__ import annotations

import json
import pickle
from typing import Any, Dict

__all__ = ["dump", "dump_json", "dump_bytes"]


def dump_bytes(include_collectives: bool = True, include_stack_traces: bool = True, only_active: bool = False) -> bytes:
    """The pickled dump, as torch's ``_dump_fr_trace`` returns it."""
    from . import _C

    return _C._dump_flight_recorder(include_collectives, include_stack_traces, only_active)


def dump(include_collectives: bool = True, include_stack_traces: bool = True, only_active: bool = False) -> Dict:
    """The dump as a dict: ``entries`` (one per operation: ``profiling_name`` like
    ``occl:all_reduce``, ``collective_seq_id``, ``state`` scheduled/started/completed,
    ``input_sizes``, ``duration_ms``, ``frames`` ...), ``pg_config`` and ``pg_status``."""
    return pickle.loads(dump_bytes(include_collectives, include_stack_traces, only_active))


def dump_json(include_collectives: bool = True, only_active: bool = False) -> Dict[str, Any]:
    """The JSON dump (no stack traces), parsed."""
    from . import _C

    return json.loads(_C._dump_flight_recorder_json(include_collectives, only_active))
