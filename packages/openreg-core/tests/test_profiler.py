"""Profiling openreg: device activity in torch.profiler through the Kineto child profiler
(csrc/profiler/OpenRegActivityProfiler.cpp) and the legacy event-based path
(csrc/profiler/OpenRegProfilerStubs.cpp)."""

import json
import os
import tempfile
import warnings

import torch
from conftest import run_python
from torch.profiler import ProfilerActivity, profile
from torch.testing._internal.common_utils import TestCase

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def _workload(a, side):
    b = a @ a  # default stream
    c = b + 1
    with torch.openreg.stream(side):
        side.wait_stream(torch.openreg.default_stream())
        d = c * 2  # a second stream
    torch.openreg.current_stream().wait_stream(side)
    return d.cpu()  # a device-to-host copy


class TestKinetoProfiler(TestCase):
    def setUp(self):
        self.a = torch.randn(512, 512, device="openreg")  # its mm far longer than its add, even on a loaded machine
        self.side = torch.openreg.Stream()
        _workload(self.a, self.side)  # first calls verify their meta kernels synchronously: not in the trace
        torch.openreg.synchronize()

    def tearDown(self):
        del self.a, self.side  # pytest keeps TestCase instances alive

    def _profile(self, activities):
        torch.add(self.a, 1)  # before the region: must not appear
        with profile(activities=activities) as prof:
            result = _workload(self.a, self.side)
        torch.add(self.a, 2)  # after the region: must not appear
        torch.openreg.synchronize()
        self.assertEqual(result, ((self.a.cpu() @ self.a.cpu()) + 1) * 2, atol=1e-3, rtol=1e-4)
        return prof

    def _trace(self, prof):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                return json.load(f)

    def test_device_activity_is_timed_and_attributed_to_its_op(self):
        # The matmul's kernel outlasts the add's, unless the stream's worker is preempted during the
        # add (a loaded CI machine: 2.6 ms for the add against 1.2 ms for the matmul): a few tries.
        times = []
        for _ in range(3):
            prof = self._profile([ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])
            device_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
            names = sorted(e.name for e in device_events)
            self.assertEqual(names, ["aten::add", "aten::mm", "aten::mul", "openreg::memcpy"])
            for e in device_events:
                self.assertGreater(e.time_range.elapsed_us(), 0, e.name)
            rows = {r.key: r for r in prof.key_averages()}
            for op in ("aten::mm", "aten::add", "aten::mul"):
                self.assertGreater(rows[op].self_device_time_total, 0, op)
                self.assertEqual(rows[op].count, 1, op)  # only the profiled region
            times.append((rows["aten::mm"].self_device_time_total, rows["aten::add"].self_device_time_total))
            if times[-1][0] > times[-1][1]:
                break
        self.assertGreater(*times[-1], msg=f"(mm, add) device times of each try: {times}")

    def test_chrome_trace_tracks_and_flows(self):
        trace = self._trace(self._profile([ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]))
        events = trace["traceEvents"]
        cpu_ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op"}
        device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
        self.assertEqual(len(device), 4)
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        for e in device:
            # On the track of its device and stream, correlated with the CPU op that launched it.
            self.assertEqual(e["pid"], 0)
            self.assertEqual(threads[(e["pid"], e["tid"])], e["args"]["stream"])
            launcher = cpu_ops[e["args"]["External id"]]
            self.assertEqual(launcher["name"], "aten::_copy_from" if e["cat"] == "gpu_memcpy" else e["name"])
            self.assertGreaterEqual(e["ts"], launcher["ts"])  # the device starts after the launch began
            self.assertGreater(e["dur"], 0)
        streams = {e["name"]: e["args"]["stream"] for e in device}
        self.assertEqual(streams["aten::mm"], "default stream")
        self.assertEqual(streams["aten::mul"], "stream 1")
        # Every device activity has a launch on the host thread, joined by a flow arrow.
        launches = [e for e in events if e.get("cat") == "privateuse1_runtime"]
        self.assertEqual(sorted(e["name"] for e in launches), ["orLaunchKernel"] * 3 + ["orMemcpyAsync"])
        flows = [e for e in events if e.get("cat") == "ac2g"]
        starts = {e["id"] for e in flows if e["ph"] == "s"}
        finishes = {e["id"] for e in flows if e["ph"] == "f"}
        self.assertEqual(starts, finishes)
        self.assertEqual(starts, {e["args"]["External id"] for e in device})

    def test_an_op_queuing_two_items_starts_one_flow(self):
        # A strided device-to-host copy queues a densifying kernel and a memcpy under one operator:
        # each item started a flow with the operator's id ("duplicate flow start" from Kineto).
        x = torch.randn(64, 32, device="openreg")
        x.t().cpu()
        torch.openreg.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            x.t().cpu()
        events = self._trace(prof)["traceEvents"]
        device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
        self.assertEqual(len(device), 2)
        self.assertEqual(len({e["args"]["External id"] for e in device}), 1)  # one operator
        flows = [e for e in events if e.get("cat") == "ac2g"]
        starts = [e["id"] for e in flows if e["ph"] == "s"]
        self.assertEqual(len(starts), len(set(starts)))
        self.assertEqual(set(starts), {e["args"]["External id"] for e in device})
        self.assertEqual(len([e for e in flows if e["ph"] == "f"]), 2)  # both items end the flow

    def test_trace_is_well_formed_for_perfetto(self):
        # Perfetto's JSON importer needs: a traceEvents list; complete events with numeric ts/dur
        # and pid/tid; flow start and finish events that pair up by id.
        trace = self._trace(self._profile([ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]))
        self.assertIsInstance(trace["traceEvents"], list)
        for e in trace["traceEvents"]:
            self.assertIn(e["ph"], {"X", "M", "s", "f", "i"}, e)
            if e["ph"] == "X":
                self.assertIsInstance(e["ts"], (int, float))
                self.assertIsInstance(e["dur"], (int, float))
                self.assertGreaterEqual(e["dur"], 0)
                self.assertIn("pid", e)
                self.assertIn("tid", e)

    def test_cpu_only_profile_has_no_device_rows(self):
        prof = self._profile([ProfilerActivity.CPU])
        self.assertFalse([e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1])
        self.assertEqual({e.name for e in prof.events()} & {"openreg::memcpy"}, set())

    def test_queued_work_stays_in_its_session(self):
        # Work nobody waits for (another device than the current one) still lands in the trace
        # of the session that launched it, not in the next one.
        b = torch.randn(256, 256, device="openreg:1")
        torch.mm(b, b)
        torch.openreg.synchronize(1)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as first:
            for _ in range(4):
                torch.mm(b, b)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as second:
            torch.add(self.a, 1)
        device = torch.autograd.DeviceType.PrivateUse1
        self.assertEqual([e.name for e in first.events() if e.device_type == device], ["aten::mm"] * 4)
        self.assertEqual([e.name for e in second.events() if e.device_type == device], ["aten::add"])

    def test_twice_in_a_row(self):
        for _ in range(2):
            prof = self._profile([ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
            self.assertEqual(len(kernels), 4)


class TestLegacyProfiler(TestCase):
    def test_use_device_openreg(self):
        a = torch.randn(128, 128, device="openreg")
        torch.mm(a, a)
        torch.openreg.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autograd.profiler.profile(use_device="openreg") as prof:
                torch.mm(a, a)
        self.assertFalse([str(w.message) for w in caught if "openreg" in str(w.message).lower()])
        [mm] = [e for e in prof.function_events if e.name == "aten::mm"]
        self.assertGreater(mm.device_time_total, 0)  # timed on the device with a pair of events
        self.assertGreater(prof.key_averages().self_cpu_time_total, 0)

    def test_capture_under_the_legacy_profiler(self):
        # Its timing events were recorded on the capturing stream, which refuses them and so
        # invalidated the capture; captured operators now get no device time, replays are timed.
        x = torch.randn(64, 64, device="openreg")
        side = torch.openreg.Stream()
        side.wait_stream(torch.openreg.current_stream())
        with torch.openreg.stream(side):
            x @ x  # warm up: a first call runs synchronously, which a capture refuses
        torch.openreg.synchronize()
        g = torch.accelerator.Graph()
        with torch.autograd.profiler.profile(use_device="openreg") as prof:
            with torch.openreg.stream(side):
                g.capture_begin()
                y = x @ x
                g.capture_end()
            x.mul_(2)
            g.replay()
            torch.openreg.synchronize()
        self.assertEqual(y.cpu(), (x @ x).cpu())  # the replay read the doubled x
        [captured] = [e for e in prof.function_events if e.name == "aten::mm"][:1]
        self.assertEqual(captured.device_time_total, 0)
        [mul] = [e for e in prof.function_events if e.name == "aten::mul_"]
        self.assertGreater(mul.device_time_total, 0)


class TestWithoutADevice(TestCase):
    def test_a_cpu_profile_with_the_default_activities(self):
        # torch lists openreg's activity whenever the backend is registered, and ends every profile
        # with torch.openreg.synchronize(): without a usable device a CPU-only profile failed there
        # ("No openreg device is available") and left the profiler's callbacks half removed.
        r = run_python(
            """
            import torch
            from torch.profiler import ProfilerActivity, profile
            print(torch.openreg.is_available(), ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities())
            with profile() as prof:
                torch.ones(8).sum()
            print(any(e.name == "aten::sum" for e in prof.events()))
            torch.openreg.synchronize()
            try:
                torch.openreg.synchronize(0)
            except RuntimeError as e:
                print(str(e).startswith("No openreg device is available"))
            """,
            env={"OPENREG_DEVICE_COUNT": "0"},
        )
        self.assertEqual(r.stdout.split(), ["False", "True", "True", "True"], r.stderr)
        self.assertNotIn("callback is not found", r.stderr)
