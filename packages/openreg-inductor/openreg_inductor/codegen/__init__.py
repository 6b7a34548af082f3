"""Inductor codegen for openreg: scheduling (C++ kernels), launch (stream launchers), wrapper."""
