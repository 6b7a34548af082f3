"""Discovery of openreg plugins (openreg-amp, openreg-distributed, ...).

Plugins register in the ``torch_openreg.plugins`` entry-point group; core
loads them after the device exists, in a fixed order (known plugins first,
then any others by name). ``OPENREG_PLUGINS`` selects them: a comma list of
names, or ``none``. A plugin that fails to load warns with its name and the
cause and never breaks ``import torch``.

A plugin declares the core versions it works with in its distribution's own
metadata, as its requirement on ``openreg-core`` (``Requires-Dist: openreg-core<0.2,>=0.1``,
from ``dependencies`` in its pyproject.toml). pip checks that at install time, but
``--no-deps``, a later upgrade of core alone or a copied site-packages skip pip's check, and a
C++ plugin built against another core may crash when imported. So core checks it again before
importing a plugin: a plugin whose range excludes this core is skipped with a warning naming both
versions, and ``import torch`` goes on.

A plugin imported directly (``import openreg_inductor``) is loaded too, whatever
``OPENREG_PLUGINS`` says: its package ends its import with ``imported(name, hook)``, which runs the
hook unless discovery did, once, and ``plugins()`` reports it loaded.
"""

import os
import re
import sys
import warnings
from importlib import metadata
from typing import Callable, Dict, List, Optional

# torch's vendored copy of `packaging`'s Version (a fresh venv need not have `packaging` itself).
from torch._vendor.packaging.version import InvalidVersion, Version

GROUP = "torch_openreg.plugins"
CORE_DISTRIBUTION = "openreg-core"
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
    unknown = [w for w in wanted if w not in names]
    if unknown:  # a typo or another case turned every plugin off without a word
        warnings.warn(
            f"OPENREG_PLUGINS names {', '.join(map(repr, unknown))}, which {'is' if len(unknown) == 1 else 'are'} "
            f"not an installed openreg plugin (installed: {', '.join(names) or 'none'}; names are case-sensitive)",
            RuntimeWarning,
            stacklevel=3,
        )
    return [n for n in names if n in wanted]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# "name [extras] (specifier) ; marker" or "name[extras]specifier; marker" (both forms occur in METADATA).
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*\(?\s*([^;()]*?)\s*\)?\s*(?:;(.*))?$")
_CLAUSE = re.compile(r"^(~=|===|==|!=|<=|>=|<|>)\s*([^\s]+)$")


def core_requirement(requires: Optional[List[str]]) -> Optional[str]:
    """The version specifier a plugin's metadata puts on openreg-core ("" when it names core without
    one), or None when it does not name core. Requirements behind an extra are not the plugin's own."""
    for line in requires or ():
        m = _REQUIREMENT.match(line)
        if m is None:
            continue
        name, spec, marker = m.groups()
        if _normalize(name) != CORE_DISTRIBUTION or (marker and "extra" in marker):
            continue
        return spec.replace(" ", "")
    return None


def _release_prefix_match(version: Version, prefix: str) -> bool:
    want = Version(prefix).release
    have = version.release + (0,) * max(0, len(want) - len(version.release))
    return have[: len(want)] == want


def version_satisfies(version: str, specifier: str) -> bool:
    """Whether `version` meets a PEP 440 specifier such as ">=0.1,<0.2", "~=0.1.0" or "==0.1.*"
    (every comma-separated clause must hold; an empty specifier allows every version)."""
    v = Version(version)
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        m = _CLAUSE.match(clause)
        if m is None:
            raise ValueError(f"cannot read the version clause {clause!r}")
        op, target = m.groups()
        if op == "===":
            ok = version == target
        elif op in ("==", "!=") and target.endswith(".*"):
            ok = _release_prefix_match(v, target[:-2]) == (op == "==")
        elif op == "~=":
            t = Version(target)
            if len(t.release) < 2:
                raise ValueError(f"~= needs at least two release numbers: {clause!r}")
            ok = v >= t and _release_prefix_match(v, ".".join(map(str, t.release[:-1])))
        else:
            t = Version(target)
            ok = {"==": v == t, "!=": v != t, "<=": v <= t, ">=": v >= t, "<": v < t, ">": v > t}[op]
        if not ok:
            return False
    return True


def _core_version() -> str:
    from torch_openreg import __version__

    return __version__


def _incompatibility(name: str, dist: Optional[metadata.Distribution]) -> Optional[str]:
    """Why plugin `name` cannot load with this core, or None when its declared range allows it."""
    if dist is None:
        return None
    spec = core_requirement(dist.requires)
    if not spec:  # no declared range: nothing to check
        return None
    core = _core_version()
    try:
        if version_satisfies(core, spec):
            return None
    except (ValueError, InvalidVersion) as e:
        return f"its requirement openreg-core{spec} cannot be read ({e})"
    plugin = f"{dist.metadata['Name']} {dist.version}"
    return (
        f"{plugin} requires openreg-core{spec}, but openreg-core {core} is installed; "
        f"skipped (install a matching pair, e.g. from one `nox -s build` wheelhouse: "
        f"pip install --find-links dist 'openreg-core[{name}]')"
    )


def _importing(module: str) -> bool:
    """Whether `module` is being imported right now (its import imported core, which loads plugins)."""
    spec = getattr(sys.modules.get(module), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def load_plugins() -> None:
    """Load the installed, selected plugins (called once by ``import torch_openreg``)."""
    eps = {ep.name: ep for ep in metadata.entry_points(group=GROUP)}
    names = sorted(eps, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))
    selected = set(_selected(names))
    for name in names:
        ep = eps[name]
        version = ep.dist.version if ep.dist is not None else None
        requires = core_requirement(ep.dist.requires) if ep.dist is not None else None
        entry = {"version": version, "loaded": False, "error": None, "module": ep.value, "requires": requires}
        _status[name] = entry
        if name not in selected:
            continue
        # Checked before the import: a C++ plugin built against another core may not even import.
        reason = _incompatibility(name, ep.dist)
        if reason is not None:
            entry["error"] = f"incompatible: {reason}"
            warnings.warn(f"openreg plugin '{name}' not loaded: {reason}", RuntimeWarning, stacklevel=2)
            continue
        try:
            hook = ep.load()  # imports the package, whose imported() may have loaded it already
            if callable(hook) and not entry["loaded"]:
                hook()
            entry["loaded"] = True
        except Exception as e:  # a broken plugin must not break `import torch`
            entry["error"] = f"{type(e).__name__}: {e}"
            if _importing(ep.module):
                entry["error"] += (
                    f" (`import {ep.module.split('.')[0]}` came first and imported core: define the entry point "
                    "before the package imports torch_openreg)"
                )
            warnings.warn(f"openreg plugin '{name}' failed to load: {entry['error']}", RuntimeWarning, stacklevel=2)


def imported(name: str, hook: Callable[[], None]) -> None:
    """Called by a plugin's package at the end of its import: loads the plugin (runs ``hook``, its
    entry point) unless discovery already did, so that ``import openreg_<name>`` loads it also
    when ``OPENREG_PLUGINS`` left it out; ``plugins()`` then reports it loaded. Before, a direct
    import loaded the plugins whose import registers (amp, quant) but not those whose entry point
    does (inductor, distributed, onnx), and ``plugins()`` said none was loaded."""
    entry = _status.get(name)
    if entry is not None and entry["loaded"]:
        return
    hook()
    if entry is not None:
        entry["loaded"] = True
        if not str(entry["error"] or "").startswith("incompatible:"):  # why discovery skipped it stays said
            entry["error"] = None


def plugins() -> Dict[str, Dict[str, Optional[str]]]:
    """Installed openreg plugins: version, whether loaded, the error if loading failed (or why the
    plugin was skipped as incompatible with this core), its module, and the openreg-core versions
    it declares (``requires``: a specifier, "" for any, None when it does not name core)."""
    return {name: dict(info) for name, info in _status.items()}
