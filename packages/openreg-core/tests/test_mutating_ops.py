"""Ops that mutate their arguments and return nothing, conjugate/negative views,
and training utilities that depend on them (GradScaler, fused and foreach optimizers)."""

import torch
from torch.testing._internal.common_utils import TestCase, run_tests


def make_pair(seed: int = 0):
    torch.manual_seed(seed)
    cpu = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    dev = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("openreg")
    dev.load_state_dict({k: v.to("openreg") for k, v in cpu.state_dict().items()})
    return cpu, dev


class TestMutatingOps(TestCase):
    def test_foreach_inplace(self):
        xs = [torch.randn(3), torch.randn(5)]
        ds = [x.to("openreg") for x in xs]
        torch._foreach_add_(ds, 2.0)
        torch._foreach_mul_(ds, ds)
        for x, d in zip(xs, ds):
            self.assertEqual(d.cpu(), (x + 2) ** 2)

    def test_optimizers_match_cpu(self):
        for kwargs in ({"fused": True}, {"foreach": True}, {"foreach": False}):
            cpu, dev = make_pair()
            opt_c = torch.optim.Adam(cpu.parameters(), lr=0.1, **kwargs)
            opt_d = torch.optim.Adam(dev.parameters(), lr=0.1, **kwargs)
            x = torch.randn(4, 6)
            for _ in range(3):
                for model, opt, inp in ((cpu, opt_c, x), (dev, opt_d, x.to("openreg"))):
                    opt.zero_grad()
                    model(inp).square().sum().backward()
                    opt.step()
            for p, d in zip(cpu.parameters(), dev.parameters()):
                self.assertEqual(d.detach().cpu(), p.detach(), atol=1e-5, rtol=1e-5, msg=str(kwargs))

    def test_fused_steps_without_an_upstream_meta_kernel_are_asynchronous_and_capturable(self):
        # _fused_sgd_, _fused_adagrad_ and the tensor-lr fused Adam/AdamW have no meta kernel in
        # torch 2.13: the generic path ran every step synchronously (the host waited for the
        # device at each one) and refused them in a graph capture, where CUDA captures them (hunt36a).
        from torch_openreg.utils.testing import StreamHold

        configs = [
            (torch.optim.SGD, {"lr": 0.1}),
            (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
            (torch.optim.SGD, {"lr": torch.tensor(0.1), "momentum": 0.9}),
            (torch.optim.Adagrad, {"lr": 0.1}),
            # Adam's family is captured only when capturable, as on CUDA (its step() refuses otherwise).
            (torch.optim.Adam, {"lr": torch.tensor(0.1), "capturable": True}),
            (torch.optim.AdamW, {"lr": torch.tensor(0.1), "amsgrad": True, "capturable": True}),
        ]
        grads = [torch.randn(5, 3), torch.randn(3)]
        for cls, kwargs in configs:
            msg = f"{cls.__name__} {kwargs}"

            def make(device):
                params = [torch.linspace(-1, 1, 15).view(5, 3), torch.linspace(2, 3, 3)]
                params = [torch.nn.Parameter(p.to(device)) for p in params]
                for p, g in zip(params, grads):
                    p.grad = g.to(device)
                options = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
                if device == "cpu":
                    options.pop("capturable", None)  # the CPU refuses it
                return params, cls(params, fused=True, **options)

            cpu_params, cpu_opt = make("cpu")
            params, opt = make("openreg")
            side = torch.openreg.Stream()
            side.wait_stream(torch.openreg.current_stream())
            with torch.openreg.stream(side):
                for _ in range(2):  # warm-up: each signature's first call is verified, synchronously
                    opt.step()  # (SGD's first step with momentum is a signature of its own)
                with StreamHold() as held:  # a step that waited for the device would block here
                    opt.step()
                    self.assertFalse(held.stream.query(), msg=msg)
                graph = torch.accelerator.Graph()
                with graph:
                    opt.step()
            torch.openreg.current_stream().wait_stream(side)
            graph.replay()
            graph.replay()
            for _ in range(5):
                cpu_opt.step()
            for p, c in zip(params, cpu_params):
                self.assertEqual(p.detach().cpu(), c.detach(), atol=1e-6, rtol=1e-6, msg=msg)
            graph.reset()

    def test_fused_steps_refuse_bad_values_at_the_call(self):
        # What the verified signature does not hold (a momentum without its buffers, a tensor lr of
        # several elements) is refused at the call with the CPU's error, not by the device later.
        def sgd(device, momentum, lr):
            p, g = [torch.zeros(3, device=device)], [torch.ones(3, device=device)]
            torch._fused_sgd_(
                p,
                g,
                [],
                weight_decay=0.0,
                momentum=momentum,
                lr=lr,
                dampening=0.0,
                nesterov=False,
                maximize=False,
                is_first_step=False,
            )
            return p[0]

        for device in ("cpu", "openreg"):
            sgd(device, 0.0, 0.1)  # verified
            sgd(device, 0.0, torch.tensor([0.1], device=device))
            with self.assertRaisesRegex(RuntimeError, "momentum_buffer_list.size\\(\\) == n_tensors"):
                sgd(device, 0.9, 0.1)
            with self.assertRaisesRegex(RuntimeError, "a Tensor with 2 elements cannot be converted to Scalar"):
                sgd(device, 0.0, torch.tensor([0.1, 0.2], device=device))
        torch.openreg.synchronize()  # and nothing failed on the device
        self.assertEqual(sgd("openreg", 0.0, 0.5).cpu(), torch.full((3,), -0.5))

    def test_grad_scaler_unscales_and_skips_inf(self):
        cpu, dev = make_pair()
        scaler = torch.amp.GradScaler("openreg", init_scale=1024.0)
        opt = torch.optim.SGD(dev.parameters(), lr=0.1)
        opt_c = torch.optim.SGD(cpu.parameters(), lr=0.1)
        x = torch.randn(4, 6)
        scaler.scale(dev(x.to("openreg")).sum()).backward()
        scaler.step(opt)
        scaler.update()
        cpu(x).sum().backward()
        opt_c.step()
        for p, d in zip(cpu.parameters(), dev.parameters()):
            self.assertEqual(d.detach().cpu(), p.detach(), atol=1e-5, rtol=1e-5)
        # An infinite gradient: the step is skipped and the scale halves.
        before = [d.detach().cpu().clone() for d in dev.parameters()]
        opt.zero_grad()
        scaler.scale(dev(torch.full((4, 6), float("inf"), device="openreg")).sum()).backward()
        scaler.step(opt)
        scaler.update()
        self.assertEqual(scaler.get_scale(), 512.0)
        for b, d in zip(before, dev.parameters()):
            self.assertEqual(d.detach().cpu(), b)


class TestConjugateAndNegativeViews(TestCase):
    def test_conj_and_neg_views(self):
        z = torch.randn(5, dtype=torch.complex64)
        d = z.to("openreg")
        self.assertTrue(d.conj().is_conj())
        self.assertEqual(d.conj().cpu(), z.conj())
        self.assertEqual(d.conj().clone().cpu(), z.conj())
        self.assertEqual((d.conj() * 2).cpu(), z.conj() * 2)
        self.assertEqual(z.conj().to("openreg").cpu(), z.conj())
        self.assertEqual(torch.view_as_real(d.conj().resolve_conj()).cpu(), torch.view_as_real(z.conj().resolve_conj()))
        self.assertEqual(d.conj().imag.neg().cpu(), -z.conj().imag)


class TestStreamPriorityProperty(TestCase):
    def test_priority(self):
        self.assertEqual(torch.openreg.Stream(priority=-1).priority, -1)
        self.assertEqual(torch.openreg.Stream().priority, 0)
        self.assertEqual(torch.openreg.default_stream().priority, 0)


class TestPinnedDestination(TestCase):
    def test_async_d2h_keeps_pinned_destination_from_reuse(self):
        src = torch.randn(512, 512, device="openreg")
        slow = src
        for _ in range(6):
            slow = slow @ slow / 512
        dst = torch.empty(512, 512).pin_memory()
        ptr = dst.data_ptr()
        dst.copy_(src, non_blocking=True)
        del dst
        other = torch.empty(512, 512).pin_memory()  # the block is still in use by the queued copy
        self.assertNotEqual(other.data_ptr(), ptr)
        torch.openreg.synchronize()


if __name__ == "__main__":
    run_tests()
