"""Test helpers shared by core's and the plugins' test suites."""

import os
import subprocess
import sys
import textwrap
from typing import Dict, Optional


def run_python(
    code: str, env: Optional[Dict[str, str]] = None, timeout: float = 120, cwd: Optional[str] = None
) -> subprocess.CompletedProcess:
    """Runs ``code`` (dedented) in a fresh interpreter and returns the finished process: for what is
    fixed at import time (autoload, plugin selection, environment variables), fork and crashes."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )
