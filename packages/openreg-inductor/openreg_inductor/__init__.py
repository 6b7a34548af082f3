"""openreg-inductor: torch.compile for openreg. Not implemented yet.

torch.compile for the openreg device: a Dynamo device interface and an Inductor backend
that generates C++ kernels and launches them on openreg streams.

This package is a placeholder: importing it registers nothing.
"""
