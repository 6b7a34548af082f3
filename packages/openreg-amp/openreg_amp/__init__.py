"""openreg-amp: autocast for openreg. Not implemented yet.

Autocast policies for the openreg device (lower-precision, fp32 and promote lists),
the dtypes it supports, and GradScaler kernels.

This package is a placeholder: importing it registers nothing.
"""
