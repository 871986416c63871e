from verl.checkpoint.manager import CheckpointManager, restore_rng_state, rng_state, save_tokenizer, write_hf_folder

__all__ = ["CheckpointManager", "write_hf_folder", "restore_rng_state", "rng_state", "save_tokenizer"]
