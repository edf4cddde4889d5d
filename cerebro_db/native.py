"""TensorFlow's shared libraries inside a PostgreSQL backend, next to PostgreSQL's LLVM JIT.

PostgreSQL loads its JIT provider (``llvmjit.so`` and the system's ``libLLVM``) with
``RTLD_GLOBAL`` the first time a session JIT-compiles a query (``jit`` is on by default and
``jit_above_cost`` is 100,000). TensorFlow carries its own LLVM; imported afterwards into the
same process with Python's default ``dlopen`` flags, its libraries bind some of their LLVM
symbols to the system's copy, and the backend dies of a segmentation fault at the import,
which restarts the whole server (an outside pass: one large query, then
``madlib_keras_predict`` in the same session; or ``jit_above_cost = 0`` for a database,
which crashed its worker sessions). TensorFlow imported first is safe either way.

:func:`install` makes the first import of ``tensorflow`` in this process load its libraries
with ``RTLD_DEEPBIND``, so that they prefer their own symbols; the process's other imports
keep the default flags. The package installs it when it is imported inside a PostgreSQL
backend (``plpy`` is there), before any of its modules can import TensorFlow.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

PACKAGE = "tensorflow"


class _DeepBindLoader(importlib.abc.Loader):
    """Runs the wrapped loader's ``exec_module`` (the whole ``import tensorflow``, with every
    library it loads) with ``RTLD_DEEPBIND`` added to the ``dlopen`` flags."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        old = sys.getdlopenflags()
        sys.setdlopenflags(old | os.RTLD_DEEPBIND)
        try:
            self.inner.exec_module(module)
        finally:
            sys.setdlopenflags(old)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self.inner, name)


class _DeepBindFinder(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` with the other finders and wraps its loader, once."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != PACKAGE:
            return None
        uninstall()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _DeepBindLoader(spec.loader)
                return spec
        return None


def installed() -> bool:
    return any(isinstance(f, _DeepBindFinder) for f in sys.meta_path)


def install() -> None:
    """Load TensorFlow's libraries with ``RTLD_DEEPBIND`` when it is first imported (no-op
    where it is imported already, or where ``dlopen`` has no such flag)."""
    if PACKAGE in sys.modules or installed() or not hasattr(os, "RTLD_DEEPBIND"):
        return
    sys.meta_path.insert(0, _DeepBindFinder())


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _DeepBindFinder)]
