"""One benchmark command for openreg: the runtime (C++) and eager (PyTorch) measures, one table.

    python tools/bench/run.py [--quick] [--json PATH] [--plot PATH] [--only NAME ...] [--threads N] [--rounds N]
    python tools/bench/run.py --list

Columns: measure, openreg, CPU (reference), ratio, goal, met. ratio = openreg / CPU (times:
lower is better; bandwidths: higher is better); the launch latency has an absolute goal.

* runtime: libopenreg/tests/runtime_bench.cpp, built with CMake + Ninja into build/bench-runtime
  (see runtime_bench.py); run 3 times (once with --quick), medians across runs.
* eager: eager.py, openreg and CPU each in a process of its own, warm-up, interleaved repetitions,
  three rounds of fresh processes (one with --quick), medians over all repetitions.

--quick is a smoke run for CI (2-3 minutes on 2 cores, most of it the compile and scenario groups' cold
Inductor compiles, logged per group): fewer iterations and repetitions, and without the measures a
group names FULL_ONLY (listed at the end and in the JSON's left_out_of_quick); nothing is
asserted about speed. The exit code is 0 whether or not the goals are met (this is a report);
it is non-zero only when a measure could not be taken (build failure, crash, bad output) or an
output could not be written. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import collectives  # noqa: E402  (no torch here; its rank processes import it)
import compile_bench  # noqa: E402  (no torch here; its device processes import it)
import first_use  # noqa: E402  (no torch here; its device processes import it)
import onnx_bench  # noqa: E402  (no torch here; its device processes import it)
import quant as quant_bench  # noqa: E402  (no torch here; its device processes import it)
import runtime_bench  # noqa: E402  (no torch; eager is imported only when an eager measure runs)
import scenarios as scenario_bench  # noqa: E402  (no torch here; its device processes import it)

EAGER_IDS = (
    "alloc-free",
    "add-tiny",
    "add-16m",
    "add-16m-out",
    "matmul",
    "mlp-step",
    "gpt-step",
    "gpt-fwd-b1",
    "mlp-step-bf16",
)  # kept equal to [m.id for m in eager.MEASURES] (checked at run time)
GROUPS = {
    "runtime": runtime_bench.IDS,
    "eager": EAGER_IDS,
    "first-use": first_use.IDS,
    "onnx": onnx_bench.IDS,
    "quant": quant_bench.IDS,
    "compile": compile_bench.IDS,
    "collectives": collectives.IDS,
    "scenarios": scenario_bench.IDS,
}
ALL_IDS = (
    *runtime_bench.IDS,
    *EAGER_IDS,
    *first_use.IDS,
    *onnx_bench.IDS,
    *quant_bench.IDS,
    *compile_bench.IDS,
    *collectives.IDS,
    *scenario_bench.IDS,
)


def log(msg: str, end: str = "\n") -> None:
    print(msg, end=end, file=sys.stderr, flush=True)


# ---- formatting ----


def fmt_value(v: Optional[float], unit: str) -> str:
    if v is None:
        return "-"
    if unit == "us":
        if v >= 1e6:
            return f"{v / 1e6:.3g} s"
        if v >= 1e3:
            return f"{v / 1e3:.3g} ms"
        return f"{v:.3g} us"
    return f"{v:.3g} {unit}"


def fmt_ratio(r: Optional[float]) -> str:
    if r is None:
        return "-"
    return f"{r:.3f}x" if r < 10 else f"{r:.1f}x"


def goal_text(spec: Optional[Dict], unit: str, group: str) -> str:
    if spec is None:
        return "report" if group == "runtime" else "n/a"
    if spec["on"] == "ratio":
        return f"{spec['op']} {spec['value']:.2f}x"
    return f"{spec['op']} {fmt_value(spec['value'], unit)}"


def met_text(row: Dict) -> str:
    if row["status"] == "not supported yet":
        return f"not supported yet ({row['error_type']})"
    if row["status"] == "error":
        return f"ERROR ({row['error_type']})"
    return {True: "yes", False: "NO", None: "-"}[row["met"]]


def table(rows: List[Dict]) -> str:
    header = ("measure", "openreg", "CPU (reference)", "ratio", "goal", "met")
    body = [
        (
            f"{r['group']}: {r['measure']}",
            fmt_value(r["openreg"], r["unit"]),
            fmt_value(r["cpu"], r["unit"]),
            fmt_ratio(r["ratio"]),
            r["goal"],
            met_text(r),
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]
    right = {1, 2, 3}  # numbers right-aligned

    def line(cells):
        cells = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return "  ".join(cells).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])


# ---- environment ----


def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> Optional[str]:
    try:
        proc = subprocess.run(["git", *args], cwd=runtime_bench.REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _loadavg() -> Optional[List[float]]:
    try:
        return list(os.getloadavg())
    except (AttributeError, OSError):
        return None


class BackgroundLoad:
    """CPU time used by other processes while the benchmark ran, in CPUs (Linux: /proc/stat minus
    this process and its children). The load average can't tell: the benchmark itself is load."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> Optional[tuple]:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        busy = sum(fields[:8]) - fields[3] - fields[4]  # user..steal, minus idle and iowait
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return busy / os.sysconf("SC_CLK_TCK"), own, time.monotonic()

    def cpus(self) -> Optional[float]:
        end = self._sample()
        if self.start is None or end is None or end[2] <= self.start[2]:
            return None
        busy, own, wall = (e - s for e, s in zip(end, self.start))
        return max(0.0, (busy - own) / wall)


def environment(args: argparse.Namespace) -> Dict:
    cpu_model = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": _version("torch"),
        "openreg_version": _version("openreg-core"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": cpu_model or platform.processor() or None,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if _git("rev-parse", "HEAD") is None else bool(_git("status", "--porcelain")),
        "openreg_env": {k: v for k, v in os.environ.items() if k.startswith("OPENREG_")},
        "quick": args.quick,
        "only": args.only,
        "loadavg_start": _loadavg(),
    }


# ---- measures ----


def _error_row(group: str, id_: str, measure: str, status: str, exc: BaseException) -> Dict:
    return {
        "id": id_,
        "group": group,
        "measure": measure,
        "openreg": None,
        "cpu": None,
        "unit": "us",
        "ratio": None,
        "goal_spec": None,
        "met": None,
        "status": status,
        "error_type": getattr(exc, "type_name", type(exc).__name__),  # eager.DeviceError: the original type
        "error": str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__,
    }


def run_runtime(ids: List[str], quick: bool) -> List[Dict]:
    log("[runtime] building and running openreg_runtime_bench ...")
    try:
        rows = runtime_bench.run(quick, log=lambda s: log(f"[runtime] {s}"))
    except Exception as e:
        log(f"[runtime] failed: {e}")
        return [_error_row("runtime", i, i, "error", e) for i in ids]
    out = []
    for row in rows:
        if row["id"] in ids:
            row.update(group="runtime", status="ok")
            out.append(row)
            log(f"[runtime] {row['measure']}: {fmt_value(row['openreg'], row['unit'])}")
    return out


def run_eager(ids: List[str], quick: bool, rounds: Optional[int], threads: Optional[int], env: Dict) -> List[Dict]:
    try:
        import eager
    except Exception as e:
        # e.g. a broken openreg-core install: torch's backend autoload raises at `import torch`.
        cause = e.__cause__ if isinstance(e.__cause__, Exception) else e
        log(f"[eager] cannot import torch with openreg: {type(e).__name__}: {e} (cause: {cause})")
        traceback.print_exc(file=sys.stderr)
        return [_error_row("eager", i, i, "error", cause) for i in ids]
    if [m.id for m in eager.MEASURES] != list(EAGER_IDS):
        raise RuntimeError("run.EAGER_IDS is out of date with eager.MEASURES")
    measures = [m for m in eager.MEASURES if m.id in ids]
    results, info = eager.run(measures, quick=quick, rounds=rounds, threads=threads, log=log)
    env.update(info)
    out = []
    for m, r in results:
        if isinstance(r, eager.Unsupported):
            row = _error_row("eager", m.id, m.name, "not supported yet", r.cause)
        elif isinstance(r, BaseException):
            row = _error_row("eager", m.id, m.name, "error", r)
            if not isinstance(r, eager.DeviceError):
                traceback.print_exception(type(r), r, r.__traceback__, file=sys.stderr)
        else:
            row = {
                "id": m.id,
                "group": "eager",
                "measure": m.name,
                "openreg": r["openreg_s"] * 1e6,
                "cpu": r["cpu_s"] * 1e6,
                "unit": "us",
                "ratio": r["ratio"],
                "goal_spec": None if m.goal is None else {"on": "ratio", "op": "<=", "value": m.goal},
                "met": r["met"],
                "status": "ok",
                "details": {
                    "iters": r["iters"],
                    "reps": r["reps"],
                    "rounds": r["rounds"],
                    "samples_us": {d: [s * 1e6 for s in v] for d, v in r["samples_s"].items()},
                },
            }
        if m.goal is not None and row["status"] != "ok":
            row["goal_spec"] = {"on": "ratio", "op": "<=", "value": m.goal}
        out.append(row)
    return out


# The plugin and process-based groups: each module has IDS and run(ids, quick, log) -> rows.
MODULE_GROUPS = {
    "first-use": first_use,
    "onnx": onnx_bench,
    "quant": quant_bench,
    "compile": compile_bench,
    "collectives": collectives,
    "scenarios": scenario_bench,
}


def _measure_name(module, id_: str) -> str:
    return module.NAMES[id_] if hasattr(module, "NAMES") else module._name(id_)


def run_module_group(group: str, ids: List[str], quick: bool) -> List[Dict]:
    """One group's rows; a group that fails as a whole gives an error row per measure."""
    module = MODULE_GROUPS[group]
    try:
        return module.run(ids, quick, log=log)
    except Exception as e:
        log(f"[{group}] failed: {e}")
        return [_error_row(group, i, _measure_name(module, i), "error", e) for i in ids]


# ---- outputs ----


def write_plot(rows: List[Dict], path: Path, env: Dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (matplotlib.ticker below)

    bars = []  # (label, value, goal, colour, text)
    for r in rows:
        spec = r["goal_spec"]
        label = f"{r['group']}: {r['measure']}"
        if r["status"] != "ok":
            bars.append((label, None, spec["value"] if spec and spec["on"] == "ratio" else None, "grey", r["status"]))
            continue
        if spec and spec["on"] == "openreg":  # absolute goal: plot value / goal against 1
            value, goal = r["openreg"] / spec["value"], 1.0
            text = f"{fmt_value(r['openreg'], r['unit'])} (/ goal {fmt_value(spec['value'], r['unit'])})"
        elif r["ratio"] is not None:
            value, goal = r["ratio"], spec["value"] if spec else None
            text = fmt_ratio(r["ratio"])
        else:
            continue
        colour = "tab:grey" if r["met"] is None else ("tab:green" if r["met"] else "tab:red")
        bars.append((label, value, goal, colour, text))

    fig, ax = plt.subplots(figsize=(10, 0.5 * len(bars) + 1.8))
    ys = range(len(bars))
    values = [b[1] for b in bars if b[1] is not None]
    floor = min([*values, *(b[2] for b in bars if b[2]), 1.0]) / 2
    for y, (label, value, goal, colour, text) in zip(ys, bars):
        if value is not None:
            ax.barh(y, value, left=0, color=colour, height=0.6)
        if goal is not None:
            ax.plot([goal, goal], [y - 0.4, y + 0.4], color="black", linewidth=2)
        ax.text(value if value is not None else floor * 1.05, y, f" {text}", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(floor, max([*values, *(b[2] for b in bars if b[2]), 1.0]) * 2)
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks(list(ys), [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="grey", linewidth=0.5, linestyle=":")
    ax.set_xlabel("openreg / CPU, latency: openreg / goal (black tick: goal; times: lower is better, GB/s: higher)")
    ax.set_title(
        f"openreg benchmarks {env['date']} - torch {env['torch_version']}, openreg {env['openreg_version']}"
        f"{' (quick)' if env['quick'] else ''}",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer iterations (CI)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write rows and environment as JSON")
    parser.add_argument("--plot", type=Path, metavar="PATH", help="write a PNG bar chart (needs matplotlib)")
    parser.add_argument(
        "--only", nargs="+", metavar="NAME", help=f"measures or groups to run: {', '.join([*GROUPS, *ALL_IDS])}"
    )
    parser.add_argument("--threads", type=int, metavar="N", help="torch.set_num_threads(N) for the eager measures")
    parser.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help="eager measures: rounds of fresh device processes (default 3; --quick: 1)",
    )
    parser.add_argument("--list", action="store_true", help="list the measure names and exit")
    args = parser.parse_args(argv)

    if args.list:
        for group, ids in GROUPS.items():
            print(f"{group}: {' '.join(ids)}")
        return 0
    selected = set()
    for name in args.only or list(GROUPS):
        if name in GROUPS:
            selected.update(GROUPS[name])
        elif name in ALL_IDS:
            selected.add(name)
        else:
            parser.error(f"unknown measure {name!r}; choose from {', '.join([*GROUPS, *ALL_IDS])}")
    # A smoke run leaves out the measures whose cost it should not pay (a group module's FULL_ONLY).
    left_out = []
    if args.quick:
        left_out = [i for m in MODULE_GROUPS.values() for i in getattr(m, "FULL_ONLY", ()) if i in selected]
        selected.difference_update(left_out)

    env = environment(args)
    env["left_out_of_quick"] = left_out
    background = BackgroundLoad()
    t0 = time.perf_counter()
    rows: List[Dict] = []
    runtime_ids = [i for i in runtime_bench.IDS if i in selected]
    eager_ids = [i for i in EAGER_IDS if i in selected]
    group_times: Dict[str, float] = {}  # wall time per group (where a run's time goes)

    def timed_group(group: str, fn, *fn_args) -> List[Dict]:
        start = time.perf_counter()
        out = fn(*fn_args)
        group_times[group] = round(time.perf_counter() - start, 2)
        log(f"[{group}] group done in {group_times[group]:.1f} s")
        return out

    if runtime_ids:
        rows += timed_group("runtime", run_runtime, runtime_ids, args.quick)
    if eager_ids:
        rows += timed_group("eager", run_eager, eager_ids, args.quick, args.rounds, args.threads, env)
        env["openreg_version"] = getattr(sys.modules.get("torch_openreg"), "__version__", env["openreg_version"])
    for group, module in MODULE_GROUPS.items():
        group_ids = [i for i in module.IDS if i in selected]
        if group_ids:
            rows += timed_group(group, run_module_group, group, group_ids, args.quick)
    for r in rows:
        r["goal"] = goal_text(r["goal_spec"], r["unit"], r["group"])
    env["loadavg_end"] = _loadavg()
    other = background.cpus()
    env["background_cpus"] = None if other is None else round(other, 2)
    env["wall_time_s"] = round(time.perf_counter() - t0, 2)
    env["group_wall_time_s"] = group_times

    print(table(rows))
    graded = [r for r in rows if r["met"] is not None]
    errors = [r for r in rows if r["status"] == "error"]
    print(
        f"\ngoals met: {sum(r['met'] for r in graded)}/{len(graded)}"
        f"; not supported yet: {sum(r['status'] == 'not supported yet' for r in rows)}"
        f"; errors: {len(errors)}; wall time {env['wall_time_s']:.1f} s"
    )
    for r in rows:
        if r["status"] != "ok":
            print(f"  {r['id']}: {r['status']}: {r['error']}")
    if left_out:
        print(f"  left out of --quick (full runs only): {', '.join(left_out)}")
    lat = next((r for r in rows if r["id"] == "launch-latency" and r["status"] == "ok"), None)
    if lat:
        d = lat["details"]
        print(
            f"  launch latency: per-run medians {d['per_run_median_us']} us, p90 {d.get('launch_latency_us_p90')} us,"
            f" enqueue {d.get('launch_enqueue_us')} us, OPENREG_SPIN_US {d.get('spin_us')},"
            f" OPENREG_WAIT_SPIN_US {d.get('wait_spin_us')}"
        )
    if other is not None and other > 0.2:
        print(
            f"  note: other processes used {other:.2f} of {env['cpu_count']} CPUs during the run;"
            " the timings are unreliable (spinning threads and thread pools suffer most)"
        )

    status = 1 if errors else 0
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"environment": env, "rows": rows}, indent=2) + "\n")
        log(f"wrote {args.json}")
    if args.plot:
        try:
            write_plot(rows, args.plot, env)
            log(f"wrote {args.plot}")
        except ImportError as e:
            log(f"--plot needs matplotlib ({e}): pip install matplotlib")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
