"""DataLoader(pin_memory=True): batches are pinned by openreg's host allocator, the current accelerator's."""

import ctypes
import os
import warnings

import torch
import torch_openreg
from conftest import run_python
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.utils.data import DataLoader, TensorDataset

OR_MEMORY_TYPE_HOST = 1  # orMemoryTypeHost: pinned host memory from orMallocHost


class _PointerAttributes(ctypes.Structure):
    # orPointerAttributes in packages/openreg-core/libopenreg/include/openreg/runtime.h
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int), ("base", ctypes.c_void_p), ("size", ctypes.c_size_t)]


_libopenreg = ctypes.CDLL(torch_openreg.library_file("openreg"))


def pointer_attributes(ptr: int) -> _PointerAttributes:
    """What the openreg runtime knows about a pointer (the process already has libopenreg loaded)."""
    attributes = _PointerAttributes()
    status = _libopenreg.orPointerGetAttributes(ctypes.byref(attributes), ctypes.c_void_p(ptr))
    assert status == 0, status
    return attributes


def deprecation_message(device: str) -> str:
    return (
        "pin_memory_device is deprecated, the current accelerator will be used as the device,"
        f"ignore pin_memory_device='{device}'."
    )


class DeviceDataset(torch.utils.data.Dataset):
    """Items made on openreg in the worker (module level: spawned workers import it)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((2, 3), float(i), device="openreg")


class TestWorkersReturningDeviceTensors(TestCase):
    def test_each_batch_keeps_its_memory(self):
        # A worker that returns openreg tensors sends them through openreg's IPC reducers and drops
        # them: its allocator gave the next batch the memory of the one the main process was
        # reading (batches [0, 1], [6, 7], [6, 7], [6, 7]). The sender now keeps what it sent until
        # the receiver's copy is gone, as torch does for CUDA tensors. Forked workers cannot use a
        # runtime the parent started, as CUDA's cannot.
        loader = DataLoader(DeviceDataset(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
        batches = list(loader)  # all held at once, read after the workers made every batch
        self.assertEqual([b.device for b in batches], [torch.device("openreg:0")] * 4)
        got = [b.cpu() for b in batches]
        want = [torch.stack([torch.full((2, 3), float(i)) for i in (2 * k, 2 * k + 1)]) for k in range(4)]
        self.assertEqual(got, want)


class TestPinnedDataLoader(TestCase):
    def setUp(self):
        super().setUp()
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(40, 5, generator=gen)
        self.y = torch.arange(40)
        self.dataset = TensorDataset(self.x, self.y)

    def check_loader(self, pin_memory_device: str, **loader_kwargs) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = DataLoader(
                self.dataset, batch_size=16, pin_memory=True, pin_memory_device=pin_memory_device, **loader_kwargs
            )
            batches = list(loader)
        messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        self.assertEqual(messages.count(deprecation_message(pin_memory_device)), 1, messages)

        self.assertEqual([len(b[1]) for b in batches], [16, 16, 8])
        for i, (bx, by) in enumerate(batches):
            self.assertEqual(bx.device, torch.device("cpu"))
            self.assertTrue(bx.is_pinned())
            self.assertTrue(by.is_pinned())
            # the memory comes from orMallocHost through openreg's host allocator, which rounds a
            # request up to a power of two of at least 4 KiB
            for t in (bx, by):
                attributes = pointer_attributes(t.data_ptr())
                self.assertEqual(attributes.type, OR_MEMORY_TYPE_HOST)
                self.assertEqual(attributes.device, -1)
                self.assertLessEqual(attributes.base, t.data_ptr())
                self.assertLessEqual(t.data_ptr() + t.nbytes, attributes.base + attributes.size)
                self.assertEqual(attributes.size, max(4096, 1 << (t.nbytes - 1).bit_length()))
            # non_blocking copies of the pinned batch give the CPU batch's values
            dx = bx.to("openreg", non_blocking=True)
            dy = by.to("openreg:1", non_blocking=True)
            self.assertEqual(dx.cpu(), self.x[16 * i : 16 * (i + 1)], atol=0, rtol=0)
            self.assertEqual(dy.cpu(), self.y[16 * i : 16 * (i + 1)])

    def test_pageable_memory_is_unknown_to_the_runtime(self):
        self.assertFalse(self.x.is_pinned())
        self.assertEqual(pointer_attributes(self.x.data_ptr()).type, 0)  # orMemoryTypeUnregistered

    def test_no_workers(self):
        self.assertEqual(torch.accelerator.current_accelerator(), torch.device("openreg"))
        self.check_loader("openreg", num_workers=0)

    def test_two_forked_workers(self):
        self.check_loader("openreg", num_workers=2)  # Linux's default start method: fork

    def test_two_spawned_workers(self):
        self.check_loader("openreg", num_workers=2, multiprocessing_context="spawn")

    def test_pin_memory_device_is_ignored(self):
        # torch 2.13 pins with the current accelerator whatever the argument names
        self.check_loader("cuda", num_workers=0)

    def test_cached_blocks_go_back_to_the_runtime(self):
        torch.ones(1, device="openreg")  # see test_empty_host_cache_needs_torch_device_init
        batches = list(DataLoader(self.dataset, batch_size=16, pin_memory=True))
        pointers = [t.data_ptr() for batch in batches for t in batch]
        self.assertTrue(all(pointer_attributes(p).type == OR_MEMORY_TYPE_HOST for p in pointers))
        del batches
        # freed pinned blocks stay cached by openreg's host allocator until the cache is emptied
        self.assertTrue(all(pointer_attributes(p).type == OR_MEMORY_TYPE_HOST for p in pointers))
        torch.accelerator.empty_host_cache()
        self.assertEqual([pointer_attributes(p).type for p in pointers], [0] * len(pointers))

    def test_empty_host_cache_needs_torch_device_init(self):
        # torch._C._accelerator_emptyHostCache skips the call for PrivateUse1 until torch's own
        # per-device "initialised" flag is set, which only torch's factories and .to() do (through
        # torch.openreg._lazy_init). Pinning memory alone does not set it: until then
        # torch.accelerator.empty_host_cache() does nothing. torch.openreg.empty_cache() always works.
        r = run_python(
            f"""
            import sys
            sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
            import torch
            from test_dataloader import pointer_attributes

            def cached_block():
                p = torch.ones(10).pin_memory()
                return p.data_ptr()

            ptr = cached_block()
            torch.openreg.init()
            torch.accelerator.empty_host_cache()
            print(pointer_attributes(ptr).type)
            torch.ones(1, device="openreg")
            torch.accelerator.empty_host_cache()
            print(pointer_attributes(ptr).type)
            ptr = cached_block()
            torch.openreg.empty_cache()
            print(pointer_attributes(ptr).type)
            """
        )
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["1", "0", "0"])


if __name__ == "__main__":
    run_tests()
