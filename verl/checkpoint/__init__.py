from verl.checkpoint.manager import CheckpointManager, write_hf_folder, restore_rng_state, rng_state

__all__ = ["CheckpointManager", "write_hf_folder", "restore_rng_state", "rng_state"]
