"""Command line: ``python -m openreg_onnx export|verify MODULE:FACTORY ...``.

``FACTORY`` is a callable in an importable module (or a ``path/to/file.py``) that returns
``(model, args)`` or ``(model, args, dynamic_shapes)``, the model and its inputs already on
openreg.

    python -m openreg_onnx export mymodels.py:tiny_gpt -o gpt.onnx [--mode vendor]
    python -m openreg_onnx verify mymodels.py:tiny_gpt [--onnx gpt.onnx] [--report report.md]

``verify`` exits with 1 when a value mismatches and prints the markdown report.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import List, Optional


def _factory(spec: str):
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"expected MODULE:FACTORY or path/to/file.py:FACTORY, got {spec!r}")
    if module_name.endswith(".py"):
        path = Path(module_name)
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    made = getattr(module, attr)()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise SystemExit(f"{spec} must return (model, args) or (model, args, dynamic_shapes)")
    model, args, *rest = made
    return model, args if isinstance(args, tuple) else (args,), (rest[0] if rest else None)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openreg_onnx", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="export a model on openreg to ONNX")
    exp.add_argument("factory", help="MODULE:FACTORY returning (model, args[, dynamic_shapes])")
    exp.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    exp.add_argument("--mode", choices=("portable", "vendor"), default="portable")
    ver = sub.add_parser("verify", help="compare onnxruntime with openreg eager")
    ver.add_argument("factory", help="MODULE:FACTORY returning (model, args[, dynamic_shapes])")
    ver.add_argument("--onnx", help="verify this saved model instead of exporting")
    ver.add_argument("--mode", choices=("portable", "vendor"), default="portable")
    ver.add_argument("--intermediates", action="store_true", help="also compare the values of the graph's nodes")
    ver.add_argument("--report", help="write the markdown report to this file too")
    ns = parser.parse_args(argv)

    import openreg_onnx

    model, args, dynamic_shapes = _factory(ns.factory)
    if ns.command == "export":
        openreg_onnx.export(model, args, ns.output, mode=ns.mode, dynamic_shapes=dynamic_shapes)
        print(f"wrote {ns.output}")
        return 0
    onnx_program = None
    if ns.onnx:
        import onnx

        onnx_program = onnx.load(ns.onnx)
    result = openreg_onnx.verify(
        model,
        args,
        onnx_program=onnx_program,
        mode=ns.mode,
        dynamic_shapes=dynamic_shapes,
        intermediates=ns.intermediates,
    )
    report = result.report()
    print(report)
    if ns.report:
        Path(ns.report).write_text(report)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
