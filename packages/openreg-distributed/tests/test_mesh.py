"""DeviceMesh, DTensor, tensor parallel and FSDP2 over occl on 2 ranks, and a 2 x 2 mesh on 4, each
equal to its single-process reference on the device."""

import copy
import os
import shutil
import tempfile
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.tensor as dtensor
import torch.nn as nn
from conftest import OcclTestCase, loopback_interface, sgd_step
from openreg_distributed import OcclOptions, flight_recorder
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.testing._internal.common_utils import run_tests

BATCH = 8  # per rank


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def full_batch(step, device, ranks=2):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(ranks * BATCH, 8, generator=g).to(device), torch.randn(ranks * BATCH, 4, generator=g).to(device)


class FSDPTraining:
    """FSDP2 training against the single-process reference, for a class of any number of ranks
    (test_three_ranks.py uses it too)."""

    def fsdp_train(self, meta=False, **kwargs):
        mesh = init_device_mesh("openreg", (self.world_size,))
        ref = make_model().to(self.device)
        if meta:
            with torch.device("meta"):
                model = make_model()
        else:
            model = copy.deepcopy(ref)
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh, **kwargs)
        fully_shard(model, mesh=mesh, **kwargs)
        if meta:
            # Materialised on the device, then given the reference's values, shard by shard.
            model.to_empty(device=self.device)
            with torch.no_grad():
                for p, q in zip(model.parameters(), ref.parameters()):
                    p.copy_(distribute_tensor(q.detach(), p.device_mesh, p.placements))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        mine = slice(self.rank * BATCH, (self.rank + 1) * BATCH)
        for step in range(3):
            x, y = full_batch(step, self.device, self.world_size)
            sgd_step(model, opt, x[mine], y[mine])
            sgd_step(ref, ref_opt, x, y)
        return model, ref

    def assert_fsdp2_equals_full_batch_training(self):
        for reshard in (True, False):
            model, ref = self.fsdp_train(reshard_after_forward=reshard)
            for p, q in zip(model.parameters(), ref.parameters()):
                self.assertEqual(p.full_tensor().cpu(), q.detach().cpu(), atol=1e-5, rtol=1e-5)


class TestMesh(FSDPTraining, OcclTestCase):
    # The default group is "openreg:occl" (device_id alone). In a "cpu:gloo,openreg:occl" group,
    # torch 2.13's own Gloo split (the cpu part) waits until its timeout once a rank was left out of a
    # new_group (the ranks hash different group names: see docs/mechanisms/distributed.md).
    backend = None

    def test_groups_split_and_non_member(self):
        # The default group is bound to the device: split_group and non-member new_group split occl.
        group = dist.split_group(split_ranks=[[0], [1]])
        x = torch.full((2,), float(self.rank + 1), device=self.device)
        dist.all_reduce(x, group=group)
        self.assertEqual(x.cpu(), torch.full((2,), float(self.rank + 1)))  # a group of one
        only_zero = dist.new_group([0])
        if self.rank == 0:
            dist.all_reduce(x, group=only_zero)
            self.assertEqual(x.cpu(), torch.full((2,), 1.0))
        pair = dist.split_group(split_ranks=[[0, 1]])
        y = torch.full((2,), float(self.rank + 1), device=self.device)
        dist.all_reduce(y, group=pair)
        self.assertEqual(y.cpu(), torch.full((2,), 3.0))
        # A rank the group does not have: refused at the call on every rank; rank 0 waited for it
        # until the split's timeout (30 minutes), then failed on a store key.
        with self.assertRaisesRegex(ValueError, "occl split_group: member rank 5 is not a rank of this process group"):
            dist.split_group(split_ranks=[[0, 5]])
        dist.all_reduce(y, group=pair)  # the groups go on
        self.assertEqual(y.cpu(), torch.full((2,), 6.0))

    def test_a_split_keeps_its_parent_timeout_and_knows_its_global_ranks(self):
        # c10d's split_group writes the child's timeout into the options the parent's backend
        # gives it: they were the parent's own, so the parent's watchdog took the child's timeout
        # (a 2 s split made the default group time out its collectives after 2 s). The child's
        # global ranks were the parent's list ([0, 1] for rank 1's group of one), which names the
        # flight recorder's group, its dump file and the errors it propagates.
        openreg = torch.device("openreg")
        parent = dist.group.WORLD._get_backend(openreg)
        self.assertEqual(parent.timeout, self.timeout)
        alone = dist.split_group(split_ranks=[[0], [1]], timeout=timedelta(seconds=2))
        self.assertEqual(alone._get_backend(openreg).timeout, timedelta(seconds=2))
        self.assertEqual(parent.timeout, self.timeout)
        init_device_mesh("openreg", (2, 1), mesh_dim_names=("dp", "tp"))  # splits with its default timeout
        self.assertEqual(parent.timeout, self.timeout)
        x = torch.ones(2, device=self.device)
        dist.all_reduce(x, group=alone)
        torch.openreg.synchronize()
        self.assertEqual(flight_recorder.dump_json()["pg_config"][alone.group_name]["ranks"], f"[{self.rank}]")

    def test_set_pg_timeout_reaches_occl(self):
        # torch 2.13 sets the Gloo (cpu) and NCCL (cuda) parts only: occl kept its timeout in a
        # cpu:gloo,openreg:occl group, and an occl-only group got a warning and nothing else.
        from torch.distributed.distributed_c10d import _set_pg_timeout

        openreg, cpu = torch.device("openreg"), torch.device("cpu")
        mixed = dist.new_group([0, 1], backend="cpu:gloo,openreg:occl")
        only = dist.new_group([0, 1], backend="occl")
        try:
            _set_pg_timeout(timedelta(seconds=7), mixed)
            self.assertEqual(mixed._get_backend(openreg).timeout, timedelta(seconds=7))
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no "only supported for either nccl or gloo"
                _set_pg_timeout(timedelta(seconds=9), only)
            self.assertEqual(only._get_backend(openreg).timeout, timedelta(seconds=9))
            self.assertEqual(dist.group.WORLD._get_backend(openreg).timeout, self.timeout)  # other groups kept
            x = torch.ones(2, device=self.device)
            dist.all_reduce(x, group=mixed)
            self.assertEqual(x.cpu(), torch.full((2,), 2.0))
            self.assertTrue(cpu in mixed._device_types)
        finally:
            dist.destroy_process_group(mixed)
            dist.destroy_process_group(only)

    def test_group_options_choose_the_transport(self):
        # pg_options, an OcclOptions, say where the group's private Gloo transport connects; the
        # groups split from it keep them (the split makes its transport with the same options).
        options = OcclOptions(interface=loopback_interface(), threads=1)
        group = dist.new_group([0, 1], backend="occl", pg_options=options)
        x = torch.full((2,), float(self.rank + 1), device=self.device)
        dist.all_reduce(x, group=group)
        self.assertEqual(x.cpu(), torch.full((2,), 3.0))
        alone = dist.split_group(group, split_ranks=[[0], [1]])
        dist.all_reduce(x, group=alone)
        self.assertEqual(x.cpu(), torch.full((2,), 3.0))  # a group of one
        # the options are used: an interface that does not exist fails Gloo's device on every rank
        with self.assertRaisesRegex(RuntimeError, "Unable to find address for: no-such-if0"):
            dist.new_group([0, 1], backend="occl", pg_options=OcclOptions(interface="no-such-if0"))
        with self.assertRaisesRegex(
            TypeError, "occl: pg_options must be an openreg_distributed.OcclOptions, got builtins.dict"
        ):
            dist.new_group([0, 1], backend="occl", pg_options={"interface": "lo"})
        with self.assertRaisesRegex(ValueError, "OcclOptions: give interface or hostname, not both"):
            OcclOptions(interface="lo", hostname="localhost")
        # the default group still works after the refused groups
        y = torch.ones(1, device=self.device)
        dist.all_reduce(y)
        self.assertEqual(y.item(), 2.0)

    def test_device_mesh_1d_and_2d(self):
        mesh = init_device_mesh("openreg", (2,))
        self.assertEqual(mesh.get_group().size(), 2)
        mesh2 = init_device_mesh("openreg", (1, 2), mesh_dim_names=("dp", "tp"))
        y = torch.ones(1, device=self.device)
        dist.all_reduce(y, group=mesh2["tp"].get_group())
        self.assertEqual(y.item(), 2.0)
        dist.all_reduce(y, group=mesh2["dp"].get_group())
        self.assertEqual(y.item(), 2.0)

    def test_dtensor_redistribute_and_matmul(self):
        mesh = init_device_mesh("openreg", (2,))
        torch.manual_seed(0)
        a = torch.randn(4, 6, device=self.device)
        b = torch.randn(6, 3, device=self.device)
        da = distribute_tensor(a, mesh, [Shard(0)])
        self.assertEqual(da.to_local().cpu(), a.cpu()[2 * self.rank : 2 * self.rank + 2])
        self.assertEqual(da.redistribute(mesh, [Replicate()]).to_local().cpu(), a.cpu())
        self.assertEqual(da.redistribute(mesh, [Shard(1)]).full_tensor().cpu(), a.cpu())
        # Shard(1) @ Shard(0) is a Partial sum; reducing it is an all-reduce, scattering it a reduce-scatter.
        c = distribute_tensor(a, mesh, [Shard(1)]) @ distribute_tensor(b, mesh, [Shard(0)])
        self.assertEqual(c.placements, (Partial(),))
        self.assertEqual(c.full_tensor().cpu(), (a @ b).cpu(), atol=1e-5, rtol=1e-5)
        self.assertEqual(c.redistribute(mesh, [Shard(0)]).full_tensor().cpu(), (a @ b).cpu(), atol=1e-5, rtol=1e-5)

    def test_dtensor_random_ops(self):
        # DTensor's RNG tracker runs on core's CUDA-shaped Philox state: replicated random tensors
        # are equal on every rank, shards of a sharded one are different draws.
        mesh = init_device_mesh("openreg", (2,))
        torch.manual_seed(3)
        sharded = dtensor.randn(8, 4, device_mesh=mesh, placements=[Shard(0)]).full_tensor().cpu()
        self.assertFalse(torch.equal(sharded[:4], sharded[4:]))
        replicated = dtensor.randn(4, 4, device_mesh=mesh, placements=[Replicate()]).to_local()
        both = torch.empty(2, 4, 4, device=self.device)
        dist.all_gather_single(both, replicated.unsqueeze(0))
        self.assertEqual(both[0].cpu(), both[1].cpu())
        dropped = nn.functional.dropout(distribute_tensor(torch.ones(8, 8, device=self.device), mesh, [Shard(0)]), 0.5)
        values = set(dropped.full_tensor().cpu().unique().tolist())
        self.assertEqual(values, {0.0, 2.0})

    def test_tensor_parallel_equals_unsharded(self):
        mesh = init_device_mesh("openreg", (2,))
        ref = make_model().to(self.device)
        model = parallelize_module(copy.deepcopy(ref), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x, _ = full_batch(0, self.device)
        self.assertEqual(model(x).cpu(), ref(x).cpu(), atol=1e-5, rtol=1e-5)

    def test_fsdp2_equals_full_batch_training(self):
        self.assert_fsdp2_equals_full_batch_training()

    def test_dcp_save_load_fsdp2(self):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        model, _ = self.fsdp_train()
        path = [tempfile.mkdtemp(prefix="occl-dcp-") if self.rank == 0 else None]
        dist.broadcast_object_list(path, src=0)
        try:  # MultiProcContinuousTest's ranks run no addCleanup
            dcp.save({"model": model.state_dict()}, checkpoint_id=path[0])
            # Back into a fresh FSDP2 model of other values, sharded the same way.
            fresh, _ = self.fsdp_train()
            for p in fresh.parameters():
                p.data.zero_()
            state = {"model": fresh.state_dict()}
            dcp.load(state, checkpoint_id=path[0])
            fresh.load_state_dict(state["model"])
            for p, q in zip(fresh.parameters(), model.parameters()):
                self.assertEqual(p.full_tensor().cpu(), q.full_tensor().cpu())
            # And on the CPU, without any process group: a plain torch.save file.
            full = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
            if self.rank == 0:
                dcp_to_torch_save(path[0], os.path.join(path[0], "model.pt"))
                loaded = torch.load(os.path.join(path[0], "model.pt"))["model"]
                self.assertEqual(set(loaded), set(full))
                for k, v in full.items():
                    self.assertEqual(loaded[k], v)
            dist.barrier()
        finally:
            if self.rank == 0:
                shutil.rmtree(path[0], ignore_errors=True)

    def test_fsdp2_meta_device_init(self):
        model, ref = self.fsdp_train(meta=True)
        for p, q in zip(model.parameters(), ref.parameters()):
            self.assertEqual(p.full_tensor().cpu(), q.detach().cpu(), atol=1e-5, rtol=1e-5)

    def test_fsdp2_mixed_precision(self):
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        model, ref = self.fsdp_train(mp_policy=policy)
        for p, q in zip(model.parameters(), ref.parameters()):
            self.assertEqual(p.full_tensor().cpu(), q.detach().cpu(), atol=2e-2, rtol=2e-2)


class TestMesh2x2(OcclTestCase):
    """A 2-D mesh of 4 ranks, 2 x 2 (the 2-rank class can only make a 1 x 2 one): rank r is at
    (r // 2, r % 2); groups along each dimension, and DTensors sharded over both."""

    world_size = 4
    backend = None

    def test_device_mesh_2x2_and_dtensor(self):
        mesh = init_device_mesh("openreg", (2, 2), mesh_dim_names=("dp", "tp"))
        r = self.rank
        for dim, peers in (("dp", [r % 2, r % 2 + 2]), ("tp", [r // 2 * 2, r // 2 * 2 + 1])):
            group = mesh[dim].get_group()
            self.assertEqual(sorted(dist.get_process_group_ranks(group)), peers)
            x = torch.full((3,), float(r + 1), device=self.device)
            dist.all_reduce(x, group=group)
            self.assertEqual(x.cpu(), torch.full((3,), float(sum(p + 1 for p in peers))), msg=dim)
        # a tensor sharded over both dimensions: rows over dp, columns over tp
        full = torch.arange(64.0).reshape(8, 8)
        t = distribute_tensor(full.to(self.device), mesh, [Shard(0), Shard(1)])
        self.assertEqual(t.to_local().cpu(), full[r // 2 * 4 : r // 2 * 4 + 4, r % 2 * 4 : r % 2 * 4 + 4])
        self.assertEqual(t.full_tensor().cpu(), full)
        moved = t.redistribute(mesh, [Replicate(), Shard(0)])
        self.assertEqual(moved.to_local().cpu(), full[r % 2 * 4 : r % 2 * 4 + 4])
        # a product whose contraction dimension is sharded over tp: partial sums reduced over tp
        w = torch.arange(16.0).reshape(8, 2) / 16
        a = distribute_tensor(full.to(self.device), mesh, [Replicate(), Shard(1)])
        b = distribute_tensor(w.to(self.device), mesh, [Replicate(), Shard(0)])
        self.assertEqual((a @ b).full_tensor().cpu(), full @ w)


class TestOcclNamedFirst(OcclTestCase):
    # "openreg:occl,cpu:gloo": occl's transport (a Gloo backend) is made before the group's own Gloo,
    # which torch 2.13 then gave no ranks (only a process's first Gloo backend answers them): the
    # Gloo part of split_group read an empty list and every rank died (SIGSEGV). hunt35a.
    backend = "openreg:occl,cpu:gloo"

    def test_split_group(self):
        pair = dist.split_group(split_ranks=[[0, 1]])
        on_device = torch.full((2,), float(self.rank + 1), device=self.device)
        on_host = torch.full((2,), float(self.rank + 1))
        dist.all_reduce(on_device, group=pair)
        dist.all_reduce(on_host, group=pair)
        self.assertEqual((on_device.cpu(), on_host), (torch.full((2,), 3.0), torch.full((2,), 3.0)))


if __name__ == "__main__":
    run_tests()
