"""Fused kernels nn modules need on an accelerator: RNN cells and scaled dot-product attention."""

import re

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.testing._internal.common_utils import TestCase, instantiate_parametrized_tests, parametrize, run_tests
from torch.utils._python_dispatch import TorchDispatchMode


def to_openreg(module: torch.nn.Module, like: torch.nn.Module) -> torch.nn.Module:
    module.load_state_dict({k: v.to("openreg") for k, v in like.state_dict().items()})
    return module


@instantiate_parametrized_tests
class TestRecurrent(TestCase):
    """csrc/aten/OpenRegRecurrent.cpp: _thnn_fused_lstm_cell / _thnn_fused_gru_cell and backward."""

    @parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
    @parametrize("bidirectional", [False, True])
    def test_matches_cpu_with_grads(self, cls, bidirectional):
        torch.manual_seed(0)
        cpu = cls(4, 8, num_layers=2, bidirectional=bidirectional, batch_first=True)
        dev = to_openreg(cls(4, 8, num_layers=2, bidirectional=bidirectional, batch_first=True).to("openreg"), cpu)
        x = torch.randn(3, 5, 4)
        y, _ = cpu(x)
        dy, _ = dev(x.to("openreg"))
        self.assertEqual(dy.cpu(), y, atol=1e-5, rtol=1e-5)
        y.square().sum().backward()
        dy.square().sum().backward()
        for (name, p), dp in zip(cpu.named_parameters(), dev.parameters()):
            self.assertEqual(dp.grad.cpu(), p.grad, atol=1e-4, rtol=1e-4, msg=name)

    @parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
    def test_packed_sequence(self, cls):
        torch.manual_seed(0)
        cpu = cls(4, 6, bidirectional=True, batch_first=True)
        dev = to_openreg(cls(4, 6, bidirectional=True, batch_first=True).to("openreg"), cpu)
        x = torch.randn(3, 5, 4)
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, [5, 3, 2], batch_first=True)
        y, _ = cpu(packed)
        dy, _ = dev(packed.to("openreg"))
        self.assertEqual(dy.data.cpu(), y.data, atol=1e-5, rtol=1e-5)
        self.assertEqual(dy.batch_sizes, y.batch_sizes)

    def test_fused_cells_check_their_arguments_at_the_call(self):
        # As CUDA's kernels do; they were accepted, gave results of the wrong shape, and failed a
        # later, unrelated call (int64 gates were computed).
        d = "openreg"
        lstm, gru = torch.ops.aten._thnn_fused_lstm_cell, torch.ops.aten._thnn_fused_gru_cell
        cases = {
            "lstm gates": (RuntimeError, "expected gates of sizes \\[3, 24\\]", lambda: lstm(
                torch.randn(3, 24, device=d), torch.randn(3, 20, device=d), torch.randn(3, 6, device=d))),
            "lstm state": (RuntimeError, "expected gates of sizes \\[3, 20\\]", lambda: lstm(
                torch.randn(3, 24, device=d), torch.randn(3, 24, device=d), torch.randn(3, 5, device=d))),
            "lstm bias": (RuntimeError, "expected a bias of 24 elements", lambda: lstm(
                torch.randn(3, 24, device=d), torch.randn(3, 24, device=d), torch.randn(3, 6, device=d),
                torch.randn(23, device=d))),
            "lstm int64": (NotImplementedError, "not implemented for 'Long'", lambda: lstm(
                *(torch.ones(3, n, dtype=torch.long, device=d) for n in (24, 24, 6)))),
            "lstm float8": (NotImplementedError, "not implemented for 'Float8_e4m3fn'", lambda: lstm(
                *(torch.zeros(3, n, device=d).to(torch.float8_e4m3fn) for n in (24, 24, 6)))),
            "lstm bias dtype": (RuntimeError, "expected a bias of 24 elements of Float", lambda: lstm(
                torch.randn(3, 24, device=d), torch.randn(3, 24, device=d), torch.randn(3, 6, device=d),
                torch.randn(24, device=d, dtype=torch.float64))),
            "gru state": (RuntimeError, "expected gates of sizes \\[3, 15\\]", lambda: gru(
                torch.randn(3, 18, device=d), torch.randn(3, 18, device=d), torch.randn(3, 5, device=d))),
        }  # fmt: skip
        for name, (error, message, call) in cases.items():
            with self.subTest(name), self.assertRaisesRegex(error, message):
                call()
        torch.openreg.synchronize()  # nothing left to fail later
        hy, cy, _ = lstm(torch.zeros(3, 24, device=d), torch.zeros(3, 24, device=d), torch.ones(3, 6, device=d))
        self.assertEqual(cy.cpu(), torch.full((3, 6), 0.5))  # f = sigmoid(0), c = tanh(0): f * cx


class OpsSeen(TorchDispatchMode):
    """The ATen operators a call reaches below autograd (which attention kernel ran)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@instantiate_parametrized_tests
class TestAttention(TestCase):
    """csrc/aten/OpenRegAttention.cpp: the OVERRIDEABLE fused attention backend, forward and backward."""

    def test_vmap_and_per_sample_gradients(self):
        # Under torch.func.vmap the choice is MATH: functorch has no batching rule for the
        # overrideable op (it returns SymInts), and every vmap of 4-D attention failed with
        # "Batching rule not implemented", per-sample gradients of an attention model among them.
        from torch.func import functional_call, grad, vmap

        torch.manual_seed(0)
        q = torch.randn(3, 2, 4, 5, 8)
        attention = lambda t: F.scaled_dot_product_attention(t, t, t, is_causal=True)  # noqa: E731
        self.assertEqual(vmap(attention)(q.to("openreg")).cpu(), vmap(attention)(q), atol=1e-5, rtol=1e-5)
        # batched over the mask alone
        masks, q1 = torch.randn(3, 5, 5), q[0]
        masked = lambda m, t: F.scaled_dot_product_attention(t, t, t, attn_mask=m)  # noqa: E731
        want = vmap(masked, in_dims=(0, None))(masks, q1)
        got = vmap(masked, in_dims=(0, None))(masks.to("openreg"), q1.to("openreg"))
        self.assertEqual(got.cpu(), want, atol=1e-5, rtol=1e-5)

        layer = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        params = {k: v.detach() for k, v in layer.named_parameters()}

        def loss(p, x):
            out = functional_call(layer, p, (x[None], x[None], x[None]), {"need_weights": False})[0]
            return out.square().mean()

        x = torch.randn(3, 5, 8)
        want = vmap(grad(loss), in_dims=(None, 0))(params, x)
        layer.to("openreg")
        got = vmap(grad(loss), in_dims=(None, 0))({k: v.to("openreg") for k, v in params.items()}, x.to("openreg"))
        for name in want:
            self.assertEqual(got[name].cpu(), want[name], atol=1e-5, rtol=1e-4, msg=name)

    @parametrize("case", ["plain", "causal", "float_mask", "bool_mask", "scale"])
    def test_overrideable_matches_cpu(self, case):
        torch.manual_seed(0)
        q, k, v = torch.randn(2, 3, 6, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 4)
        kwargs = {
            "plain": {},
            "causal": {"is_causal": True},
            "float_mask": {"attn_mask": torch.randn(6, 5)},
            "bool_mask": {"attn_mask": torch.rand(6, 5) > 0.3},
            "scale": {"scale": 0.3},
        }[case]
        cpu_in = [t.clone().requires_grad_() for t in (q, k, v)]
        dev_in = [t.to("openreg").requires_grad_() for t in (q, k, v)]
        dev_kwargs = {n: (a.to("openreg") if isinstance(a, torch.Tensor) else a) for n, a in kwargs.items()}
        out = F.scaled_dot_product_attention(*cpu_in, **kwargs)
        with OpsSeen() as seen:
            dout = F.scaled_dot_product_attention(*dev_in, **dev_kwargs)
        self.assertIn("aten._scaled_dot_product_fused_attention_overrideable.default", seen.ops)
        self.assertNotIn("aten.softmax.int", seen.ops)  # not the MATH decomposition
        self.assertEqual(dout.cpu(), out, atol=1e-5, rtol=1e-5)
        grad = torch.randn_like(out)
        out.backward(grad)
        dout.backward(grad.to("openreg"))
        for c, d in zip(cpu_in, dev_in):
            self.assertEqual(d.grad.cpu(), c.grad, atol=1e-4, rtol=1e-4)

    def test_mask_gradient(self):
        q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
        mask = torch.randn(4, 4, requires_grad=True)
        dmask = mask.detach().to("openreg").requires_grad_()
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
        F.scaled_dot_product_attention(
            q.to("openreg"), k.to("openreg"), v.to("openreg"), attn_mask=dmask
        ).sum().backward()
        self.assertEqual(dmask.grad.cpu(), mask.grad, atol=1e-4, rtol=1e-4)

    def test_masked_16_bit_attention_is_as_accurate_as_the_cpus(self):
        # A mask sends openreg to its composed kernel, which computed the scores in the input's
        # 16-bit type and rounded the probabilities back to it: 3 to 10 times the CPU's error (the
        # CPU computes in float32). Now both are as far from the float64 result.
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 4, 16, 32) * 2 for _ in range(3))
        mask = torch.randn(16, 16)
        ref_in = [t.double().requires_grad_() for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*ref_in, attn_mask=mask.double())
        ref.pow(2).sum().backward()
        for dtype in (torch.bfloat16, torch.float16):
            errors = {}
            for device in ("cpu", "openreg"):
                ins = [t.to(dtype).to(device).requires_grad_() for t in (q, k, v)]
                out = F.scaled_dot_product_attention(*ins, attn_mask=mask.to(dtype).to(device))
                out.float().pow(2).sum().backward()
                errors[device] = [
                    (t.cpu().double() - r).abs().max().item()
                    for t, r in zip([out, *(i.grad for i in ins)], [ref, *(i.grad for i in ref_in)])
                ]
            for name, cpu, ours in zip(("out", "dq", "dk", "dv"), errors["cpu"], errors["openreg"]):
                self.assertLessEqual(ours, 1.25 * cpu + 1e-3, msg=f"{dtype} {name}: openreg {ours}, cpu {cpu}")

    def test_rows_masked_out_entirely_are_zero(self):
        # exp(S - logsumexp(S)) is NaN where logsumexp is -inf; MATH's _safe_softmax gives 0.
        q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
        mask = torch.ones(3, 5, dtype=torch.bool)
        mask[1] = False
        cpu_in = [t.clone().requires_grad_() for t in (q, k, v)]
        dev_in = [t.to("openreg").requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*cpu_in, attn_mask=mask)
        dout = F.scaled_dot_product_attention(*dev_in, attn_mask=mask.to("openreg"))
        self.assertEqual(dout.cpu(), out, atol=1e-5, rtol=1e-5)
        self.assertEqual(out[:, :, 1], torch.zeros(1, 2, 4))
        out.sum().backward()
        dout.sum().backward()
        for c, d in zip(cpu_in, dev_in):
            self.assertEqual(d.grad.cpu(), c.grad, atol=1e-4, rtol=1e-4)

    def test_the_logsumexp_is_float32_as_the_fake_kernel_says(self):
        # For float64 inputs too: the op returned a float64 logsumexp where its meta kernel says float32,
        # and an Inductor graph that read it read the float64 bytes as float32.
        torch.manual_seed(0)
        q = torch.randn(2, 3, 5, 8, dtype=torch.float64)
        op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
        qd = q.to("openreg")
        out, lse = op(qd, qd, qd)[:2]
        with torch._subclasses.FakeTensorMode() as mode:
            fq = mode.from_tensor(qd)
            fake_lse = op(fq, fq, fq)[1]
        self.assertEqual((lse.dtype, fake_lse.dtype), (torch.float32, torch.float32))
        self.assertEqual(lse.cpu(), torch.logsumexp(q @ q.transpose(-2, -1) / 8**0.5, -1).float())
        self.assertEqual(out.cpu(), F.scaled_dot_product_attention(q, q, q), atol=1e-12, rtol=1e-12)
        # float64 gradients through the flash backward: its logsumexp is recomputed in float64 (scores
        # scaled up, so that a float32 one would put them off by ~1e-5)
        ins = [(t * 30).requires_grad_() for t in (q, torch.randn_like(q), torch.randn_like(q))]
        F.scaled_dot_product_attention(*ins, is_causal=True).square().sum().backward()
        dev = [t.detach().to("openreg").requires_grad_() for t in ins]
        F.scaled_dot_product_attention(*dev, is_causal=True).square().sum().backward()
        for got, want in zip(dev, ins):
            self.assertEqual(got.grad.cpu(), want.grad, atol=1e-9, rtol=1e-9)

    def test_rows_masked_with_huge_values_match_math(self):
        # P was exp(S - logsumexp(S)): a row masked with the dtype's lowest value has a logsumexp that
        # rounds to it, and P was 1 everywhere (the sum of V, not the mean); float64 gradients were
        # taken from the float32 logsumexp (off by up to e^32 for a -1e9 padding row). The CPU's own
        # default (its flash kernel) is off for such rows too: compared with its MATH backend.
        torch.manual_seed(0)
        for dtype, low in (
            (torch.float32, None),
            (torch.float64, None),
            (torch.float64, -1e9),
            (torch.float64, -1e300),
        ):
            low = torch.finfo(dtype).min if low is None else low
            q, k, v = (torch.randn(1, 2, n, 4, dtype=dtype) for n in (3, 5, 5))
            mask = torch.zeros(3, 5, dtype=dtype)
            mask[1] = low  # a row with no key left: uniform weights, as the softmax gives
            mask[:, 4] = low  # a padded key
            results = []
            for device in ("cpu", "openreg"):
                ins = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
                with sdpa_kernel(SDPBackend.MATH if device == "cpu" else SDPBackend.OVERRIDEABLE):
                    out = F.scaled_dot_product_attention(*ins, attn_mask=mask.to(device))
                out.square().sum().backward()
                results.append([t.cpu() for t in (out.detach(), *(i.grad for i in ins))])
            tol = 1e-5 if dtype == torch.float32 else 1e-12
            for got, want in zip(results[1], results[0]):
                self.assertEqual(got, want, atol=tol, rtol=tol, msg=f"{dtype} {low}")

    def test_integer_inputs_are_refused_as_on_the_cpu(self):
        # Integer inputs: the CPU's error, at the call and while tracing.
        ints = torch.ones(2, 2, 4, 8, dtype=torch.long)
        with self.assertRaises(RuntimeError) as cpu:
            F.scaled_dot_product_attention(ints, ints, ints)
        with self.assertRaisesRegex(RuntimeError, "^" + re.escape(str(cpu.exception).splitlines()[0])):
            F.scaled_dot_product_attention(*(ints.to("openreg"),) * 3)
        on_device = ints.to("openreg")
        with torch._subclasses.FakeTensorMode() as mode:  # the fused op's meta kernel took them
            fake = mode.from_tensor(on_device)
            with self.assertRaisesRegex(RuntimeError, "expected scalar type"):
                F.scaled_dot_product_attention(fake, fake, fake)

    def test_results_match_the_fake_kernel(self):
        # Compiled graphs are traced with the fake/meta kernel and assert the real results' sizes and
        # strides: every result of the fused operator (Philox seed and offset were 1-dim, not 0-dim).
        q = torch.randn(2, 5, 3, 8, device="openreg").transpose(1, 2)
        op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
        real = op(q, q, q, is_causal=True)
        with torch._subclasses.FakeTensorMode() as mode:
            fq = mode.from_tensor(q)
            fake = op(fq, fq, fq, is_causal=True)

        def geometry(results):
            return [(tuple(r.shape), r.stride()) if isinstance(r, torch.Tensor) else r for r in results]

        self.assertEqual(geometry(real), geometry(fake))

    def test_unmasked_attention_runs_the_cpu_flash_kernels(self):
        # Without a mask the device runs the CPU's flash-attention kernels (forward and backward) on
        # the kernel views: the profiler sees them inside the fused operator's kernel; gradcheck holds.
        q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64, device="openreg", requires_grad=True) for _ in range(3))
        for causal in (False, True):
            self.assertTrue(
                torch.autograd.gradcheck(
                    lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), (q, k, v)
                )
            )
        # The CPU itself runs its flash kernels for unmasked attention: the results are bitwise equal
        # (the composed form differs in the last bits).
        q, k, v = (torch.randn(2, 4, 33, 16) for _ in range(3))
        cpu_in = [t.clone().requires_grad_() for t in (q, k, v)]
        dev_in = [t.to("openreg").requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*cpu_in, is_causal=True)
        dout = F.scaled_dot_product_attention(*dev_in, is_causal=True)
        self.assertEqual(dout.cpu(), out, atol=0, rtol=0)
        grad = torch.randn_like(out)
        out.backward(grad)
        dout.backward(grad.to("openreg"))
        for c, d in zip(cpu_in, dev_in):
            self.assertEqual(d.grad.cpu(), c.grad, atol=0, rtol=0)
        # Inputs whose last dimension is strided (OpInfo's non-contiguous samples): the flash kernels
        # read them as contiguous, so the device hands them contiguous copies (they were wrong).
        full = [torch.randn(2, 3, 5, 16) for _ in range(3)]
        cpu_in = [t[..., ::2].detach().requires_grad_() for t in full]
        dev_in = [t.to("openreg")[..., ::2].detach().requires_grad_() for t in full]
        self.assertEqual(dev_in[0].stride(-1), 2)
        out = F.scaled_dot_product_attention(*cpu_in, is_causal=True)
        dout = F.scaled_dot_product_attention(*dev_in, is_causal=True)
        self.assertEqual(dout.cpu(), out, atol=1e-5, rtol=1e-5)
        out.sum().backward()
        dout.sum().backward()
        for c, d in zip(cpu_in, dev_in):
            self.assertEqual(d.grad.cpu(), c.grad, atol=1e-4, rtol=1e-4)

    def test_fused_kernel_gradcheck_float64(self):
        # float64 is computed in float64 (16-bit types in float32), so gradcheck holds; an
        # undefined incoming gradient (gradcheck tries one) gives none back.
        q, k, v = (torch.randn(1, 2, 3, 4, dtype=torch.float64, device="openreg", requires_grad=True) for _ in range(3))
        mask = torch.randn(3, 3, dtype=torch.float64, device="openreg", requires_grad=True)
        self.assertTrue(
            torch.autograd.gradcheck(
                lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), (q, k, v, mask)
            )
        )
        self.assertTrue(
            torch.autograd.gradcheck(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v))
        )

    @parametrize("case", ["kv_batch_1", "q_batch_1", "v_one_head", "kv_batch_1_masked"])
    def test_broadcasting_sizes_match_cpu(self, case):
        # The CPU takes MATH for batch or head sizes that broadcast; openreg sent them to the CPU's
        # flash kernel, which read past a broadcast key and value: wrong results, and a backward that
        # corrupted the heap (with a mask, a gradient of the wrong shape failed a later call).
        torch.manual_seed(0)
        q_shape, k_shape, v_shape = {
            "kv_batch_1": ((2, 3, 4, 8), (1, 3, 6, 8), (1, 3, 6, 8)),
            "q_batch_1": ((1, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8)),
            "v_one_head": ((2, 3, 4, 8), (2, 3, 6, 8), (2, 1, 6, 8)),
            "kv_batch_1_masked": ((2, 3, 4, 8), (1, 3, 6, 8), (1, 3, 6, 8)),
        }[case]
        inputs = [torch.randn(*shape, dtype=torch.float64) for shape in (q_shape, k_shape, v_shape)]
        mask = torch.randn(4, 6, dtype=torch.float64) if case.endswith("masked") else None
        results = []
        for device in ("cpu", "openreg"):
            q, k, v = (t.detach().to(device).requires_grad_() for t in inputs)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.to(device))
            out.square().sum().backward()
            results.append([t.cpu() for t in (out, q.grad, k.grad, v.grad)])
        for got, want in zip(*reversed(results)):
            self.assertEqual(got, want, atol=1e-10, rtol=1e-10)
        torch.openreg.synchronize()  # nothing left to fail later

    def test_sizes_that_do_not_broadcast_are_refused_at_the_call(self):
        q, k = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8)
        cases = {  # the last: MATH's matmul is refused by its meta kernel, in other words than the CPU's
            "value batch": (q, k, torch.randn(3, 3, 6, 8), None, True),
            "key head size": (q, torch.randn(2, 3, 6, 7), torch.randn(2, 3, 6, 8), None, True),
            "value length, masked": (q, k, torch.randn(2, 3, 5, 8), torch.zeros(4, 6), False),
            # a mask that would make the scores larger (batch 2 for a query of batch 1)
            "mask batch": (q[:1], k[:1], k[:1], torch.zeros(2, 3, 4, 6), True),
        }
        for name, (q_, k_, v_, m, same_words) in cases.items():
            with self.subTest(name):
                with self.assertRaises(RuntimeError) as cpu:
                    F.scaled_dot_product_attention(q_, k_, v_, attn_mask=m)
                moved = [None if t is None else t.to("openreg") for t in (q_, k_, v_, m)]
                with self.assertRaises(RuntimeError) as got:  # at the call
                    F.scaled_dot_product_attention(*moved[:3], attn_mask=moved[3])
                if same_words:
                    self.assertEqual(str(got.exception).splitlines()[0], str(cpu.exception).splitlines()[0])
        torch.openreg.synchronize()  # nothing left to fail later
        # Called directly, the fused operator refuses them too.
        with self.assertRaisesRegex(RuntimeError, "one batch and head count for query, key and value"):
            torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
                q.to("openreg"), k[:1].to("openreg"), k[:1].to("openreg")
            )

    def test_nested_inputs_take_math(self):
        # As on the CPU (their sequence dimension has no single size): the choice read it and failed.
        torch.manual_seed(0)
        parts = [torch.randn(3, n, 8) for n in (4, 6)]
        want = F.scaled_dot_product_attention(*(torch.nested.nested_tensor(parts),) * 3)
        nt = torch.nested.nested_tensor([p.to("openreg") for p in parts])
        got = F.scaled_dot_product_attention(nt, nt, nt)
        for g, w in zip(got.unbind(), want.unbind()):
            self.assertEqual(g.cpu(), w, atol=1e-5, rtol=1e-5)

    def test_sdpa_kernel_restrictions_apply(self):
        # scaled_dot_product_attention asks _fused_sdp_choice_stub, not the operator: without the
        # stub PyTorch ran MATH for every call and ignored sdpa_kernel.
        q = torch.randn(1, 1, 4, 8, device="openreg")
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            with self.assertRaisesRegex(
                RuntimeError, "No available kernel for scaled_dot_product_attention on openreg"
            ):
                F.scaled_dot_product_attention(q, q, q)
            # The reason is the disabled backend, even for inputs it would not take (it named the
            # feature: "does not support dropout", under a backend the user had turned off).
            with self.assertRaisesRegex(
                RuntimeError, "on openreg: the OVERRIDEABLE backend is disabled, and the MATH backend is disabled"
            ):
                F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
        with sdpa_kernel(SDPBackend.OVERRIDEABLE):
            with self.assertRaisesRegex(
                RuntimeError, "the OVERRIDEABLE backend does not support dropout, and the MATH backend is disabled"
            ):
                F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
        with sdpa_kernel(SDPBackend.MATH), OpsSeen() as seen:
            F.scaled_dot_product_attention(q, q, q)
        self.assertNotIn("aten._scaled_dot_product_fused_attention_overrideable.default", seen.ops)

    def test_backend_choice(self):
        q = torch.randn(1, 1, 4, 8, device="openreg")
        choice = torch.ops.aten._fused_sdp_choice
        self.assertEqual(choice(q, q, q), SDPBackend.OVERRIDEABLE.value)
        self.assertEqual(choice(q, q, q, dropout_p=0.5), SDPBackend.MATH.value)  # dropout: MATH
        with sdpa_kernel(SDPBackend.MATH):
            self.assertEqual(choice(q, q, q), SDPBackend.MATH.value)
        with sdpa_kernel(SDPBackend.OVERRIDEABLE):
            with self.assertRaisesRegex(RuntimeError, "does not support dropout, and the MATH backend is disabled"):
                choice(q, q, q, dropout_p=0.5)
            # It names what it does not support (it said "dropout or grouped-query attention" for all).
            with self.assertRaisesRegex(RuntimeError, "does not support inputs that are not 4-D"):
                choice(q[0], q[0], q[0])
            with self.assertRaisesRegex(RuntimeError, "does not support batch sizes, head counts or head sizes that"):
                choice(q, q, q.expand(1, 2, 4, 8))
        out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
        self.assertEqual(out.shape, q.shape)


class TestArgumentErrorsAtTheCall(TestCase):
    """What the CPU's convolution, attention and mm kernels refuse without looking at the data is
    refused at the call with the CPU's error, as on the CPU and CUDA. The native kernels' meta
    checks shapes only: these errors came from the kernel, at some later synchronising call, and
    the call returned uninitialised memory."""

    def check_like_cpu(self, call, *args, **kwargs):
        with self.assertRaises(Exception) as cpu:
            call(*args, **kwargs)
        device_args, device_kwargs = torch.utils._pytree.tree_map_only(
            torch.Tensor, lambda t: t.to("openreg"), (args, kwargs)
        )
        for _ in range(2):  # a signature whose first call failed is verified again
            with self.assertRaises(type(cpu.exception)) as got:
                call(*device_args, **device_kwargs)
            self.assertEqual(str(got.exception).splitlines()[0], str(cpu.exception).splitlines()[0])
        torch.openreg.synchronize()  # nothing left to fail later
        self.assertEqual((torch.ones(2, device="openreg") + 1).cpu().tolist(), [2.0, 2.0])

    def test_convolution(self):
        x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 2, 2)
        self.check_like_cpu(F.conv2d, x, w.double())
        self.check_like_cpu(F.conv2d, x, w.long())
        self.check_like_cpu(F.conv2d, x.bool(), w.bool())
        self.check_like_cpu(F.conv2d, x, w, dilation=0)
        self.check_like_cpu(F.conv_transpose2d, x, torch.randn(2, 3, 2, 2), output_padding=2)
        self.check_like_cpu(F.conv_transpose2d, x.int(), torch.randn(2, 3, 2, 2).int())
        # the same arguments, valid: computed as on the CPU
        self.assertEqual(F.conv2d(x.to("openreg"), w.to("openreg"), dilation=2).cpu(), F.conv2d(x, w, dilation=2))

    def test_convolution_backward(self):
        x = torch.randn(1, 2, 5, 5, dtype=torch.float64)
        w = torch.randn(3, 2, 2, 2, dtype=torch.float64)
        grad = torch.randn(1, 3, 4, 4, dtype=torch.float64)

        def backward(g, i, wt):
            return torch.ops.aten.convolution_backward(g, i, wt, [3], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                       [True, True, True])  # fmt: skip

        self.check_like_cpu(backward, grad.float(), x, w)

    def test_attention(self):
        q = torch.randn(1, 2, 4, 8)
        self.check_like_cpu(F.scaled_dot_product_attention, q, q, q, attn_mask=torch.zeros(4, 3))
        self.check_like_cpu(F.scaled_dot_product_attention, q, q, q, attn_mask=torch.zeros(5, 4, 4))
        self.check_like_cpu(F.scaled_dot_product_attention, q.long(), q.long(), q.long())

    def test_mm_into_an_expanded_out(self):
        a, b = torch.randn(3, 4), torch.randn(4, 5)
        message = "more than one element of the written-to tensor refers to a single memory location"
        for device in ("cpu", "openreg"):  # (.to() would make the expanded out contiguous)
            for op in (torch.mm, torch.matmul):
                out = torch.zeros(1, 5, device=device).expand(3, 5)
                with self.assertRaisesRegex(RuntimeError, message, msg=f"{device} {op.__name__}"):
                    op(a.to(device), b.to(device), out=out)
        torch.openreg.synchronize()  # nothing left to fail later


if __name__ == "__main__":
    run_tests()
