"""Giving the memory a burst of reconcile passes freed back to the system.

glibc keeps what is freed for reuse and returns it only from the top of its heap, so the garbage of a burst
(a thousand apps created at once) stays in the operator's RSS for good, interleaved with what lives on.
malloc_trim(0) releases the free pages wherever they are (make bench-operator measures the RSS): during a
burst at most once per interval, and once more when the passes have stopped, after kopf's per-object workers
have exited and freed what they held.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from collections.abc import Callable

TRIM_SECONDS = 10.0  # at most once per this during a burst; the trailing trim this long after the last pass


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
        self._last_trim = float("-inf")
        self._last_pass = float("-inf")
        self._untrimmed = False  # a pass ended since the last trailing trim (its own trim does not count: the
        # workers free what they held after it)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def after_pass(self, now: float | None = None) -> bool:
        """A reconcile pass ended: trim when the last trim is `every` seconds old; True when it did."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._last_pass, self._untrimmed = now, True
            if self._trim is None or now - self._last_trim < self._every:
                return False
            self._last_trim = now
        self._trim(0)
        return True

    def trailing(self, now: float | None = None) -> bool:
        """Trim once the passes have stopped for `every` seconds, if one ended after the last trim."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._trim is None or not self._untrimmed or now - self._last_pass < self._every:
                return False
            self._last_trim, self._untrimmed = now, False
        self._trim(0)
        return True

    def start(self) -> None:
        """Check for a trailing trim every `every` seconds, in a daemon thread (once per process)."""
        if self._trim is None or self._thread is not None:
            return

        def run() -> None:
            while True:
                time.sleep(self._every)
                self.trailing()

        self._thread = threading.Thread(target=run, name="malloc-trim", daemon=True)
        self._thread.start()


TRIMMER = Trimmer(_malloc_trim())
