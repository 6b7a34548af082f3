"""The multi-node recipe: `torchrun --nnodes 2 --nproc-per-node 2` on loopback, two "nodes" of two
openreg devices each, the transport's interface chosen through the backend's options
(``pg_options=OcclOptions(interface="lo")``, where NCCL's and HCCL's Options carry their fabric's
settings) or, for every group, with GLOO_SOCKET_IFNAME (what occl's Gloo transport reads)."""

import os
import re
import socket
import subprocess
import sys
import tempfile
import textwrap

from conftest import loopback_interface
from torch.testing._internal.common_utils import TestCase, run_tests

SCRIPT = """
import os, torch, torch.distributed as dist
from openreg_distributed import OcclOptions
local = int(os.environ["LOCAL_RANK"])
interface = os.environ.get("OCCL_OPTIONS_INTERFACE")
options = OcclOptions(interface=interface) if interface else None
dist.init_process_group(device_id=torch.device("openreg", local), pg_options=options)
x = torch.full((4,), float(dist.get_rank() + 1), device="openreg")
dist.all_reduce(x)
rank, world = dist.get_rank(), dist.get_world_size()
print(f"rank {rank}/{world} local {local} {dist.get_backend()}: {x.cpu().tolist()}", flush=True)
dist.destroy_process_group()
"""


class TestTorchrun(TestCase):
    def test_two_nodes_on_loopback(self):
        # node 0: the interface from the environment; node 1: from the group's options
        env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
        self._two_nodes(
            [
                dict(env, OPENREG_DEVICE_COUNT="2", GLOO_SOCKET_IFNAME=loopback_interface()),
                dict(env, OPENREG_DEVICE_COUNT="2", OCCL_OPTIONS_INTERFACE=loopback_interface()),
            ]
        )

    def _two_nodes(self, node_envs):
        # torchrun's nodes meet at a TCP port: one found free here may be taken by another process
        # before node 0 listens on it. Tried again on another port then.
        for _ in range(3):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            nodes, outs = self._run_nodes(node_envs, port)
            if "EADDRINUSE" not in outs[0][1]:  # node 0 listens: "... name: EADDRINUSE, message: ..."
                break
        for p, (_, err) in zip(nodes, outs):
            self.assertEqual(p.returncode, 0, err[-2000:])
        # The ranks of a node share its stdout, where other libraries write too (Gloo's connection
        # messages): each result is looked for anywhere in it, not only at the start of a line.
        lines = sorted(m for out, _ in outs for m in re.findall(r"rank \d+/\d+ local \d+ \w+: \[[^\]]*\]", out))
        self.assertEqual(
            lines,
            [f"rank {r}/4 local {r % 2} occl: [10.0, 10.0, 10.0, 10.0]" for r in range(4)],
            msg="\n---\n".join(out for out, _ in outs),
        )

    def _run_nodes(self, node_envs, port):
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "train.py")
            with open(script, "w") as f:
                f.write(textwrap.dedent(SCRIPT))
            nodes = [
                subprocess.Popen(
                    [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2"]
                    + ["--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", str(port), script],
                    env=node_envs[n],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for n in (0, 1)
            ]
            first = nodes[0].communicate(timeout=180)
            if "EADDRINUSE" in first[1]:  # node 1 would wait for its rendezvous until it timed out
                nodes[1].kill()
            return nodes, [first, nodes[1].communicate(timeout=180)]


if __name__ == "__main__":
    run_tests()
