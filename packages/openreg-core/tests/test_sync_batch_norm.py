"""The batch-norm operators nn.SyncBatchNorm calls (csrc/aten/OpenRegSyncBatchNorm.cpp), which
PyTorch has for CUDA but not for the CPU. Composed as SyncBatchNorm composes them, over a batch
split into "ranks", they must give what F.batch_norm gives on the CPU for the whole batch: output,
running statistics and gradients."""

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import TestCase, instantiate_parametrized_tests, parametrize, run_tests


def sync_batch_norm(shards, weight, bias, running_mean, running_var, momentum=0.1, eps=1e-5):
    """SyncBatchNorm's forward (torch/nn/modules/_functions.py) with the all_gather done by hand."""
    stats = [torch.batch_norm_stats(x, eps) for x in shards]
    mean_all = torch.stack([m for m, _ in stats])
    invstd_all = torch.stack([s for _, s in stats])
    counts = torch.tensor([x.numel() // x.size(1) for x in shards], dtype=mean_all.dtype, device=mean_all.device)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        shards[0], mean_all, invstd_all, running_mean, running_var, momentum, eps, counts
    )
    outs = [torch.batch_norm_elemt(x, weight, bias, mean, invstd, eps) for x in shards]
    return outs, mean, invstd, counts


def sync_batch_norm_backward(grads, shards, weight, mean, invstd, counts):
    """SyncBatchNorm's backward with the all_reduce done by hand."""
    reduced = [
        torch.batch_norm_backward_reduce(g, x, mean, invstd, weight, True, True, True) for g, x in zip(grads, shards)
    ]
    sum_dy = sum(r[0] for r in reduced)
    sum_dy_xmu = sum(r[1] for r in reduced)
    grad_weight = sum(r[2] for r in reduced)
    grad_bias = sum(r[3] for r in reduced)
    count = counts.to(torch.int32)
    grad_inputs = [
        torch.batch_norm_backward_elemt(g, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count)
        for g, x in zip(grads, shards)
    ]
    return grad_inputs, grad_weight, grad_bias


class TestSyncBatchNormOps(TestCase):
    @parametrize("shape", [(6, 3), (4, 3, 5), (4, 3, 5, 2)])
    @parametrize("dtype", [torch.float32, torch.float64])
    def test_matches_batch_norm_on_the_whole_batch(self, shape, dtype):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(*shape, generator=g, dtype=dtype) * 3 + 1
        dy = torch.randn(*shape, generator=g, dtype=dtype)
        w = torch.rand(shape[1], generator=g, dtype=dtype) + 0.5
        b = torch.randn(shape[1], generator=g, dtype=dtype)
        rm, rv = torch.zeros(shape[1], dtype=dtype), torch.ones(shape[1], dtype=dtype)
        # The CPU reference: one batch norm over the whole batch.
        xr = x.clone().requires_grad_()
        wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
        rm_ref, rv_ref = rm.clone(), rv.clone()
        y_ref = F.batch_norm(xr, rm_ref, rv_ref, wr, br, training=True, momentum=0.1, eps=1e-5)
        y_ref.backward(dy)
        # openreg: the batch in two uneven "ranks".
        dev = "openreg"
        shards = [x[:2].to(dev), x[2:].to(dev)]
        grads = [dy[:2].to(dev), dy[2:].to(dev)]
        rm_or, rv_or = rm.to(dev), rv.to(dev)
        outs, mean, invstd, counts = sync_batch_norm(shards, w.to(dev), b.to(dev), rm_or, rv_or)
        tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else {}
        self.assertEqual(torch.cat([o.cpu() for o in outs]), y_ref.detach(), **tol)
        self.assertEqual(rm_or.cpu(), rm_ref, **tol)
        self.assertEqual(rv_or.cpu(), rv_ref, **tol)  # updated with the unbiased variance
        grad_inputs, grad_w, grad_b = sync_batch_norm_backward(grads, shards, w.to(dev), mean, invstd, counts)
        self.assertEqual(torch.cat([gi.cpu() for gi in grad_inputs]), xr.grad, **tol)
        self.assertEqual(grad_w.cpu(), wr.grad, **tol)
        self.assertEqual(grad_b.cpu(), br.grad, **tol)

    def test_half_inputs_keep_float_statistics(self):
        x = torch.randn(8, 4, 3).half().to("openreg")
        mean, invstd = torch.batch_norm_stats(x, 1e-5)
        self.assertEqual((mean.dtype, invstd.dtype), (torch.float32, torch.float32))
        ref = x.cpu().float()
        self.assertEqual(mean.cpu(), ref.mean((0, 2)))
        self.assertEqual(invstd.cpu(), (ref.var((0, 2), unbiased=False) + 1e-5).rsqrt())
        y = torch.batch_norm_elemt(x, None, None, mean, invstd, 1e-5)
        self.assertEqual(y.dtype, torch.float16)
        self.assertEqual(y.cpu().float(), F.batch_norm(ref, None, None, training=True), atol=2e-3, rtol=2e-3)

    def test_channels_last_stays_channels_last(self):
        x = torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last).to("openreg")
        mean, invstd = torch.batch_norm_stats(x, 1e-5)
        y = torch.batch_norm_elemt(x, None, None, mean, invstd, 1e-5)
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last))
        self.assertEqual(y.cpu(), F.batch_norm(x.cpu(), None, None, training=True), atol=1e-5, rtol=1e-5)

    def test_bad_shapes_raise_at_the_call(self):
        with self.assertRaisesRegex(RuntimeError, "batch_norm_stats: expected an input with at least 2 dimensions"):
            torch.batch_norm_stats(torch.ones(3, device="openreg"), 1e-5)
        m = torch.zeros(2, 3, device="openreg")
        with self.assertRaisesRegex(RuntimeError, r"expected mean and invstd of shape \[world, C\]"):
            torch.batch_norm_gather_stats_with_counts(
                torch.ones(4, 3, device="openreg"), m, m, None, None, 0.1, 1e-5, torch.ones(3, device="openreg")
            )


instantiate_parametrized_tests(TestSyncBatchNormOps)

if __name__ == "__main__":
    run_tests()
