"""Scenario: checkpoints. Train on openreg, save, resume on openreg and continue exactly as the run
that never stopped; then load the same checkpoint on a machine without openreg (a subprocess with
TORCH_DEVICE_BACKEND_AUTOLOAD=0, map_location="cpu") and continue there within the CPU's rounding.

- torch.save / torch.load of the model's and the optimizer's state (AdamW: its moments are openreg
  tensors), single process;
- torch.distributed.checkpoint (DCP) of an FSDP2 model sharded over 2 ranks (openreg-distributed),
  read back on the CPU with dcp_to_torch_save, no process group.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from ranks import TwoRanks
from report import report
from torch.testing._internal.common_utils import TestCase, run_tests
from torch_openreg.utils.testing import run_python
from workloads import make_gpt, train_steps

HERE = Path(__file__).resolve().parent
BEFORE, AFTER = 3, 3  # steps before the checkpoint, and after it
BATCH = 8
LR = 1e-2


# Runs without openreg (autoload off; nothing imports torch_openreg): loads the checkpoint onto the
# CPU, checks it holds the saved values, and continues training there.
RESUME_ON_CPU = """
import json, sys, torch
sys.path.insert(0, {here!r})
from workloads import make_gpt, train_steps
ckpt = torch.load({path!r}, map_location="cpu")
values = torch.load({values!r})
model = make_gpt(seed=1)
model.load_state_dict(ckpt["model"])
opt = torch.optim.AdamW(model.parameters(), lr={lr})
opt.load_state_dict(ckpt["optim"])
same = all(torch.equal(v, values[k]) for k, v in model.state_dict().items())
tensors = [*model.parameters(), *(t for s in opt.state.values() for t in s.values())]
devices = sorted({{str(t.device) for t in tensors}})
losses = train_steps(model, opt, {after}, "cpu", first=ckpt["step"])
print(json.dumps({{"same": same, "devices": devices, "losses": losses, "openreg": "torch_openreg" in sys.modules}}))
"""

DCP_ON_CPU = """
import json, sys, torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
dcp_to_torch_save({path!r}, {out!r})
state = torch.load({out!r}, map_location="cpu")["model"]
values = torch.load({values!r})
same = all(torch.equal(state[k], v) for k, v in values.items())
devices = sorted({{str(v.device) for v in state.values()}})
print(json.dumps({{"keys": sorted(state) == sorted(values), "same": same, "devices": devices,
                  "openreg": "torch_openreg" in sys.modules}}))
"""


def without_openreg(code: str) -> dict:
    r = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


class TestTorchSave(TestCase):
    def test_save_resume_and_load_without_openreg(self):
        device = torch.device("openreg", 0)
        with tempfile.TemporaryDirectory() as tmp:
            path, values = os.path.join(tmp, "ckpt.pt"), os.path.join(tmp, "values.pt")
            # The run that never stops, on openreg and on the CPU.
            model = make_gpt().to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=LR)
            straight = train_steps(model, opt, BEFORE, device)
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": BEFORE}, path)
            torch.save({k: v.cpu() for k, v in model.state_dict().items()}, values)
            straight += train_steps(model, opt, AFTER, device, first=BEFORE)
            cpu_model = make_gpt()
            cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=LR)
            cpu = train_steps(cpu_model, cpu_opt, BEFORE + AFTER, "cpu")

            # Resumed on openreg: a model of other values, then the checkpoint (back onto openreg:0).
            resumed = make_gpt(seed=1).to(device)
            ropt = torch.optim.AdamW(resumed.parameters(), lr=LR)
            ckpt = torch.load(path)
            # AdamW's moments come back to openreg:0, its step counters are host tensors.
            state_devices = {t.device for s in ckpt["optim"]["state"].values() for t in s.values()}
            self.assertEqual(state_devices, {device, torch.device("cpu")})
            resumed.load_state_dict(ckpt["model"])
            ropt.load_state_dict(ckpt["optim"])
            continued = train_steps(resumed, ropt, AFTER, device, first=ckpt["step"])
            self.assertEqual(continued, straight[BEFORE:], atol=0, rtol=0)
            for p, q in zip(resumed.parameters(), model.parameters()):
                self.assertEqual(p, q, atol=0, rtol=0)

            # On a machine without openreg.
            away = without_openreg(RESUME_ON_CPU.format(here=str(HERE), path=path, values=values, lr=LR, after=AFTER))
        self.assertEqual((away["same"], away["devices"], away["openreg"]), (True, ["cpu"], False))
        self.assertEqual(straight, cpu, atol=1e-4, rtol=0)
        self.assertEqual(away["losses"], straight[BEFORE:], atol=1e-4, rtol=0)
        report(
            f"checkpoint torch.save: {BEFORE}+{AFTER} AdamW steps, resumed on openreg identical "
            f"(loss {straight[-1]:.4f}), CPU-only resume {away['losses'][-1]:.4f}, "
            f"max |openreg - CPU| {max(abs(a - b) for a, b in zip(straight, cpu)):.1e}"
        )


class TestDistributedCheckpoint(TwoRanks):
    def fsdp(self, seed=0):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("openreg", (self.world_size,))
        model = make_gpt(seed).to(self.device)
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=LR)

    def test_dcp_fsdp2_resume_and_load_without_openreg(self):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        rows = self.mine(BATCH)
        path = [tempfile.mkdtemp(prefix="openreg-dcp-") if self.rank == 0 else None]
        dist.broadcast_object_list(path, src=0)
        ckpt = os.path.join(path[0], "ckpt")
        try:
            model, opt = self.fsdp()
            straight = train_steps(model, opt, BEFORE, self.device, rows=rows)
            model_sd, optim_sd = get_state_dict(model, opt)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=ckpt)
            full = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
            if self.rank == 0:
                torch.save(full, os.path.join(path[0], "values.pt"))
            straight += train_steps(model, opt, AFTER, self.device, first=BEFORE, rows=rows)

            # Resumed: a fresh sharded model of other values and a fresh optimizer, then the checkpoint.
            resumed, ropt = self.fsdp(seed=1)
            model_sd, optim_sd = get_state_dict(resumed, ropt)
            state = {"model": model_sd, "optim": optim_sd}
            dcp.load(state, checkpoint_id=ckpt)
            set_state_dict(resumed, ropt, model_state_dict=state["model"], optim_state_dict=state["optim"])
            continued = train_steps(resumed, ropt, AFTER, self.device, first=BEFORE, rows=rows)
            self.assertEqual(continued, straight[BEFORE:], atol=0, rtol=0)
            for p, q in zip(resumed.parameters(), model.parameters()):
                self.assertEqual(p.full_tensor().cpu(), q.full_tensor().cpu(), atol=0, rtol=0)
            # The full-batch loss follows single-process CPU training.
            mean = [self.mean_over_ranks(x) for x in straight]
            cpu_model = make_gpt()
            cpu = train_steps(cpu_model, torch.optim.AdamW(cpu_model.parameters(), lr=LR), BEFORE + AFTER, "cpu")
            self.assertEqual(mean, cpu, atol=1e-4, rtol=0)
            dist.barrier()
            if self.rank == 0:
                away = without_openreg(
                    DCP_ON_CPU.format(
                        path=ckpt, out=os.path.join(path[0], "model.pt"), values=os.path.join(path[0], "values.pt")
                    )
                )
                self.assertEqual(away, {"keys": True, "same": True, "devices": ["cpu"], "openreg": False})
                report(
                    f"checkpoint DCP+FSDP2: 2 ranks, {BEFORE}+{AFTER} AdamW steps, resumed identical "
                    f"(loss {mean[-1]:.4f}, CPU {cpu[-1]:.4f}), read back on the CPU without openreg"
                )
            dist.barrier()
        finally:
            if self.rank == 0:
                shutil.rmtree(path[0], ignore_errors=True)


if __name__ == "__main__":
    run_tests()
