"""The multi-node recipe: `torchrun --nnodes 2 --nproc-per-node 2` on loopback, two "nodes" of two
openreg devices each, the interface chosen with GLOO_SOCKET_IFNAME (what occl's Gloo transport uses)."""

import os
import socket
import subprocess
import sys
import tempfile
import textwrap

from torch.testing._internal.common_utils import TestCase, run_tests

SCRIPT = """
import os, torch, torch.distributed as dist
local = int(os.environ["LOCAL_RANK"])
dist.init_process_group(device_id=torch.device("openreg", local))
x = torch.full((4,), float(dist.get_rank() + 1), device="openreg")
dist.all_reduce(x)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} local {local} {dist.get_backend()}: {x.cpu().tolist()}")
dist.destroy_process_group()
"""


class TestTorchrun(TestCase):
    def test_two_nodes_on_loopback(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "train.py")
            with open(script, "w") as f:
                f.write(textwrap.dedent(SCRIPT))
            env = dict(os.environ, OPENREG_DEVICE_COUNT="2", GLOO_SOCKET_IFNAME="lo")
            nodes = [
                subprocess.Popen(
                    [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2"]
                    + ["--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", str(port), script],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for n in (0, 1)
            ]
            outs = [p.communicate(timeout=180) for p in nodes]
        for p, (_, err) in zip(nodes, outs):
            self.assertEqual(p.returncode, 0, err[-2000:])
        lines = sorted(line for out, _ in outs for line in out.splitlines() if line.startswith("rank "))
        self.assertEqual(
            lines,
            [f"rank {r}/4 local {r % 2} occl: [10.0, 10.0, 10.0, 10.0]" for r in range(4)],
        )


if __name__ == "__main__":
    run_tests()
