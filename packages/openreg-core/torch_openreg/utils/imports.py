"""Registration that waits for an import: :func:`when_imported`.

A plugin that extends a heavy part of torch (Dynamo and Inductor, the ONNX exporter) must not
import it when it loads: ``import torch`` loads every plugin, and would pay seconds for modules
most processes never use. The plugin asks instead to be called when that module gets imported.
One finder on ``sys.meta_path`` serves every such request; it wraps the loader of a watched module
only, and leaves ``sys.meta_path`` once nothing is left to watch.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
import warnings
from types import ModuleType
from typing import Callable, Dict, List

from .fork import renewed_at_fork


@renewed_at_fork
def _new_lock() -> None:
    global _lock
    _lock = threading.Lock()


_pending: Dict[str, List[Callable[[ModuleType], None]]] = {}


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Calls ``callback(module)`` once the module ``name`` has been imported: at once if it is, else
    right after its code has run, before its importer gets it. Asking twice for the same pair
    is asking once.

    Called at once, an exception of ``callback`` reaches the caller; called from an import, it is
    reported as a RuntimeWarning, since it must not fail an import the plugin did not start."""
    with _lock:
        if name not in sys.modules:
            callbacks = _pending.setdefault(name, [])
            if callback not in callbacks:
                callbacks.append(callback)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    callback(sys.modules[name])


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._looking_up = threading.local()  # names whose real spec this thread is finding

    def find_spec(self, name, path, target=None):
        busy = self._looking_up.__dict__.setdefault("names", set())
        if name in busy or name not in _pending:
            return None
        busy.add(name)
        try:
            spec = importlib.util.find_spec(name)  # the real one, through the rest of sys.meta_path
        finally:
            busy.discard(name)
        if spec is None or spec.loader is None:
            return None
        with _lock:
            callbacks = _pending.pop(name, [])
            if not _pending and self in sys.meta_path:
                sys.meta_path.remove(self)
        if callbacks:
            spec.loader = _CallingLoader(spec.loader, name, callbacks)
        return spec


class _CallingLoader(importlib.abc.Loader):
    def __init__(self, real, name: str, callbacks: List[Callable[[ModuleType], None]]) -> None:
        self.real, self.name, self.callbacks = real, name, callbacks

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module) -> None:
        # The module keeps its real loader (importlib.resources, inspect and reloads use it).
        module.__loader__ = module.__spec__.loader = self.real
        self.real.exec_module(module)
        for callback in self.callbacks:
            try:
                callback(module)
            except Exception as e:
                where = f"{getattr(callback, '__module__', '?')}.{getattr(callback, '__qualname__', callback)}"
                warnings.warn(
                    f"openreg: {where}, run after the import of {self.name}, failed: {type(e).__name__}: {e}",
                    RuntimeWarning,
                    stacklevel=2,
                )


_finder = _Finder()
