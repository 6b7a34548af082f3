"""Collective benchmarks (openreg-distributed, backend occl), nccl-tests style, 2 ranks on loopback.

Both ranks run this file (--serve RANK) in one ``cpu:gloo,openreg:occl`` group, so every size is
measured three ways in the same processes, their repetitions interleaved (in alternating order, so
that a slow phase of the shared machine weighs on each alike):

- occl: openreg tensors, the collective as a kernel on the comm stream over kernel views (the
  openreg column);
- Gloo on CPU tensors: the reference (the CPU column);
- copy-through: what a backend without kernel views would do: D2H copy, Gloo on the CPU copy, H2D
  copy back (in the details, and as its own row at 16 MiB).

Per collective and size: time (median over repetitions of a batch of operations, each batch ended by
a device synchronisation), algbw = bytes / time and busbw = algbw x nccl-tests' factor (allreduce
2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, send/recv 1), and the number
of wrong results (checked once per size against hand-computed values). Goals: busbw >= 0.9x Gloo's
from 1 MiB up (time ratio <= 1.11x), small-message latency <= 1.5x Gloo's, >= 1.5x copy-through's
busbw at 16 MiB (time ratio <= 0.67x). Sizes 8 B to 64 MiB. A row times the out-of-place form
(all_reduce and broadcast: in place, their only form); all_gather and reduce_scatter are also timed
in place (IN_PLACE, in the details), and their wrong-result count covers both forms.

    python tools/bench/collectives.py [--quick]     prints one dict per measure
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Callable, Dict, List

from rows import time_interleaved

OPS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv")
SIZES = {"8b": 8, "64k": 64 << 10, "1m": 1 << 20, "16m": 16 << 20, "64m": 64 << 20}
# The collectives whose torch API takes either form: the in-place one's input is the rank's slice of
# its output (all_gather) or its output the rank's slice of its input (reduce_scatter), as in
# nccl-tests. all_reduce and broadcast are in place only; all_to_all_single and send/recv out of place.
IN_PLACE = ("allgather", "reducescatter")
IDS = (*(f"coll-{op}-{s}" for op in OPS for s in SIZES), "coll-copythrough-allreduce-16m")
BUSBW = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}
WORLD = 2


def _name(id_: str) -> str:
    if id_ == "coll-copythrough-allreduce-16m":
        return "allreduce 16 MiB: occl vs copy-through (D2H, Gloo, H2D)"
    _, op, size = id_.split("-")
    return f"{op} {size.upper().replace('B', ' B').replace('K', ' KiB').replace('M', ' MiB')}"


def _goal(id_: str):
    if id_ == "coll-copythrough-allreduce-16m":
        return 1 / 1.5
    size = SIZES[id_.split("-")[2]]
    return 1 / 0.9 if size >= (1 << 20) else 1.5


def serve(rank: int, port: int, quick: bool) -> Dict:
    """One rank's measures (rank 0 prints them)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    torch.openreg.set_device(rank)
    dev = torch.device("openreg", rank)
    dist.init_process_group("cpu:gloo,openreg:occl", rank=rank, world_size=WORLD)
    peer = 1 - rank

    def make(op: str, nbytes: int, device, in_place: bool = False):
        n = max(nbytes // 4, WORLD)
        n -= n % WORLD
        x = torch.full((n,), float(rank + 1), device=device)
        if op == "allreduce":
            return lambda: dist.all_reduce(x), None, x
        if op == "allgather":
            out = torch.empty(n * WORLD, device=device)
            if in_place:
                x = out[rank * n : (rank + 1) * n]
                x.fill_(float(rank + 1))
            return lambda: dist.all_gather_into_tensor(out, x), None, (out, n)
        if op == "reducescatter":
            m = n // WORLD
            out = x[rank * m : (rank + 1) * m] if in_place else torch.empty(m, device=device)
            return lambda: dist.reduce_scatter_tensor(out, x), None, out
        if op == "alltoall":
            out = torch.empty(n, device=device)
            return lambda: dist.all_to_all_single(out, x), None, out
        if op == "broadcast":
            return lambda: dist.broadcast(x, src=0), None, x
        out = torch.empty(n, device=device)

        def sendrecv():
            # Both directions at once: each rank's send and receive overlap (send/recv streams).
            for w in (dist.isend(x, peer), dist.irecv(out, peer)):
                w.wait()

        return sendrecv, None, out

    def check(op: str, nbytes: int, device, in_place: bool = False) -> int:
        """Wrong elements after one operation from fresh inputs."""
        fn, _, res = make(op, nbytes, device, in_place)
        fn()
        if op == "allreduce":
            want = lambda t: torch.full_like(t, 3.0)  # noqa: E731
            got = res
        elif op == "allgather":
            got, n = res
            want = lambda t: torch.cat([torch.full((n,), 1.0), torch.full((n,), 2.0)])  # noqa: E731
        elif op == "reducescatter":
            got, want = res, lambda t: torch.full_like(t, 3.0)  # noqa: E731
        elif op == "alltoall":
            got = res
            half = got.numel() // 2
            want = lambda t: torch.cat([torch.full((half,), 1.0), torch.full((half,), 2.0)])  # noqa: E731
        elif op == "broadcast":
            got, want = res, lambda t: torch.full_like(t, 1.0)  # noqa: E731
        else:
            got, want = res, lambda t: torch.full_like(t, float(peer + 1))  # noqa: E731
        got = got.cpu()
        return int((got != want(got)).sum())

    def sync():
        torch.openreg.synchronize()

    def timed(fns: Dict[str, Callable[[], None]], iters: int, reps: int) -> Dict[str, float]:
        return time_interleaved(fns, sync, iters, reps, start=lambda: dist.barrier(group=cpu_group))

    cpu_group = dist.new_group(backend="gloo")
    out: Dict[str, Dict] = {}
    reps = 3 if quick else 7
    for op in OPS:
        for label, nbytes in SIZES.items():
            iters = max(1, min(50 if quick else 200, (4 << 20) // max(nbytes, 1) // (4 if quick else 1)))
            fns = {"occl_s": make(op, nbytes, dev)[0], "gloo_s": make(op, nbytes, "cpu")[0]}
            if op == "allreduce" and nbytes >= (1 << 20):
                x = torch.full((nbytes // 4,), float(rank + 1), device=dev)

                def copy_through():
                    h = x.cpu()
                    dist.all_reduce(h)
                    x.copy_(h)

                fns["copythrough_s"] = copy_through
            row = {**timed(fns, iters, reps), "iters": iters, "reps": reps, "bytes": nbytes}
            row["wrong"] = check(op, nbytes, dev)
            if op in IN_PLACE:
                in_place = {
                    "in_place_occl_s": make(op, nbytes, dev, in_place=True)[0],
                    "in_place_gloo_s": make(op, nbytes, "cpu", in_place=True)[0],
                }
                row.update(timed(in_place, iters, reps))
                row["wrong"] += check(op, nbytes, dev, in_place=True)
            out[f"coll-{op}-{label}"] = row
    dist.destroy_process_group()
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(ids: List[str], quick: bool, log: Callable[[str], None]) -> List[Dict]:
    """Rows for run.py (same keys as its eager rows)."""
    port = _free_port()
    log(f"[collectives] 2 ranks on 127.0.0.1:{port} ...")
    cmd = [sys.executable, os.path.abspath(__file__), "--port", str(port)] + (["--quick"] if quick else [])
    procs = [
        subprocess.Popen([*cmd, "--serve", str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(WORLD)
    ]
    outs = [p.communicate(timeout=1200) for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"rank process failed: {err.strip()[-500:]}")
    results = json.loads(outs[0][0].strip().splitlines()[-1])
    rows = []
    for id_ in ids:
        if id_ == "coll-copythrough-allreduce-16m":
            r = results["coll-allreduce-16m"]
            o, c = r["occl_s"], r["copythrough_s"]
        else:
            r = results[id_]
            o, c = r["occl_s"], r["gloo_s"]
        op = id_.split("-")[1] if id_ != "coll-copythrough-allreduce-16m" else "allreduce"
        factor = BUSBW[op](WORLD)
        details = {
            "iters": r["iters"],
            "reps": r["reps"],
            "bytes": r["bytes"],
            "wrong_results": r["wrong"],
            "algbw_GBps": {"occl": r["bytes"] / r["occl_s"] / 1e9, "gloo_cpu": r["bytes"] / r["gloo_s"] / 1e9},
        }
        if "copythrough_s" in r:
            details["algbw_GBps"]["copy_through"] = r["bytes"] / r["copythrough_s"] / 1e9
        if "in_place_occl_s" in r:
            details["in_place_time_us"] = {"occl": r["in_place_occl_s"] * 1e6, "gloo_cpu": r["in_place_gloo_s"] * 1e6}
            details["algbw_GBps"]["occl_in_place"] = r["bytes"] / r["in_place_occl_s"] / 1e9
            details["algbw_GBps"]["gloo_cpu_in_place"] = r["bytes"] / r["in_place_gloo_s"] / 1e9
        details["busbw_GBps"] = {k: v * factor for k, v in details["algbw_GBps"].items()}
        goal = _goal(id_)
        rows.append(
            {
                "id": id_,
                "group": "collectives",
                "measure": _name(id_),
                "openreg": o * 1e6,
                "cpu": c * 1e6,
                "unit": "us",
                "ratio": o / c,
                "goal_spec": {"on": "ratio", "op": "<=", "value": goal},
                # A wrong result fails the measure whatever its speed.
                "met": o / c <= goal and r["wrong"] == 0,
                "status": "ok",
                "details": details,
            }
        )
        ref = "copy-through" if id_ == "coll-copythrough-allreduce-16m" else "Gloo"
        log(
            f"[collectives] {_name(id_)}: occl {o * 1e6:.1f} us ({details['busbw_GBps']['occl']:.2f} GB/s busbw),"
            f" {ref} {c * 1e6:.1f} us, wrong {r['wrong']}"
        )
    return rows


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    if "--serve" in sys.argv:
        rank = int(sys.argv[sys.argv.index("--serve") + 1])
        result = serve(rank, int(sys.argv[sys.argv.index("--port") + 1]), quick)
        if rank == 0:
            print(json.dumps(result))
    else:
        for row in run(list(IDS), quick, log=lambda s: print(s, file=sys.stderr)):
            print(row)
