"""openreg_onnx.export: provenance, dynamic dimensions checked, loud errors for bad inputs, CLI."""

import io
import textwrap

import onnx
import onnxruntime as ort
import openreg_onnx
import pytest
import torch
from conftest import MLP, run_python
from onnxscript import opset18 as op
from openreg_onnx import _vendor
from openreg_onnx.__main__ import main
from openreg_onnx._export import DeviceMismatchError, DynamicDimError, UnsupportedOperatorError, check_dynamic_dims
from openreg_onnx._verify import run_onnx
from torch.export import Dim
from torch.testing._internal.common_utils import TestCase


@torch.library.custom_op("openreg_onnx_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


class Twice(torch.nn.Module):
    def forward(self, x):
        return twice(x) + 1


class BranchOnBatch(torch.nn.Module):
    """Specialises the batch size: torch.export's suggested fix makes it static."""

    def forward(self, x):
        return x * 2 if x.shape[0] == 2 else x


@pytest.fixture(scope="module")
def mlp_program():
    torch.manual_seed(0)
    model = MLP().to("openreg").eval()
    x = torch.randn(4, 8, device="openreg")
    return model, x, openreg_onnx.export(model, (x,), dynamic_shapes={"x": {0: Dim("batch")}})


class TestProvenanceAndShapes:
    def test_provenance_metadata(self, mlp_program):
        _, _, program = mlp_program
        meta = {p.key: p.value for p in program.model_proto.metadata_props}
        assert meta["openreg_onnx.version"] == openreg_onnx.__version__
        assert meta["openreg_onnx.torch"] == torch.__version__
        assert meta["openreg_onnx.onnx"] == onnx.__version__
        assert meta["openreg_onnx.onnxscript"].startswith("0.7")
        assert meta["openreg_onnx.opsets"] == "ai.onnx:20"
        assert meta["openreg_onnx.mode"] == "portable"
        assert meta["openreg_onnx.source_device"] == "openreg:0"

    def test_dynamic_batch_runs_at_new_sizes(self, mlp_program):
        model, _, program = mlp_program
        dims = program.model_proto.graph.input[0].type.tensor_type.shape.dim
        assert [d.dim_param or d.dim_value for d in dims] == ["batch", 8]
        for batch in (1, 7):
            x = torch.randn(batch, 8, device="openreg")
            (got,), _, _ = run_onnx(program.model_proto, {"x": x.cpu().numpy()})
            torch.testing.assert_close(torch.from_numpy(got), model(x).detach().cpu(), rtol=1e-4, atol=1e-5)

    def test_requested_dynamic_dim_that_came_out_static_fails_loudly(self):
        x = torch.randn(2, 3, device="openreg")
        # torch.onnx.export itself applies torch.export's suggested fix and keeps the size:
        plain = torch.onnx.export(BranchOnBatch().eval(), (x,), dynamic_shapes={"x": {0: Dim("b")}}, verbose=False)
        assert plain.model_proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2
        with pytest.raises(DynamicDimError, match=r"came out static in the ONNX model: x\[0\] = 2 \("):
            openreg_onnx.export(BranchOnBatch(), (x,), dynamic_shapes={"x": {0: Dim("b")}})

    def test_check_lists_every_static_dim_and_accepts_positional_specs(self):
        model = onnx.helper.make_model(
            onnx.helper.make_graph(
                [onnx.helper.make_node("Identity", ["a"], ["y"])],
                "g",
                [onnx.helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [2, "s", 5])],
                [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
            )
        )
        check_dynamic_dims(model, [("a", 1)])
        with pytest.raises(DynamicDimError, match=r"a\[0\] = 2, a\[2\] = 5 "):
            check_dynamic_dims(model, [("a", 0), ("a", 1), ("a", 2)])
        with pytest.raises(DynamicDimError, match=r"a\[2\] = 5 "):
            check_dynamic_dims(model, [("0", 2)])  # positional: the first input

    def test_nested_inputs_keep_their_dynamic_dims(self):
        batch = Dim("batch")

        class DictIn(torch.nn.Module):
            def forward(self, inp):
                return inp["a"] * 2 + inp["b"]

        class ListIn(torch.nn.Module):
            def forward(self, xs):
                return xs[0] - xs[1]

        def shapes(program):
            graph = program.model_proto.graph
            return [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input]

        pair = {"a": torch.randn(3, 4), "b": torch.randn(3, 4)}
        cases = [
            (DictIn().eval(), (), {"inp": pair}, {"inp": {"a": {0: batch}, "b": {0: batch}}}),
            (ListIn().eval(), ([pair["a"], pair["b"]],), {}, ([{0: batch}, {0: batch}],)),
        ]
        for model, args, kwargs, dynamic in cases:
            args_d = torch.utils._pytree.tree_map(lambda t: t.to("openreg"), args)
            kwargs_d = torch.utils._pytree.tree_map(lambda t: t.to("openreg"), kwargs)
            program = openreg_onnx.export(model, args_d, kwargs=kwargs_d, dynamic_shapes=dynamic)
            plain = torch.onnx.export(
                model, args_d, kwargs=kwargs_d, dynamic_shapes=dynamic, dynamo=True, verbose=False
            )
            assert shapes(program) == shapes(plain) == [["batch", 4], ["batch", 4]]
            # and it runs at another batch size
            flat = [torch.randn(5, 4), torch.randn(5, 4)]
            feeds = {i.name: t.numpy() for i, t in zip(program.model_proto.graph.input, flat)}
            (got,), _, _ = run_onnx(program.model_proto, feeds)
            call = model({"a": flat[0], "b": flat[1]}) if isinstance(model, DictIn) else model(flat)
            torch.testing.assert_close(torch.from_numpy(got), call)

    def test_static_dim_is_found_under_custom_input_names(self):
        x = torch.randn(2, 3, device="openreg")
        with pytest.raises(DynamicDimError, match=r"came out static in the ONNX model: inp\[0\] = 2 \("):
            openreg_onnx.export(BranchOnBatch(), (x,), dynamic_shapes={"x": {0: Dim("b")}}, input_names=["inp"])

    def test_dynamic_dims_follow_the_inputs_not_the_names(self):
        # Keywords out of signature order, a constant int (no ONNX input), a nested dict: the
        # specialised batch is y's, the third ONNX input, renamed "third".
        class Mixed(torch.nn.Module):
            def forward(self, x, n, y, z):
                return x * n + z["a"], BranchOnBatch()(y)

        x, y, za = (torch.randn(2, 3, device="openreg") for _ in range(3))
        dynamic = {"x": {0: Dim("b")}, "n": None, "y": {0: Dim("c")}, "z": {"a": {0: Dim("b")}}}
        with pytest.raises(DynamicDimError, match=r"came out static in the ONNX model: third\[0\] = 2 \("):
            openreg_onnx.export(
                Mixed(),
                (x, 3),
                kwargs={"z": {"a": za}, "y": y},
                dynamic_shapes=dynamic,
                input_names=["first", "second", "third"],
            )

    def test_training_mode_is_restored(self):
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.drop = torch.nn.Dropout(0.5)
                self.frozen = torch.nn.BatchNorm1d(8).eval()  # kept in eval by its owner
                self.fc = torch.nn.Linear(8, 4)

            def forward(self, x):
                return self.fc(self.frozen(self.drop(x)))

        torch.manual_seed(0)
        model = Net().to("openreg")
        x = torch.randn(5, 8, device="openreg")
        program = openreg_onnx.export(model, (x,))
        assert [m.training for m in model.modules()] == [True, True, False, True]
        # the export is of inference: no dropout
        (got,), _, _ = run_onnx(program.model_proto, {"x": x.cpu().numpy()})
        with torch.no_grad():
            expected = model.eval()(x).cpu()
        torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-4, atol=1e-5)

    def test_a_module_from_torch_export_is_exported_as_captured(self):
        # ExportedProgram.module() (and every PT2E model: prepare/convert_pt2e) refuses eval(),
        # which export and verify called on any module in training mode: both failed with torch's
        # NotImplementedError, where torch.onnx.export takes the module. Its graph holds the mode
        # it was captured in (here eval: no dropout).
        net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Dropout(0.5), torch.nn.ReLU()).to("openreg").eval()
        x = torch.randn(5, 8, device="openreg")
        captured = torch.export.export(net, (x,)).module()
        assert captured.training  # as torch.export leaves it
        with pytest.raises(NotImplementedError):
            captured.eval()
        program = openreg_onnx.export(captured, (x,))
        (got,), _, _ = run_onnx(
            program.model_proto, {next(iter(program.model_proto.graph.input)).name: x.cpu().numpy()}
        )
        with torch.no_grad():
            expected = net(x).cpu()
        torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-4, atol=1e-5)
        result = openreg_onnx.verify(captured, (x,))
        assert result.ok, result.report()
        assert captured.training

    def test_a_module_holding_a_captured_one_is_exported_in_eval_mode(self):
        # eval() stops at the captured child, which refuses it: a dropout after it kept training,
        # and the export dropped at random. Every module's flag is set, as eval() would have.
        x = torch.randn(5, 8, device="openreg")
        captured = torch.export.export(torch.nn.Linear(8, 8).to("openreg").eval(), (x,)).module()

        class Holder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.captured = captured
                self.drop = torch.nn.Dropout(0.5)

            def forward(self, x):
                return self.drop(self.captured(x))

        model = Holder()
        program = openreg_onnx.export(model, (x,))
        assert "Dropout" not in {n.op_type for n in program.model_proto.graph.node}
        assert all(m.training for m in model.modules())  # given back as it was
        result = openreg_onnx.verify(model, (x,))
        assert result.ok, result.report()

    def test_a_captured_module_that_drops_at_random_is_not_verified(self):
        # Captured from a model in train() mode, its dropout drops at random, and so does its ONNX
        # model: verify(program) refused it, verify(program.module()) compared random outputs.
        net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Dropout(0.5)).to("openreg").train()
        x = torch.randn(5, 8, device="openreg")
        with pytest.raises(
            ValueError, match=r"^the captured module drops at random \(.*capture it from model.eval\(\)"
        ):
            openreg_onnx.verify(torch.export.export(net, (x,)).module(), (x,))

    def test_a_file_object_takes_the_weights_inline(self):
        # As torch.onnx.export writes to an io.BytesIO; ONNXProgram.save refused external_data=True
        # for it (TypeError), and torch.onnx.export's own default is external_data=True.
        model = torch.nn.Linear(4, 3).to("openreg").eval()
        x = torch.randn(2, 4, device="openreg")
        buf = io.BytesIO()
        openreg_onnx.export(model, (x,), buf, external_data=True)
        proto = onnx.load_from_string(buf.getvalue())
        assert sorted(len(i.raw_data) for i in proto.graph.initializer) == [12, 48]  # inline
        (got,), _, _ = run_onnx(proto, {proto.graph.input[0].name: x.cpu().numpy()})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(got), model(x).cpu(), rtol=1e-5, atol=1e-6)

    def test_a_cpu_scalar_input_is_not_a_device_mismatch(self):
        # A 0-dim CPU tensor combines with openreg tensors in eager code, as with CUDA tensors,
        # and torch.onnx.export takes it; a CPU tensor with dimensions is still refused.
        class Scale(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 4)

            def forward(self, x, s):
                return self.fc(x) * s

        model = Scale().to("openreg").eval()
        x, s = torch.randn(2, 4, device="openreg"), torch.tensor(2.5)
        program = openreg_onnx.export(model, (x, s))
        assert [i.name for i in program.model_proto.graph.input] == ["x", "s"]
        result = openreg_onnx.verify(model, (x, s))
        assert result.ok, result.report()
        with pytest.raises(DeviceMismatchError, match="input 1"):
            openreg_onnx.export(model, (x, torch.full((1,), 2.5)))

    def test_verify_leaves_buffers_the_forward_updates_as_they_were(self):
        # verify's reference is the model's real forward: a running sum updated in place (and a
        # counter rebound) changed the model, and the ONNX run read the changed initializer.
        class Accumulating(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("acc", torch.zeros(4))
                self.register_buffer("calls", torch.zeros((), dtype=torch.long))

            def forward(self, x):
                self.acc.add_(x.sum(0))
                self.calls = self.calls + 1
                return x * 2 + self.acc

        model = Accumulating().to("openreg").eval()
        acc, calls = model.acc, model.calls
        x = torch.ones(2, 4, device="openreg")
        result = openreg_onnx.verify(model, (x,))
        assert result.ok, result.report()
        assert model.acc is acc and model.calls is calls
        assert model.acc.cpu().tolist() == [0.0] * 4 and model.calls.item() == 0
        # the model still computes as before verification: its first call's output
        torch.testing.assert_close(model(x).cpu(), torch.full((2, 4), 4.0))

    def test_training_mode_is_restored_when_export_fails(self):
        model = Twice().train()
        with pytest.raises(UnsupportedOperatorError):
            openreg_onnx.export(model, (torch.randn(3, device="openreg"),))
        assert model.training

    def test_vendor_export_saves_a_runnable_file(self, tmp_path):
        x = torch.randn(3, 4, device="openreg")

        class M(torch.nn.Module):
            def forward(self, x):
                return torch.ops.openreg.scaled_square(torch.ops.openreg.custom_abs(x), 3.0)

        path = tmp_path / "m.onnx"
        openreg_onnx.export(M(), (x,), str(path), mode="vendor")
        model = onnx.load(str(path))
        assert _vendor.used_ops(model) == ["custom_abs", "scaled_square"]
        (got,), backend, _ = run_onnx(model, {"x": x.cpu().numpy()})
        assert backend == "onnxruntime"
        torch.testing.assert_close(torch.from_numpy(got), M()(x).cpu())
        # Attaching again adds nothing.
        n = len(model.functions)
        assert len(_vendor.attach_functions(model).functions) == n

    def test_external_data_is_honoured(self, tmp_path):
        # torch.onnx.export(f, external_data=...) applies it when saving f; so must we.
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 64).to("openreg").eval()
        x = torch.randn(2, 64, device="openreg")
        with torch.no_grad():
            expected = model(x).cpu()
        for external in (True, False):
            path = tmp_path / f"external_{external}.onnx"
            openreg_onnx.export(model, (x,), str(path), external_data=external)
            data = tmp_path / f"external_{external}.onnx.data"
            assert data.exists() == external
            locations = {
                i.name: i.data_location for i in onnx.load(str(path), load_external_data=False).graph.initializer
            }
            stored = onnx.TensorProto.EXTERNAL if external else onnx.TensorProto.DEFAULT
            assert locations["weight"] == stored
            # The file as written (its .data beside it) runs in onnxruntime.
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            (got,) = session.run(None, {"input": x.cpu().numpy()})
            torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-4, atol=1e-5)
            (got,), backend, _ = run_onnx(onnx.load(str(path)), {"input": x.cpu().numpy()})
            assert backend == "onnxruntime"
            torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-4, atol=1e-5)

    def test_save_options_without_a_file_fail(self):
        # torch.onnx.export ignores them without f; a caller who passes one expects a file.
        x = torch.randn(2, 4, device="openreg")
        with pytest.raises(TypeError, match=r"external_data only shapes the file written to f, and no f was given"):
            openreg_onnx.export(torch.nn.Linear(4, 4).to("openreg"), (x,), external_data=True)

    def test_plain_export_with_the_vendor_table_then_attach(self):
        x = torch.randn(3, 4, device="openreg")

        class M(torch.nn.Module):
            def forward(self, x):
                return torch.ops.openreg.custom_abs(x) + 1

        table = openreg_onnx.translation_table("vendor")
        program = torch.onnx.export(M().eval(), (x,), dynamo=True, custom_translation_table=table, verbose=False)
        assert [f.name for f in program.model_proto.functions] == []  # the exporter inlines its own
        assert openreg_onnx.attach_functions(program) is program
        assert [f.name for f in program.model_proto.functions] == ["custom_abs"]
        (got,), backend, _ = run_onnx(program.model_proto, {"x": x.cpu().numpy()})
        assert backend == "onnxruntime"
        torch.testing.assert_close(torch.from_numpy(got), M()(x).cpu())


class TestBadInputs(TestCase):
    def test_unsupported_operator_names_the_op_and_the_table(self):
        x = torch.randn(3, device="openreg")
        with self.assertRaisesRegex(
            UnsupportedOperatorError,
            r"openreg_onnx_test::twice.default has no ONNX translation: torch's exporter \(torchlib\) has none, "
            r"and neither has openreg-onnx's table \(openreg_onnx.translation_table\('portable'\), which covers "
            r"openreg::custom_abs, .*\). Pass custom_translation_table=\{torch.ops.openreg_onnx_test.twice.default: ",
        ):
            openreg_onnx.export(Twice(), (x,))

    def test_unsupported_operator_with_a_user_translation(self):
        def twice_onnx(x):
            return op.Add(x, x)

        x = torch.randn(3, device="openreg")
        table = {torch.ops.openreg_onnx_test.twice.default: twice_onnx}
        result = openreg_onnx.verify(Twice(), (x,), custom_translation_table=table)
        self.assertTrue(result.ok, result.report())

    def test_mismatched_devices(self):
        model = MLP().to("openreg")
        with self.assertRaisesRegex(
            DeviceMismatchError,
            r"the model and its inputs are on different devices \(cpu: input 0; openreg:0: parameter "
            r"net.0.bias, parameter net.0.weight, .*\): move them to one device",
        ):
            openreg_onnx.export(model, (torch.randn(2, 8),))
        with self.assertRaisesRegex(DeviceMismatchError, r"\(openreg:0: .*; openreg:1: input 0\)"):
            openreg_onnx.verify(model, (torch.randn(2, 8, device="openreg:1"),))
        # A long list says how many it leaves out (it was cut at six without saying so; hunt33d).
        deep = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(4)))  # 8 tensors on the CPU
        with self.assertRaisesRegex(
            DeviceMismatchError,
            r"\(cpu: parameter 0.bias, parameter 0.weight, (parameter [0-9.a-z]+, ){3}"
            r"parameter 2.weight and 2 more; openreg:0: input 0\)",
        ):
            openreg_onnx.export(deep, (torch.randn(2, 8, device="openreg"),))

    def test_mismatched_devices_name_buffers_and_a_programs_non_persistent_ones(self):
        class Scaled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 4)
                self.register_buffer("shift", torch.zeros(4))
                self.register_buffer("scale", torch.ones(4), persistent=False)

            def forward(self, x):
                return self.fc(x) * self.scale + self.shift

        model = Scaled().to("openreg")
        model.shift = model.shift.to("openreg:1")
        x = torch.randn(2, 4, device="openreg")
        with self.assertRaisesRegex(DeviceMismatchError, r"openreg:1: buffer shift\)"):
            openreg_onnx.export(model, (x,))
        model.shift = model.shift.to("openreg:0")
        program = torch.export.export(model, (x,))
        program.constants["scale"] = program.constants["scale"].to("openreg:1")
        with self.assertRaisesRegex(DeviceMismatchError, r"openreg:1: buffer scale\)"):
            openreg_onnx.export(program, (x,))

    def test_a_programs_cpu_tensor_constants_are_not_a_mismatch(self):
        # torch.export lifts a plain tensor attribute (which model.to() does not move) and a tensor
        # forward builds from data as constants on the CPU; the graph moves them itself. Valid
        # programs (torch.onnx.export takes them, and so did the plugin as an nn.Module), refused
        # with DeviceMismatchError.
        class Table(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(3, 3)
                self.table = torch.tensor([1.0, 2.0, 3.0])  # an attribute, not a buffer

            def forward(self, x):
                return self.fc(x) * self.table.to(x.device)

        class Lifted(torch.nn.Module):
            def forward(self, x):
                return x * torch.tensor([1.0, 2.0, 3.0]).to(x.device)

        x = torch.randn(2, 3, device="openreg")
        for model in (Table().to("openreg"), Lifted()):
            program = torch.export.export(model, (x,))
            self.assertEqual({str(t.device) for t in program.constants.values()}, {"cpu"})
            openreg_onnx.export(program, (x,))
            result = openreg_onnx.verify(program, (x,))
            self.assertTrue(result.ok, result.report())

    def test_the_torchscript_exporter_is_refused_clearly(self):
        # dynamo=False reached torch.onnx.export next to the dynamo=True given there: a raw TypeError.
        model = torch.nn.Linear(4, 2).to("openreg")
        x = torch.randn(3, 4, device="openreg")
        with self.assertRaisesRegex(ValueError, r"openreg_onnx exports with the dynamo exporter only.*dynamo=False"):
            openreg_onnx.export(model, (x,), dynamo=False)
        with self.assertRaisesRegex(ValueError, r"openreg_onnx exports with the dynamo exporter only"):
            openreg_onnx.export_without_weights(lambda: torch.nn.Linear(4, 2), lambda: torch.randn(3, 4), dynamo=False)
        openreg_onnx.export(model, (x,), dynamo=True)  # what it does anyway


FACTORY = """
import torch

def tiny():
    torch.manual_seed(0)
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
        def forward(self, x):
            return torch.ops.openreg.custom_abs(self.fc(x))
    return M().to("openreg").eval(), (torch.randn(2, 4, device="openreg"),)

def wrong():
    # A model whose saved ONNX file the CLI is asked to verify does not match it.
    model, args = tiny()
    model.fc.bias.data += 1
    return model, args
"""


class TestCommandLine:
    def test_export_then_verify(self, tmp_path, capsys):
        factory = tmp_path / "models.py"
        factory.write_text(textwrap.dedent(FACTORY))
        out = tmp_path / "tiny.onnx"
        assert main(["export", f"{factory}:tiny", "-o", str(out), "--mode", "vendor"]) == 0
        assert _vendor.used_ops(onnx.load(str(out))) == ["custom_abs"]
        report = tmp_path / "report.md"
        assert main(["verify", f"{factory}:tiny", "--onnx", str(out), "--report", str(report)]) == 0
        assert report.read_text().startswith("# openreg-onnx verification: PASS")
        assert main(["verify", f"{factory}:wrong", "--onnx", str(out)]) == 1
        assert "# openreg-onnx verification: FAIL" in capsys.readouterr().out

    def test_module_entry(self):
        r = run_python(
            "import runpy, sys; sys.argv = ['openreg_onnx', '--help']; "
            "runpy.run_module('openreg_onnx', run_name='__main__')"
        )
        assert r.returncode == 0, r.stderr
        assert "failed to load" not in r.stderr  # `import openreg_onnx` before torch loads it once, cleanly
        assert "usage: python -m openreg_onnx [-h] {export,verify}" in r.stdout
