"""torch.save/torch.load of openreg tensors, modules and optimizers (PyTorch's generic PrivateUse1 path)."""

import io
import os
import pickle
import struct
import tempfile
import zipfile

import torch
from conftest import run_python
from torch.testing._internal.common_utils import TestCase, run_tests

# torch.load's clear message for a damaged archive ends with this advice.
CORRUPTED_HINT = "there is a high likelihood that your checkpoint file is corrupted"
WEIGHTS_ONLY_FAILED = "Weights only load failed"


class _Stub:
    """Stands in for every class a checkpoint's pickle names, so the pickle can be read without torch."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


class _LocationReader(pickle.Unpickler):
    """Reads a checkpoint's data.pkl and collects the persistent ids torch.save wrote for the storages."""

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data))
        self.storages = {}

    def find_class(self, module, name):
        return type(name, (_Stub,), {"module": module})

    def persistent_load(self, pid):
        kind, storage_type, key, location, numel = pid
        if kind != "storage":
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        self.storages[key] = (location, numel, f"{storage_type.module}.{storage_type.__name__}")
        return _Stub()


def storage_locations(path: str) -> dict:
    """{record key: (location tag, numel, storage class)} for every storage in the checkpoint at `path`."""
    with zipfile.ZipFile(path) as z:
        (name,) = [n for n in z.namelist() if n.endswith("/data.pkl")]
        reader = _LocationReader(z.read(name))
    reader.load()
    return reader.storages


def make_payload() -> dict:
    """Tensors on both devices, of several dtypes and layouts, plus a view that shares its base's storage."""
    torch.manual_seed(0)
    base = torch.randn(6, 8, device="openreg:0")
    return {
        "f32_dev0": base,
        "view_of_f32_dev0": base[1:4, 2:],  # storage offset 10, strides (8, 1)
        "f32_dev1": torch.randn(5, 3, device="openreg:1"),
        "bf16": torch.randn(7, device="openreg:0").to(torch.bfloat16),
        "int64": torch.arange(-5, 5, dtype=torch.int64, device="openreg:1"),
        "bool": torch.tensor([True, False, True, True], device="openreg:0"),
        "transposed": torch.randn(4, 6, device="openreg:1").t(),
        "strided_slice": torch.arange(20.0, device="openreg:0")[3::4],
    }


class SerializationTestCase(TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def path(self, name: str = "ckpt.pt") -> str:
        return os.path.join(self.tmp.name, name)

    def save(self, obj, name: str = "ckpt.pt") -> str:
        path = self.path(name)
        torch.save(obj, path)
        return path


class TestTensors(SerializationTestCase):
    def test_round_trip_keeps_device_dtype_layout_values_and_sharing(self):
        payload = make_payload()
        reference = {k: v.cpu() for k, v in payload.items()}
        path = self.save(payload)
        for weights_only in (True, False):
            with self.subTest(weights_only=weights_only):
                loaded = torch.load(path, weights_only=weights_only)
                self.assertEqual(sorted(loaded), sorted(payload))
                for key, orig in payload.items():
                    t = loaded[key]
                    self.assertEqual(t.device, orig.device, key)
                    self.assertEqual(t.dtype, orig.dtype, key)
                    self.assertEqual(t.shape, orig.shape, key)
                    self.assertEqual(t.stride(), orig.stride(), key)
                    self.assertEqual(t.storage_offset(), orig.storage_offset(), key)
                    self.assertEqual(t.is_contiguous(), orig.is_contiguous(), key)
                    self.assertEqual(t.cpu(), reference[key], atol=0, rtol=0, msg=key)
                base, view = loaded["f32_dev0"], loaded["view_of_f32_dev0"]
                self.assertEqual(view.untyped_storage().data_ptr(), base.untyped_storage().data_ptr())
                base[2, 3] = 123.0  # element (1, 1) of the view
                self.assertEqual(view[1, 1].item(), 123.0)

    def test_storage_location_tags(self):
        payload = make_payload()
        locations = storage_locations(self.save(payload))
        # one record per storage (the view adds none), tagged with the device it lives on
        storage_class = {
            torch.float32: "torch.FloatStorage",
            torch.bfloat16: "torch.BFloat16Storage",
            torch.int64: "torch.LongStorage",
            torch.bool: "torch.BoolStorage",
        }
        storages = {t.untyped_storage().data_ptr(): t for t in payload.values()}
        expected = sorted(
            (str(t.device), t.untyped_storage().nbytes() // t.element_size(), storage_class[t.dtype])
            for t in storages.values()
        )
        self.assertEqual(sorted(locations.values()), expected)
        self.assertEqual(sorted({location for location, _, _ in locations.values()}), ["openreg:0", "openreg:1"])

    def test_map_location(self):
        payload = make_payload()
        reference = {k: v.cpu() for k, v in payload.items()}
        path = self.save(payload)
        cpu, dev1 = torch.device("cpu"), torch.device("openreg:1")
        cases = [
            ("cpu", lambda orig: cpu),
            ("openreg:1", lambda orig: dev1),
            (torch.device("openreg", 1), lambda orig: dev1),
            ({"openreg:0": "openreg:1"}, lambda orig: dev1),
            ({"openreg:0": "cpu"}, lambda orig: cpu if orig.index == 0 else orig),
            (lambda storage, loc: storage, lambda orig: cpu),
            (lambda storage, loc: storage.openreg(1), lambda orig: dev1),
        ]
        for map_location, expected_device in cases:
            for weights_only in (True, False):
                with self.subTest(map_location=repr(map_location), weights_only=weights_only):
                    loaded = torch.load(path, map_location=map_location, weights_only=weights_only)
                    for key, orig in payload.items():
                        self.assertEqual(loaded[key].device, expected_device(orig.device), key)
                        self.assertEqual(loaded[key].stride(), orig.stride(), key)
                        self.assertEqual(loaded[key].cpu(), reference[key], atol=0, rtol=0, msg=key)
                    self.assertEqual(
                        loaded["view_of_f32_dev0"].untyped_storage().data_ptr(),
                        loaded["f32_dev0"].untyped_storage().data_ptr(),
                    )

    def test_load_saved_on_a_device_this_process_lacks_names_map_location(self):
        # torch.serialization parses the location with torch.openreg._utils._get_device_index (CUDA's
        # contract: no range check) and then raises its own error, which tells the user what to do.
        path = self.save({"b": torch.ones(2, device="openreg:1")})
        r = run_python(
            f"""
            import torch
            try:
                torch.load({path!r})
            except RuntimeError as e:
                print(e)
            print(torch.load({path!r}, map_location="openreg:0")["b"].device)
            """,
            env={"OPENREG_DEVICE_COUNT": "1"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(
            "Attempting to deserialize object on OPENREG device 1 but torch.openreg.device_count() is 1. "
            "Please use torch.load with map_location",
            r.stdout,
        )
        self.assertTrue(r.stdout.strip().endswith("openreg:0"), r.stdout)

    def test_load_onto_missing_device_index(self):
        path = self.save({"a": torch.ones(3, device="openreg:0"), "b": torch.ones(2, device="openreg:1")})
        # torch's own message (torch.serialization._validate_device), which names map_location.
        message = r"Attempting to deserialize object on OPENREG device 5 but torch.openreg.device_count\(\) is 2"
        for map_location in ("openreg:5", torch.device("openreg", 5), {"openreg:0": "openreg:5"}):
            for weights_only in (True, False):
                with self.subTest(map_location=repr(map_location), weights_only=weights_only):
                    with self.assertRaisesRegex(RuntimeError, message):
                        torch.load(path, map_location=map_location, weights_only=weights_only)
        # nothing was left half-initialised
        loaded = torch.load(path, weights_only=True)
        self.assertEqual(loaded["b"].device, torch.device("openreg:1"))
        self.assertEqual(loaded["b"].add(1).cpu(), torch.full((2,), 2.0))

    def test_storageless_tensors_that_require_grad_load_as_leaves(self):
        # torch pickles them as a CPU copy made with autograd on, and its rebuild set requires_grad
        # on the moved (non-leaf) copy: "you can only change requires_grad flags of leaf variables",
        # for every map_location and for pickle (torch_openreg/openreg/_serialization.py).
        dense = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
        layouts = {
            "csr": lambda t: t.to_sparse_csr(),
            "csc": lambda t: t.to_sparse_csc(),
            "bsr": lambda t: t.to_sparse_bsr((1, 1)),
        }
        for name, make in layouts.items():
            for requires_grad in (True, False):
                t = make(dense).to("openreg:1").requires_grad_(requires_grad)
                path = self.save({"t": t, "p": torch.nn.Parameter(make(dense).to("openreg"))}, f"{name}.pt")
                for map_location, device in ((None, "openreg:1"), ("cpu", "cpu"), ("openreg:0", "openreg:0")):
                    for weights_only in (True, False):
                        with self.subTest(layout=name, grad=requires_grad, map_location=map_location, wo=weights_only):
                            loaded = torch.load(path, map_location=map_location, weights_only=weights_only)
                            r, p = loaded["t"], loaded["p"]
                            self.assertEqual((r.layout, r.device), (t.layout, torch.device(device)))
                            self.assertEqual((r.requires_grad, r.is_leaf, r.grad_fn), (requires_grad, True, None))
                            self.assertEqual(r.to_dense().cpu(), dense)
                            self.assertIsInstance(p, torch.nn.Parameter)
                            self.assertEqual((p.requires_grad, p.is_leaf), (True, True))
                with self.subTest(layout=name, grad=requires_grad, via="pickle"):
                    r = pickle.loads(pickle.dumps(t))
                    self.assertEqual((r.device, r.requires_grad, r.is_leaf), (t.device, requires_grad, True))
                    self.assertEqual(r.to_dense().cpu(), dense)


class TestModulesAndOptimizers(SerializationTestCase):
    def make_model(self, device):
        torch.manual_seed(1)
        return torch.nn.Sequential(
            torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
        ).to(device)

    def test_module_state_dict(self):
        model = self.make_model("openreg:1")
        x = torch.randn(16, 6, device="openreg:1")
        model(x)  # training mode: updates BatchNorm's running stats and num_batches_tracked (int64)
        state = model.state_dict()
        path = self.save(state)

        loaded = torch.load(path, weights_only=True)
        self.assertEqual(list(loaded), list(state))
        for key, value in state.items():
            self.assertEqual(loaded[key].device, torch.device("openreg:1"), key)
            self.assertEqual(loaded[key].dtype, value.dtype, key)
            self.assertEqual(loaded[key].cpu(), value.cpu(), atol=0, rtol=0, msg=key)
        self.assertEqual(loaded["1.num_batches_tracked"].item(), 1)

        # a fresh model on the other device (different init) behaves like the original once loaded
        torch.manual_seed(2)
        other = torch.nn.Sequential(
            torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
        ).to("openreg:0")
        other.load_state_dict(torch.load(path, map_location="openreg:0", weights_only=True))
        model.eval()
        other.eval()
        self.assertEqual(other(x.to("openreg:0")).cpu(), model(x).cpu())

    def test_optimizer_state_dict_after_a_step(self):
        factories = {
            "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
            "adam": lambda p: torch.optim.Adam(p, lr=0.01),
        }
        x = torch.randn(16, 6, device="openreg:0")
        for name, make_optimizer in factories.items():
            with self.subTest(optimizer=name):
                model = self.make_model("openreg:0")
                optimizer = make_optimizer(model.parameters())
                model(x).square().mean().backward()
                optimizer.step()
                path = self.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, f"{name}.pt")

                checkpoint = torch.load(path, weights_only=True)
                saved_state = optimizer.state_dict()["state"]
                self.assertEqual(sorted(checkpoint["optimizer"]["state"]), sorted(saved_state))
                for index, param_state in saved_state.items():
                    for key, value in param_state.items():
                        got = checkpoint["optimizer"]["state"][index][key]
                        self.assertEqual(got.device, value.device, f"{index}.{key}")
                        self.assertEqual(got.cpu(), value.cpu(), atol=0, rtol=0, msg=f"{index}.{key}")
                self.assertEqual(checkpoint["optimizer"]["param_groups"], optimizer.state_dict()["param_groups"])

                # resuming from the checkpoint continues exactly like the original
                resumed = self.make_model("openreg:0")
                resumed.load_state_dict(checkpoint["model"])
                resumed_optimizer = make_optimizer(resumed.parameters())
                resumed_optimizer.load_state_dict(checkpoint["optimizer"])
                for m, opt in ((model, optimizer), (resumed, resumed_optimizer)):
                    opt.zero_grad()
                    m(x).square().mean().backward()
                    opt.step()
                for (key, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
                    self.assertEqual(b.device, torch.device("openreg:0"), key)
                    self.assertEqual(b.cpu(), a.cpu(), atol=0, rtol=0, msg=key)


class TestDamagedCheckpoints(SerializationTestCase):
    def setUp(self):
        super().setUp()
        self.original = torch.arange(4096, dtype=torch.float32, device="openreg:1")
        self.good = self.save({"w": self.original})
        with open(self.good, "rb") as f:
            self.blob = f.read()

    def load_bytes(self, blob: bytes, weights_only: bool):
        path = self.path("damaged.pt")
        with open(path, "wb") as f:
            f.write(blob)
        return torch.load(path, weights_only=weights_only)

    def assert_device_still_usable(self):
        self.assertEqual(torch.ones(3, device="openreg:1").mul(2).cpu(), torch.full((3,), 2.0))
        self.assertEqual(torch.load(self.good, weights_only=True)["w"].cpu(), self.original.cpu())

    def test_truncated(self):
        # the first half of a 400 KB checkpoint: a clear error
        large = self.save({"w": torch.arange(100_000, dtype=torch.float32, device="openreg:1")}, "large.pt")
        with open(large, "rb") as f:
            large_blob = f.read()
        for weights_only in (True, False):
            with self.subTest(weights_only=weights_only):
                message = "PytorchStreamReader failed reading zip archive: failed finding central directory"
                with self.assertRaisesRegex(RuntimeError, message + ".*" + CORRUPTED_HINT):
                    self.load_bytes(large_blob[: len(large_blob) // 2], weights_only)
                # The first half of this 18 KB one: miniz's backwards search for the end of the central
                # directory steps before the start of the file (an unsigned underflow) and torch seeks the
                # file object to a negative offset: a bare OSError that does not say the file is damaged.
                with self.assertRaisesRegex(OSError, r"^\[Errno 22\] Invalid argument$"):
                    self.load_bytes(self.blob[: len(self.blob) // 2], weights_only)
        self.assert_device_still_usable()

    def test_corrupted_central_directory_and_record_header(self):
        with zipfile.ZipFile(self.good) as z:
            (record,) = [i for i in z.infolist() if i.filename.endswith("/data/0")]
            central_directory = z.start_dir

        def flipped(offset: int, count: int) -> bytes:
            b = bytearray(self.blob)
            for i in range(offset, offset + count):
                b[i] ^= 0xFF
            return bytes(b)

        cases = [
            (flipped(central_directory, 16), "PytorchStreamReader failed reading zip archive: invalid header"),
            (flipped(record.header_offset, 4), "PytorchStreamReader failed reading file data/0: invalid header"),
        ]
        for blob, message in cases:
            for weights_only in (True, False):
                with self.subTest(message=message, weights_only=weights_only):
                    with self.assertRaisesRegex(RuntimeError, message + ".*" + CORRUPTED_HINT):
                        self.load_bytes(blob, weights_only)
        self.assert_device_still_usable()

    def test_flipped_tensor_bytes_are_not_detected(self):
        # torch.load does not check the CRC-32 of the records it reads: bytes flipped inside a tensor's
        # data (the middle of this archive) load without an error, as wrong values. zipfile notices.
        with zipfile.ZipFile(self.good) as z:
            (record,) = [i for i in z.infolist() if i.filename.endswith("/data/0")]
        middle = len(self.blob) // 2
        # the data follows the local header: 30 bytes, then the name and the extra field (torch pads it)
        name_length, extra_length = struct.unpack_from("<HH", self.blob, record.header_offset + 26)
        data_start = record.header_offset + 30 + name_length + extra_length
        self.assertTrue(data_start < middle < data_start + record.file_size)
        damaged = bytearray(self.blob)
        for i in range(middle, middle + 8):
            damaged[i] ^= 0xFF
        for weights_only in (True, False):
            with self.subTest(weights_only=weights_only):
                loaded = self.load_bytes(bytes(damaged), weights_only)["w"]
                self.assertEqual(loaded.device, torch.device("openreg:1"))
                differs = (loaded.cpu() != self.original.cpu()).nonzero().flatten().tolist()
                first, last = (middle - data_start) // 4, (middle + 7 - data_start) // 4
                self.assertEqual(differs, list(range(first, last + 1)))
        with zipfile.ZipFile(self.path("damaged.pt")) as z:
            self.assertEqual(z.testzip(), record.filename)
        self.assert_device_still_usable()

    def test_not_a_checkpoint(self):
        # Files that are not zip archives are read as the legacy pickle format; the errors are torch's.
        html = b"<!DOCTYPE html>\n<html><body>404 Not Found</body></html>\n"
        cases = [
            (html, True, pickle.UnpicklingError, WEIGHTS_ONLY_FAILED + r"(.|\n)*Unsupported operand 60"),
            (html, False, pickle.UnpicklingError, "invalid load key, '<'"),
            (bytes(4096), True, RuntimeError, "Cannot use ``weights_only=True`` with files saved in the legacy .tar"),
            (bytes(4096), False, KeyError, "filename 'storages' not found"),
        ]
        for blob, weights_only, error, message in cases:
            with self.subTest(blob=blob[:8], weights_only=weights_only):
                with self.assertRaisesRegex(error, message):
                    self.load_bytes(blob, weights_only)
        self.assert_device_still_usable()


class TestWithoutOpenreg(SerializationTestCase):
    def test_checkpoint_loads_on_cpu_without_the_backend(self):
        payload = {"w": torch.arange(6.0, device="openreg:0").view(2, 3), "b": torch.tensor([7, 8], device="openreg:1")}
        path = self.save(payload)
        # Sparse and nested tensors have no storage: pickled as a CPU copy and the device's name.
        x = torch.tensor([[0.0, 1.0], [2.0, 0.0]], device="openreg")
        parts = {"coo": x.to_sparse(), "nested": torch.nested.nested_tensor([x[0], x[1, :1]])}
        storageless = self.save(parts, "storageless.pt")
        r = run_python(
            f"""
            import torch
            print(hasattr(torch, "openreg"), torch._C._get_privateuse1_backend_name())
            state = torch.load({path!r}, map_location="cpu", weights_only=True)
            print({{k: (str(v.device), v.tolist()) for k, v in sorted(state.items())}})
            try:
                torch.load({path!r}, weights_only=True)
            except Exception as e:
                print(type(e).__name__, str(e).splitlines()[-1])
            state = torch.load({storageless!r}, map_location="cpu", weights_only=True)
            print(str(state["coo"].device), state["coo"].to_dense().tolist(), [t.tolist() for t in state["nested"]])
            try:
                torch.load({storageless!r}, weights_only=True)
            except Exception as e:
                print(type(e).__name__, str(e).splitlines()[0])
            """,
            env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.strip().splitlines()
        self.assertEqual(lines[0], "False privateuseone")
        self.assertEqual(lines[1], str({"b": ("cpu", [7, 8]), "w": ("cpu", [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])}))
        self.assertEqual(
            lines[2],
            "RuntimeError don't know how to restore data location of torch.storage.UntypedStorage "
            "(tagged with openreg:0)",
        )
        self.assertEqual(lines[3], "cpu [[0.0, 1.0], [2.0, 0.0]] [[0.0, 1.0], [2.0]]")
        self.assertRegex(
            lines[4], r"^RuntimeError Expected one of cpu, .* device type at start of device string: openreg$"
        )

    def test_a_late_import_under_no_grad_still_loads_storageless_tensors_that_require_grad(self):
        # torch's weights_only unpickler caches the functions it allows at its first load: one
        # before openreg's import kept torch's broken rebuild; and the probe that decides whether to
        # wrap it answered "sound" when the import ran under no_grad.
        path = self.save(torch.eye(2).to_sparse_csr().to("openreg").requires_grad_(), "csr.pt")
        r = run_python(
            f"""
            import io, torch
            buf = io.BytesIO(); torch.save(torch.ones(1), buf); buf.seek(0)
            torch.load(buf, weights_only=True)  # fills torch's cache of allowed functions
            with torch.no_grad():
                import torch_openreg
            t = torch.load({path!r}, weights_only=True)
            print(t.device, t.layout, t.requires_grad, t.is_leaf, t.to_dense().cpu().tolist())
            """,
            env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        )
        self.assertEqual(r.stdout.strip(), "openreg:0 torch.sparse_csr True True [[1.0, 0.0], [0.0, 1.0]]", r.stderr)

    def test_byteswap_of_a_device_storage(self):
        # torch's UntypedStorage._byteswap swaps through host memory: on an openreg storage the
        # process died (SIGSEGV). It runs on the device now, with torch's checks.
        cpu = torch.arange(6, dtype=torch.float32)
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.complex64, torch.uint8):
            with self.subTest(dtype):
                expected = cpu.to(dtype).untyped_storage()
                device = cpu.to(dtype).to("openreg").untyped_storage()
                expected.byteswap(dtype)
                device.byteswap(dtype)
                self.assertEqual(torch.tensor(list(device.cpu())), torch.tensor(list(expected)))
        odd = torch.zeros(3, dtype=torch.uint8, device="openreg").untyped_storage()
        with self.assertRaisesRegex(RuntimeError, "the length of data is not a multiple of 4"):
            odd._byteswap(4)
        for storage in (torch.UntypedStorage(4), odd):
            with self.assertRaisesRegex(RuntimeError, "elem_size must be 1, 2, 4, or 8"):
                storage._byteswap(3)


if __name__ == "__main__":
    run_tests()
