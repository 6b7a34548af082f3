"""DDP communication hooks for models on openreg.

torch 2.13's DDP accepts its ``bf16_compress_hook`` and ``bf16_compress_wrapper`` only on a CUDA
build with NCCL 2.10+ or on XPU with XCCL: ``DistributedDataParallel._register_comm_hook``
(torch/nn/parallel/distributed.py) refuses any other device by the hook's name, whatever the backend
can reduce. occl reduces bfloat16, so openreg ships the hook under a name of its own, as a vendor does
for its collective library. The fp16 hooks of torch work as they are.
"""

import torch
import torch.distributed as dist

__all__ = ["occl_bf16_compress_hook"]


def occl_bf16_compress_hook(
    process_group: dist.ProcessGroup, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Gradient compression to bfloat16: the bucket is cast to bfloat16 and divided by the group's
    size, all-reduced (asynchronously, on occl's communication stream), and the sum is cast back
    into the bucket in place. Register with
    ``ddp_model.register_comm_hook(process_group_or_None, occl_bf16_compress_hook)``."""
    group = process_group if process_group is not None else dist.group.WORLD
    grads = bucket.buffer()
    compressed = grads.to(torch.bfloat16).div_(dist.get_world_size(group))
    reduced = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        grads.copy_(fut.value()[0])  # back to the bucket's dtype, in place: no second buffer
        return grads

    return reduced.then(decompress)
