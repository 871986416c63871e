"""``python -m verl.model_merger merge|test``: a training checkpoint as a Hugging Face folder.

verl's command of the same name, over this project's checkpoints (:mod:`verl.model_merger.checkpoint`
says which folders it takes, :mod:`verl.model_merger.merge` what it writes); see docs/after_training.md.
"""

from verl.model_merger.merge import MergeRequest, merge, check_against

__all__ = ["MergeRequest", "merge", "check_against"]
