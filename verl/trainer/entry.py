"""What every command-line entry point shares: help, clean errors, and Ctrl-C."""

from __future__ import annotations

import logging
import os
import sys

from verl.config import TrainerConfig
from verl.distributed.process_group import leave_job
from verl.errors import VerlError


def run_entry(job, args: list[str], doc: str | None) -> int:
    """Run ``job()``; a :class:`VerlError` prints its message alone and exits 2."""
    if any(a in ("-h", "--help") for a in args):
        print((doc or "").strip() + "\n\nKeys (key=value):\n" + TrainerConfig.format_help())
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=os.environ.get("VERL_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        job()
    except VerlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: checkpoints already written are complete; run the same command again to "
              "resume from the latest one.", file=sys.stderr)
        return 130
    leave_job(0)  # under torchrun: exit now, past an occasional abort in torch's shutdown (see leave_job)
    return 0
