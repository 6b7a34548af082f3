"""openreg-inductor as a plugin: found by core's discovery, registered lazily, part of the cache key."""

import uuid

import torch
from conftest import run_python
from torch.testing._internal.common_utils import TestCase, run_tests

PROBE = """
import sys, torch
info = torch.openreg.plugins()["inductor"]
lazy = "torch._dynamo" not in sys.modules  # import torch did not pay for Dynamo and Inductor
try:
    out = torch.compile(lambda x: x.cos() + 1)(torch.zeros(4, device="openreg")).cpu().tolist()
except Exception as e:
    out = type(e).__name__ + ": " + str(e).splitlines()[0]
print(info["loaded"], lazy, out)
"""


class TestPluginLoading(TestCase):
    def test_loaded_by_import_torch_registered_by_dynamo(self):
        r = run_python(PROBE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "True True [2.0, 2.0, 2.0, 2.0]")

    def test_direct_import_loads_core_first(self):
        # With autoload too: then `import openreg_inductor` imports core, which loads the plugins
        # while openreg_inductor is still importing.
        for autoload in ("0", "1"):
            r = run_python("import openreg_inductor\n" + PROBE, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": autoload})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), "True True [2.0, 2.0, 2.0, 2.0]", autoload)
            self.assertNotIn("openreg plugin", r.stderr)

    def test_register_called_before_inductor_is_imported(self):
        # Registration then runs once, through the import hook (as the tests that reach the
        # benchmarker before any compile do). Run twice, workaround 7 wrapped argmax's loader twice.
        r = run_python(
            "import sys, torch, openreg_inductor\n"
            "assert 'torch._inductor.compile_fx' not in sys.modules\n"
            "openreg_inductor.register()\n"
            "x = torch.randn(5, 7)\n"
            "out = torch.compile(lambda t: t.t().argmax())(x.to('openreg'))\n"
            "print(out.item(), x.t().argmax().item())"
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        got, expected = r.stdout.split()
        self.assertEqual(got, expected)

    def test_excluded_by_openreg_plugins(self):
        r = run_python(PROBE, env={"OPENREG_PLUGINS": "none"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip().split(" ", 2)[:2], ["False", "True"])
        self.assertIn("InductorError", r.stdout)
        # then imported by hand: loaded (its entry point registers; the import alone did not)
        r = run_python(
            "import torch, openreg_inductor\n" + PROBE,
            env={"OPENREG_PLUGINS": "none"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "True True [2.0, 2.0, 2.0, 2.0]")

    def test_registrations(self):
        import openreg_inductor
        import torch._inductor.compile_fx  # noqa: F401  (registration waits for its import)
        from openreg_inductor.codegen.scheduling import OpenRegScheduling
        from openreg_inductor.codegen.wrapper import OpenRegPythonWrapper
        from torch._dynamo.device_interface import get_interface_for_device
        from torch._inductor.codegen.common import (
            custom_backend_codegen_configs,
            get_device_op_overrides,
            get_scheduling_for_device,
            get_wrapper_codegen_for_device,
        )

        self.assertTrue(openreg_inductor._registered)
        interface = get_interface_for_device("openreg")
        self.assertEqual(interface.device_count(), torch.openreg.device_count())
        self.assertEqual(interface.get_device_properties(1).multi_processor_count, 2)
        self.assertEqual(interface.get_raw_stream(0), torch.openreg.current_raw_stream(0))
        self.assertIs(get_interface_for_device("openreg:1"), interface)
        self.assertIs(get_scheduling_for_device("openreg"), OpenRegScheduling)
        self.assertIs(get_wrapper_codegen_for_device("openreg"), OpenRegPythonWrapper)
        self.assertIn("current_raw_stream", get_device_op_overrides("openreg").import_get_raw_stream_as("s"))
        self.assertIs(custom_backend_codegen_configs["openreg"], openreg_inductor.config)


class TestCacheKey(TestCase):
    def test_codegen_version_invalidates_cached_graphs(self):
        import openreg_inductor.config as plugin_config
        from torch._dynamo.utils import counters

        x = torch.randn(16, device="openreg")

        def run():
            torch._dynamo.reset()
            counters.clear()
            torch.compile(lambda t: t * 5 - 1)(x)
            return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]

        run()
        self.assertEqual(run(), (1, 0))  # the same plugin reuses the cached graph
        # A version never used before (the cache may outlive this run): the key must change.
        with plugin_config.patch(codegen_version=plugin_config.codegen_version + 1 + uuid.uuid4().int % 10**9):
            self.assertEqual(run(), (0, 1))  # a changed codegen does not


if __name__ == "__main__":
    run_tests()
