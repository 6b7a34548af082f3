"""Sparse tensors on openreg (COO: SparsePrivateUse1; CSR, CSC, BSR, BSC: SparseCsrPrivateUse1),
compared with the CPU: values, layout, nnz, coalesced flag and dtype of every result."""

import io
import re

import torch
from torch.testing._internal.common_utils import TestCase, run_tests


def coo_sample(shape=(5, 4), nnz=8, seed=0, dense_dims=()):
    """An uncoalesced COO tensor on the CPU (repeated indices are likely)."""
    g = torch.Generator().manual_seed(seed)
    indices = torch.stack([torch.randint(0, n, (nnz,), generator=g) for n in shape])
    values = torch.randn(nnz, *dense_dims, generator=g)
    return torch.sparse_coo_tensor(indices, values, tuple(shape) + tuple(dense_dims))


def dense_sample(shape, seed=0, density=0.4):
    """A dense CPU tensor with about `density` of its elements nonzero."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * (torch.rand(shape, generator=g) < density)


def members(t):
    if t.layout == torch.sparse_coo:
        return (t._indices(), t._values())
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return (t.crow_indices(), t.col_indices(), t.values())
    return (t.ccol_indices(), t.row_indices(), t.values())


class SparseTestCase(TestCase):
    def assertSparseEqual(self, got, expected, tol=1e-5):
        """got (openreg) against expected (CPU): structure, then every member, then the host copy."""
        self.assertEqual(got.device.type, "openreg")
        self.assertEqual(got.layout, expected.layout)
        self.assertEqual(got.dtype, expected.dtype)
        self.assertEqual(got.shape, expected.shape)
        self.assertEqual(got._nnz(), expected._nnz())
        self.assertEqual(got.dense_dim(), expected.dense_dim())
        if expected.layout == torch.sparse_coo:
            self.assertEqual(got.is_coalesced(), expected.is_coalesced())
            self.assertEqual(got.sparse_dim(), expected.sparse_dim())
        for g, e in zip(members(got), members(expected)):
            self.assertEqual(g.device.type, "openreg")  # the members live on the device
            torch.testing.assert_close(g.cpu(), e, atol=tol, rtol=tol)
        back = got.cpu()
        self.assertEqual(back.layout, expected.layout)
        torch.testing.assert_close(back.to_dense(), expected.to_dense(), atol=tol, rtol=tol)

    def assertDenseEqual(self, got, expected, tol=1e-5):
        self.assertEqual(got.device.type, "openreg")
        self.assertEqual(got.layout, torch.strided)
        torch.testing.assert_close(got.cpu(), expected, atol=tol, rtol=tol)


class TestSparseCOO(SparseTestCase):
    def test_construction(self):
        s = coo_sample()
        on_device = torch.sparse_coo_tensor(s._indices().to("openreg"), s._values().to("openreg"), s.shape)
        self.assertSparseEqual(on_device, s)
        from_lists = torch.sparse_coo_tensor([[0, 1, 1], [2, 0, 2]], [3.0, 4.0, 5.0], (2, 3), device="openreg")
        self.assertSparseEqual(from_lists, torch.sparse_coo_tensor([[0, 1, 1], [2, 0, 2]], [3.0, 4.0, 5.0], (2, 3)))
        d = dense_sample((6, 5))
        self.assertSparseEqual(d.to("openreg").to_sparse(), d.to_sparse())
        self.assertSparseEqual(d.to("openreg").to_sparse(1), d.to_sparse(1))  # hybrid: one sparse dimension
        self.assertSparseEqual(
            torch.zeros(3, 4, layout=torch.sparse_coo, device="openreg"), torch.zeros(3, 4, layout=torch.sparse_coo)
        )
        empty = torch.empty(3, 4, layout=torch.sparse_coo, device="openreg")
        self.assertEqual((empty.layout, empty.shape, empty._nnz()), (torch.sparse_coo, torch.Size([3, 4]), 0))

    def test_construction_checks_invariants_like_the_cpu(self):
        # is_coalesced=True under check_sparse_tensor_invariants: the check flattens the indices
        # through a DispatchStub with no openreg entry (an internal assert); it runs on the device.
        cases = {
            "coalesced": ([[0, 1], [2, 0]], True),
            "not sorted": ([[1, 0], [0, 2]], True),
            "duplicate": ([[0, 0], [1, 1]], True),
            "out of bounds": ([[0, 2], [0, 0]], False),
        }
        for name, (indices, coalesced) in cases.items():
            with self.subTest(name), torch.sparse.check_sparse_tensor_invariants():
                results = []
                for device in ("cpu", "openreg"):
                    i = torch.tensor(indices, device=device)
                    try:
                        t = torch.sparse_coo_tensor(i, torch.ones(2, device=device), (2, 3), is_coalesced=coalesced)
                        results.append(("result", t.is_coalesced(), t.to_dense().cpu()))
                    except RuntimeError as e:
                        results.append(("error", str(e).splitlines()[0]))
                self.assertEqual(results[1], results[0])
                self.assertEqual(results[0][0], "result" if name == "coalesced" else "error")

    def test_members_live_on_the_device_and_alias(self):
        s = coo_sample().coalesce()
        d = s.to("openreg")
        self.assertEqual(d.indices().device.type, "openreg")
        self.assertEqual(d.values().device.type, "openreg")
        d.values().mul_(2)  # a view of the member: the sparse tensor sees it, as on the CPU
        s.values().mul_(2)
        self.assertSparseEqual(d, s)
        self.assertDenseEqual(d.indices(), s.indices())

    def test_coalesce_and_to_dense(self):
        s = coo_sample(nnz=12)
        d = s.to("openreg")
        self.assertFalse(d.is_coalesced())
        self.assertSparseEqual(d.coalesce(), s.coalesce())
        self.assertDenseEqual(d.to_dense(), s.to_dense())
        hybrid = coo_sample(dense_dims=(3,), seed=1)
        self.assertSparseEqual(hybrid.to("openreg").coalesce(), hybrid.coalesce())
        self.assertDenseEqual(hybrid.to("openreg").to_dense(), hybrid.to_dense())

    def test_matrix_products(self):
        s, m = coo_sample(), torch.randn(4, 3)
        bias = torch.randn(5, 3)
        ds, dm, dbias = s.to("openreg"), m.to("openreg"), bias.to("openreg")
        self.assertDenseEqual(torch.sparse.mm(ds, dm), torch.sparse.mm(s, m))
        self.assertDenseEqual(torch.mm(ds, dm), torch.mm(s, m))
        self.assertDenseEqual(ds @ dm, s @ m)
        self.assertDenseEqual(torch.addmm(dbias, ds, dm, beta=0.5, alpha=2), torch.addmm(bias, s, m, beta=0.5, alpha=2))
        self.assertDenseEqual(torch.sparse.addmm(dbias, ds, dm), torch.sparse.addmm(bias, s, m))
        out = torch.empty(5, 3, device="openreg")
        torch.mm(ds, dm, out=out)
        self.assertDenseEqual(out, torch.mm(s, m))
        other = coo_sample((4, 6), seed=2)
        self.assertSparseEqual(torch.sparse.mm(ds, other.to("openreg")), torch.sparse.mm(s, other))  # sparse result

    def test_sum(self):
        s = coo_sample(dense_dims=(2,), seed=3)
        d = s.to("openreg")
        self.assertDenseEqual(torch.sparse.sum(d), torch.sparse.sum(s))
        self.assertSparseEqual(torch.sparse.sum(d, dim=0), torch.sparse.sum(s, dim=0))
        self.assertDenseEqual(torch.sparse.sum(d, dim=(0, 1)), torch.sparse.sum(s, dim=(0, 1)))
        self.assertDenseEqual(d.sum(), s.sum())

    def test_elementwise_and_in_place(self):
        s, t = coo_sample(), coo_sample(seed=4)
        d, e = s.to("openreg"), t.to("openreg")
        self.assertSparseEqual(d * 2, s * 2)
        self.assertSparseEqual(d + e, s + t)
        self.assertSparseEqual(d.neg(), s.neg())
        self.assertSparseEqual(torch.cat([d, e]), torch.cat([s, t]))
        # In place: the argument takes the CPU kernel's new members (a new nnz) on the device.
        d.add_(e)
        s.add_(t)
        self.assertSparseEqual(d, s)
        d.mul_(3)
        s.mul_(3)
        self.assertSparseEqual(d, s)
        d.zero_()
        s.zero_()
        self.assertSparseEqual(d, s)
        dense, ddense = torch.randn(5, 4), torch.randn(5, 4).to("openreg")
        ddense.copy_(dense)
        ddense.add_(t.to("openreg"))  # dense += sparse: the dense argument is written in place
        self.assertDenseEqual(ddense, dense.add_(t))

    def test_transfers(self):
        s = coo_sample()
        d = s.to("openreg")
        self.assertSparseEqual(d, s)
        self.assertEqual(d.device, torch.device("openreg:0"))
        back = d.cpu()
        self.assertEqual((back.device.type, back.layout, back.is_coalesced()), ("cpu", torch.sparse_coo, False))
        torch.testing.assert_close(back._indices(), s._indices())
        torch.testing.assert_close(back._values(), s._values())
        target = torch.empty(5, 4, layout=torch.sparse_coo, device="openreg")
        target.copy_(s)  # host to device, sparse to sparse
        self.assertSparseEqual(target, s)
        self.assertSparseEqual(d.clone(), s.clone())

    def test_on_a_device_that_is_not_current(self):
        # The structure operators run under a guard of their device, as CUDA's: without it the CPU's
        # kernel made the members on the current device (an internal assert, or the wrong device).
        s = coo_sample().coalesce()
        self.assertEqual(torch.openreg.current_device(), 0)
        built = torch.sparse_coo_tensor(s.indices().to("openreg:1"), s.values().to("openreg:1"), s.shape)
        moved = s.to("openreg").to("openreg:1")  # device to device
        empty = torch.empty((2, 2), layout=torch.sparse_coo, device="openreg:1")
        buffer = io.BytesIO()
        torch.save(built, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer)
        for name, t in {"built": built, "moved": moved, "empty": empty, "loaded": loaded}.items():
            with self.subTest(name):
                self.assertEqual(t.device, torch.device("openreg:1"))
                self.assertTrue(all(m.device == torch.device("openreg:1") for m in members(t)))
        self.assertSparseEqual(built, torch.sparse_coo_tensor(s.indices(), s.values(), s.shape))
        self.assertSparseEqual(loaded, torch.sparse_coo_tensor(s.indices(), s.values(), s.shape))
        self.assertSparseEqual(moved, s)
        self.assertEqual(torch.openreg.current_device(), 0)

    def test_no_host_device_copies(self):
        # Members stay in device memory: the operators run the CPU's kernels on their kernel views.
        d, m = coo_sample().to("openreg"), torch.randn(4, 3, device="openreg")
        torch.openreg.synchronize()
        before = torch.openreg._runtime_counters()
        torch.sparse.mm(d.coalesce(), m).sum()
        torch.openreg.synchronize()
        after = torch.openreg._runtime_counters()
        self.assertEqual(after["memcpy_h2d"], before["memcpy_h2d"])
        self.assertEqual(after["memcpy_d2h"], before["memcpy_d2h"])


class TestSparseCompressed(SparseTestCase):
    def test_construction(self):
        d = dense_sample((6, 4), seed=5)
        csr = d.to_sparse_csr()
        on_device = torch.sparse_csr_tensor(
            csr.crow_indices().to("openreg"), csr.col_indices().to("openreg"), csr.values().to("openreg"), csr.shape
        )
        self.assertSparseEqual(on_device, csr)
        dd = d.to("openreg")
        self.assertSparseEqual(dd.to_sparse_csr(), csr)
        self.assertSparseEqual(dd.to_sparse_csc(), d.to_sparse_csc())
        self.assertSparseEqual(dd.to_sparse_bsr((2, 2)), d.to_sparse_bsr((2, 2)))
        self.assertSparseEqual(dd.to_sparse(layout=torch.sparse_csr), d.to_sparse(layout=torch.sparse_csr))
        coo = coo_sample((6, 4)).coalesce()
        self.assertSparseEqual(coo.to("openreg").to_sparse_csr(), coo.to_sparse_csr())
        self.assertSparseEqual(on_device.to_sparse(), csr.to_sparse())  # and back to COO

    def test_members_live_on_the_device_and_alias(self):
        csr = dense_sample((5, 5), seed=6).to_sparse_csr()
        d = csr.to("openreg")
        for t in (d.crow_indices(), d.col_indices(), d.values()):
            self.assertEqual(t.device.type, "openreg")
        d.values().add_(1)
        csr.values().add_(1)
        self.assertSparseEqual(d, csr)

    def test_to_dense_and_sum(self):
        csr = dense_sample((6, 5), seed=7).to_sparse_csr()
        d = csr.to("openreg")
        self.assertDenseEqual(d.to_dense(), csr.to_dense())
        self.assertDenseEqual(d.sum(), csr.sum())
        self.assertDenseEqual(torch.sparse.sum(d.to_sparse()), torch.sparse.sum(csr.to_sparse()))

    def test_matrix_products(self):
        csr, m, bias = dense_sample((5, 4), seed=8).to_sparse_csr(), torch.randn(4, 3), torch.randn(5, 3)
        d, dm, dbias = csr.to("openreg"), m.to("openreg"), bias.to("openreg")
        self.assertDenseEqual(torch.sparse.mm(d, dm), torch.sparse.mm(csr, m))
        self.assertDenseEqual(d @ dm, csr @ m)
        self.assertDenseEqual(torch.addmm(dbias, d, dm, alpha=2), torch.addmm(bias, csr, m, alpha=2))
        for reduce in ("sum", "mean", "amax", "amin"):
            self.assertDenseEqual(torch.sparse.mm(d, dm, reduce), torch.sparse.mm(csr, m, reduce))
        a, b = torch.randn(5, 7), torch.randn(7, 4)
        self.assertSparseEqual(
            torch.sparse.sampled_addmm(d, a.to("openreg"), b.to("openreg"), beta=0.5, alpha=2),
            torch.sparse.sampled_addmm(csr, a, b, beta=0.5, alpha=2),
        )


class TestSparseAutograd(SparseTestCase):
    def test_sparse_mm_backward(self):
        s, m = coo_sample().coalesce(), torch.randn(4, 3)
        grads = []
        for device in ("cpu", "openreg"):
            a = s.detach().to(device).requires_grad_()
            b = m.detach().to(device).requires_grad_()
            torch.sparse.mm(a, b).pow(2).sum().backward()
            grads.append((a.grad, b.grad))
        (cpu_a, cpu_b), (dev_a, dev_b) = grads
        self.assertSparseEqual(dev_a, cpu_a)
        self.assertDenseEqual(dev_b, cpu_b)

    def test_sparse_mm_reduce_backward(self):
        # amax's forward computes the argmax its backward reads only for an input that requires
        # grad: the kernel view of a sparse argument carries requires_grad.
        csr, m = dense_sample((5, 4), seed=9).to_sparse_csr(), torch.randn(4, 3)
        for reduce in ("sum", "amax"):
            grads = []
            for device in ("cpu", "openreg"):
                a = csr.detach().to(device).requires_grad_()
                b = m.detach().to(device).requires_grad_()
                torch.sparse.mm(a, b, reduce).pow(2).sum().backward()
                grads.append((a.grad, b.grad))
            (cpu_a, cpu_b), (dev_a, dev_b) = grads
            self.assertSparseEqual(dev_a, cpu_a)
            self.assertDenseEqual(dev_b, cpu_b)


class TestSparseParameters(SparseTestCase):
    def test_module_to_and_a_coo_parameter(self):
        # torch 2.13 lets a sparse COO tensor take another's data only between its own backends
        # (TensorImpl::has_compatible_shallow_copy_type, which SparseTensorImpl::shallow_copy_from
        # asserts: no dispatcher call openreg could answer), so Module.to("openreg") makes a new
        # Parameter for a COO one, and an optimizer built before the move would update the old one.
        # With swap_module_params_on_conversion (swap_tensors) the Parameter object is kept.
        i, v = torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0])
        with self.assertRaisesRegex(RuntimeError, "incompatible tensor type"):
            torch.sparse_coo_tensor(i, v, (2, 2)).data = torch.sparse_coo_tensor(i, v, (2, 2)).to("openreg")
        previous = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            module = torch.nn.Module()
            module.p = torch.nn.Parameter(torch.sparse_coo_tensor(i, v, (2, 2)).coalesce())
            kept = module.p
            opt = torch.optim.SGD(module.parameters(), lr=0.1)
            module.to("openreg")
        finally:
            torch.__future__.set_swap_module_params_on_conversion(previous)
        self.assertIs(module.p, kept)
        self.assertEqual(kept.device, torch.device("openreg:0"))
        torch.sparse.mm(module.p, torch.ones(2, 3, device="openreg")).sum().backward()
        opt.step()
        self.assertEqual(kept.detach().coalesce().values().cpu(), torch.tensor([0.7, 1.7]))


class TestSparseSerialization(SparseTestCase):
    def test_save_and_load(self):
        coo = coo_sample()
        csr = dense_sample((4, 6), seed=10).to_sparse_csr()
        buffer = io.BytesIO()
        torch.save({"coo": coo.to("openreg"), "csr": csr.to("openreg")}, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer)
        self.assertSparseEqual(loaded["coo"], coo)
        self.assertSparseEqual(loaded["csr"], csr)
        buffer.seek(0)
        on_cpu = torch.load(buffer, map_location="cpu")
        self.assertEqual(on_cpu["coo"].device.type, "cpu")
        torch.testing.assert_close(on_cpu["csr"].to_dense(), csr.to_dense())


class TestSparseErrors(SparseTestCase):
    def test_operator_without_a_cpu_sparse_kernel(self):
        # openreg runs the CPU's sparse kernels: where the CPU has none, the error names the
        # operator and the layout, with the CPU's exception type, at the call.
        samples = {
            "sparse_coo": coo_sample(),
            "sparse_csr": dense_sample((4, 4)).to_sparse_csr(),
            "sparse_csc": dense_sample((4, 4)).to_sparse_csc(),
        }
        for layout, t in samples.items():
            with self.assertRaises(NotImplementedError):
                torch.nonzero(t)  # the CPU has no kernel either
            with self.assertRaisesRegex(
                NotImplementedError, f"'aten::nonzero' is not supported for torch.{layout} tensors on openreg"
            ):
                torch.nonzero(t.to("openreg"))
        coo = samples["sparse_coo"].to("openreg")
        with self.assertRaisesRegex(
            NotImplementedError, "'aten::_sparse_mm_reduce_impl' is not supported for torch.sparse_coo tensors"
        ):
            torch.sparse.mm(coo, torch.randn(4, 3, device="openreg"), "sum")  # reductions: compressed only
        a, b = torch.randn(5, 7, device="openreg"), torch.randn(7, 4, device="openreg")
        with self.assertRaisesRegex(
            NotImplementedError, "'aten::sparse_sampled_addmm' is not supported for torch.sparse_coo tensors"
        ):
            torch.sparse.sampled_addmm(coo, a, b)

    def test_collectives_refuse_sparse_tensors(self):
        # A c10d operator on the sparse path would reduce CPU copies of the members and leave the
        # openreg tensor as it was: refused at the call instead.
        import torch.distributed as dist

        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            s = coo_sample().coalesce().to("openreg")
            before = s.to_dense().cpu()
            with self.assertRaisesRegex(
                NotImplementedError, "'c10d::allreduce_' is not supported for torch.sparse_coo tensors on openreg"
            ):
                dist.all_reduce(s)
            torch.testing.assert_close(s.to_dense().cpu(), before)
        finally:
            dist.destroy_process_group()

    def test_wrong_arguments_raise_the_cpus_error_at_the_call(self):
        # Every sparse call is synchronous: the CPU kernel's argument errors come at the call.
        csr, a, b = dense_sample((5, 4)).to_sparse_csr(), torch.randn(5, 7), torch.randn(6, 4)
        with self.assertRaises(RuntimeError) as cpu:
            torch.sparse.sampled_addmm(csr, a, b)
        message = cpu.exception.args[0].splitlines()[0]
        with self.assertRaisesRegex(RuntimeError, re.escape(message)):
            torch.sparse.sampled_addmm(csr.to("openreg"), a.to("openreg"), b.to("openreg"))
        with self.assertRaisesRegex(RuntimeError, "Cannot get indices on an uncoalesced tensor"):
            coo_sample().to("openreg").indices()

    def test_members_on_two_devices_are_refused_at_the_call(self):
        # ATen checks this only for CUDA's COO tensors: an internal assert ("please report a bug to
        # PyTorch") fired instead.
        i, v = torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0])
        message = r"^device of indices \(openreg:1\) must match device of values \(openreg:0\)"
        with self.assertRaisesRegex(RuntimeError, message):
            torch.sparse_coo_tensor(i.to("openreg:1"), v.to("openreg:0"), (2, 2))
        with self.assertRaisesRegex(RuntimeError, message):
            torch.ops.aten._sparse_coo_tensor_with_dims_and_tensors(
                2, 0, (2, 2), i.to("openreg:1"), v.to("openreg:0"), dtype=torch.float32, layout=torch.sparse_coo
            )
        t = torch.sparse_coo_tensor(i.to("openreg:1"), v.to("openreg:1"), (2, 2))
        self.assertEqual(t.device, torch.device("openreg:1"))
        self.assertEqual(t.to_dense().cpu(), torch.sparse_coo_tensor(i, v, (2, 2)).to_dense())

    def test_strict_mode_names_the_operator(self):
        d = coo_sample().to("openreg")
        torch.openreg.set_strict_mode(True)
        try:
            with self.assertRaisesRegex(
                RuntimeError, "openreg strict mode: 'aten::_coalesce' has no native openreg kernel"
            ):
                d.coalesce()
        finally:
            torch.openreg.set_strict_mode(False)


if __name__ == "__main__":
    run_tests()
