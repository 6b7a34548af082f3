"""compare_with_cpu_inductor: the suite's oracle (openreg Inductor vs CPU Inductor, same inputs)."""

import torch
from torch.utils._pytree import tree_map


def to_device(tree, device):
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tree)


def clone(tree):
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


def compare_with_cpu_inductor(test, fn, *args, exact=True, atol=None, rtol=None, keep_on_cpu=(), **compile_kwargs):
    """Compiles ``fn`` for the CPU and for openreg, runs both on the same inputs (args are CPU
    tensors; those at the indices ``keep_on_cpu`` stay there for openreg too) and compares outputs
    and mutated inputs. Bitwise by default: both backends run the same generated C++ loops.
    Returns the openreg outputs."""
    cpu_args = clone(args)
    or_args = [a if i in keep_on_cpu else to_device(a, "openreg") for i, a in enumerate(clone(args))]
    expected = torch.compile(fn, **compile_kwargs)(*cpu_args)
    actual = torch.compile(fn, **compile_kwargs)(*or_args)
    tol = dict(atol=0, rtol=0) if exact and atol is None else dict(atol=atol, rtol=rtol)
    test.assertEqual(to_device(actual, "cpu"), expected, **tol, exact_device=False)
    test.assertEqual(to_device(or_args, "cpu"), cpu_args, **tol, exact_device=False)  # input mutations
    return actual
