"""openreg-distributed as a plugin: loaded by `import torch`, registers occl once, selectable."""

from conftest import run_python
from torch.testing._internal.common_utils import TestCase

PROBE = """
import torch, torch.distributed as dist
info = torch.openreg.plugins().get("distributed")
try:
    default = dist.get_default_backend_for_device("openreg")
except Exception as e:
    default = type(e).__name__
print(info["version"], info["loaded"], default)
"""

# One rank is enough to see what init_process_group picks and how a group is named.
SINGLE_RANK = """
import warnings, torch, torch.distributed as dist
store = dist.HashStore()
dist.init_process_group(store=store, rank=0, world_size=1, device_id=torch.device("openreg", 0))
pg = dist.distributed_c10d._get_default_group()
x = torch.arange(4.0, device="openreg")
dist.all_reduce(x)
print(dist.get_backend_config(), pg.name(), x.cpu().tolist())
dist.destroy_process_group()
dist.init_process_group("cpu:gloo,openreg:occl", store=dist.HashStore(), rank=0, world_size=1)
pg = dist.distributed_c10d._get_default_group()
print(dist.get_backend_config(), pg.name(), pg._get_backend(torch.device("openreg")).name())
dist.destroy_process_group()
"""


# PyTorch's fake process group (one process pretending to be a rank of many) registers for cpu,
# cuda, hpu and xpu only; a device map names openreg explicitly.
FAKE_GROUP = """
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
dist.init_process_group("cpu:fake,openreg:fake", store=FakeStore(), rank=1, world_size=4)
x = torch.ones(4, device="openreg")
dist.all_reduce(x)
mesh = init_device_mesh("openreg", (2, 2))
local = distribute_tensor(torch.ones(8, 8, device="openreg"), mesh, [Shard(0), Shard(1)]).to_local()
print(dist.get_backend_config(), tuple(local.shape), local.device)
"""


# One rank is enough to see where a collective lands in a profiler trace.
PROFILED = """
import json, os, tempfile, torch, torch.distributed as dist
from torch.profiler import ProfilerActivity, profile
dist.init_process_group("openreg:occl", store=dist.HashStore(), rank=0, world_size=1)
x = torch.ones(1024, device="openreg")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
    dist.all_reduce(x)
    y = x * 2
    torch.openreg.synchronize()
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
kernels = {e["name"]: e for e in events if e.get("cat") == "kernel"}
comms = [e for e in events if e.get("name") == "record_param_comms"]
kernel = kernels.get("occl::all_reduce", {})
print("occl::all_reduce" in kernels, kernel.get("tid") != kernels.get("aten::mul", {}).get("tid"))
# The host-side record of the collective, with its metadata, linked to the kernel it launched.
args = comms[0]["args"] if comms else {}
print(args.get("Collective name"), args.get("In msg nelems"), args.get("dtype"))
print(kernel.get("args", {}).get("External id") == args.get("External id"))
"""


class TestPluginLoading(TestCase):
    def test_loaded_by_import_torch(self):
        r = run_python(PROBE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "0.1.0 True occl")

    def test_excluded_by_openreg_plugins(self):
        r = run_python(PROBE, env={"OPENREG_PLUGINS": "amp"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "0.1.0 False ValueError")

    def test_direct_import_loads_core_first(self):
        # With autoload too: then `import openreg_distributed` imports core, which loads the plugins
        # while openreg_distributed is still importing.
        for autoload in ("0", "1"):
            r = run_python(
                """
                import openreg_distributed, torch, torch.distributed as dist
                print(dist.get_default_backend_for_device("openreg"), openreg_distributed.__version__,
                      torch.openreg.plugins()["distributed"]["loaded"])
                openreg_distributed.register()  # idempotent
                print(dist.get_default_backend_for_device("openreg"))
                """,
                env={"TORCH_DEVICE_BACKEND_AUTOLOAD": autoload},
            )
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip().splitlines(), ["occl 0.1.0 True", "occl"], autoload)
            self.assertNotIn("openreg plugin", r.stderr)

    def test_group_selection_and_names(self):
        # device_id alone picks the device's default backend, as cuda:nccl does upstream; the mixed
        # map is named after occl's type ("custom"), never "undefined", and warns about nothing.
        r = run_python(SINGLE_RANK)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(
            r.stdout.strip().splitlines(),
            ["openreg:occl custom [0.0, 1.0, 2.0, 3.0]", "cpu:gloo,openreg:occl custom occl"],
        )
        self.assertNotIn("undefined", r.stderr)
        self.assertNotIn("Warning", r.stderr)

    def test_fake_process_group_covers_openreg(self):
        r = run_python(FAKE_GROUP)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "cpu:fake,openreg:fake (4, 4) openreg:0")

    def test_profiler_shows_collectives_on_the_comm_stream(self):
        # The collective is a kernel of its own name, on another stream track than the compute,
        # and a host-side record_param_comms event (as NCCL's) with its metadata launched it.
        r = run_python(PROFILED)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip().splitlines()[-3:], ["True True", "all_reduce 1024 Float", "True"])
