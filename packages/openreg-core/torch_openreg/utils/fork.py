"""Module state a forked child gets fresh: :func:`renewed_at_fork`.

Only the forking thread exists in a child, so a lock another thread of the parent held at the fork
stays held there for ever, and the child's first use of it waits for ever (lazy-init-fork.md).
"""

import os
from typing import Callable


def renewed_at_fork(make: Callable[[], None]) -> Callable[[], None]:
    """Runs ``make`` (which creates a module's lock) now, and again in every child this process
    forks (POSIX; elsewhere there is no fork). Usable as a decorator."""
    make()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=make)
    return make
