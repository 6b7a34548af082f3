"""Native aten::_int_mm and aten::_weight_int8pack_mm on openreg (csrc/fused/IntMM.cpp), against the
CPU's kernels; torchao's int8 configs on openreg models against the same configs on the CPU."""

import os

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")  # torchao's CUDA-only libraries

import torch  # noqa: E402
from conftest import run_recorded  # noqa: E402
from torch.testing._internal.common_utils import TestCase  # noqa: E402


class TestIntMM(TestCase):
    def test_int_mm_exact(self):
        g = torch.Generator().manual_seed(0)
        for m, k, n in ((1, 8, 8), (32, 1024, 72), (5, 2500, 24), (4, 0, 8)):
            a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
            b = torch.randint(-128, 128, (k, n), generator=g, dtype=torch.int8)
            if k:  # the extreme products: every partial sum at its bound
                a[0], b[:, 0] = -128, -128
            want = torch._int_mm(a, b) if k >= 1 else torch.zeros(m, n, dtype=torch.int32)
            got = torch._int_mm(a.to("openreg"), b.to("openreg"))
            self.assertEqual(got.dtype, torch.int32)
            self.assertEqual(got.cpu(), want, atol=0, rtol=0, msg=f"{m}x{k}x{n}")
        # out=: written in place. An out of another shape is refused, not resized, as on the CPU
        # and CUDA, with their messages, as is a non-contiguous one (left untouched).
        a = torch.randint(-128, 128, (6, 40), generator=g, dtype=torch.int8)
        b = torch.randint(-128, 128, (40, 16), generator=g, dtype=torch.int8)
        out = torch.empty(6, 16, dtype=torch.int32, device="openreg")
        storage = out.data_ptr()
        for x in (a, a.flip(0)):
            self.assertIs(torch._int_mm(x.to("openreg"), b.to("openreg"), out=out), out)
            self.assertEqual(out.data_ptr(), storage)
            self.assertEqual(out.cpu(), torch._int_mm(x, b), atol=0, rtol=0)
        wrong = {
            "Expected result dtype to be of type kInt but got long int": torch.zeros(6, 16, dtype=torch.long),
            r"Expected result.size\(0\) to be 6 but got 0": torch.zeros(0, dtype=torch.int32),
            r"Expected result.size\(1\) to be 16 but got 3": torch.zeros(6, 3, dtype=torch.int32),
            "Expected result to be of dimension 2 but got 3": torch.zeros(6, 16, 1, dtype=torch.int32),
            "Expected result to be contiguous.": torch.zeros(16, 6, dtype=torch.int32).t(),
        }
        for message, t in wrong.items():
            for device in ("cpu", "openreg"):
                target = t.to(device)
                with self.assertRaisesRegex(RuntimeError, message, msg=device):
                    torch._int_mm(a.to(device), b.to(device), out=target)
                self.assertEqual(target.shape, t.shape)
                self.assertEqual(target.cpu().count_nonzero().item(), 0)

    def test_int_mm_uint8_activations_exact(self):
        # The CPU takes uint8 activations (u8 x s8 -> int32; CUDA int8 only). Its products reach
        # 255 * 128: K is summed in float32 blocks of 512, whose partial sums stay below 2^24.
        g = torch.Generator().manual_seed(1)
        for m, k, n in ((3, 4, 5), (4, 1500, 9), (2, 513, 3)):
            a = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8)
            b = torch.randint(-128, 128, (k, n), generator=g, dtype=torch.int8)
            a[0], b[:, 0] = 255, -128  # every partial sum at its bound
            a[1], b[:, 1] = 255, 127
            got = torch._int_mm(a.to("openreg"), b.to("openreg"))
            self.assertEqual(got.cpu(), torch._int_mm(a, b), atol=0, rtol=0, msg=f"{m}x{k}x{n}")
            self.assertEqual(got.cpu(), a.long() @ b.long(), atol=0, rtol=0, exact_dtype=False)

    def test_int_mm_native_and_errors(self):
        a = torch.ones(8, 16, dtype=torch.int8, device="openreg")
        b = torch.ones(16, 8, dtype=torch.int8, device="openreg")
        x = torch.ones(3, 16, device="openreg")
        s = torch.ones(8, device="openreg")
        torch._int_mm(a, b)
        torch._weight_int8pack_mm(x, a, s)
        torch.openreg.set_strict_mode(True)  # both are native: neither reaches the generic path
        try:
            torch._int_mm(a, b)
            torch._weight_int8pack_mm(x, a, s)
        finally:
            torch.openreg.set_strict_mode(False)
        with self.assertRaisesRegex(RuntimeError, "self.size\\(1\\) needs to match mat2.size\\(0\\) but got 16 and 8"):
            torch._int_mm(a, a)
        for device in ("cpu", "openreg"):
            with self.assertRaisesRegex(
                RuntimeError, "Expected self dtype to be int8 or uint8 but got float", msg=device
            ):
                torch._int_mm(a.float().to(device), b.to(device))
            with self.assertRaisesRegex(
                RuntimeError, "Expected mat2 dtype to be of type int8 but got unsigned char", msg=device
            ):
                torch._int_mm(a.to(device), b.to(device, torch.uint8))

    def test_weight_int8pack_mm(self):
        g = torch.Generator().manual_seed(0)
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(7, 64, generator=g).to(dtype)
            w = torch.randint(-128, 128, (40, 64), generator=g, dtype=torch.int8)
            s = (torch.rand(40, generator=g) * 0.01).to(dtype)
            want = torch._weight_int8pack_mm(x, w, s)
            got = torch._weight_int8pack_mm(x.to("openreg"), w.to("openreg"), s.to("openreg"))
            self.assertEqual(got.dtype, dtype)
            tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
            self.assertEqual(got.cpu(), want, **tol)
        with self.assertRaisesRegex(RuntimeError, "expected scales to have A's dtype"):
            torch._weight_int8pack_mm(x.to("openreg"), w.to("openreg"), s.float().to("openreg"))


class TestTorchaoConfigs(TestCase):
    def _run(self, config, device, out_features):
        from torchao.quantization import quantize_

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, out_features)).to(
            device
        )
        quantize_(model, config)
        self._model = model
        x = torch.randn(8, 64).to(device)
        with torch.no_grad():
            model(x)  # first calls of each signature run synchronously: record the second forward
            y, self._ops, self._generic, copies = run_recorded(lambda: model(x))
        return y.cpu(), copies

    def test_int8_weight_only(self):
        from torchao.quantization import Int8WeightOnlyConfig

        want, _ = self._run(Int8WeightOnlyConfig(), "cpu", 40)
        got, copies = self._run(Int8WeightOnlyConfig(), "openreg", 40)
        self.assertEqual(got, want, atol=1e-5, rtol=1e-5)
        self.assertEqual(copies, 0)
        # torchao 0.18's Int8Tensor converts the int8 weight to the activations' dtype on the device and
        # multiplies in float (aten._weight_int8pack_mm is not on its path, on any device)
        self.assertLessEqual({"aten._to_copy.default", "aten.mm.default"}, self._ops)
        self.assertNotIn("aten._weight_int8pack_mm.default", self._ops)
        self.assertEqual(self._generic, {"aten::mul.Tensor", "aten::add_.Tensor", "aten::relu"})

    def test_stock_int8_dynamic_config_copies_to_the_host(self):
        # torchao's own config gives the CPU's numbers on openreg, but its safe_int_mm formats the
        # input with __repr__() (a copy of the data to the host) on every matmul: see the docs.
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig

        want, _ = self._run(Int8DynamicActivationInt8WeightConfig(), "cpu", 40)
        got, copies = self._run(Int8DynamicActivationInt8WeightConfig(), "openreg", 40)
        self.assertEqual(got, want, atol=1e-5, rtol=1e-5)
        self.assertGreater(copies, 0)
        # and its int8 x int8 product is an int32 aten.mm, not aten._int_mm
        self.assertIn("aten.mm.default", self._ops)
        self.assertNotIn("aten._int_mm.default", self._ops)

    def test_openreg_int8_dynamic_config(self):
        from openreg_quant import OpenRegInt8DynamicActivationInt8WeightConfig

        for width in (40, 36):  # 36: not a multiple of 8
            want, _ = self._run(OpenRegInt8DynamicActivationInt8WeightConfig(), "cpu", width)
            got, copies = self._run(OpenRegInt8DynamicActivationInt8WeightConfig(), "openreg", width)
            self.assertEqual(got, want, atol=1e-6, rtol=1e-6)
            self.assertEqual(copies, 0)
            # the int8 product is the native aten._int_mm, the activations are quantized per token by
            # the native kernel; only the elementwise ops and the per-token amax (scales, bias, relu)
            # take core's generic path. The scales are not choose_qparams_per_token's (see
            # test_openreg_config_compiles_and_exports).
            native = {"aten._int_mm.default", "quantized_decomposed.quantize_per_token.default"}
            self.assertLessEqual(native, self._ops)
            self.assertNotIn("aten.mm.default", self._ops)
            self.assertNotIn("quantized_decomposed.choose_qparams_per_token.default", self._ops)
            self.assertEqual(
                self._generic,
                {"aten::amax", "aten::clamp", "aten::div.Tensor", "aten::zero_"}
                | {"aten::mul.Tensor", "aten::add.Tensor", "aten::relu"},
            )
            # and close to the float model
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, width))
            x = torch.randn(8, 64)
            ref = model(x).detach()
            self.assertLess(((got - ref).norm() / ref.norm()).item(), 0.05)
        from openreg_quant.torchao_configs import Int8DynamicActivationLinear

        self.assertIsInstance(self._model, torch.nn.Sequential)
        self.assertIsInstance(self._model[0], Int8DynamicActivationLinear)

    def test_openreg_config_scales_are_choose_qparams_per_token_s(self):
        # forward computes quantized_decomposed.choose_qparams_per_token's scales with elementwise ops
        # (below): the same bits for every float dtype, as the op gave them before
        from openreg_quant import OpenRegInt8DynamicActivationInt8WeightConfig
        from torchao.quantization import quantize_

        qd = torch.ops.quantized_decomposed

        def with_the_op(m, x):
            rows = x.reshape(-1, m.in_features)
            scales, zeros = qd.choose_qparams_per_token(rows, torch.int8)
            x_int8 = qd.quantize_per_token(rows, scales, zeros, -127, 127, torch.int8)
            y = torch._int_mm(x_int8, m.weight_int8_t).float() * scales.float() * m.weight_scales + m.bias
            return y.to(x.dtype).reshape(*x.shape[:-1], m.out_features)

        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 40)).to("openreg", dtype)
            quantize_(model, OpenRegInt8DynamicActivationInt8WeightConfig())
            x = torch.randn(2, 9, 64).to("openreg", dtype)
            x[0, 0] = 0  # an all-zero row: the scale's lower bound
            with torch.no_grad():
                self.assertEqual(model(x).cpu(), with_the_op(model[0], x).cpu(), atol=0, rtol=0, msg=str(dtype))

    def test_openreg_config_compiles_and_exports(self):
        # quantized_decomposed.choose_qparams_per_token's meta kernel (upstream) says float64 scales,
        # its kernels return float32: Inductor read the scales as float64 (NaN or garbage) and exported
        # programs failed ("Tensor dtype mismatch! Expected: Double, Got: float"). forward does not call it.
        # The exported program runs the traced (meta) dtypes against the real ones, as Inductor's code
        # does; Inductor itself is openreg-inductor's (not installed in this package's session).
        from openreg_quant import OpenRegInt8DynamicActivationInt8WeightConfig
        from torchao.quantization import quantize_

        torch._dynamo.reset()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 36)).to("openreg")
        quantize_(model, OpenRegInt8DynamicActivationInt8WeightConfig())
        x = torch.randn(8, 64).to("openreg")
        with torch.no_grad():
            want = model(x).cpu()
            compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
            self.assertEqual(compiled(x).cpu(), want, atol=0, rtol=0)
            exported = torch.export.export(model, (x,))
            self.assertEqual(exported.module()(x).cpu(), want, atol=0, rtol=0)

    def test_openreg_config_wrong_width(self):
        # the float linear's message, not the reshape's ("shape '[-1, 20]' is invalid for input of size 30")
        from openreg_quant import OpenRegInt8DynamicActivationInt8WeightConfig
        from torchao.quantization import quantize_

        model = torch.nn.Sequential(torch.nn.Linear(20, 12)).to("openreg")
        quantize_(model, OpenRegInt8DynamicActivationInt8WeightConfig())
        for shape, mat1 in (((4, 10), "4x10"), ((3, 10), "3x10"), ((2, 3, 10), "6x10"), ((10,), "1x10")):
            with self.assertRaisesRegex(
                RuntimeError, rf"^mat1 and mat2 shapes cannot be multiplied \({mat1} and 20x12\)"
            ):
                torch.nn.Linear(20, 12)(torch.randn(shape))  # the same as the float linear's
            with self.assertRaisesRegex(
                RuntimeError, rf"^mat1 and mat2 shapes cannot be multiplied \({mat1} and 20x12\)"
            ):
                model(torch.randn(shape, device="openreg"))

    def test_openreg_config_against_the_stock_config(self):
        # Same scheme, quantized_decomposed's conventions (range [-127, 127], scale amax / 127,
        # x / scale) instead of torchao's Int8Tensor's ([-128, 127], amax / 127.5, x * (1 / scale)):
        # not the stock config's bits, as accurate against the float model (see the docs).
        import copy

        from openreg_quant import OpenRegInt8DynamicActivationInt8WeightConfig
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        for width in (40, 36, 256):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, width))
            x = torch.randn(8, 64)
            ref = model(x).detach()
            stock = copy.deepcopy(model)
            quantize_(stock, Int8DynamicActivationInt8WeightConfig())
            ours = copy.deepcopy(model).to("openreg")
            quantize_(ours, OpenRegInt8DynamicActivationInt8WeightConfig())
            with torch.no_grad():
                y_stock, y_ours = stock(x), ours(x.to("openreg")).cpu()
            err_stock = ((y_stock - ref).norm() / ref.norm()).item()
            err_ours = ((y_ours - ref).norm() / ref.norm()).item()
            self.assertLess(err_stock, 0.02)
            self.assertLessEqual(err_ours, err_stock * 1.1)
            self.assertLess((y_ours - y_stock).abs().max().item(), 0.03 * ref.abs().max().item())
