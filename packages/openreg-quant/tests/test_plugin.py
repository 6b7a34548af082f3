"""openreg-quant as a plugin: found by core's discovery, selectable, importable on its own, and
its kernels take over the quantized_decomposed ops whichever side registers first."""

from conftest import run_python
from torch.testing._internal.common_utils import TestCase

PROBE = """
import torch
import torch.ao.quantization.fx._decomposed  # defines the namespace (a no-op when the plugin did)
info = torch.openreg.plugins().get("quant")
x = torch.randn(8, device="openreg")
torch.openreg.reset_fallback_op_counts()
q = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.1, 3, -128, 127, torch.int8)
generic = bool(torch.openreg.fallback_op_counts())  # the decomposition's aten ops
print(info["version"], info["loaded"], generic, q.dtype)
"""


class TestPluginLoading(TestCase):
    def test_loaded_by_import_torch(self):
        r = run_python(PROBE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "0.1.0 True False torch.int8")

    def test_excluded_by_openreg_plugins(self):
        # Without the plugin the decomposition runs op by op through core's generic path.
        r = run_python(PROBE, env={"OPENREG_PLUGINS": "amp"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "0.1.0 False True torch.int8")

    def test_selected_by_openreg_plugins(self):
        r = run_python(PROBE, env={"OPENREG_PLUGINS": "quant"})
        self.assertEqual(r.stdout.strip(), "0.1.0 True False torch.int8", r.stderr)

    def test_direct_import_loads_core_first(self):
        # With autoload too: then `import openreg_quant` imports core, which loads the plugins while
        # openreg_quant is still importing.
        for autoload in ("0", "1"):
            r = run_python(
                "import openreg_quant\n" + PROBE,
                env={"TORCH_DEVICE_BACKEND_AUTOLOAD": autoload},
            )
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), "0.1.0 True False torch.int8", autoload)
            self.assertNotIn("openreg plugin", r.stderr)

    def test_core_refusals_name_the_plugin_once_it_is_imported(self):
        # Left out by OPENREG_PLUGINS, then imported: core's refusal of a quantized operator said the
        # plugin was not loaded for the rest of the process (it cached its first answer).
        r = run_python(
            """
            import torch
            x = torch.randn(4, device="openreg")
            def refusal(call):
                try:
                    call()
                except NotImplementedError as e:
                    return str(e).splitlines()[0].split(". ", 1)[1]
            print(refusal(lambda: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)))
            import openreg_quant
            q = torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)
            print(q.dtype, refusal(lambda: torch.flip(q, [0])))
            """,
            env={"OPENREG_PLUGINS": "none"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        before, after = r.stdout.strip().splitlines()
        self.assertTrue(before.startswith("Quantized kernels come from the openreg-quant plugin, which is not loaded"))
        self.assertTrue(after.startswith("torch.qint8 openreg-quant provides the quantized-tensor operators"), after)

    def test_python_namespace_first_then_plugin(self):
        # The schemas defined by Python before the C++ kernels register: the kernels still win.
        r = run_python(
            """
            import torch
            import torch.ao.quantization.fx._decomposed
            import openreg_quant
            x = torch.randn(8, device="openreg")
            torch.openreg.reset_fallback_op_counts()
            q = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.1, 3, -128, 127, torch.int8)
            print(dict(torch.openreg.fallback_op_counts()), openreg_quant.__version__)
            """,
            env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "{} 0.1.0")
