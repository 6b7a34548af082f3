"""Glue that openreg's plugins (and a vendor's own extensions) share: building C++ against
core (:mod:`torch_openreg.utils.cpp_extension`) and running code in a fresh interpreter in
tests (:mod:`torch_openreg.utils.testing`)."""
