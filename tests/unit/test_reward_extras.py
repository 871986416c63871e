"""The keys a reward function's dict returns beside "score": averaged in training's metrics and in
validation's, per data source, whatever number type they come as (as verl logs its reward_extra_info)."""

import numpy as np
import pytest
import torch

from verl.distributed.worker_group import LocalWorkerGroup
from verl.models.tiny import build_char_tokenizer
from verl.protocol import Batch
from verl.rewards import RuleRewardManager
from verl.trainer.ppo.core import compute_data_metrics
from verl.trainer.ppo.validation import validation_metrics
from verl.workers.reward import RewardWorker

TOK = build_char_tokenizer()


def responses(texts, sources, width=6):
    ids = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros(len(texts), width, dtype=torch.long)
    for i, text in enumerate(texts):
        toks = TOK(text, add_special_tokens=False)["input_ids"][:width]
        ids[i, :len(toks)] = torch.tensor(toks)
        mask[i, :len(toks)] = 1
    return Batch({"responses": ids, "response_mask": mask},
                 {"data_source": sources, "ground_truth": ["12"] * len(texts), "uid": [str(i) for i in range(len(texts))],
                  "extra_info": [{"i": i} for i in range(len(texts))], "raw_prompt": [None] * len(texts)})


def numpy_extras(data_source, solution_str, ground_truth, extra_info=None):
    """What a verl reward function computed with numpy returns: numpy scalars, a tensor, text."""
    hit = solution_str == ground_truth
    return {"score": float(hit), "acc": np.bool_(hit), "length": np.int64(len(solution_str)),
            "ratio": np.float32(0.5), "t": torch.tensor([2.0]), "pred": solution_str}


def test_numpy_and_tensor_extras_are_averaged_in_training_and_text_is_not():
    batch = responses(["12", "7", "123"], ["a"] * 3)
    scores, columns = RuleRewardManager(TOK, numpy_extras)(batch)
    size, width = batch["responses"].shape
    step = Batch({"token_level_scores": scores, "token_level_rewards": scores, "advantages": scores,
                  "returns": scores, "response_mask": batch["response_mask"], "prompts": torch.ones(size, 2),
                  "attention_mask": torch.cat([torch.ones(size, 2), batch["response_mask"]], dim=1)})
    for key, values in columns.items():
        step[f"reward_extra/{key}"] = values
    metrics = compute_data_metrics(step, width)
    assert metrics["reward_extra/acc/mean"] == pytest.approx(1 / 3)
    assert metrics["reward_extra/length/mean"] == pytest.approx(2.0)
    assert metrics["reward_extra/ratio/mean"] == pytest.approx(0.5)
    assert metrics["reward_extra/t/mean"] == pytest.approx(2.0)
    assert "reward_extra/pred/mean" not in metrics


def test_validation_averages_the_extras_per_source_and_puts_acc_under_val_core():
    reward = LocalWorkerGroup(RewardWorker(RuleRewardManager(TOK, numpy_extras)), "reward")
    greedy = responses(["12", "7", "12"], ["a", "a", "b"])
    sampled = responses(["12", "7", "1", "12"], ["a", "a", "b", "b"])
    sampled["uid"] = ["p0", "p0", "p1", "p1"]
    metrics = validation_metrics(None, reward, [("greedy", 1, greedy), ("sampled", 2, sampled)])
    assert metrics["val-core/a/reward/mean@1"] == 0.5 and metrics["val-core/a/acc/mean@1"] == 0.5
    assert metrics["val-core/b/acc/mean@1"] == 1.0
    assert metrics["val-aux/a/length/mean@1"] == pytest.approx(1.5)
    assert metrics["val-aux/b/length/mean@2"] == pytest.approx(1.5)
    assert metrics["val-core/b/acc/mean@2"] == 0.5 and metrics["val-aux/a/ratio/mean@2"] == pytest.approx(0.5)
    assert not any("/pred/" in k for k in metrics)


def test_the_end_of_run_table_keeps_to_the_reward_rows():
    from verl.tracking.summary import format_summary

    val = {"val-core/a/reward/mean@1": 0.5, "val-core/a/acc/mean@1": 0.5, "val-aux/a/length/mean@1": 3.0}
    table = format_summary({"validation": [(0, val), (2, val)]})
    assert table.splitlines()[1].startswith("a greedy reward (mean@1)") and len(table.splitlines()) == 2
