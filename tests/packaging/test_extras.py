"""`pip install --find-links dist "openreg-core[EXTRA]"` into a fresh venv installs core plus
exactly the chosen plugins from the wheelhouse `nox -s build` writes, and `import torch` loads
exactly those (`torch.openreg.plugins()`).

One fresh venv (no system site-packages) per test process for the whole module (`nox -s packaging`
runs two): torch is installed once, then each extra is installed, probed and uninstalled again with
core (its third-party dependencies stay, so each is fetched once per venv). Run with
`nox -s packaging` (OPENREG_DIST names the wheelhouse); without OPENREG_DIST the tests fail, they
never skip. OPENREG_TORCH_LAYER (set by nox: the folder its sessions share torch from) makes the venv
see that torch through a .pth file instead of unpacking it again (25 s of this module's minute); pip
then finds torch installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLUGINS = ("amp", "distributed", "inductor", "onnx", "quant")
# As in noxfile.py: exactly pinned, so pip takes the local wheel and never another torch.
TORCH = "torch==2.13.0"

SITE_PACKAGES = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
PROBE = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
x = torch.ones(2, device="openreg") * 3
print(json.dumps({
    "plugins": torch.openreg.plugins(),
    "warnings": [str(w.message) for w in caught if "openreg" in str(w.message)],
    "value": x.cpu().tolist(),
    "torch": torch.__version__,
}))
"""


def _bin(venv: Path, name: str) -> str:
    folder = "Scripts" if os.name == "nt" else "bin"
    return str(venv / folder / name)


def _run(cmd: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    # The venv's own pip and python, untouched by the caller's selection or autoload switches.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENREG_", "PIP_REQUIRE_VIRTUALENV"))}
    for key in ("TORCH_DEVICE_BACKEND_AUTOLOAD", "PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(key, None)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


class FreshVenv:
    """A venv without system site-packages, holding torch and what the tests install into it."""

    def __init__(self, root: Path, dist: Path, torch_layer: Path | None = None):
        self.root, self.dist = root, dist
        self.venv = root / "venv"
        _run([sys.executable, "-m", "venv", str(self.venv)], cwd=root)
        self.python = _bin(self.venv, "python")
        if torch_layer is not None:
            site = _run([self.python, "-c", SITE_PACKAGES], cwd=root).stdout.strip()
            Path(site, "_torch_layer.pth").write_text(f"{torch_layer}\n")
        # Every install below holds torch to the tested release (a dependency may not move it).
        self.constraints = root / "constraints.txt"
        self.constraints.write_text(TORCH + "\n")
        self.pip("install", "setuptools>=77", "wheel")
        self.pip("install", TORCH, "numpy")

    def pip(self, *args: str) -> subprocess.CompletedProcess:
        return _run([self.python, "-m", "pip", "--disable-pip-version-check", *args], cwd=self.root)

    def install_extra(self, extra: str) -> list[dict]:
        """`pip install --find-links dist "openreg-core[extra]"`; returns pip's report of what it installed."""
        report = self.root / f"report-{extra}.json"
        self.pip(
            "install", "-c", str(self.constraints), "--find-links", str(self.dist), f"openreg-core[{extra}]",
            "--report", str(report),
        )  # fmt: skip
        return json.loads(report.read_text())["install"]

    def probe(self) -> dict:
        return json.loads(_run([self.python, "-c", PROBE], cwd=self.root).stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> FreshVenv:
    value = os.environ.get("OPENREG_DIST")
    if not value or not Path(value).is_dir():
        pytest.fail(
            "OPENREG_DIST must name the wheelhouse `nox -s build` writes (dist/): run `nox -s packaging`",
            pytrace=False,
        )
    layer = os.environ.get("OPENREG_TORCH_LAYER")
    return FreshVenv(tmp_path_factory.mktemp("extras"), Path(value).resolve(), Path(layer) if layer else None)


def _from_wheelhouse(installed: list[dict], dist: Path) -> dict[str, str]:
    """The openreg distributions pip installed, name -> file; each must come from the wheelhouse."""
    found = {}
    for item in installed:
        name = item["metadata"]["name"]
        if not name.startswith("openreg"):
            continue
        url = item["download_info"]["url"]
        assert url.startswith("file:") and Path(url.removeprefix("file://")).parent == dist, (
            f"{name} came from {url}, not from the wheelhouse {dist}"
        )
        found[name] = Path(url).name
    return found


def _assert_loaded(state: dict, plugins: tuple[str, ...]) -> None:
    loaded = {name: info for name, info in state["plugins"].items()}
    assert sorted(loaded) == sorted(plugins), f"installed plugins {sorted(loaded)}, expected {sorted(plugins)}"
    for name, info in loaded.items():
        assert info["loaded"] and info["error"] is None, f"plugin {name} did not load: {info}"
        assert info["requires"], f"plugin {name} declares no openreg-core range: {info}"
    assert state["warnings"] == [], state["warnings"]
    assert state["value"] == [3.0, 3.0] and state["torch"].startswith("2.13.0"), state


@pytest.mark.parametrize("plugin", PLUGINS)
def test_extra_installs_core_and_that_plugin(venv: FreshVenv, plugin: str):
    try:
        installed = _from_wheelhouse(venv.install_extra(plugin), venv.dist)
        expected = {"openreg-core", f"openreg-{plugin}"}
        assert set(installed) == expected, f"[{plugin}] installed {installed}, expected {sorted(expected)}"
        assert all(f.endswith(".whl") for f in installed.values()), installed  # wheels, not sdists
        _assert_loaded(venv.probe(), (plugin,))
    finally:  # the next test starts from torch alone
        venv.pip("uninstall", "-y", f"openreg-{plugin}", "openreg-core")


def test_all_installs_every_plugin(venv: FreshVenv):
    try:
        # Over core and one plugin already installed: only the other plugins come.
        first = _from_wheelhouse(venv.install_extra(PLUGINS[0]), venv.dist)
        assert set(first) == {"openreg-core", f"openreg-{PLUGINS[0]}"}, first
        installed = _from_wheelhouse(venv.install_extra("all"), venv.dist)
        assert set(installed) == {f"openreg-{p}" for p in PLUGINS[1:]}, installed
        _assert_loaded(venv.probe(), PLUGINS)
    finally:
        venv.pip("uninstall", "-y", "openreg-core", *(f"openreg-{p}" for p in PLUGINS))
