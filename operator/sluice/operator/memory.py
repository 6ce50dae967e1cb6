"""Giving the memory a burst of reconcile passes freed back to the system.

glibc keeps what is freed for reuse and returns it only from the top of its heap, so the garbage of a burst
(a thousand apps created at once) stays in the operator's RSS for good, interleaved with what lives on.
malloc_trim(0) releases the free pages wherever they are (make bench-operator measures the RSS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from collections.abc import Callable

TRIM_SECONDS = 10.0  # at most once per this, from whichever pass ends


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim): nothing to do
        return None


class Trimmer:
    def __init__(self, trim: Callable[[int], int] | None, every: float = TRIM_SECONDS) -> None:
        self._trim = trim
        self._every = every
        self._last = float("-inf")
        self._lock = threading.Lock()

    def maybe_trim(self, now: float | None = None) -> bool:
        """Trim when the last trim is `every` seconds old; True when it did."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._trim is None or now - self._last < self._every:
                return False
            self._last = now
        self._trim(0)
        return True


TRIMMER = Trimmer(_malloc_trim())
