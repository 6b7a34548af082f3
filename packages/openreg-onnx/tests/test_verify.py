"""openreg_onnx.verify: a wrong translation is reported, tolerances per dtype, backends."""

import os
import tempfile

import onnx
import openreg_onnx
import pytest
import torch
from onnxscript import opset18 as op
from openreg_onnx._verify import TOLERANCES, _from_numpy, compare, run_onnx
from torch.testing._internal.common_utils import TestCase


class AbsThenScale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, x):
        return torch.ops.openreg.scaled_square(torch.ops.openreg.custom_abs(self.fc(x)), 0.5) + 1


def wrong_abs(input):
    """A deliberately wrong translation: |x| for x > 0 and 0 elsewhere (ReLU)."""
    return op.Relu(input)


@pytest.fixture(scope="module")
def wrong_result():
    torch.manual_seed(0)
    model = AbsThenScale().to("openreg").eval()
    x = torch.randn(4, 6, device="openreg")
    table = {torch.ops.openreg.custom_abs.default: wrong_abs}
    return openreg_onnx.verify(model, (x,), custom_translation_table=table, intermediates=True)


class TestWrongTranslation:
    def test_is_reported_at_the_output(self, wrong_result):
        assert not wrong_result.ok
        (output,) = [c for c in wrong_result.comparisons if c.kind == "output"]
        assert not output.ok
        assert "elements; worst at [" in output.detail

    def test_intermediates_point_at_the_translated_node(self, wrong_result):
        first = wrong_result.mismatches[0]
        assert (first.name, first.kind) == ("custom_abs", "intermediate")
        # The values before it are still right.
        assert [c.name for c in wrong_result.comparisons if c.ok][:1] == ["linear"]

    def test_report(self, wrong_result):
        report = wrong_result.report()
        assert report.startswith("# openreg-onnx verification: FAIL\n")
        assert "- actual values from: **onnxruntime**" in report
        assert "## Mismatches" in report
        assert "First value that drifts: `custom_abs` (intermediate)." in report
        assert "| `custom_abs` | intermediate | torch.float32 | [4, 6] |" in report
        assert "**MISMATCH**" in report


class TestVerify(TestCase):
    def test_right_translation_passes_with_intermediates(self):
        torch.manual_seed(0)
        model = AbsThenScale().to("openreg").eval()
        result = openreg_onnx.verify(model, (torch.randn(4, 6, device="openreg"),), intermediates=True)
        self.assertTrue(result.ok, result.report())
        self.assertIn("custom_abs", [c.name for c in result.comparisons if c.kind == "intermediate"])
        self.assertTrue(result.report().startswith("# openreg-onnx verification: PASS"))

    def test_reference_backend_on_request_and_a_saved_program(self):
        model = AbsThenScale().to("openreg").eval()
        x = torch.randn(4, 6, device="openreg")
        program = openreg_onnx.export(model, (x,), mode="vendor")
        result = openreg_onnx.verify(model, (x,), onnx_program=program, backend="reference")
        self.assertTrue(result.ok, result.report())
        self.assertEqual((result.backend, result.fallback_reason), ("onnx.reference", "backend='reference' requested"))
        self.assertIs(result.onnx_program, program)  # not exported again

    def test_exported_program_input(self):
        model = AbsThenScale().to("openreg").eval()
        x = torch.randn(4, 6, device="openreg")
        result = openreg_onnx.verify(torch.export.export(model, (x,)), (x,))
        self.assertTrue(result.ok, result.report())

    def test_train_mode_model_is_verified_as_exported_and_given_back_unchanged(self):
        # The export is of eval mode; the eager reference must be too (training-mode batch norm
        # normalises with the batch's statistics, dropout drops), and must not update the
        # running statistics of the caller's model.
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Dropout(0.5), torch.nn.Flatten()
        ).to("openreg")
        with torch.no_grad():  # statistics that differ from the batch's
            model[1].running_mean.uniform_(-1, 1)
            model[1].running_var.uniform_(0.5, 2)
        model.train()
        before = {k: v.cpu().clone() for k, v in model.state_dict().items()}
        x = torch.randn(2, 3, 6, 6, device="openreg")
        for intermediates in (False, True):
            result = openreg_onnx.verify(model, (x,), intermediates=intermediates)
            self.assertTrue(result.ok, result.report())
            self.assertEqual([m.training for m in model.modules()], [True] * 5)
            after = model.state_dict()
            self.assertEqual(list(after), list(before))
            for k, v in before.items():  # bit for bit, num_batches_tracked still 0
                self.assertTrue(torch.equal(after[k].cpu(), v), k)

    def test_a_program_is_verified_on_its_own_example_inputs(self):
        # As export(program) without inputs: the program's example inputs. verify() raised "the
        # ONNX model takes 1 inputs, the call gives 0 tensors".
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).to("openreg")
        program = torch.export.export(model, (torch.randn(5, 4, device="openreg"),))
        result = openreg_onnx.verify(program)
        self.assertTrue(result.ok, result.report())
        self.assertEqual([c.shape for c in result.comparisons], [(5, 3)])

    def test_program_captured_in_train_mode_is_verified_as_exported(self):
        # A program captured from a model in train() mode keeps training batch norm, which the
        # ONNX exporter translates as inference. The reference ran the program as captured (a
        # false FAIL) and updated the caller's running statistics, which the program shares with
        # the model.
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU()).to("openreg")
        with torch.no_grad():
            model[1].running_mean.uniform_(-1, 1)
            model[1].running_var.uniform_(0.5, 2)
        x = torch.randn(8, 4, device="openreg")
        program = torch.export.export(model, (x,))
        before = {k: v.cpu().clone() for k, v in model.state_dict().items()}
        for intermediates in (False, True):
            result = openreg_onnx.verify(program, (x,), intermediates=intermediates)
            self.assertTrue(result.ok, result.report())
            for k, v in model.state_dict().items():  # bit for bit, num_batches_tracked still 0
                self.assertTrue(torch.equal(v.cpu(), before[k]), k)
        # the program itself still trains when run
        program.module()(x)
        self.assertEqual(int(model[1].num_batches_tracked), 1)
        # dropout in training mode is exported as it is (a Dropout that drops at random): refused
        dropping = torch.export.export(torch.nn.Sequential(model, torch.nn.Dropout(0.5)), (x,))
        with self.assertRaisesRegex(
            ValueError, r"the program drops at random \(dropout.*capture it from model.eval\(\)"
        ):
            openreg_onnx.verify(dropping, (x,))

    def test_a_file_with_initializers_as_inputs(self):
        # keep_initializers_as_inputs lists the weights among the graph's inputs too: they are not
        # fed (their stored values run, as onnxruntime runs them).
        model = AbsThenScale().to("openreg").eval()
        x = torch.randn(4, 6, device="openreg")
        program = openreg_onnx.export(model, (x,))
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "kiai.onnx")
            program.save(path, keep_initializers_as_inputs=True)
            saved = onnx.load(path)
        self.assertGreater(len(saved.graph.input), 1)
        result = openreg_onnx.verify(model, (x,), onnx_program=saved)
        self.assertTrue(result.ok, result.report())


class RunningSum(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.register_buffer("acc", torch.zeros(3))

    def forward(self, x):
        self.acc.add_(x.sum(0))
        return self.fc(x) + self.acc


class TestStateLeftAlone(TestCase):
    def test_an_input_changed_in_place_is_fed_as_given_and_given_back(self):
        # The eager reference ran on the caller's tensors (x becomes 1), and onnxruntime was then
        # fed the changed x: a correct export reported as FAIL, the caller's input changed.
        class AddOneInPlace(torch.nn.Module):
            def forward(self, x):
                x.add_(1)
                return x * 2

        for intermediates in (False, True):
            x = torch.zeros(3, device="openreg")
            result = openreg_onnx.verify(AddOneInPlace(), (x,), intermediates=intermediates)
            self.assertTrue(result.ok, result.report())
            self.assertEqual(x.cpu().tolist(), [0.0] * 3)

    def test_intermediates_leave_buffers_the_forward_updates_as_they_were(self):
        # The per-node run executes the captured program, whose buffers are the model's own.
        model = RunningSum().to("openreg")
        x = torch.ones(2, 3, device="openreg")
        result = openreg_onnx.verify(model, (x,), intermediates=True)
        self.assertTrue(result.ok, result.report())
        self.assertEqual(model.acc.cpu().tolist(), [0.0] * 3)

    def test_a_programs_buffers_are_left_as_they_were(self):
        # A program's buffers are the tensors of the model it was captured from: each verification
        # advanced the running sum of both.
        model = RunningSum().to("openreg")
        x = torch.ones(2, 3, device="openreg")
        program = torch.export.export(model, (x,))
        for intermediates in (False, True, False):
            result = openreg_onnx.verify(program, (x,), intermediates=intermediates)
            self.assertTrue(result.ok, result.report())
            self.assertEqual(program.state_dict["acc"].cpu().tolist(), [0.0] * 3)
            self.assertEqual(model.acc.cpu().tolist(), [0.0] * 3)


class BfloatBodyFloatHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 3).to(torch.bfloat16)
        self.head = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.body(x.to(torch.bfloat16)).float()), x * 3  # the second: float32 only


class TestMixedPrecision(TestCase):
    def test_float32_values_computed_from_bfloat16_ones_get_its_tolerance(self):
        # The bf16 Linear rounds once differently in the ONNX run (1 bf16 ulp, within bf16's
        # tolerance); the float32 values after the cast carry that difference. They were compared
        # at float32's tolerance: a correct export reported as FAIL.
        torch.manual_seed(0)
        model = BfloatBodyFloatHead().to("openreg")
        x = torch.randn(2, 4, device="openreg")
        for intermediates in (False, True):
            result = openreg_onnx.verify(model, (x,), intermediates=intermediates)
            self.assertTrue(result.ok, result.report())
            float32 = {c.name: (c.rtol, c.atol) for c in result.comparisons if c.dtype == "torch.float32"}
            head, alone = result.comparisons[-2], result.comparisons[-1]  # the outputs, in order
            self.assertEqual((head.rtol, head.atol), TOLERANCES[torch.bfloat16])
            self.assertEqual((alone.rtol, alone.atol), TOLERANCES[torch.float32])  # no 16-bit value in it
            widened = [n for n, t in float32.items() if t == TOLERANCES[torch.bfloat16]]
            note = (
                f"{len(widened)} float32/float64 values computed from bfloat16 values: compared at the tolerance "
                "of the 16-bit type they were computed from"
            )
            self.assertEqual(result.tolerance_note, note)
            self.assertIn(f"- {note}", result.report())
        # tolerances given by the caller are used as they are
        strict = openreg_onnx.verify(model, (x,), tolerances={torch.float32: (0.0, 0.0)})
        self.assertEqual(strict.tolerance_note, "")
        self.assertTrue(all((c.rtol, c.atol) == (0.0, 0.0) for c in strict.comparisons))

    def test_which_values_are_computed_from_16_bit_ones(self):
        from onnx import TensorProto, helper
        from openreg_onnx._verify import _computed_from_16_bit

        def info(name, elem):
            return helper.make_tensor_value_info(name, elem, [4])

        # a float32 product next to an unrelated bfloat16 input; a bf16 round trip made by Casts
        # in a graph without value_info; a float16 value feeding a bfloat16 one
        graph = helper.make_graph(
            [
                helper.make_node("Mul", ["x", "x"], ["a"]),
                helper.make_node("Cast", ["y"], ["b"], to=TensorProto.FLOAT),
                helper.make_node("Cast", ["x"], ["h"], to=TensorProto.BFLOAT16),
                helper.make_node("Cast", ["h"], ["o"], to=TensorProto.FLOAT),
                helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT16),
                helper.make_node("Add", ["f", "f"], ["g"]),
                helper.make_node("Cast", ["g"], ["gb"], to=TensorProto.BFLOAT16),
            ],
            "g",
            [info("x", TensorProto.FLOAT), info("y", TensorProto.BFLOAT16)],
            [info(n, TensorProto.FLOAT) for n in ("a", "b", "o")] + [info("gb", TensorProto.BFLOAT16)],
        )
        low = _computed_from_16_bit(helper.make_model(graph))
        self.assertNotIn("a", low)
        self.assertNotIn("x", low)
        self.assertEqual(
            {n: low[n] for n in ("y", "b", "h", "o", "f", "g", "gb")},
            {"y": torch.bfloat16, "b": torch.bfloat16, "h": torch.bfloat16, "o": torch.bfloat16,
             "f": torch.float16, "g": torch.float16, "gb": torch.bfloat16},
        )  # fmt: skip


class TestCompare(TestCase):
    def test_tolerance_per_dtype(self):
        self.assertEqual(TOLERANCES[torch.float16], (1e-2, 2e-3))
        base = torch.full((4,), 1.0)
        off = base + 1e-3
        self.assertTrue(compare("v", "output", base.half(), off.half()).ok)
        self.assertFalse(compare("v", "output", base, off).ok)
        self.assertTrue(compare("v", "output", base.double(), (base + 1e-9).double()).ok)
        self.assertFalse(compare("v", "output", base.double(), (base + 1e-6).double()).ok)

    def test_integers_are_exact_and_nonfinite_values_must_agree(self):
        self.assertFalse(compare("i", "output", torch.tensor([1, 2]), torch.tensor([1, 3])).ok)
        self.assertTrue(compare("i", "output", torch.tensor([True, False]), torch.tensor([True, False])).ok)
        inf_nan = torch.tensor([float("inf"), float("nan"), 1.0])
        self.assertTrue(compare("f", "output", inf_nan, inf_nan.clone()).ok)
        c = compare("f", "output", inf_nan, torch.tensor([1.0, float("nan"), 1.0]))
        self.assertFalse(c.ok)
        self.assertEqual(c.detail, "1/3 elements; worst at [0]: expected inf, got 1")

    def test_integers_are_exact_beyond_float64_and_an_output_keeps_its_dtype(self):
        big = torch.tensor([2**53 + 1], dtype=torch.int64)
        c = compare("i", "output", big, big - 1)  # equal in float64
        self.assertFalse(c.ok)
        self.assertEqual(c.detail, "1/1 elements; worst at [0]: expected 9007199254740993, got 9007199254740992")
        self.assertTrue(compare("i", "output", big, big.clone()).ok)
        for expected, actual in (
            (torch.tensor([1, 2]), torch.tensor([1.0, 2.0])),
            (torch.tensor([True]), torch.tensor([1], dtype=torch.int32)),
        ):
            c = compare("d", "output", expected, actual)
            self.assertFalse(c.ok)
            self.assertEqual(c.detail, f"dtype {actual.dtype} instead of {expected.dtype}")
        # an intermediate value may be kept in a wider type: compared by value
        self.assertTrue(compare("d", "intermediate", torch.tensor([1, 2]), torch.tensor([1.0, 2.0])).ok)
        # a float64 mismatch prints enough digits to tell the values apart
        c = compare(
            "f", "output", torch.tensor([1.0], dtype=torch.float64), torch.tensor([1.000001], dtype=torch.float64)
        )
        self.assertEqual(c.detail, "1/1 elements; worst at [0]: expected 1, got 1.0000009999999999")

    def test_shape_mismatch(self):
        c = compare("s", "output", torch.zeros(2, 3), torch.zeros(3, 2))
        self.assertFalse(c.ok)
        self.assertEqual(c.detail, "shape [3, 2] instead of [2, 3]")


class TestZeroDimOutputs(TestCase):
    def test_scalar_outputs_keep_their_shape(self):
        # np.ascontiguousarray makes a 0-d array 1-D: a scalar output (a loss, x.sum()) came back
        # from onnxruntime as shape [1] and was reported as "shape [1] instead of []".
        class Losses(torch.nn.Module):
            def forward(self, x):
                return (x * x).mean(), x.sum(), x.amax(0), (x > 0).any()

        torch.manual_seed(0)
        x = torch.randn(4, 3)
        want = Losses()(x)  # the CPU reference
        for backend in ("onnxruntime", "reference"):
            result = openreg_onnx.verify(Losses(), (x.to("openreg"),), backend=backend)
            self.assertTrue(result.ok, result.report())
            self.assertEqual([c.shape for c in result.comparisons], [(), (), (3,), ()])
        got = run_onnx(result.onnx_program.model_proto, {"x": x.numpy()})[0]
        for g, w in zip(got, want):
            self.assertEqual(_from_numpy(g), w, atol=1e-5, rtol=1e-5)


class ComplexIn(torch.nn.Module):
    def forward(self, z):
        return (z * z).abs()


class ComplexOut(torch.nn.Module):
    def __init__(self, factor: float = 2.0):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return torch.view_as_complex(x) * self.factor


class TestInputsAndOptions(TestCase):
    def test_complex_values_are_compared_as_the_exporter_represents_them(self):
        # The exporter represents a complex tensor as a real one with a last dimension of 2 (as
        # torch's own verification converts it): the complex inputs went to onnxruntime as they
        # were (refused, then a wrong shape from the reference evaluator), and a complex output
        # was compared with its real form: correct exports reported as FAIL.
        for model, x in ((ComplexIn(), torch.randn(3, 4, dtype=torch.complex64)), (ComplexOut(), torch.randn(3, 4, 2))):
            result = openreg_onnx.verify(model.to("openreg"), (x.to("openreg"),))
            self.assertTrue(result.ok, result.report())
            self.assertEqual(result.backend, "onnxruntime")
        # a wrong complex result is still one
        x = torch.randn(3, 4, 2, device="openreg")
        wrong = openreg_onnx.export(ComplexOut(3.0), (x,))
        result = openreg_onnx.verify(ComplexOut(), (x,), onnx_program=wrong)
        self.assertFalse(result.ok)
        self.assertEqual(result.mismatches[0].shape, (3, 4, 2))

    def test_tolerances_for_some_dtypes_leave_the_others_at_their_defaults(self):
        # A dict naming float32 compared every float16 value exactly: a correct float16 export failed.
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
        model = model.to("openreg").half().eval()
        x = torch.randn(4, 16, device="openreg", dtype=torch.float16)
        result = openreg_onnx.verify(model, (x,), tolerances={torch.float32: (1e-3, 1e-4)})
        self.assertTrue(result.ok, result.report())
        [out] = result.comparisons
        self.assertEqual((out.dtype, out.rtol, out.atol), ("torch.float16", *TOLERANCES[torch.float16]))

    def test_a_saved_model_by_its_path(self):
        model = AbsThenScale().to("openreg").eval()
        x = torch.randn(4, 6, device="openreg")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.onnx")
            openreg_onnx.export(model, (x,), path)
            result = openreg_onnx.verify(model, (x,), onnx_program=path)
        self.assertTrue(result.ok, result.report())
        self.assertIsInstance(result.onnx_program, onnx.ModelProto)
