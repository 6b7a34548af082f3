"""Plugin discovery: core loads plugins from the `torch_openreg.plugins` entry-point group."""

import importlib
import importlib.abc
import os
import shutil
import sys
import tempfile
import textwrap

from conftest import run_python
from torch.testing._internal.common_utils import TestCase, run_tests


def install_plugin(root, name: str, body: str, requires: tuple = ()) -> None:
    """Installs a one-module distribution into `root` the way pip lays it out (module + dist-info);
    `requires` are its Requires-Dist lines."""
    module = f"openreg_test_{name}"
    with open(os.path.join(root, f"{module}.py"), "w") as f:
        f.write(textwrap.dedent(body))
    info = os.path.join(root, f"openreg_test_{name}-1.2.3.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: openreg-test-{name}\nVersion: 1.2.3\n")
        f.writelines(f"Requires-Dist: {r}\n" for r in requires)
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
        # A name no installed plugin has (a typo, another case) says so; it turned every plugin off
        # without a word.
        r = run_python(REPORT, env={**self.env, "OPENREG_PLUGINS": "zzgood,ZZbroken"})
        lines = r.stdout.strip().splitlines()
        self.assertEqual(lines[0], "[('zzbroken', '1.2.3', False), ('zzgood', '1.2.3', True)]")
        self.assertRegex(
            lines[1],
            r"OPENREG_PLUGINS names 'ZZbroken', which is not an installed openreg plugin \(installed: .*zzbroken, "
            r"zzgood; names are case-sensitive\)",
        )

    def test_a_direct_import_loads_the_plugin_once(self):
        # A plugin ends its import with imported(name, hook): `import plugin` loads it even when
        # OPENREG_PLUGINS left it out (a plugin whose entry point registers stayed unregistered,
        # and plugins() said "not loaded" for every one), and discovery does not load it twice.
        body = """
        CALLS = 0
        def load():
            global CALLS
            CALLS += 1
        import torch
        torch.openreg._plugins.imported("zzself", load)
        """
        install_plugin(self.dir.name, "zzself", body)
        probe = """
        import torch
        before = torch.openreg.plugins()["zzself"]["loaded"]
        import openreg_test_zzself
        print(before, openreg_test_zzself.CALLS, torch.openreg.plugins()["zzself"]["loaded"])
        """
        for spec, want in ((None, "True 1 True"), ("none", "False 1 True"), ("zzgood", "False 1 True")):
            env = dict(self.env) if spec is None else {**self.env, "OPENREG_PLUGINS": spec}
            r = run_python(probe, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), want, spec)
        # imported first: core's discovery meets the module half-imported and calls the hook; the
        # module's own call then finds it loaded
        r = run_python(
            "import openreg_test_zzself, torch\n"
            "print(openreg_test_zzself.CALLS, torch.openreg.plugins()['zzself']['loaded'])\n",
            env=self.env,
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "1 True")
        self.assertNotIn("openreg plugin 'zzself'", r.stderr)

    def test_plugin_imported_before_torch(self):
        # `import plugin` imports core (here through `import torch`), which loads the plugins while
        # the plugin's own module is still importing: an entry point defined before that import is
        # found and called; one defined after it is not, and the warning says why.
        early = """
        def load():
            import torch  # the module's own `import torch` below has not bound the name yet

            global LOADED
            LOADED = torch.ones(1, device="openreg").device.type
        import torch
        """
        late = """
        import torch
        def load():
            pass
        """
        install_plugin(self.dir.name, "zzearly", early)
        install_plugin(self.dir.name, "zzlate", late)
        probe = """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import openreg_test_zzearly
        print(openreg_test_zzearly.LOADED, openreg_test_zzearly.torch.openreg.plugins()["zzearly"]["loaded"])
        print([str(w.message) for w in caught if "zzearly" in str(w.message)])
        """
        env = {**self.env, "OPENREG_PLUGINS": "zzearly"}
        r = run_python(probe, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip().splitlines(), ["openreg True", "[]"])
        r = run_python(
            "import warnings\nwarnings.simplefilter('always')\nimport openreg_test_zzlate, torch\n"
            "print(torch.openreg.plugins()['zzlate']['error'])",
            env={**self.env, "OPENREG_PLUGINS": "zzlate"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("has no attribute 'load'", r.stdout)
        self.assertIn(
            "(`import openreg_test_zzlate` came first and imported core: define the entry point before the package "
            "imports torch_openreg)",
            r.stdout,
        )
        self.assertIn("openreg plugin 'zzlate' failed to load", r.stderr)


MARKED = """
import torch
IMPORTED_WITH = torch.openreg.device_count()
def load():
    pass
"""

VERSIONS = """
import sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
import torch_openreg
plugins = torch.openreg.plugins()
print(torch_openreg.__version__)
print(sorted((n, p["loaded"], p["requires"]) for n, p in plugins.items() if n.startswith("zz")))
print(plugins["zzfuture"]["error"])
print([str(w.message) for w in caught if "openreg plugin" in str(w.message)])
print(sorted(m for m in sys.modules if m.startswith("openreg_test_")))
print(torch.ones(2, device="openreg").add(1).cpu().tolist())
"""


class TestWhenImported(TestCase):
    """torch_openreg.utils.imports.when_imported: how plugins wait for the import of a heavy module."""

    def setUp(self):
        self.root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.root, True)
        sys.path.insert(0, self.root)
        self.addCleanup(sys.path.remove, self.root)

    def module(self, name: str, body: str = "VALUE = 42\n") -> str:
        name = f"openreg_test_watched_{name}"
        with open(os.path.join(self.root, f"{name}.py"), "w") as f:
            f.write(body)
        self.addCleanup(sys.modules.pop, name, None)
        return name

    def test_called_once_right_after_the_import(self):
        from torch_openreg.utils.imports import _finder, _pending, when_imported

        name, seen = self.module("later"), []

        def callback(module):
            seen.append((module.__name__, module.VALUE, name in sys.modules))

        when_imported(name, callback)
        when_imported(name, callback)  # the same pair again: still one call
        self.assertEqual(seen, [])
        self.assertIn(_finder, sys.meta_path)
        module = importlib.import_module(name)
        self.assertEqual(seen, [(name, 42, True)])
        self.assertNotIsInstance(module.__loader__, importlib.abc.MetaPathFinder)  # the real loader
        self.assertIs(module.__spec__.loader, module.__loader__)
        self.assertNotIn(name, _pending)
        self.assertEqual(_finder in sys.meta_path, bool(_pending))  # it leaves when nothing is left to watch
        importlib.reload(module)
        self.assertEqual(len(seen), 1)

    def test_an_imported_module_is_passed_at_once(self):
        from torch_openreg.utils.imports import when_imported

        seen = []
        when_imported("json", seen.append)
        self.assertEqual(seen, [sys.modules["json"]])
        with self.assertRaisesRegex(ValueError, "at once"):
            when_imported("json", lambda m: (_ for _ in ()).throw(ValueError("at once")))

    def test_a_callback_may_import_its_module_and_watch_another(self):
        # inductor's register() imports the module it waits for; a callback may also ask for more.
        from torch_openreg.utils.imports import when_imported

        first, second, order = self.module("first"), self.module("second"), []

        def on_first(module):
            self.assertIs(importlib.import_module(first), module)
            when_imported(second, lambda m: order.append(m.__name__))
            order.append(module.__name__)

        when_imported(first, on_first)
        importlib.import_module(first)
        importlib.import_module(second)
        self.assertEqual(order, [first, second])

    def test_a_failing_callback_warns_and_the_import_succeeds(self):
        from torch_openreg.utils.imports import when_imported

        name, seen = self.module("broken"), []

        def broken(module):
            raise RuntimeError("cannot register")

        when_imported(name, broken)
        when_imported(name, seen.append)
        with self.assertWarnsRegex(
            RuntimeWarning, rf"broken, run after the import of {name}, failed: RuntimeError: cannot register"
        ):
            module = importlib.import_module(name)
        self.assertEqual(module.VALUE, 42)
        self.assertEqual(seen, [module])  # the next callback still ran

    def test_a_missing_module_stays_missing(self):
        from torch_openreg.utils.imports import _pending, when_imported

        name = "openreg_test_watched_nowhere"
        self.addCleanup(_pending.pop, name, None)
        when_imported(name, lambda m: self.fail("called for a module that does not exist"))
        with self.assertRaises(ModuleNotFoundError):
            importlib.import_module(name)
        self.assertIn(name, _pending)  # still waiting: it may be installed later


class TestCoreVersions(TestCase):
    """A plugin declares the core versions it works with as its requirement on openreg-core; core
    skips one whose range excludes the installed core, with a warning, before importing it."""

    def test_incompatible_plugin_is_skipped_with_a_warning(self):
        from importlib import metadata

        with tempfile.TemporaryDirectory() as root:
            install_plugin(root, "zzfuture", MARKED, requires=("openreg-core<10,>=9.0", "torch>=2.13,<2.14"))
            install_plugin(root, "zzcurrent", MARKED, requires=("openreg-core (>=0.1,<1000)",))
            install_plugin(root, "zzany", MARKED, requires=("openreg-core",))
            install_plugin(root, "zzextra", MARKED, requires=('openreg-core>=9; extra == "x"',))
            r = run_python(VERSIONS, env={"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")})
        self.assertEqual(r.returncode, 0, r.stderr)
        core, status, error, warned, imported, values = r.stdout.strip().splitlines()
        self.assertEqual(core, metadata.version("openreg-core"))  # the version checked is the installed one
        self.assertEqual(
            status,
            str(
                [
                    ("zzany", True, ""),
                    ("zzcurrent", True, ">=0.1,<1000"),
                    ("zzextra", True, None),
                    ("zzfuture", False, "<10,>=9.0"),
                ]
            ),
        )
        message = (
            f"openreg-test-zzfuture 1.2.3 requires openreg-core<10,>=9.0, but openreg-core {core} is installed; "
            "skipped (install a matching pair, e.g. from one `nox -s build` wheelhouse: "
            "pip install --find-links dist 'openreg-core[zzfuture]')"
        )
        self.assertEqual(error, f"incompatible: {message}")
        self.assertEqual(warned, str([f"openreg plugin 'zzfuture' not loaded: {message}"]))
        # never imported (a C++ plugin built against another core might not even import)
        self.assertEqual(imported, str(["openreg_test_zzany", "openreg_test_zzcurrent", "openreg_test_zzextra"]))
        self.assertEqual(values, "[2.0, 2.0]")  # and the device works

    def test_version_specifiers(self):
        from torch_openreg.openreg._plugins import core_requirement, version_satisfies

        cases = [
            (">=0.1,<0.2", "0.1.0", True),
            (">=0.1,<0.2", "0.2.0", False),
            (">=0.1,<0.2", "0.0.9", False),
            ("~=0.1.0", "0.1.7", True),
            ("~=0.1.0", "0.2.0", False),
            ("~=0.1", "0.9", True),
            ("==0.1.*", "0.1.3", True),
            ("==0.1.*", "0.10.0", False),
            ("!=0.1.*", "0.2", True),
            ("==0.1", "0.1.0", True),
            ("!=0.1.0", "0.1", False),
            (">0.1", "0.1.1", True),
            ("<=0.1", "0.1.1", False),
            ("===0.1.0", "0.1.0", True),
            ("", "7.0", True),
        ]
        for spec, version, want in cases:
            self.assertEqual(version_satisfies(version, spec), want, f"{version} in {spec!r}")
        with self.assertRaisesRegex(ValueError, "cannot read the version clause 'about 0.1'"):
            version_satisfies("0.1", "about 0.1")
        self.assertEqual(core_requirement(["torch>=2.13", "openreg_core (<0.2,>=0.1)"]), "<0.2,>=0.1")
        self.assertEqual(core_requirement(["Openreg.Core"]), "")
        self.assertIsNone(core_requirement(["torch", 'openreg-core>=1; extra == "dev"']))
        self.assertIsNone(core_requirement(None))

    def test_shipped_plugins_declare_this_core(self):
        """Every plugin in the monorepo names a core range that includes this core's version."""
        import tomllib
        from pathlib import Path

        from torch_openreg.openreg._plugins import core_requirement, version_satisfies

        packages = Path(__file__).resolve().parents[2]
        core = tomllib.loads((packages / "openreg-core" / "pyproject.toml").read_text())["project"]
        for plugin in ("amp", "distributed", "inductor", "onnx", "quant"):
            project = tomllib.loads((packages / f"openreg-{plugin}" / "pyproject.toml").read_text())["project"]
            spec = core_requirement(project["dependencies"])
            self.assertTrue(spec, f"openreg-{plugin} declares no openreg-core range: {project['dependencies']}")
            self.assertTrue(version_satisfies(core["version"], spec), f"openreg-{plugin}: {spec} vs {core['version']}")


if __name__ == "__main__":
    run_tests()
