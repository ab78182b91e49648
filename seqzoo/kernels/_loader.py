"""Loading the compiled kernels: plain C libraries that setuptools builds beside these modules."""

from __future__ import annotations

import ctypes
import functools
import sysconfig
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from seqzoo._warn import warn_user

__all__ = ["DTYPE_CODE", "CompiledKernel", "kernel_serves", "load_kernel"]

DTYPE_CODE = {torch.float32: 0, torch.float64: 1}  # the kernels' dtype argument

_CTYPES = {"i": ctypes.c_int, "l": ctypes.c_int64, "d": ctypes.c_double, "p": ctypes.c_void_p}


def load_kernel(name: str, abi_version: int, **signatures: str) -> ctypes.CDLL | str:
    """The library ``_NAME`` (built from ``NAME.c``) beside this module, or why it cannot serve: it is
    missing (no C compiler at install time), or its ``NAME_abi_version()`` is not ``abi_version`` (built
    from other sources). ``signatures`` declares each function the caller uses, all returning a C
    ``int`` status: its arguments as one letter each, ``i`` int, ``l`` int64_t, ``d`` double, ``p`` a
    pointer (spaces ignored), e.g. ``crf_viterbi="i ppppp lll pp i"``."""
    path = Path(__file__).with_name(f"_{name}" + sysconfig.get_config_var("EXT_SUFFIX"))
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as err:
        return f"cannot load {path.name} ({err}); reinstall seqzoo with a C compiler to build it"
    if getattr(lib, f"{name}_abi_version", lambda: 1)() != abi_version:
        return f"{path.name} was built from other kernel sources; rebuild it (reinstall seqzoo)"
    for function, codes in signatures.items():
        getattr(lib, function).argtypes = [_CTYPES[code] for code in codes.replace(" ", "")]
        getattr(lib, function).restype = ctypes.c_int
    return lib


class CompiledKernel:
    """A kernel's library, loaded by :func:`load_kernel` on first use and kept: :meth:`unavailable` says
    why it cannot serve (None when it can), :meth:`loaded` returns it or raises that reason."""

    def __init__(self, name: str, abi_version: int, **signatures: str) -> None:
        self.name, self.abi_version, self.signatures = name, abi_version, signatures

    @functools.cached_property
    def library(self) -> ctypes.CDLL | str:
        return load_kernel(self.name, self.abi_version, **self.signatures)

    def unavailable(self) -> str | None:
        return self.library if isinstance(self.library, str) else None

    def loaded(self) -> ctypes.CDLL:
        if isinstance(self.library, str):
            raise RuntimeError(self.library)
        return self.library


def kernel_serves(tensor: Tensor, available: Callable[[], str | None], fallback: str) -> bool:
    """Whether a C kernel takes ``tensor``: float32/float64 on the CPU, the kernel loaded (``available()``
    is None); warns, naming the ``fallback``, where it should run but cannot load."""
    if tensor.device.type != "cpu" or tensor.dtype not in DTYPE_CODE:
        return False
    reason = available()
    if reason is not None:
        warn_user(f"{fallback}: {reason}", RuntimeWarning)
    return reason is None
