"""Glue that openreg's plugins (and a vendor's own extensions) share: building C++ against
core (:mod:`torch_openreg.utils.cpp_extension`), registering when a heavy torch module gets
imported (:mod:`torch_openreg.utils.imports`) and running code in a fresh interpreter in tests
(:mod:`torch_openreg.utils.testing`)."""
