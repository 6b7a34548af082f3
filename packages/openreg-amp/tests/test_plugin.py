"""openreg-amp as a plugin: found by core's discovery, selectable, importable on its own."""

from conftest import run_python
from torch.testing._internal.common_utils import TestCase

PROBE = """
import torch
a = torch.randn(4, 4, device="openreg")
with torch.autocast("openreg", dtype=torch.float16):
    mm = (a @ a).dtype
info = torch.openreg.plugins().get("amp")
scale, tracker = torch.ones(1, device="openreg"), torch.zeros(1, dtype=torch.int32, device="openreg")
torch.openreg.reset_fallback_op_counts()
torch._amp_update_scale_(scale, tracker, torch.zeros(1, device="openreg"), 2.0, 0.5, 1)
generic = "aten::_amp_update_scale_" in torch.openreg.fallback_op_counts()
print(info["version"], info["loaded"], mm, generic, scale.item())
"""


class TestPluginLoading(TestCase):
    def test_loaded_by_import_torch(self):
        r = run_python(PROBE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "0.1.0 True torch.float16 False 2.0")
        self.assertNotIn("has no effect without the openreg-amp plugin", r.stderr)

    def test_excluded_by_openreg_plugins(self):
        # Without the plugin autocast falls through (core's default) and GradScaler's ops take
        # the generic path: same numbers, no casts.
        for spec in ("none", "distributed,onnx"):
            r = run_python(PROBE, env={"OPENREG_PLUGINS": spec})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), "0.1.0 False torch.float32 True 2.0", spec)
            self.assertIn("torch.autocast has no effect without the openreg-amp plugin", r.stderr)
            # What to do, for this case: the plugin is installed (the advice was a pip install).
            self.assertIn("it is installed but OPENREG_PLUGINS left it out: import openreg_amp", r.stderr)

    def test_selected_by_openreg_plugins(self):
        r = run_python(PROBE, env={"OPENREG_PLUGINS": "amp"})
        self.assertEqual(r.stdout.strip(), "0.1.0 True torch.float16 False 2.0", r.stderr)

    def test_direct_import_loads_core_first(self):
        # With autoload too: then `import openreg_amp` imports core, which loads the plugins while
        # openreg_amp is still importing.
        for autoload in ("0", "1"):
            r = run_python(
                """
                import openreg_amp, torch
                a = torch.ones(2, 2, device="openreg")
                with torch.autocast("openreg", dtype=torch.bfloat16):
                    print((a @ a).dtype, openreg_amp.__version__, torch.openreg.plugins()["amp"]["loaded"])
                """,
                env={"TORCH_DEVICE_BACKEND_AUTOLOAD": autoload},
            )
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), "torch.bfloat16 0.1.0 True", autoload)
            self.assertNotIn("openreg plugin", r.stderr)
