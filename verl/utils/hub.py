"""The Hugging Face hub's offline switches, read the way the Hugging Face libraries read them."""

from __future__ import annotations

import os
from collections.abc import Mapping

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def offline_flag(env: Mapping[str, str] = os.environ) -> str | None:
    """The variable that puts the Hugging Face libraries in offline mode, or None."""
    return next((key for key in OFFLINE_VARIABLES if env.get(key, "").upper() in ("1", "ON", "YES", "TRUE")), None)
