"""Stage timers: ``with timer("gen", timing): ...`` adds the seconds to ``timing["timing_s/gen"]``."""

from __future__ import annotations

import time
from contextlib import contextmanager


@contextmanager
def timer(name: str, timing: dict):
    start = time.perf_counter()
    try:
        yield
    finally:
        key = f"timing_s/{name}"
        timing[key] = timing.get(key, 0.0) + time.perf_counter() - start
