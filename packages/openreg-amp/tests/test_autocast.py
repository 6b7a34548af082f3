"""Autocast on openreg: the policies of AutocastPolicies.cpp, compared with CPU autocast.

Every op runs on openreg under torch.autocast("openreg") and on the CPU under
torch.autocast("cpu") with the same inputs. The openreg result dtype must be the one the
CUDA policy gives; where CPU autocast applies the same policy, the values must match too.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase

LOW = ("float16", "bfloat16")


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(8, 8, generator=g),
        "b": torch.randn(8, 8, generator=g),
        "v": torch.randn(8, generator=g),
        "pos": torch.rand(8, 8, generator=g) + 0.5,
        "b3": torch.randn(2, 8, 8, generator=g),
        "img": torch.randn(1, 3, 8, 8, generator=g),
        "w": torch.randn(4, 3, 3, 3, generator=g),
        "q": torch.randn(1, 2, 4, 8, generator=g),
        "target": torch.randint(0, 8, (8,), generator=g),
        "idx": torch.tensor([0, 2, 5]),
        "vals": torch.randn(3, 8, generator=g),
    }


# name -> (policy, fn(t) where t maps names to tensors on the device under test).
# "low" means the autocast dtype, "fp32" float32.
CASES = {
    # lower_precision_fp
    "mm": ("low", lambda t: torch.mm(t["a"], t["b"])),
    "matmul": ("low", lambda t: t["a"] @ t["b"]),
    "linear": ("low", lambda t: F.linear(t["a"], t["b"], t["v"])),
    "addmm": ("low", lambda t: torch.addmm(t["a"], t["a"], t["b"])),
    "bmm": ("low", lambda t: torch.bmm(t["b3"], t["b3"])),
    "baddbmm": ("low", lambda t: torch.baddbmm(t["b3"], t["b3"], t["b3"])),
    "conv2d": ("low", lambda t: F.conv2d(t["img"], t["w"])),
    "sdpa": ("low", lambda t: F.scaled_dot_product_attention(t["q"], t["q"], t["q"])),
    # fp32
    "exp": ("fp32", lambda t: torch.exp(t["a"])),
    "log": ("fp32", lambda t: torch.log(t["pos"])),
    "pow": ("fp32", lambda t: torch.pow(t["pos"], 2.5)),
    "layer_norm": ("fp32", lambda t: F.layer_norm(t["a"], (8,))),
    "mse_loss": ("fp32", lambda t: F.mse_loss(t["a"], t["b"])),
    "nll_loss": ("fp32", lambda t: F.nll_loss(t["a"], t["target"])),
    "cosine_similarity": ("fp32", lambda t: F.cosine_similarity(t["a"], t["b"])),
    # fp32_set_opt_dtype
    "softmax": ("fp32", lambda t: torch.softmax(t["a"], 1)),
    "log_softmax": ("fp32", lambda t: torch.log_softmax(t["a"], 1)),
    "sum": ("fp32", lambda t: torch.sum(t["a"])),
    "cumsum": ("fp32", lambda t: torch.cumsum(t["a"], 0)),
    # fp32_append_dtype
    "norm": ("fp32", lambda t: torch.norm(t["a"])),
    # promote: a float32 and a low-precision input give float32
    "addcmul": ("fp32", lambda t: torch.addcmul(t["a"], t["a"].to(t["low"]), t["b"])),
    "index_put": ("fp32", lambda t: t["a"].to(t["low"]).index_put((t["idx"],), t["vals"])),
    "atan2": ("fp32", lambda t: torch.atan2(t["a"].to(t["low"]), t["b"])),
    # not listed: falls through and keeps its input dtype (cat and stack promote natively, as on CUDA)
    "cat": ("fp32", lambda t: torch.cat([t["a"], t["b"].to(t["low"])])),
    "stack": ("fp32", lambda t: torch.stack([t["a"], t["b"].to(t["low"])])),
    "add (fallthrough)": ("fp32", lambda t: t["a"] + t["b"]),
    "relu of low (fallthrough)": ("low", lambda t: torch.relu(t["a"].to(t["low"]))),
}
# Ops whose CPU autocast policy is the same as CUDA's in torch 2.13: values are compared too.
SAME_POLICY_ON_CPU = {"mm", "matmul", "linear", "addmm", "bmm", "baddbmm", "conv2d", "mse_loss", "nll_loss"}


def _run(device: str, low: torch.dtype, fn):
    t = {k: v.to(device) for k, v in _inputs().items()}
    t["low"] = low
    with torch.autocast(device, dtype=low):
        return fn(t)


@pytest.mark.parametrize("low_name", LOW)
@pytest.mark.parametrize("name", list(CASES))
def test_policy_dtype_and_values(name, low_name):
    low = getattr(torch, low_name)
    policy, fn = CASES[name]
    out = _run("openreg", low, fn)
    assert out.device.type == "openreg"
    expected = low if policy == "low" else torch.float32
    assert out.dtype == expected, f"{name} under {low_name}: {out.dtype}, policy says {expected}"
    try:
        ref = _run("cpu", low, fn)
    except RuntimeError:  # CPU autocast lacks the policy (index_put is not "promote" there)
        assert name not in SAME_POLICY_ON_CPU
        ref = None
    if name in SAME_POLICY_ON_CPU:
        assert ref.dtype == out.dtype, f"CPU autocast gave {ref.dtype}"
    if ref is not None and ref.dtype == out.dtype:
        # Same casts on both sides; the kernels may still accumulate differently in low precision.
        tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}[out.dtype]
        torch.testing.assert_close(out.cpu().float(), ref.float(), atol=tol, rtol=tol)
    else:
        # The policies differ (e.g. CPU keeps exp in bf16): compare with float32 math.
        ref32 = fn({**_inputs(), "low": torch.float32})
        torch.testing.assert_close(out.cpu().float(), ref32, atol=5e-2, rtol=5e-2)


class TestAutocastBehaviour(TestCase):
    def setUp(self):
        self.a = torch.randn(4, 4, device="openreg")

    def test_banned_binary_cross_entropy(self):
        p = torch.rand(4, device="openreg")
        with torch.autocast("openreg", dtype=torch.float16):
            with self.assertRaisesRegex(
                RuntimeError,
                r"torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
                r"Many models use a sigmoid layer right before the binary cross entropy layer.\n(.|\n)*"
                r"binary_cross_entropy_with_logits and BCEWithLogits are\nsafe to autocast.",
            ):
                F.binary_cross_entropy(p, p)
            # The safe form works, in float32.
            self.assertEqual(F.binary_cross_entropy_with_logits(p, p).dtype, torch.float32)
        self.assertEqual(F.binary_cross_entropy(p, p).item(), F.binary_cross_entropy(p.cpu(), p.cpu()).item())

    def test_cat_and_stack_keep_the_other_16_bit_type_as_on_cuda(self):
        # CUDA does not list cat and stack: bfloat16 tensors concatenated in a float16 region stay
        # bfloat16 (a rotary embedding's torch.cat((-x2, x1), -1) in a model.bfloat16()). CPU
        # autocast lists them as promote, which refuses the other 16-bit type.
        for region, other in ((torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)):
            x = torch.randn(2, 3).to(other)
            for combine in (torch.cat, torch.stack):
                with torch.autocast("openreg", dtype=region):
                    out = combine([x.to("openreg"), -x.to("openreg")])
                self.assertEqual(out.dtype, other)
                self.assertEqual(out.cpu(), combine([x, -x]), atol=0, rtol=0)
                with torch.autocast("cpu", dtype=region):
                    with self.assertRaisesRegex(RuntimeError, "Unexpected floating ScalarType"):
                        combine([x, -x])

    def test_attention_inference_fast_path_runs_in_the_region_dtype(self):
        # nn.MultiheadAttention's eval/no_grad fast path asks torch.is_autocast_enabled(), CUDA's
        # state only: on openreg (as on the CPU) the fused op runs inside the region, and without a
        # policy for it the block ran in float32. Its result matches the slow path's in the same region.
        torch.manual_seed(0)
        mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).to("openreg").eval()
        x = torch.randn(2, 5, 8, device="openreg")
        for region in (torch.float16, torch.bfloat16):
            torch.openreg.reset_fallback_op_counts()
            with torch.no_grad(), torch.autocast("openreg", dtype=region):
                fast = mha(x, x, x)[0]
                slow = mha(x, x, x, need_weights=True)[0]  # the decomposed path autocast reaches op by op
            self.assertIn("aten::_native_multi_head_attention", torch.openreg.fallback_op_counts())
            self.assertEqual((fast.dtype, slow.dtype), (region, region))
            tol = 2e-2 if region == torch.float16 else 5e-2
            torch.testing.assert_close(fast.cpu().float(), slow.cpu().float(), atol=tol, rtol=tol)

    def test_encoder_layer_inference_fast_path_follows_the_region(self):
        # The fused layer now runs on the host over openreg's operators (core), so the region
        # reaches its attention, linears and norms, each by CUDA's policy, as in the module's
        # op-by-op path; as one generic-path kernel on a stream worker it ran wholly in float32,
        # bit for bit the result outside the region.
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).to("openreg").eval()
        x = torch.randn(2, 5, 8, device="openreg")
        with torch.no_grad():
            outside = layer(x)
        for region in (torch.float16, torch.bfloat16):
            with torch.autocast("openreg", dtype=region):
                with torch.no_grad():
                    fast = layer(x)
                slow = layer(x).detach()  # grad mode: the module's op-by-op path
            self.assertEqual(fast.dtype, slow.dtype)
            self.assertGreater((fast.float() - outside).abs().max().item(), 0)  # the region had an effect
            tol = 2e-2 if region == torch.float16 else 5e-2
            torch.testing.assert_close(fast.cpu().float(), slow.cpu().float(), atol=tol, rtol=tol)

    def test_supported_dtypes(self):
        self.assertEqual(torch.openreg.get_amp_supported_dtype(), [torch.float16, torch.bfloat16])

    def test_unsupported_dtype_disables_autocast_with_torchs_warning(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast("openreg", dtype=torch.float64):
                self.assertFalse(torch.is_autocast_enabled("openreg"))
                self.assertEqual((self.a @ self.a).dtype, torch.float32)
        messages = [str(w.message) for w in caught]
        expected = "In openreg autocast, but the target dtype is not supported. Disabling autocast."
        self.assertTrue(any(expected in m for m in messages), messages)

    def test_get_and_set_autocast_dtype(self):
        self.assertEqual(torch.get_autocast_dtype("openreg"), torch.float16)  # CUDA's default too
        with torch.autocast("openreg"):
            self.assertEqual((self.a @ self.a).dtype, torch.float16)
        torch.set_autocast_dtype("openreg", torch.bfloat16)
        self.assertEqual(torch.get_autocast_dtype("openreg"), torch.bfloat16)
        with torch.autocast("openreg"):
            self.assertEqual((self.a @ self.a).dtype, torch.bfloat16)
        self.assertEqual(torch.get_autocast_dtype("cpu"), torch.bfloat16)  # other devices untouched

    def test_nesting_and_enabled_false(self):
        self.assertFalse(torch.is_autocast_enabled("openreg"))
        with torch.autocast("openreg", dtype=torch.float16):
            self.assertEqual((self.a @ self.a).dtype, torch.float16)
            with torch.autocast("openreg", enabled=False):
                self.assertFalse(torch.is_autocast_enabled("openreg"))
                self.assertEqual((self.a @ self.a).dtype, torch.float32)
            with torch.autocast("openreg", dtype=torch.bfloat16):
                self.assertEqual((self.a @ self.a).dtype, torch.bfloat16)
            self.assertTrue(torch.is_autocast_enabled("openreg"))
            self.assertEqual(torch.get_autocast_dtype("openreg"), torch.float16)
            self.assertEqual((self.a @ self.a).dtype, torch.float16)
        self.assertFalse(torch.is_autocast_enabled("openreg"))
        self.assertEqual((self.a @ self.a).dtype, torch.float32)

    def test_cpu_autocast_does_not_touch_openreg(self):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            self.assertEqual((self.a @ self.a).dtype, torch.float32)
        with torch.autocast("openreg", dtype=torch.bfloat16):
            cpu = torch.randn(4, 4)
            self.assertEqual((cpu @ cpu).dtype, torch.float32)

    def _count_weight_casts(self, device: str, cache_enabled: bool) -> int:
        from torch.utils._python_dispatch import TorchDispatchMode

        class CountCasts(TorchDispatchMode):
            n = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten._to_copy.default:
                    CountCasts.n += 1
                return func(*args, **(kwargs or {}))

        w = torch.randn(4, 4, device=device, requires_grad=True)  # a leaf: eligible for the cache
        x = torch.randn(4, 4, device=device)
        with torch.autocast(device, dtype=torch.bfloat16, cache_enabled=cache_enabled), CountCasts():
            for _ in range(3):
                torch.mm(x, w)
        return CountCasts.n

    def test_cast_cache_as_on_cpu(self):
        # 3 mm calls: x is cast each time, the leaf weight once with the cache and 3 times without.
        self.assertEqual(self._count_weight_casts("openreg", True), 4)
        self.assertEqual(self._count_weight_casts("openreg", False), 6)
        self.assertEqual(self._count_weight_casts("openreg", True), self._count_weight_casts("cpu", True))

    def test_backward_through_autocast_region(self):
        w = torch.randn(4, 4, requires_grad=True)
        wd = w.detach().to("openreg").requires_grad_()
        for weight, device in ((w, "cpu"), (wd, "openreg")):
            x = torch.ones(2, 4, device=device)
            with torch.autocast(device, dtype=torch.bfloat16):
                y = torch.mm(x, weight)
            y.float().sum().backward()
        self.assertEqual(wd.grad.dtype, torch.float32)  # grads arrive in the parameter's dtype
        torch.testing.assert_close(wd.grad.cpu(), w.grad)

    def test_autocast_inside_compile_aot_eager(self):
        torch._dynamo.reset()

        def f(a, b):
            with torch.autocast("openreg", dtype=torch.float16):
                c = a @ b
                return c, torch.softmax(c, 1)

        b = torch.randn(4, 4, device="openreg")
        eager = f(self.a, b)
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(self.a, b)
        self.assertEqual([t.dtype for t in compiled], [torch.float16, torch.float32])
        for got, want in zip(compiled, eager):
            torch.testing.assert_close(got.cpu(), want.cpu())
