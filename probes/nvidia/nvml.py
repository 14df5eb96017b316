"""Loading the NVML library, once per process, for every NVIDIA probe and event source."""

from __future__ import annotations

import ctypes
import threading
from typing import Optional

import pynvml

LIBRARY_NOT_FOUND = 12  # NVML_ERROR_LIBRARY_NOT_FOUND
MISSING = "no NVML library (no NVIDIA driver installed)"
_LOAD_LOCK = threading.Lock()


def load_library(path: Optional[str]) -> None:
    """Make pynvml use ``path`` (when given) instead of ``libnvidia-ml.so.1`` from the loader.

    pynvml loads its library once into the module global ``nvmlLib`` and only when that is None,
    so setting it first is the binding's own hook. Raises ``NVMLError`` (LIBRARY_NOT_FOUND).
    """
    with _LOAD_LOCK:
        if pynvml.nvmlLib is None:
            if path:
                try:
                    pynvml.nvmlLib = ctypes.CDLL(path)
                except OSError:
                    raise pynvml.NVMLError(LIBRARY_NOT_FOUND) from None
            else:
                pynvml._LoadNvmlLibrary()


def library_missing(path: Optional[str]) -> bool:
    """Whether the NVML library cannot be found (other load errors surface when it is used)."""
    try:
        load_library(path)
    except pynvml.NVMLError as exc:
        return bool(exc.value == LIBRARY_NOT_FOUND)
    return False
