"""occl's flight recorder: PyTorch's FlightRecorder template over the points of each collective's
kernel on its comm stream (openreg_distributed.flight_recorder), in torch's dump formats."""

import time

import torch
import torch.distributed as dist
from conftest import OcclTestCase
from openreg_distributed import flight_recorder
from torch.testing._internal.common_utils import run_tests
from torch_openreg.utils.testing import StreamHold


def entries_of(group, dump):
    return [e for e in dump.get("entries", []) if e["process_group"][0] == group.group_name]


def retired(group, limit=30.0):
    """The group's entries once the watchdog has retired them all (it looks every 100 ms)."""
    t0 = time.monotonic()
    while True:
        mine = entries_of(group, flight_recorder.dump())
        if mine and all(e["retired"] for e in mine):
            return mine
        if time.monotonic() - t0 > limit:
            raise AssertionError(f"entries not retired: {mine}")
        time.sleep(0.05)


class TestFlightRecorder(OcclTestCase):
    def test_records_every_operation(self):
        group = dist.new_group(backend="occl")
        x = torch.ones(4, 2, device=self.device)
        dist.all_reduce(x, group=group)
        out = torch.empty(16, device=self.device)
        dist.all_gather_into_tensor(out, x.view(-1), group=group)
        if self.rank == 0:
            dist.send(x, 1, group=group)
        else:
            dist.recv(x, 0, group=group)
        torch.openreg.synchronize()
        mine = retired(group)
        p2p = "occl:send" if self.rank == 0 else "occl:recv"
        self.assertEqual([e["profiling_name"] for e in mine], ["occl:all_reduce", "occl:all_gather_into_tensor", p2p])
        self.assertEqual([e["collective_seq_id"] for e in mine], [1, 2, 2])
        self.assertEqual([e["p2p_seq_id"] for e in mine], [0, 0, 1])
        self.assertEqual([e["is_p2p"] for e in mine], [False, False, True])
        self.assertEqual([e["op_id"] for e in mine], [1, 2, 3])
        self.assertEqual({e["state"] for e in mine}, {"completed"})
        reduce = mine[0]
        self.assertEqual(reduce["input_sizes"], [[4, 2]])
        self.assertEqual(reduce["output_sizes"], [[4, 2]])
        self.assertEqual(reduce["output_dtypes"], ["Float"])
        self.assertEqual(mine[1]["output_sizes"], [[16]])
        self.assertGreaterEqual(reduce["duration_ms"], 0.0)
        self.assertLessEqual(reduce["time_discovered_started_ns"], reduce["time_discovered_completed_ns"])
        # The Python stack of the call.
        self.assertIn("test_records_every_operation", [f["name"] for f in reduce["frames"]])
        # The group's ranks and status.
        dump = flight_recorder.dump(include_stack_traces=False)
        self.assertEqual(dump["pg_config"][group.group_name]["ranks"], "[0, 1]")
        self.assertIn(3, [s["last_completed_collective"] for s in dump["pg_status"].values()])
        # The JSON form has the same entries (without stacks).
        names = [e["profiling_name"] for e in entries_of(group, flight_recorder.dump_json())]
        self.assertEqual(names, ["occl:all_reduce", "occl:all_gather_into_tensor", p2p])
        dist.destroy_process_group(group)

    def test_a_premul_sum_device_factor_is_not_recorded_as_an_input(self):
        # The device factor of PREMUL_SUM is kept alive with the operation's inputs, and was recorded
        # in their place: an in-place all_reduce read input_sizes [[]], the factor's, on every rank,
        # which hid any real mismatch of sizes between ranks (hunt35a F2).
        group = dist.new_group(backend="occl")
        factor = torch.tensor(0.5, device=self.device)
        x = torch.ones(4, 3, device=self.device)
        dist.all_reduce(x, op=dist._make_nccl_premul_sum(factor), group=group)
        out = torch.empty(4, device=self.device)
        ins = [torch.ones(4, device=self.device) for _ in range(self.world_size)]
        dist.reduce_scatter(out, ins, op=dist._make_nccl_premul_sum(factor), group=group)
        torch.openreg.synchronize()
        self.assertEqual(x.cpu(), torch.ones(4, 3))  # 2 ranks x 0.5
        self.assertEqual(out.cpu(), torch.ones(4))
        mine = retired(group)
        self.assertEqual([e["profiling_name"] for e in mine], ["occl:all_reduce", "occl:reduce_scatter"])
        self.assertEqual([e["input_sizes"] for e in mine], [[[4, 3]], [[4]] * self.world_size])
        self.assertEqual([e["output_sizes"] for e in mine], [[[4, 3]], [[4]]])
        dist.destroy_process_group(group)

    def test_operation_in_flight_is_active(self):
        group = dist.new_group(backend="occl")
        x = torch.ones(4, device=self.device)
        if self.rank == 0:
            with StreamHold(self.device.index):  # the collective waits for compute that is still running
                dist.all_reduce(x, group=group)
                active = entries_of(group, flight_recorder.dump(only_active=True))
                self.assertEqual(
                    [(e["profiling_name"], e["state"]) for e in active], [("occl:all_reduce", "scheduled")]
                )
        else:
            dist.all_reduce(x, group=group)
        self.assertEqual(x.cpu(), torch.full((4,), 2.0))
        self.assertEqual(entries_of(group, flight_recorder.dump(only_active=True)), [])
        self.assertEqual([e["state"] for e in retired(group)], ["completed"])
        dist.destroy_process_group(group)


if __name__ == "__main__":
    run_tests()
