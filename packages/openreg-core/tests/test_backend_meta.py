"""Backend metadata on openreg tensors (csrc/tensor/OpenRegBackendMeta.cpp, torch_openreg/openreg/backend_meta.py)."""

import io
import os
import tempfile
import warnings
from copy import deepcopy

import torch
from conftest import run_python
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.openreg import BackendMeta, clear_backend_meta, get_backend_meta, set_backend_meta
from torch.testing._internal.common_utils import TestCase


def _round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


class TestBackendMeta(TestCase):
    def setUp(self):
        self.t = torch.arange(6.0, device="openreg")
        set_backend_meta(self.t, format=9, compressed=True)

    def tearDown(self):
        del self.t  # pytest keeps TestCase instances alive

    def test_set_get_replace_clear(self):
        self.assertIsNone(get_backend_meta(torch.ones(2, device="openreg")))
        self.assertEqual(get_backend_meta(self.t), BackendMeta(format=9, compressed=True))
        set_backend_meta(self.t, format=3)
        self.assertEqual(get_backend_meta(self.t), BackendMeta(format=3, compressed=False))
        clear_backend_meta(self.t)
        self.assertIsNone(get_backend_meta(self.t))
        self.assertEqual(self.t.cpu().tolist(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])  # data untouched

    def test_bad_input(self):
        with self.assertRaisesRegex(RuntimeError, "backend metadata belongs to openreg tensors, got a tensor on cpu"):
            set_backend_meta(torch.ones(2), format=1)
        for bad in (-1, 16):
            with self.assertRaisesRegex(RuntimeError, f"backend metadata format must be in 0..15, got {bad}"):
                set_backend_meta(self.t, format=bad)
        self.assertEqual(get_backend_meta(self.t), BackendMeta(9, True))  # a failed set changes nothing

    def test_copied_with_the_tensor_each_copy_its_own(self):
        for copy in (self.t.detach(), self.t.data, torch.nn.Parameter(self.t)):
            self.assertEqual(get_backend_meta(copy), BackendMeta(9, True))
        d = self.t.detach()
        set_backend_meta(d, format=1)  # the copy's metadata is its own object
        self.assertEqual(get_backend_meta(self.t), BackendMeta(9, True))
        self.assertEqual(get_backend_meta(d), BackendMeta(1, False))

    def test_new_tensors_start_without_it(self):
        for new in (self.t + 1, self.t.clone(), self.t[1:], self.t.to("openreg:1")):
            self.assertIsNone(get_backend_meta(new))

    def test_survives_save_and_load(self):
        for kwargs in ({}, {"weights_only": True}, {"map_location": "openreg:1"}, {"map_location": "openreg:0"}):
            loaded = _round_trip(self.t, **kwargs)
            self.assertEqual(get_backend_meta(loaded), BackendMeta(9, True), msg=str(kwargs))
            self.assertEqual(loaded.cpu(), self.t.cpu())
        self.assertEqual(_round_trip(self.t, map_location="openreg:1").device, torch.device("openreg:1"))

    def test_survives_in_module_state(self):
        model = torch.nn.Linear(3, 2).to("openreg")
        set_backend_meta(model.weight, format=15, compressed=False)
        state = _round_trip(model.state_dict(), weights_only=True)
        self.assertEqual(get_backend_meta(state["weight"]), BackendMeta(15, False))
        self.assertIsNone(get_backend_meta(state["bias"]))
        fresh = torch.nn.Linear(3, 2).to("openreg")
        fresh.load_state_dict(state, assign=True)
        self.assertEqual(get_backend_meta(fresh.weight), BackendMeta(15, False))

    def test_loading_to_cpu_drops_it(self):
        loaded = _round_trip(self.t, map_location="cpu", weights_only=True)
        self.assertEqual(loaded.device.type, "cpu")
        self.assertEqual(loaded, self.t.cpu())
        self.assertEqual(torch._C._get_tensor_metadata(loaded), {})

    def test_checkpoint_with_metadata_loads_without_openreg(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ckpt.pt")
            torch.save({"t": self.t}, path)
            r = run_python(
                f"""
                import torch
                assert not hasattr(torch, "openreg")
                t = torch.load({path!r}, map_location="cpu", weights_only=True)["t"]
                print(t.device, t.tolist())
                """,
                env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
            )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "cpu [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]")

    def test_propagates_into_fake_tensor(self):
        fake = FakeTensorMode().from_tensor(self.t)
        self.assertEqual(fake.device, torch.device("openreg:0"))
        self.assertEqual(get_backend_meta(fake), BackendMeta(9, True))
        self.assertIsNone(get_backend_meta(FakeTensorMode().from_tensor(torch.ones(2, device="openreg"))))

    def test_propagates_into_functional_tensor(self):
        wrapper = torch._to_functional_tensor(self.t)  # the C++ FunctionalTensorWrapper
        self.assertTrue(torch._is_functional_tensor(wrapper))
        self.assertEqual(get_backend_meta(wrapper), BackendMeta(9, True))
        with FunctionalTensorMode():
            functional = FunctionalTensor.to_functional(self.t)  # the Python subclass torch.compile uses
        self.assertEqual(get_backend_meta(functional), BackendMeta(9, True))
        self.assertEqual(get_backend_meta(functional.elem), BackendMeta(9, True))


class TestUnderDynamo(TestCase):
    def test_compiled_autograd_in_a_compiled_step(self):
        # Compiled autograd makes FakeTensors of the backward's inputs while the compiled step's
        # frame callback is active; the propagation wrapper around torch's FakeTensorConverter is
        # this package's code, which Dynamo compiled (and failed on: "Found tensor of type
        # Parameter, which is not supported by FakeTensorMode") until it was marked skipped, as
        # torch's own code is (backend_meta._skipped_by_dynamo).
        torch.manual_seed(0)
        cpu = torch.nn.Linear(6, 3)
        dev = deepcopy(cpu).to("openreg")
        set_backend_meta(dev.weight, format=4)
        x = torch.randn(4, 6)

        def make_step(model):
            optimizer = torch.optim.Adam(model.parameters(), lr=0.1)

            def step(inp):
                optimizer.zero_grad()
                model(inp).square().sum().backward()
                optimizer.step()

            return step

        from unittest import mock

        import torch._dynamo.convert_frame as convert_frame

        compiled = []  # the files of the frames Dynamo compiles
        compile_frame = convert_frame._compile

        def spy(code, *args, **kwargs):
            compiled.append(code.co_filename)
            return compile_frame(code, *args, **kwargs)

        torch._dynamo.reset()
        with (
            torch._dynamo.config.patch(compiled_autograd=True),
            mock.patch.object(convert_frame, "_compile", spy),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            # openreg first: compiled autograd would reuse the graph the CPU's run cached, without fakes.
            for model, inp in ((dev, x.to("openreg")), (cpu, x)):
                step = torch.compile(make_step(model), backend="eager")
                for _ in range(3):
                    step(inp)
        torch._dynamo.reset()
        # The function the wrappers call (_copy_meta) is skipped too: Dynamo compiled it once per
        # shape, up to its recompile limit, and warned that it cannot trace _get_backend_meta (hunt36b).
        self.assertTrue(compiled)
        from torch_openreg.openreg import backend_meta

        self.assertFalse([f for f in compiled if f == backend_meta.__file__])
        self.assertFalse([w for w in caught if "_get_backend_meta" in str(w.message)])
        self.assertEqual(dev.weight.cpu(), cpu.weight, atol=1e-6, rtol=1e-6)
        self.assertEqual(dev.bias.cpu(), cpu.bias, atol=1e-6, rtol=1e-6)
        self.assertEqual(get_backend_meta(dev.weight), BackendMeta(4, False))
