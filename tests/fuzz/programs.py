"""Differential fuzzing of openreg: random programs run on openreg and on the CPU must agree.

A *program* is a list of Python statements over tensors named t0, t1, ...; each line may end in a
tag comment (`# strides`, `# deferred`, `# meta`) that says what the comparison may rely on.
`draw_step` draws the next statement with hypothesis, given the tensors the program has so far
(their CPU shapes and dtypes), from a catalogue of about 150 operator forms: elementwise, broadcasting,
type promotion, reductions, views, transposes, slices, indexing, in-place and `out=` forms,
0-size shapes, CPU scalars, data-dependent shapes, sync points (`.item()`) and autograd
(`grads(...)`). `Differential.step` runs each statement on both devices, in lockstep, and compares:

* errors: a call the CPU rejects must be rejected by openreg with the same exception type, at
  the call; only statements tagged `deferred` (the error depends on the data, which the host
  cannot read: an index out of range, an integer division by zero) may report it at the next
  synchronisation instead, as CUDA does, with the CPU's message inside the device's;
* every tensor a statement binds: device, dtype, shape, requires_grad, grad_fn's type, the
  conjugate and negative bits, which other tensors of the program it aliases, and its strides
  and storage offset where PyTorch promises them (see `same_layout`);
* values: Python results (`.item()`, `.tolist()`) and gradients at once; the values of every
  tensor of the program at `# check` lines and at the end (reading them synchronises the device,
  so in between the device runs ahead, on the asynchronous path, as in real use).

`python tests/fuzz/programs.py FILE` replays a program (the listing a failure prints) and
reports its first disagreement. See docs/mechanisms/fuzzing.md.
"""

from __future__ import annotations

import ast
import cmath
import functools
import math
import sys
import warnings
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

DEVICE = "openreg"

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
# Drawn by index: the first entries are the likeliest to stay after shrinking.
DTYPES = (
    torch.float32,
    torch.int64,
    torch.float32,
    torch.bool,
    torch.float64,
    torch.int32,
    torch.float16,
    torch.bfloat16,
    torch.uint8,
    torch.int16,
    torch.int8,
    torch.complex64,
)
# Dimension sizes (by index): mostly small, a 0 now and then.
SIZES = (2, 3, 1, 4, 2, 5, 3, 1, 6, 0)


# ---- what a program's namespace holds (the same helpers on both devices) ----
def make(shape, dtype, seed, device, requires_grad=False, perm=None, special=False):
    """A tensor with values that depend only on (shape, dtype, seed), made on the CPU and copied to
    `device`. Floats are multiples of 1/4 (exact in every float dtype); `special` puts inf and nan
    in; `perm` lays the storage out permuted (a non-contiguous tensor of the same shape)."""
    gen = torch.Generator().manual_seed(seed)
    stored = shape if perm is None else tuple(shape[p] for p in perm)
    if dtype == torch.bool:
        x = torch.randint(0, 2, stored, generator=gen).bool()
    elif dtype.is_floating_point or dtype.is_complex:
        x = torch.randint(-8, 9, stored, generator=gen).to(torch.float64) / 4
        if special and x.numel() > 0:
            flat = x.view(-1)
            flat[seed % flat.numel()] = (math.inf, -math.inf, math.nan)[seed % 3]
        if dtype.is_complex:
            x = torch.complex(x, torch.randint(-8, 9, stored, generator=gen).to(torch.float64) / 4)
        x = x.to(dtype)
    else:
        lo = 0 if dtype == torch.uint8 else -5
        x = torch.randint(lo, 6, stored, generator=gen).to(dtype)
    if perm is not None:
        # clone(): a permuted layout, but not a view (x.to("cpu") would keep a view a view)
        x = x.permute([perm.index(i) for i in range(len(perm))]).clone()
    x = x.to(device)
    return x.requires_grad_() if requires_grad else x


def grads(out, inputs, seed):
    """The gradients of `out` (weighted by `make`'s values) with respect to `inputs`."""
    weight = make(tuple(out.shape), out.dtype, seed, out.device)
    return torch.autograd.grad(out, inputs, grad_outputs=weight, allow_unused=True, retain_graph=True)


def namespace(device: str) -> dict:
    return {"torch": torch, "F": torch.nn.functional, "make": make, "grads": grads, "dev": device, "inf": math.inf}


# ---- a program's statements ----
@dataclass
class Step:
    stmt: str
    tags: frozenset = frozenset()

    @property
    def line(self) -> str:
        return self.stmt + (f"  # {' '.join(sorted(self.tags))}" if self.tags else "")

    @staticmethod
    def parse(line: str) -> "Step":
        stmt, _, tags = line.partition("  # ")
        return Step(stmt.rstrip(), frozenset(tags.split()))

    @functools.cached_property
    def names(self) -> set[str]:
        """Every name the statement mentions."""
        return {n.id for n in ast.walk(ast.parse(self.stmt)) if isinstance(n, ast.Name)}

    @functools.cached_property
    def written(self) -> set[str]:
        """The names of the tensors the statement writes: `out=` arguments, the receivers of
        in-place methods (`t0.add_(1)`, `t0[1:].zero_()`), assignments into them (`t0[1] = 2`)."""
        roots = []
        for node in ast.walk(ast.parse(self.stmt)):
            if isinstance(node, ast.keyword) and node.arg == "out":
                roots.append(node.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.endswith("_"):
                roots.append(node.func.value)
            elif isinstance(node, ast.Assign):
                roots += [t for t in node.targets if isinstance(t, ast.Subscript)]
            elif isinstance(node, ast.AugAssign):
                roots.append(node.target)
        return {n.id for r in roots for n in ast.walk(r) if isinstance(n, ast.Name)}

    @functools.cached_property
    def out_is_new(self) -> bool:
        """Whether an `out=` argument is a new tensor (`out=torch.empty(0, ...)`), not a name."""
        return any(
            isinstance(n, ast.keyword) and n.arg == "out" and not isinstance(n.value, ast.Name)
            for n in ast.walk(ast.parse(self.stmt))
        )

    @functools.cached_property
    def targets(self) -> list[str]:
        """The names the statement binds (`t1 = ...`, `t1, t2 = ...`; not `t1[0] = ...`)."""
        names = []
        for node in ast.parse(self.stmt).body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    for n in target.elts if isinstance(target, ast.Tuple) else [target]:
                        if isinstance(n, ast.Name):
                            names.append(n.id)
        return names


CHECK = Step("# check")


@functools.lru_cache(maxsize=4096)
def _compiled(stmt: str):
    return compile(stmt, "<fuzz program>", "exec")


# Operators whose results openreg lays out differently from the CPU, a known gap, not a latitude:
# their composite kernels allocate an empty result and call the out= overload, whose Python meta
# kernel resizes it contiguous, where the CPU's TensorIterator follows the input's layout (a
# channels-last input gives a channels-last result on the CPU and CUDA). Their values are compared.
KNOWN_LAYOUT_GAPS = ("logical_not", "logical_and", "logical_or", "logical_xor")
# Errors openreg reports only at the next synchronisation although the host could know them: the
# CPU implementation checks them, not the meta kernel. Known gaps (not latitudes), by operator.
KNOWN_DEFERRED = {
    "torch.mode(": "mode(): an empty reduction dimension",
    "torch.addmm(": "addmm: a bias that does not broadcast to the result",
}
OVERLAP_ERROR = "unsupported operation: some elements of the input tensor and the written-to tensor"


class Disagreement(AssertionError):
    pass


# ---- comparison rules ----
def tolerance(dtype: torch.dtype) -> dict:
    # Both sides run the same CPU kernels, mostly bit for bit; a different (allowed) layout can
    # change the order of a reduction's additions, hence a small tolerance for floats.
    if dtype in (torch.float16, torch.bfloat16):
        return {"rtol": 1e-2, "atol": 1e-2}
    if dtype in (torch.float64, torch.complex128):
        return {"rtol": 1e-9, "atol": 1e-9}
    if dtype.is_floating_point or dtype.is_complex:
        return {"rtol": 1e-5, "atol": 1e-5}
    return {"rtol": 0, "atol": 0}


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Strides as PyTorch defines them: a dimension of size 1 may have any stride, and an empty
    tensor any strides at all (no element is ever addressed); the meta kernels and the CPU kernels
    are free to differ there."""
    if a.numel() == 0:
        return True
    return all(sa == sb for n, sa, sb in zip(a.shape, a.stride(), b.stride()) if n != 1)


def aliases(t: torch.Tensor, env: dict) -> set:
    """The names in `env` whose storage `t` shares (an empty storage shares nothing)."""
    ptr = t.untyped_storage().data_ptr()
    if ptr == 0:
        return set()
    return {n for n, v in env.items() if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() == ptr}


def compare_values(what: str, cpu, dev) -> None:
    if isinstance(cpu, torch.Tensor):
        if not isinstance(dev, torch.Tensor):
            raise Disagreement(f"{what}: the CPU gives a tensor, openreg {type(dev).__name__}")
        got = dev.detach().cpu()
        want = cpu.detach()
        if got.dtype != want.dtype or got.shape != want.shape:
            raise Disagreement(
                f"{what}: {got.dtype}{list(got.shape)} on openreg, {want.dtype}{list(want.shape)} on the CPU"
            )
        try:
            torch.testing.assert_close(got, want, equal_nan=True, check_stride=False, **tolerance(want.dtype))
        except AssertionError as e:
            raise Disagreement(f"{what}: values differ\n{e}\nCPU:     {want}\nopenreg: {got}") from None
    elif isinstance(cpu, (tuple, list)):
        if not isinstance(dev, (tuple, list)) or len(dev) != len(cpu):
            raise Disagreement(f"{what}: {cpu!r} on the CPU, {dev!r} on openreg")
        for i, (c, d) in enumerate(zip(cpu, dev)):
            compare_values(f"{what}[{i}]", c, d)
    elif isinstance(cpu, (float, complex)) and type(cpu) is type(dev):
        if not (cpu == dev or (cmath.isnan(cpu) and cmath.isnan(dev)) or cmath.isclose(cpu, dev, rel_tol=1e-5)):
            raise Disagreement(f"{what}: {cpu!r} on the CPU, {dev!r} on openreg")
    elif type(cpu) is not type(dev) or cpu != dev:
        raise Disagreement(f"{what}: {cpu!r} on the CPU, {dev!r} on openreg")


def grad_fn_name(t: torch.Tensor):
    try:
        return type(t.grad_fn).__name__ if t.grad_fn is not None else None
    except RuntimeError as e:  # a view whose base was modified in place may not be read
        return f"{type(e).__name__}: {str(e)[:40]}"


def compare_metadata(
    what: str, cpu: torch.Tensor, dev: torch.Tensor, tags: frozenset, cpu_env: dict, dev_env: dict, check_aliases=True
):
    if not isinstance(dev, torch.Tensor):
        raise Disagreement(f"{what}: a tensor on the CPU, {type(dev).__name__} on openreg")
    if dev.device.type != DEVICE:
        raise Disagreement(f"{what}: on {dev.device}, expected an openreg tensor")
    facts = lambda t: (  # noqa: E731
        t.dtype,
        tuple(t.shape),
        t.requires_grad,
        # Whether it has a backward node, not which: an operator may decompose differently per
        # device (dropout: CUDA's and openreg's fused native_dropout, the CPU's bernoulli and mul;
        # reshape: a view or _reshape_alias), and the gradients are compared by value anyway.
        grad_fn_name(t) is not None,
        t.is_conj(),
        t.is_neg(),
    )
    if facts(cpu) != facts(dev):
        raise Disagreement(
            f"{what}: (dtype, shape, requires_grad, grad_fn, conj, neg)"
            f" {facts(dev)} on openreg, {facts(cpu)} on the CPU"
        )
    if "strides" in tags and not same_layout(cpu, dev):
        raise Disagreement(
            f"{what}: strides {dev.stride()} on openreg, {cpu.stride()} on the CPU (shape {list(cpu.shape)})"
        )
    if "strides" in tags and cpu.numel() > 0 and cpu._is_view() and dev.storage_offset() != cpu.storage_offset():
        raise Disagreement(
            f"{what}: storage offset {dev.storage_offset()} on openreg, {cpu.storage_offset()} on the CPU"
        )
    # Which tensors of the program it shares memory with: a view must stay a view, a copy a copy.
    a_cpu, a_dev = aliases(cpu, cpu_env), aliases(dev, dev_env)
    if check_aliases and a_cpu != a_dev:
        raise Disagreement(f"{what}: shares memory with {sorted(a_dev)} on openreg, {sorted(a_cpu)} on the CPU")


class Differential:
    """Runs a program statement by statement on the CPU and on openreg and compares them."""

    def __init__(self):
        self.cpu = namespace("cpu")
        self.dev = namespace(DEVICE)
        self.steps: list[Step] = []
        # Tensors whose strides differ where PyTorch promises none (a reduction's, a matmul's...):
        # what is computed from them is compared by value, not by layout.
        self.free_layout: set[str] = set()

    # The tensors of the program (what later statements may use), from the CPU side.
    def tensors(self) -> dict[str, torch.Tensor]:
        return {n: v for n, v in self.cpu.items() if n.startswith("t") and isinstance(v, torch.Tensor)}

    def listing(self) -> str:
        return "\n".join(s.line for s in self.steps)

    def fail(self, message: str):
        raise Disagreement(f"{message}\n\nThe program (replay: python tests/fuzz/programs.py FILE):\n{self.listing()}")

    @staticmethod
    def _run(stmt: str, ns: dict):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(_compiled(stmt), ns)
        except Exception as e:  # every error is compared with the other side's
            return e
        return None

    def step(self, step: Step) -> None:
        self.steps.append(step)
        if step is CHECK or step.stmt == CHECK.stmt:
            return self.check()
        before = [(ns, {n: ns.get(n) for n in step.targets}) for ns in (self.cpu, self.dev)]
        env = self.tensors()
        written = {n for w in step.written & env.keys() for n in aliases(env[w], env) | {w}}
        shapes = {n: env[n].shape for n in written}
        cpu_err = self._run(step.stmt, self.cpu)
        dev_err = self._run(step.stmt, self.dev)
        if cpu_err is not None:
            for ns, old in before:  # a failed statement binds nothing (on either side)
                for n, v in old.items():
                    ns.pop(n, None)
                    if v is not None:
                        ns[n] = v
            # PyTorch promises nothing about what a failed call wrote: the CPU's structured
            # kernels resize an out= tensor before they find that they have no kernel for its
            # dtype, and openreg (whose CPU kernel then ran on a copy of the geometry) does not.
            # The tensors it may have written (and their aliases) are dropped on both sides.
            self.drop(written)
            writes_nothing = any(math.prod(shape) == 0 for shape in shapes.values())
            return self._expect_error(step, cpu_err, dev_err, writes_nothing)
        if dev_err is not None:
            self.fail(f"openreg raised {type(dev_err).__name__}: {dev_err}\nwhere the CPU succeeded")
        cpu_env = self.tensors()
        dev_env = {n: self.dev[n] for n in cpu_env if n in self.dev}
        # A statement reading a tensor whose layout legitimately differs (see `free_layout`) may
        # differ in layout too: in its strides, and in whether a reshape or contiguous() copies.
        free = bool(step.names & self.free_layout)
        # A resized out= tensor's layout is not promised (PyTorch's own out= tests check that a
        # resized output warns, not its strides): the CPU gives it the layout of its inputs, a meta
        # kernel written in Python a contiguous one.
        resized_out = "out=" in step.stmt and (
            step.out_is_new
            or any(n in shapes and n in self.cpu and self.cpu[n].shape != shapes[n] for n in step.written)
        )
        # KNOWN_LAYOUT_GAPS: layouts openreg is known to get wrong (see there).
        gap = any(f"torch.{op}(" in step.stmt or f".{op}(" in step.stmt for op in KNOWN_LAYOUT_GAPS)
        free = free or resized_out or gap
        tags = step.tags - {"strides"} if free else step.tags
        # A fresh (not a view) result of inputs laid out differently: which layout it gets is a
        # heuristic (TensorIterator's on the CPU, a meta kernel's on openreg; they differ when
        # operands disagree or broadcast). PyTorch promises the layout of views, of tensors
        # written in place, and of fresh results of contiguous inputs (contiguous).
        plain_inputs = "perm=" not in step.stmt and all(
            cpu_env[n].is_contiguous() for n in (step.names - set(step.targets)) & cpu_env.keys()
        )
        # What it binds, and the tensors it reads or writes in place (t0.t_(), t0[1:] += 1).
        mentioned = [n for n in sorted(step.names & cpu_env.keys()) if n not in step.targets]
        for name in step.targets + mentioned:
            c, d = self.cpu.get(name), self.dev.get(name)
            if isinstance(c, torch.Tensor):
                if name not in mentioned and not c._is_view() and not plain_inputs:
                    tags = tags - {"strides"}
                others = (
                    {k: v for k, v in cpu_env.items() if k != name},
                    {k: v for k, v in dev_env.items() if k != name},
                )
                self._try(lambda: compare_metadata(name, c, d, tags, *others, check_aliases=not free))
                if name in mentioned:
                    continue
                self.free_layout.discard(name)
                if "strides" not in tags and isinstance(d, torch.Tensor) and not same_layout(c, d):
                    self.free_layout.add(name)
                if "meta" in step.tags:  # uninitialised or random values: never used again
                    self.cpu.pop(name)
                    self.dev.pop(name)
            elif not (free and "layout" in step.tags):  # Python values, gradients: at once (synchronises)
                self._try(lambda: compare_values(name, c, d))
        if "uninit" in step.tags:  # resize_: what it adds is uninitialised memory, on either side
            self.drop(written)

    def drop(self, names):
        """Forgets tensors whose values PyTorch does not define (on both sides)."""
        for n in names:
            self.cpu.pop(n, None)
            self.dev.pop(n, None)

    def _try(self, compare):
        try:
            compare()
        except Disagreement as e:
            self.fail(str(e))

    def _expect_error(self, step: Step, cpu_err: Exception, dev_err: Exception | None, writes_nothing=False):
        free = bool(step.names & self.free_layout)
        if dev_err is not None:
            if type(dev_err) is not type(cpu_err):
                self.fail(
                    f"the CPU raised {type(cpu_err).__name__}: {cpu_err}\n"
                    f"openreg raised {type(dev_err).__name__}: {dev_err}"
                )
            return
        # Not raised at the call: only a data-dependent error may come later, at the next
        # synchronisation (as on CUDA: the host cannot read the data that is wrong), and openreg's
        # documented exception: an argument written in place that is exactly another argument
        # (same memory and geometry) keeps the call asynchronous, so a kernel that forbids that
        # overlap fails on the device (docs/mechanisms/generic-path.md, step 6); if the tensor
        # is empty, the kernel writes nothing and finds nothing to refuse.
        overlap = str(cpu_err).startswith(OVERLAP_ERROR)
        known = any(op in step.stmt for op in KNOWN_DEFERRED)
        try:
            torch.openreg.synchronize()
        except Exception as late:
            if "deferred" not in step.tags and not overlap and not known:
                self.fail(
                    f"the CPU raised {type(cpu_err).__name__} at the call: {cpu_err}\n"
                    f"openreg raised only at the next synchronisation: {late}"
                )
            if str(cpu_err).split("\n")[0] not in str(late):
                self.fail(f"the CPU raised: {cpu_err}\nopenreg's deferred error says something else: {late}")
            return
        if overlap and (writes_nothing or ".copy_(" in step.stmt):
            # copy_ between two views of the same memory with different geometries: the CPU's
            # TensorIterator refuses some that openreg's copy (same elements) lets pass. Known gap.
            return
        if free and str(cpu_err).startswith("view size is not compatible"):
            return  # the input's layout is free (see free_layout), and so is whether it can be viewed
        self.fail(f"the CPU raised {type(cpu_err).__name__}: {cpu_err}\nopenreg raised nothing")

    def check(self) -> None:
        """Compares the values of every tensor of the program (this synchronises the device)."""
        try:
            torch.openreg.synchronize()
        except Exception as e:
            self.fail(f"openreg raised at synchronisation: {type(e).__name__}: {e}")
        for name, c in self.tensors().items():
            self._try(lambda: compare_values(name, c, self.dev.get(name)))


def replay(text: str) -> Differential:
    """Runs a program listing (as a failure prints it); raises Disagreement at the first difference."""
    run = Differential()
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("The program"):
            run.step(Step.parse(line.strip()) if line.strip() != CHECK.stmt else CHECK)
    run.check()
    return run


# ---- drawing programs ----
class Draw:
    """The statement generator's view of hypothesis' draws and of the program so far."""

    def __init__(self, data, run: Differential):
        self.data = data
        self.run = run

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def bool(self) -> bool:
        return self.data.draw(st.booleans())

    def chance(self, n: int) -> bool:
        """True about once in `n` draws (shrinks to False)."""
        return self.int(0, n - 1) == n - 1

    def pick(self, seq):
        seq = list(seq)
        return seq[self.int(0, len(seq) - 1)]

    def dtype(self) -> torch.dtype:
        return self.pick(DTYPES)

    def size(self) -> int:
        return self.pick(SIZES)

    def shape(self, max_rank: int = 4) -> tuple:
        return tuple(self.size() for _ in range(self.int(0, max_rank)))

    def name(self, ok=lambda t: True) -> str | None:
        names = [n for n, t in self.run.tensors().items() if ok(t)]
        return self.pick(names) if names else None

    def new_name(self) -> str:
        used = self.run.tensors().keys() | self.run.cpu.keys()
        i = 0
        while f"t{i}" in used:
            i += 1
        return f"t{i}"

    def dim(self, t: torch.Tensor, allow_wrong=True) -> int:
        """A dimension of `t` (negative or not); now and then one out of range."""
        rank = max(t.dim(), 1)
        if allow_wrong and self.chance(20):
            return rank
        d = self.int(0, rank - 1)
        return d - rank if self.bool() else d

    def broadcast_shape(self, shape: tuple) -> tuple:
        """A shape that broadcasts with `shape` (now and then one that does not)."""
        if self.chance(15):
            return self.shape()
        out = [1 if self.chance(3) else n for n in shape]
        if out and self.chance(3):
            out = out[self.int(0, len(out)) :]
        if len(out) < 4 and self.chance(5):
            out = [self.pick((1, 2))] + out
        return tuple(out)

    def tensor_literal(self, shape: tuple, dtype=None, **kw) -> str:
        dtype = dtype or self.dtype()
        seed = self.int(0, 999)
        extra = ""
        if (dtype.is_floating_point or dtype.is_complex) and self.chance(6):
            extra += ", special=True"
        if len(shape) >= 2 and self.chance(3):
            perm = list(range(len(shape)))
            perm = perm[::-1] if self.bool() else perm[1:] + perm[:1]
            extra += f", perm={tuple(perm)}"
        if dtype.is_floating_point and kw.get("grad", True) and self.chance(3):
            extra += ", requires_grad=True"
        return f"make({shape}, {dtype}, {seed}, dev{extra})"

    def operand(self, shape: tuple, want_dtype=None) -> str:
        """A second operand for `shape`: a tensor of the program, a new tensor, a Python number or a
        0-dim CPU tensor (a CPU scalar, which openreg reads as CUDA does)."""
        kind = self.int(0, 9)
        if kind <= 4:
            name = self.name(lambda t: _broadcasts(t.shape, shape))
            if name and kind <= 3:
                return name
            return self.tensor_literal(self.broadcast_shape(shape), want_dtype)
        if kind <= 7:
            return self.pick(("2", "-1", "0.5", "True", "0", "3", "-2.25", "inf"))
        return f"torch.tensor({self.pick(('1.5', '2', '-3', 'True', '0'))})"


def _broadcasts(a, b) -> bool:
    try:
        torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


def _is_float(t) -> bool:
    return t.dtype.is_floating_point


UNARY = tuple(
    "neg abs sin exp log sqrt tanh sigmoid relu floor ceil round trunc sign reciprocal square "
    "logical_not bitwise_not isnan isfinite signbit frac erf expm1 log1p rsqrt nan_to_num cos angle "
    "sgn positive conj_physical".split()
)
UNARY_INPLACE = tuple(f"{op}()" for op in "neg_ abs_ sin_ exp_ sqrt_ relu_ floor_ sigmoid_ square_".split()) + (
    "clamp_(min=0)",
)
BINARY = tuple(
    "add sub mul div true_divide floor_divide remainder fmod maximum minimum atan2 pow eq ne lt ge "
    "logical_and logical_xor bitwise_and bitwise_or bitwise_xor hypot copysign fmax fmin xlogy".split()
    # Not the bit shifts: a negative or too large shift is undefined behaviour in C++, and the CPU
    # kernels' vectorised and scalar loops give different results for it.
)
# Integer division and remainder fail on a zero divisor, which only the data tells.
DATA_ERRORS = {"div", "floor_divide", "remainder", "fmod", "true_divide"}
REDUCTIONS = (
    *("sum", "mean", "prod", "amax", "amin", "argmax", "argmin"),
    *("all", "any", "std", "var", "logsumexp", "norm"),
)
REDUCTIONS_DIM = ("cumsum", "cumprod", "softmax", "log_softmax", "cummax", "logcumsumexp")
TUPLE_REDUCTIONS = ("max", "min", "median", "mode", "sort", "kthvalue", "topk", "aminmax")


def gen_make(d: Draw) -> Step:
    return Step(f"{d.new_name()} = {d.tensor_literal(d.shape())}")


def gen_factory(d: Draw) -> Step:
    n = d.new_name()
    shape = d.shape(3)
    dtype = d.dtype()
    src = d.name()
    forms = [
        (f"torch.zeros({shape}, dtype={dtype}, device=dev)", True),
        (f"torch.ones({shape}, dtype={dtype}, device=dev)", True),
        (f"torch.full({shape}, {d.pick(('2', '-1.5', 'True'))}, device=dev)", True),
        (f"torch.arange({d.int(-3, 2)}, {d.int(-2, 9)}, {d.pick((1, 2, -1))}, dtype={dtype}, device=dev)", True),
        (f"torch.eye({d.int(0, 4)}, {d.int(0, 4)}, dtype={dtype}, device=dev)", True),
        (f"torch.linspace({d.int(-3, 3)}, {d.int(-3, 3)}, {d.int(0, 6)}, device=dev)", True),
        (f"torch.tensor({d.pick(('[1, 2, 3]', '[[0.5, -1.0]]', '[]', '3.0', '[True, False]'))}, device=dev)", True),
    ]
    if src:
        forms += [
            (f"torch.zeros_like({src})", True),
            (f"torch.ones_like({src}, dtype={dtype})", True),
            (f"torch.full_like({src}, 7)", True),
            (f"{src}.new_zeros({shape})", True),
            (f"{src}.new_full({shape}, 2)", True),
        ]
    expr, strides = d.pick(forms)
    return Step(f"{n} = {expr}", frozenset({"strides"} if strides else ()))


def gen_meta_only(d: Draw) -> Step:
    """Uninitialised and random results: their values differ by design, so only metadata counts."""
    n = d.new_name()
    src = d.name()
    shape = d.shape(3)
    forms = [
        f"torch.empty({shape}, device=dev)",
        f"torch.randn({shape}, device=dev)",
        f"torch.rand({shape}, dtype=torch.float64, device=dev)",
        f"torch.randint(0, 5, {shape}, device=dev)",
        f"torch.empty_strided({shape}, {tuple(reversed(range(1, len(shape) + 1)))}, device=dev)",
    ]
    if src:
        forms += [
            f"torch.empty_like({src})",
            f"torch.rand_like({src})",
            f"F.dropout({src}, p=0.5, training=True)",
            f"torch.bernoulli(torch.full_like({src}, 0.5))",
            f"{src}.new_empty({shape})",
        ]
    return Step(f"{n} = {d.pick(forms)}", frozenset({"meta", "strides"}))


def gen_unary(d: Draw) -> Step:
    x = d.name()
    n = d.new_name()
    form = d.int(0, 5)
    if form <= 2:
        return Step(f"{n} = torch.{d.pick(UNARY)}({x})", frozenset({"strides"}))
    if form == 3:
        return Step(f"{x}.{d.pick(UNARY_INPLACE)}", frozenset({"strides"}))
    if form == 4:
        lo, hi = d.pick(("-1", "None", "0.5")), d.pick(("1", "None", "2"))
        return Step(f"{n} = torch.clamp({x}, {lo}, {hi})", frozenset({"strides"}))
    out = d.name() if d.bool() else f"torch.empty(0, dtype={d.dtype()}, device=dev)"
    return Step(f"{n} = torch.{d.pick(UNARY)}({x}, out={out})", frozenset({"strides"}))


def gen_binary(d: Draw) -> Step:
    x = d.name()
    t = d.run.tensors()[x]
    op = d.pick(BINARY)
    y = d.operand(tuple(t.shape))
    n = d.new_name()
    tags = {"strides"}
    if op in DATA_ERRORS:
        tags.add("deferred")
    extra = ""
    if op in ("add", "sub") and d.chance(4):
        extra = f", alpha={d.pick(('2', '-1', '0.5'))}"
    if op == "div" and d.chance(3):
        extra = f", rounding_mode={d.pick(('None', chr(39) + 'floor' + chr(39), chr(39) + 'trunc' + chr(39)))}"
    form = d.int(0, 7)
    if form <= 3:
        return Step(f"{n} = torch.{op}({x}, {y}{extra})", frozenset(tags))
    if form == 4:  # swapped operands: a Python number first (`2 - t0`)
        # Not a CPU scalar tensor: the composite kernels of non-structured ops (logical_and, ...)
        # allocate their result with the first operand's options, on the CPU, and then refuse the
        # device operand, on CUDA too; the CPU reference cannot show what a device should do.
        y = y if not y.startswith("torch.tensor") else y[len("torch.tensor(") : -1]
        return Step(f"{n} = torch.{op}({y}, {x}{extra})", frozenset(tags))
    if form == 5:
        return Step(f"{x}.{op}_({y}{extra})", frozenset(tags))
    out_shape = d.pick(("0", "()", str(tuple(t.shape))))
    out = d.name() if d.bool() else f"torch.empty({out_shape}, dtype={d.dtype()}, device=dev)"
    return Step(f"{n} = torch.{op}({x}, {y}{extra}, out={out})", frozenset(tags))


def gen_operator(d: Draw) -> Step:
    """Python operators, including in-place ones on views (`t[1:] += ...`)."""
    x = d.name()
    t = d.run.tensors()[x]
    op = d.pick(("+", "-", "*", "/", "//", "%", "**", "&", "|", "<", "==", "@"))
    y = d.operand(tuple(t.shape))
    tags = {"strides"} if op != "@" else set()
    if op in ("/", "//", "%"):
        tags.add("deferred")
    if d.chance(3) and op not in ("<", "=="):  # in place (`t0[1:] += t1`)
        target = x if t.dim() == 0 or d.bool() else f"{x}[{d.int(0, 1)}:]"
        return Step(f"{target} {op}= {y}", frozenset(tags))
    return Step(f"{d.new_name()} = {x} {op} {y}", frozenset(tags))


def gen_where(d: Draw) -> Step:
    x = d.name()
    t = d.run.tensors()[x]
    cond = d.name(lambda c: c.dtype == torch.bool and _broadcasts(c.shape, t.shape)) or f"({x} > 0)"
    y = d.operand(tuple(t.shape))
    form = d.int(0, 3)
    n = d.new_name()
    if form == 0:
        return Step(f"{n} = torch.where({cond}, {x}, {y})", frozenset({"strides"}))
    if form == 1:
        return Step(f"{n} = {x}.masked_fill({cond}, {d.pick(('0', '-1.5', 'True'))})", frozenset({"strides"}))
    if form == 2:
        return Step(f"{x}.masked_fill_({cond}, {d.pick(('0', '2', 'torch.tensor(3.0)'))})", frozenset({"strides"}))
    return Step(f"{n} = torch.lerp({x}, {y}, 0.25)", frozenset({"strides"}))


def gen_reduction(d: Draw) -> Step:
    x = d.name()
    t = d.run.tensors()[x]
    n = d.new_name()
    form = d.int(0, 4)
    if form <= 1:
        op = d.pick(REDUCTIONS)
        args = []
        one_dim = op in ("argmax", "argmin", "all", "any")
        if d.int(0, 2) > 0:
            dims = d.dim(t) if one_dim or d.bool() else (d.dim(t), d.dim(t))
            args.append(f"dim={dims}")
            if d.bool():
                args.append("keepdim=True")
        if op in ("sum", "prod", "mean") and d.chance(4):
            args.append(f"dtype={d.pick((torch.float64, torch.int64, torch.float32))}")
        return Step(f"{n} = torch.{op}({', '.join([x, *args])})")
    if form == 2:
        op = d.pick(REDUCTIONS_DIM)
        fn = "F" if op in ("softmax", "log_softmax") else "torch"
        return Step(f"{n} = {fn}.{op}({x}, {d.dim(t)})")
    if form == 3:
        op = d.pick(TUPLE_REDUCTIONS)
        if op == "topk":
            args = f"{d.int(0, 3)}, dim={d.dim(t)}, largest={d.bool()}, sorted=True"
        elif op == "kthvalue":
            args = f"{d.int(1, 3)}, dim={d.dim(t)}"
        elif op == "aminmax":
            args = f"dim={d.dim(t)}" if d.bool() else ""
        elif op == "sort":
            args = f"dim={d.dim(t)}, descending={d.bool()}, stable=True"
        else:
            args = f"dim={d.dim(t)}, keepdim={d.bool()}"
        m = f"t{int(n[1:]) + 1}"  # the second result's name
        while m in d.run.cpu:
            m = f"t{int(m[1:]) + 1}"
        if op in ("sort", "max", "kthvalue", "topk") and d.chance(3):  # into two given outputs
            outs = f"torch.empty(0, dtype={t.dtype}, device=dev), torch.empty(0, dtype=torch.int64, device=dev)"
            args += f", out=({outs})"
        return Step(f"{n}, {m} = torch.{op}({x}{', ' if args else ''}{args})")
    # out= forms of reductions (the out tensor may be resized)
    op = d.pick(("sum", "mean", "amax", "prod", "cumsum"))
    out = d.name() if d.bool() else f"torch.empty(0, dtype={t.dtype}, device=dev)"
    return Step(f"{n} = torch.{op}({x}, {d.dim(t)}, out={out})")


def _view_shape(d: Draw, shape: tuple) -> tuple:
    numel = math.prod(shape)
    if numel == 0:
        return d.pick([(0,), (0, 3), (-1,), (2, 0)] + ([shape] if shape else []))
    factors = []
    rest = numel
    for f in (2, 3, 5, 2, 2, 3):
        if rest % f == 0 and d.bool():
            factors.append(f)
            rest //= f
    out = factors + [rest] if rest != 1 or not factors else factors
    if d.chance(3):
        out[d.int(0, len(out) - 1)] = -1
    if d.chance(12):
        out = out + [2]  # a wrong total now and then
    return tuple(out)


def gen_view(d: Draw) -> Step:
    x = d.name()
    t = d.run.tensors()[x]
    n = d.new_name()
    r = t.dim()
    options = [
        lambda: f"{x}.t()" if r <= 2 else f"{x}.mT",
        lambda: f"{x}.transpose({d.dim(t)}, {d.dim(t)})",
        lambda: f"{x}.permute({tuple(_perm(d, r))})",
        lambda: f"{x}[{_slices(d, t)}]",
        lambda: f"{x}.select({d.dim(t)}, {d.int(-2, 2)})",
        lambda: f"{x}.narrow({d.dim(t)}, {d.int(0, 2)}, {d.int(0, 2)})",
        lambda: f"{x}.unsqueeze({d.int(-r - 1, r)})",
        lambda: f"{x}.squeeze({d.dim(t)})" if d.bool() else f"{x}.squeeze()",
        lambda: f"{x}.view({_view_shape(d, tuple(t.shape))})",
        lambda: f"{x}.reshape({_view_shape(d, tuple(t.shape))})",
        lambda: f"{x}.expand({tuple(d.pick((2, 3)) if n == 1 and d.bool() else n for n in t.shape)})",
        lambda: f"{x}.expand({(2,) + tuple(t.shape)})",
        lambda: f"{x}.flatten()",
        lambda: f"{x}.diagonal({d.int(-1, 1)})",
        lambda: f"{x}.unfold({d.dim(t)}, {d.int(1, 2)}, {d.int(1, 2)})",
        lambda: f"{x}.movedim({d.dim(t)}, {d.dim(t)})",
        lambda: f"{x}.split({d.int(1, 3)}, {d.dim(t)})[{d.int(0, 1)}]",
        lambda: f"{x}.chunk({d.int(1, 3)}, {d.dim(t)})[{d.int(0, 1)}]",
        lambda: f"{x}.unbind({d.dim(t)})[{d.int(0, 1)}]",
        lambda: f"{x}.detach()",
        lambda: f"{x}.view({d.pick((torch.int32, torch.float32, torch.int16, torch.uint8))})",
        # Within the tensor's own elements: how much storage lies beyond them is not promised (a
        # CPU kernel may leave its result in a larger allocation, openreg copies it to a fitting one).
        lambda: (
            f"{x}.as_strided(({min(t.numel(), 2)},), (1,), {x}.storage_offset())"
            if t.is_contiguous()
            else f"{x}.flatten()"
        ),
        lambda: f"{x}.conj()",
        lambda: f"{x}.real" if t.is_complex() or d.bool() else f"{x}.imag",
        lambda: f"torch.view_as_real({x})",
        lambda: f"{x}.expand_as({d.name()})",
        lambda: f"{x}.view_as({d.name()})",
        lambda: f"{x}.T" if r != 2 else f"{x}.H",
    ]
    return Step(f"{n} = {d.pick(options)()}", frozenset({"strides"}))


def _perm(d: Draw, r: int) -> list:
    perm = list(range(r))
    for i in range(r - 1, 0, -1):
        j = d.int(0, i)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def _slices(d: Draw, t: torch.Tensor) -> str:
    parts = []
    for _ in range(d.int(1, max(t.dim(), 1))):
        kind = d.int(0, 5)
        if kind == 0:
            parts.append(":")
        elif kind == 1:
            parts.append(str(d.int(-1, 1)))
        elif kind == 2:
            parts.append("None")
        elif kind == 3:
            parts.append("...")
        else:
            a, b, s = d.int(-3, 2), d.int(-2, 4), d.pick((1, 2, 3))
            parts.append(f"{a}:{b}:{s}")
    if parts.count("...") > 1:
        parts = [p for p in parts if p != "..."] + ["..."]
    return ", ".join(parts)


def gen_shape_op(d: Draw) -> Step:
    x = d.name()
    t = d.run.tensors()[x]
    n = d.new_name()
    r = t.dim()
    others = [m for m, o in d.run.tensors().items() if o.shape[1:] == t.shape[1:] or o.dim() == 1 and o.numel() == 0]
    cat_list = ", ".join([x] + [d.pick(others) for _ in range(d.int(0, 2))])
    options = [
        (lambda: f"torch.cat([{cat_list}], {d.dim(t) if r else 0})", True),
        (lambda: f"torch.stack([{x}, {x}.clone()], {d.int(-1, r)})", True),
        (lambda: f"torch.flip({x}, ({d.dim(t)},))", True),
        (lambda: f"torch.roll({x}, {d.int(-2, 3)}, {d.dim(t)})", False),
        (lambda: f"{x}.repeat({tuple(d.int(0, 2) for _ in range(max(r, 1)))})", True),
        (lambda: f"torch.tril({x}, {d.int(-1, 1)})", True),
        (lambda: f"torch.triu({x})", True),
        (lambda: f"{x}.to({d.dtype()})", True),
        (lambda: f"{x}.contiguous()", True),
        (lambda: f"{x}.clone()", True),
        (lambda: f"{x}.clone(memory_format=torch.contiguous_format)", True),
        (lambda: f"{x}.clone(memory_format=torch.channels_last)" if r == 4 else f"{x}.float()", True),
        (lambda: f"torch.nan_to_num({x}, nan=0.0, posinf=1.0)", True),
        (lambda: f"F.pad({x}, ({d.int(0, 2)}, {d.int(-1, 2)}), value={d.pick(('0.0', '1.5'))})", True),
        (lambda: f"{x}.tile(({d.int(1, 2)}, {d.int(1, 2)}))", True),
        (lambda: f"torch.diff({x}, dim={d.dim(t)})", True),
        (lambda: f"torch.diag({x})", False),
        (lambda: f"{x}.type_as({d.name()})", True),
        (lambda: f"torch.broadcast_to({x}, {(2,) + tuple(t.shape)})", True),
        (lambda: f"{x}.index_fill({d.dim(t)}, torch.tensor([0], device=dev), -1)", "deferred"),
        (lambda: f"torch.repeat_interleave({x}, {d.int(0, 2)}, dim={d.dim(t)})", False),
    ]
    expr, strides = d.pick(options)
    tags = {"strides"} if strides else set()
    if strides == "deferred":  # an index the host cannot read
        tags.add("deferred")
    return Step(f"{n} = {expr()}", frozenset(tags))


def gen_index(d: Draw) -> Step:
    x = d.name()
    t = d.run.tensors()[x]
    n = d.new_name()
    size0 = t.shape[0] if t.dim() else 1
    hi = size0 + (1 if d.chance(10) else 0)  # now and then an index out of range
    idx_vals = [d.int(-hi, max(hi - 1, 0)) for _ in range(d.int(0, 3))]
    # Index tensors: on the device, or a CPU tensor (advanced indexing moves it to the device)
    idx = f"torch.tensor({idx_vals}, dtype=torch.int64{', device=dev' if d.bool() else ''})"
    idx_dev = f"torch.tensor({idx_vals}, dtype=torch.int64, device=dev)"
    mask = d.name(lambda m: m.dtype == torch.bool and m.shape == t.shape) or f"({x} > 0)"
    tags = frozenset({"deferred"})
    options = [
        lambda: f"{n} = {x}[{idx}]",
        lambda: f"{n} = torch.index_select({x}, 0, {idx_dev})",
        lambda: f"{n} = {x}[{mask}]",
        lambda: f"{n} = torch.masked_select({x}, {mask})",
        lambda: f"{n} = torch.nonzero({x})",
        lambda: f"{n} = {x}.argwhere()",
        lambda: f"{n} = torch.unique({x}, sorted=True, return_inverse={d.bool()})",
        lambda: f"{n} = torch.unique_consecutive({x})",
        lambda: f"{x}[{idx}] = {d.pick(('0', '1.5', 'True'))}",
        lambda: f"{x}[{mask}] = {d.pick(('-1', '2.5'))}",
        lambda: f"{x}.index_add_(0, {idx_dev}, {d.name()})",
        lambda: f"{x}.index_copy_(0, {idx_dev}, {d.name()})",
        lambda: f"{x}.index_put_(({idx},), {d.operand(())}, accumulate={d.bool()})",
        lambda: f"{n} = torch.gather({x}, {d.dim(t)}, {d.name(lambda i: i.dtype == torch.int64) or idx_dev})",
        lambda: f"{n} = torch.take({x}, {idx_dev})",
        lambda: f"{x}.scatter_({d.dim(t)}, {d.name(lambda i: i.dtype == torch.int64) or idx_dev}, {d.operand(())})",
        lambda: f"{n} = {x}.scatter_add(0, {d.name(lambda i: i.dtype == torch.int64) or idx_dev}, {d.name()})",
        lambda: f"{n} = torch.bincount({idx_dev}.abs())",
        lambda: f"{n} = torch.searchsorted(torch.tensor([0.0, 1.0, 2.5], device=dev), {x})",
    ]
    return Step(d.pick(options)(), tags)


def gen_linalg(d: Draw) -> Step:
    n = d.new_name()
    x = d.name()
    t = d.run.tensors()[x]
    k = t.shape[-1] if t.dim() else 1
    m = d.size()
    other_shape = (k, m) if t.dim() != 3 or d.chance(3) else (t.shape[0], k, m)
    y = d.name(lambda o: o.dim() >= 1 and o.shape[-2 if o.dim() > 1 else 0] == k) if d.bool() else None
    y = y or d.tensor_literal(other_shape, t.dtype)
    options = [
        f"torch.matmul({x}, {y})",
        f"{x} @ {y}",
        f"torch.mm({x}, {y})",
        f"torch.bmm({x}, {y})",
        f"torch.addmm({d.tensor_literal((m,), t.dtype)}, {x}, {y}, beta={d.pick((1, 0.5))})",
        f"torch.outer({x}.flatten(), {y}.flatten())",
        f"torch.dot({x}.flatten(), {x}.flatten())",
        f"torch.einsum('...i,...i->...', {x}, {x})",
        f"F.linear({x}, {y}.mT)",
        f"F.layer_norm({x}, {tuple(t.shape[-1:])})",
        f"F.gelu({x})",
        f"F.silu({x})",
        f"F.leaky_relu({x}, 0.1)",
        f"F.mse_loss({x}, {x}.detach() * 0.5, reduction={d.pick(('mean', 'sum', 'none'))!r})",
        f"F.normalize({x}, dim={d.dim(t)})",
        f"torch.linalg.vector_norm({x}, ord={d.pick((1, 2, 'inf'))})",
        f"torch.cdist({x}, {x})",
    ]
    return Step(f"{n} = {d.pick(options)}")


def gen_mutate(d: Draw) -> Step:
    """Writes into a tensor or into a view of one: every tensor sharing its memory must follow."""
    x = d.name()
    t = d.run.tensors()[x]
    target = x if d.bool() or t.dim() == 0 else f"{x}[{_slices(d, t)}]"
    options = [
        lambda: f"{target}.zero_()",
        lambda: f"{target}.fill_({d.pick(('2', '-0.5', 'True', 'torch.tensor(7)'))})",
        lambda: f"{target}.copy_({d.operand(tuple(t.shape))})",
        lambda: f"{target} = {d.pick(('3', '-1.25'))}",
        lambda: f"{target}.add_({d.operand(tuple(t.shape))}, alpha=2)",
        lambda: f"{target}.mul_({d.operand(tuple(t.shape))})",
        lambda: f"{target}.clamp_(min={d.pick(('-1', '0'))}, max=2)",
        lambda: f"{x}.t_()" if t.dim() <= 2 else f"{x}.transpose_(0, 1)",
        lambda: f"{x}.unsqueeze_(0)",
        lambda: Step(f"{x}.resize_({d.shape(3)})", frozenset({"strides", "uninit"})),
        lambda: f"{x}.requires_grad_()",
        lambda: f"{x}.detach_()",
    ]
    choice = d.pick(options)()
    return choice if isinstance(choice, Step) else Step(choice, frozenset({"strides"}))


def gen_sync(d: Draw) -> Step:
    """Values the host reads: these synchronise."""
    x = d.name()
    n = f"s{len(d.run.steps)}"
    options = [
        f"{n} = {x}.sum().item()",
        f"{n} = {x}.flatten()[0].item()",
        f"{n} = {x}.tolist()",
        f"{n} = bool(({x} != 0).any())",
        f"{n} = {x}.numel()",
        f"{n} = torch.equal({x}, {x}.clone())",
        f"{n} = {x}.max().item()",
    ]
    if d.chance(8):  # a value that depends on the layout
        return Step(f"{n} = {x}.is_contiguous()", frozenset({"layout"}))
    return Step(d.pick(options), frozenset({"deferred"}))


def gen_grads(d: Draw) -> Step:
    out = d.name(lambda t: t.requires_grad)
    leaves = [n for n, t in d.run.tensors().items() if t.is_leaf and t.requires_grad]
    if out is None or not leaves:
        return gen_make(d)
    chosen = [leaf for leaf in leaves if d.bool()] or leaves[:1]
    return Step(f"g{len(d.run.steps)} = grads({out}, [{', '.join(chosen)}], {d.int(0, 99)})")


# (generator, weight): drawn by weight.
GENERATORS = (
    (gen_make, 2),
    (gen_unary, 3),
    (gen_binary, 5),
    (gen_operator, 2),
    (gen_where, 1),
    (gen_reduction, 3),
    (gen_view, 5),
    (gen_shape_op, 3),
    (gen_index, 2),
    (gen_linalg, 2),
    (gen_mutate, 3),
    (gen_factory, 1),
    (gen_meta_only, 1),
    (gen_sync, 1),
    (gen_grads, 2),
)
_TABLE = [g for g, w in GENERATORS for _ in range(w)]


def draw_step(d: Draw) -> Step:
    if not d.run.tensors():
        return gen_make(d)
    if d.chance(20):
        return CHECK
    return d.pick(_TABLE)(d)


def run_program(data, min_steps: int = 5, max_steps: int = 50) -> Differential:
    """Draws and runs one program; raises Disagreement at the first difference."""
    run = Differential()
    d = Draw(data, run)
    try:
        for _ in range(d.int(min_steps, max_steps)):
            run.step(draw_step(d))
        run.check()
    finally:
        try:
            torch.openreg.synchronize()
        except Exception:  # already reported (a failing program), or by check()
            pass
    return run


if __name__ == "__main__":
    import torch_openreg  # noqa: F401 (the device, if autoload is off)

    with open(sys.argv[1]) as f:
        try:
            replay(f.read())
        except Disagreement as e:
            print(e)
            sys.exit(1)
    print("openreg and the CPU agree")
