"""openreg-distributed: the c10d backend occl. Not implemented yet.

The c10d backend `occl` for openreg tensors: collectives enqueued on a communication
stream, ordered with the compute stream by events, carried over Gloo.

This package is a placeholder: importing it registers nothing.
"""
