"""Plugin discovery: core loads plugins from the `torch_openreg.plugins` entry-point group."""

import os
import textwrap

from conftest import run_python
from torch.testing._internal.common_utils import TestCase, run_tests


def install_plugin(root, name: str, body: str) -> None:
    """Installs a one-module distribution into `root` the way pip lays it out (module + dist-info)."""
    module = f"openreg_test_{name}"
    with open(os.path.join(root, f"{module}.py"), "w") as f:
        f.write(textwrap.dedent(body))
    info = os.path.join(root, f"openreg_test_{name}-1.2.3.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: openreg-test-{name}\nVersion: 1.2.3\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write(f"[torch_openreg.plugins]\n{name} = {module}:load\n")


GOOD = """
import torch
LOADED_WITH_DEVICE = None
def load():
    global LOADED_WITH_DEVICE
    LOADED_WITH_DEVICE = str(torch.ones(1, device="openreg").device)
"""
BROKEN = """
def load():
    raise ImportError("needs a library that is missing")
"""

REPORT = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
plugins = torch.openreg.plugins()
print(sorted((n, p["version"], p["loaded"]) for n, p in plugins.items() if n.startswith("zz")))
print([str(w.message) for w in caught if "openreg plugin" in str(w.message)])
import sys
print(getattr(sys.modules.get("openreg_test_zzgood"), "LOADED_WITH_DEVICE", None))
"""


class TestPlugins(TestCase):
    def setUp(self):
        import tempfile

        self.dir = tempfile.TemporaryDirectory()
        install_plugin(self.dir.name, "zzgood", GOOD)
        install_plugin(self.dir.name, "zzbroken", BROKEN)
        self.env = {"PYTHONPATH": self.dir.name + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def tearDown(self):
        self.dir.cleanup()

    def test_loads_plugins_and_reports_broken_one(self):
        r = run_python(REPORT, env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.strip().splitlines()
        self.assertEqual(lines[0], "[('zzbroken', '1.2.3', False), ('zzgood', '1.2.3', True)]")
        self.assertIn(
            "openreg plugin 'zzbroken' failed to load: ImportError: needs a library that is missing", lines[1]
        )
        self.assertEqual(lines[2], "openreg:0")  # loaded after the device exists

    def test_selection_by_env(self):
        r = run_python(REPORT, env={**self.env, "OPENREG_PLUGINS": "zzgood"})
        self.assertEqual(
            r.stdout.strip().splitlines()[:2], ["[('zzbroken', '1.2.3', False), ('zzgood', '1.2.3', True)]", "[]"]
        )
        r = run_python(REPORT, env={**self.env, "OPENREG_PLUGINS": "none"})
        self.assertEqual(
            r.stdout.strip().splitlines(), ["[('zzbroken', '1.2.3', False), ('zzgood', '1.2.3', False)]", "[]", "None"]
        )


if __name__ == "__main__":
    run_tests()
