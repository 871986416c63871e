"""What SFT, DPO and KTO share: the run loop (``OfflineTrainer``), model loading and log-probs
(``runtime``), their rows (``rows``) and the command-line helper (``cli``)."""

from verl.trainer.offline.trainer import OfflineTrainer

__all__ = ["OfflineTrainer"]
