"""Live progress: a bar on a terminal, a plain line every few percent when output is a file or pipe."""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm


def _eta(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


class Progress:
    """``update(postfix)`` once per step; ``postfix`` is a short ``key=value`` string."""

    def __init__(self, total: int, *, initial: int = 0, enabled: bool = True, desc: str = "RL"):
        self.total, self.done, self.desc = total, initial, desc
        self.enabled = enabled
        self.tty = sys.stdout.isatty()
        self.start, self.start_done = time.perf_counter(), initial
        self.every = max(1, total // 20)
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True,
                        file=sys.stdout) if enabled and self.tty else None

    def update(self, postfix: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(1)
        elif self.enabled and (self.done % self.every == 0 or self.done == self.total):
            elapsed = time.perf_counter() - self.start
            rate = (self.done - self.start_done) / max(elapsed, 1e-9)
            eta = (self.total - self.done) / max(rate, 1e-9)
            print(f"{self.desc} {self.done}/{self.total} {postfix} [{_eta(elapsed)}<{_eta(eta)}]", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def rl_postfix(metrics: dict) -> str:
    kl = metrics.get("actor/ref_kl", metrics.get("actor/ppo_kl", 0.0))
    return (f"reward={metrics.get('critic/score/mean', 0.0):.3f} kl={kl:.4f} "
            f"tok/s={metrics.get('perf/throughput', 0.0):,.0f}")
