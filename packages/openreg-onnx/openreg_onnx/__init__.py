"""openreg-onnx: ONNX export for openreg. Not implemented yet.

ONNX export of models that live on openreg, translation of openreg custom ops, and
verification against onnxruntime.

This package is a placeholder: importing it registers nothing.
"""
