"""openreg-quant: int8 quantization for openreg. Not implemented yet.

int8 quantize/dequantize and quantized kernels on openreg, and a PT2E flow (torchao)
that lowers to them.

This package is a placeholder: importing it registers nothing.
"""
