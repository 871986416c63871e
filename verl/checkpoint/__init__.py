from verl.checkpoint.manager import CheckpointManager, export_hf, restore_rng_state, rng_state

__all__ = ["CheckpointManager", "export_hf", "restore_rng_state", "rng_state"]
