"""Random programs of 5 to 50 operations run on openreg and on the CPU must agree (values, dtypes,
shapes, strides where promised, aliasing, and errors): see programs.py and
docs/mechanisms/fuzzing.md.

The quick profile (part of `nox -s tests`) runs a fixed set of programs: hypothesis is
derandomized and keeps no example database, so every run, in CI too, draws the same programs.
The long profile (`nox -s fuzz -- --minutes N`) draws new programs until the time is up, one
hypothesis run per seed; a failure names its seed (`--fuzz-seed`) and prints the program, which
`python tests/fuzz/programs.py FILE` replays.
"""

from __future__ import annotations

import random
import time

import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from programs import Disagreement, replay, run_program

QUICK_EXAMPLES = 300  # about two minutes on two busy cores
LONG_EXAMPLES_PER_SEED = 100
COMMON = dict(
    deadline=None,
    database=None,  # nothing carried over between runs: what runs is what the seed says
    print_blob=True,
    suppress_health_check=list(HealthCheck),  # programs are big, slow draws by design
)


def _fuzz(max_examples: int, derandomize: bool, run_seed: int | None = None):
    @settings(max_examples=max_examples, derandomize=derandomize, **COMMON)
    @given(st.data())
    def program(data):
        run_program(data)

    if run_seed is not None:
        program = seed(run_seed)(program)
    program()


def test_quick_profile():
    """Deselected when the long profile's options are given (conftest.py)."""
    _fuzz(QUICK_EXAMPLES, derandomize=True)


def test_long_profile(fuzz_options):
    """Runs only with --fuzz-minutes N or --fuzz-seed N (nox -s fuzz -- --minutes N); deselected otherwise."""
    minutes, one_seed = fuzz_options
    if one_seed is not None:
        _fuzz(LONG_EXAMPLES_PER_SEED, derandomize=False, run_seed=one_seed)
        return
    end = time.monotonic() + 60 * minutes
    seeds = 0
    while time.monotonic() < end:
        s = random.SystemRandom().randrange(2**32)
        try:
            _fuzz(LONG_EXAMPLES_PER_SEED, derandomize=False, run_seed=s)
        except BaseException as e:
            raise AssertionError(f"seed {s} failed (rerun: pytest tests/fuzz --fuzz-seed {s})") from e
        seeds += 1
    print(f"long profile: {seeds} seeds x {LONG_EXAMPLES_PER_SEED} programs agreed in {minutes} minutes")


def test_replay_reports_the_first_disagreement():
    """The replay of a listing runs the same comparison: a program that agrees passes, and the
    comparison itself catches a difference (here a CPU-only statement the device cannot match)."""
    replay("t0 = make((2, 3), torch.float32, 1, dev)\nt1 = t0.t()  # strides\n# check\nt0.add_(1)")
    with pytest.raises(Disagreement, match="shares memory|values differ"):
        replay("t0 = make((2, 3), torch.float32, 1, dev)\nt1 = t0.clone() if t0.is_cpu else t0\nt1.add_(1)")
    assert torch.openreg.is_available()
