"""Discovery of openreg plugins (openreg-amp, openreg-distributed, ...).

Plugins register in the ``torch_openreg.plugins`` entry-point group; core
loads them after the device exists, in a fixed order (known plugins first,
then any others by name). ``OPENREG_PLUGINS`` selects them: a comma list of
names, or ``none``. A plugin that fails to load warns with its name and the
cause and never breaks ``import torch``.
"""

import os
import warnings
from importlib import metadata
from typing import Dict, List, Optional

GROUP = "torch_openreg.plugins"
_ORDER = ["amp", "distributed", "inductor", "onnx", "quant"]

_status: Dict[str, Dict[str, Optional[str]]] = {}


def _selected(names: List[str]) -> List[str]:
    spec = os.environ.get("OPENREG_PLUGINS")
    if spec is None:
        return names
    spec = spec.strip()
    if spec.lower() in ("none", ""):
        return []
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    return [n for n in names if n in wanted]


def load_plugins() -> None:
    """Load the installed, selected plugins (called once by ``import torch_openreg``)."""
    eps = {ep.name: ep for ep in metadata.entry_points(group=GROUP)}
    names = sorted(eps, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))
    selected = set(_selected(names))
    for name in names:
        ep = eps[name]
        version = ep.dist.version if ep.dist is not None else None
        entry = {"version": version, "loaded": False, "error": None, "module": ep.value}
        _status[name] = entry
        if name not in selected:
            continue
        try:
            hook = ep.load()
            if callable(hook):
                hook()
            entry["loaded"] = True
        except Exception as e:  # a broken plugin must not break `import torch`
            entry["error"] = f"{type(e).__name__}: {e}"
            warnings.warn(f"openreg plugin '{name}' failed to load: {entry['error']}", RuntimeWarning, stacklevel=2)


def plugins() -> Dict[str, Dict[str, Optional[str]]]:
    """Installed openreg plugins: version, whether loaded, and the error if loading failed."""
    return {name: dict(info) for name, info in _status.items()}
