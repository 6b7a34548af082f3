"""Smoke tests of the benchmark command (tools/bench/run.py): structure only, no timing assertions.

pytest tools/bench/test_bench_cli.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parent / "run.py"
ROW_KEYS = {"measure", "openreg", "cpu", "ratio", "goal", "met"}
ENV_KEYS = {"torch_version", "openreg_version", "cpu_count", "date"}
CHEAP = "alloc-free"  # an eager measure that takes well under a second


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUN), *args], capture_output=True, text=True, timeout=timeout)


def test_quick_json_structure_and_plot(tmp_path: Path):
    """--json writes rows and environment; --plot writes a PNG (the bench session installs matplotlib)."""
    out = tmp_path / "nested" / "bench.json"  # the parent directory is created
    png = tmp_path / "bench.png"
    proc = _run("--quick", "--json", str(out), "--plot", str(png), "--only", CHEAP)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(out.read_text())

    env = data["environment"]
    assert ENV_KEYS <= set(env), sorted(env)
    assert env["torch_version"] and env["openreg_version"]
    assert isinstance(env["cpu_count"], int) and env["cpu_count"] >= 1
    assert env["quick"] is True

    rows = data["rows"]
    assert [r["id"] for r in rows] == [CHEAP]
    (row,) = rows
    assert ROW_KEYS <= set(row), sorted(row)
    assert row["status"] == "ok"
    for key in ("openreg", "cpu", "ratio"):
        assert isinstance(row[key], float) and row[key] > 0, (key, row[key])
    assert isinstance(row["goal"], str) and row["goal"]
    assert isinstance(row["met"], bool)
    assert row["details"]["rounds"] == 1 and row["details"]["reps"] == 3  # --quick: one round of 3 repetitions
    # The table on stdout has the documented columns and the row.
    header = proc.stdout.splitlines()[0].split()
    assert header[:2] == ["measure", "openreg"] and header[-3:] == ["ratio", "goal", "met"]
    assert row["measure"] in proc.stdout


def test_quick_leaves_out_full_only_measures(tmp_path: Path):
    """A measure a group keeps for full runs (compile_bench.FULL_ONLY) is not taken by --quick, and the
    run says so on stdout and in the JSON; the rest of the selection runs."""
    out = tmp_path / "bench.json"
    proc = _run("--quick", "--json", str(out), "--only", "compile-gpt-step", CHEAP)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    data = json.loads(out.read_text())
    assert [r["id"] for r in data["rows"]] == [CHEAP]
    assert data["environment"]["left_out_of_quick"] == ["compile-gpt-step"]
    assert "left out of --quick (full runs only): compile-gpt-step" in proc.stdout
    assert "[compile]" not in proc.stderr  # the group had nothing left to run: no processes started


def test_unknown_measure_is_an_error():
    proc = _run("--only", "no-such-measure", timeout=60)
    assert proc.returncode == 2
    assert "unknown measure" in proc.stderr


def test_list():
    proc = _run("--list", timeout=60)
    assert proc.returncode == 0
    assert CHEAP in proc.stdout and "launch-latency" in proc.stdout


def test_runtime_output_parsing():
    """The parser of the C++ benchmark's output fails clearly when a key it needs is missing."""
    sys.path.insert(0, str(RUN.parent))
    import runtime_bench

    good = {k: 1.5 for k in runtime_bench.REQUIRED_KEYS}
    assert runtime_bench.parse_output("noise\n" + json.dumps(good) + "\n") == good
    rows = runtime_bench.rows([good, good])
    assert [r["id"] for r in rows] == list(runtime_bench.IDS)
    assert all(ROW_KEYS - {"goal"} <= set(r) for r in rows)

    bad = dict(good)
    del bad["h2d_pinned_gbps"]
    with pytest.raises(runtime_bench.BenchError, match="h2d_pinned_gbps"):
        runtime_bench.parse_output(json.dumps(bad))
    with pytest.raises(runtime_bench.BenchError, match="no JSON"):
        runtime_bench.parse_output("usage: ...")


def test_device_processes_report_errors_and_stay_usable():
    """Each device runs in a process of its own (eager.DeviceProcess): an exception in a workload comes
    back as a DeviceError naming its type, and the process goes on serving."""
    sys.path.insert(0, str(RUN.parent))
    import eager

    with eager.Processes() as procs:
        cpu = procs["cpu"]
        assert cpu.info["ready"] == "cpu" and cpu.info["torch_num_threads"] >= 1
        with pytest.raises(eager.DeviceError, match="KeyError") as err:
            cpu.call(op="setup", id="no-such-measure", warmup=1)
        assert err.value.type_name == "KeyError"
        with pytest.raises(eager.DeviceError, match="RuntimeError: no measure is set up"):
            cpu.call(op="rep", iters=1)  # the failed setup left none
        assert cpu.call(op="setup", id=CHEAP, warmup=1) == {"ok": True}
        assert cpu.call(op="rep", iters=3)["s"] > 0
        assert procs["cpu"] is cpu  # still the same process
        cpu.proc.kill()
        cpu.proc.wait()
        with pytest.raises(RuntimeError, match="the cpu benchmark process exited with code"):
            cpu.call(op="rep", iters=1)
        assert procs["cpu"] is not cpu  # a dead process is replaced
        assert procs["cpu"].call(op="setup", id=CHEAP, warmup=1) == {"ok": True}
