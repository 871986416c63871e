"""Dynamic batch size (micro-batches cut by tokens) and the token-balanced order of a step.

Cutting a mini-batch by tokens changes only which rows share a forward pass: the loss is normalised
by the mini-batch's counts, so the update must equal the one with fixed-size micro-batches, for
every loss_agg_mode, and per-row outputs (log-probs, values) must come back in the original order.
"""

import random

import pytest
import torch

from verl.algorithms.utils import AGG_MODES
from verl.config import ConfigError, TrainerConfig
from verl.config.cross_checks import log_prob_token_budget
from verl.data.collate import collate_prompts
from verl.distributed.fsdp import full_state_dict
from verl.distributed.worker_group import shard_rows
from verl.models.loading import load_causal_lm
from verl.models.value_model import ValueModel
from verl.protocol import Batch
from verl.rollout import assemble_rollout
from verl.workers.actor import Actor, PolicyModel
from verl.workers.critic import Critic
from verl.workers.engine import micro_batch_groups, restore_order
from verl.workers.token_balance import balanced_groups, balanced_order, fewest_groups, token_micro_batches

CPU = torch.device("cpu")
PAD, EOS, RESPONSE_LENGTH = 0, 2, 8
RESPONSES = [[EOS], [70, 71, 72, 73, 74, 75, 76, 77], [70, EOS], [50, 51, 52, 53, 54, EOS], [EOS],
             [60, 61, 62, 63, 64, 65, 66, EOS], [71, EOS], [90, 91, 92, 93, 94, 95, EOS]]


# ---------------------------------------------------------------------------- pure partitioning
def test_token_micro_batches_respect_the_budget_and_cover_every_row_once():
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 30))]
        budget = rng.randint(10, 120)
        groups = token_micro_batches(lengths, budget)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        assert all(g for g in groups)
        assert all(len(g) == 1 or sum(lengths[i] for i in g) <= budget for g in groups)
        assert len(groups) >= min(-(-sum(lengths) // budget), len(lengths)) or max(lengths) > budget


def test_a_row_longer_than_the_budget_runs_alone_and_groups_are_balanced():
    assert sorted(map(tuple, token_micro_batches([50, 3, 4, 5], 10))) == [(0,), (1, 2), (3,)]
    # 8 rows of 10 tokens under a budget of 40: two groups of 40, not 40 + 40 + 0 or 30 + 30 + 20.
    assert [len(g) for g in token_micro_batches([10] * 8, 40)] == [4, 4]
    loads = [sum(g) for g in ([[7, 6, 5, 4, 3, 2][i] for i in grp] for grp in balanced_groups([7, 6, 5, 4, 3, 2], 3))]
    assert loads == [9, 9, 9]
    assert fewest_groups([5, 5, 5], 5, at_least=4) == 4
    assert balanced_groups([3, 1], 3)[2] == []  # more groups than rows: empty ones


def test_balanced_order_is_a_permutation_within_blocks_that_evens_out_the_ranks():
    rng = random.Random(1)
    for world, block, n in ((2, 8, 32), (4, 16, 64), (2, 6, 15), (3, None, 20)):
        lengths = [rng.choice([5, 10, 200, 400]) for _ in range(n)]
        order = balanced_order(lengths, world, block)
        assert sorted(order) == list(range(n))
        size = block or n
        for start in range(0, n, size):  # rows stay in their mini-batch block
            assert sorted(order[start:start + size]) == list(range(start, min(start + size, n)))

        def imbalance(perm):
            loads = [sum(lengths[perm[i]] for i in rows) for rows in shard_rows(n, world, block)]
            return max(loads) - min(loads)

        assert imbalance(order) < imbalance(list(range(n)))
        for start in range(0, n, size):  # greedy packing: each block within one longest row
            rows = shard_rows(min(size, n - start), world, size)
            loads = [sum(lengths[order[start + i]] for i in part) for part in rows]
            assert max(loads) - min(loads) <= 400
    assert balanced_order([5, 1, 9, 2], 1, 2) == [0, 1, 2, 3]  # one rank: the identity
    # Long rows first in a block of 4 over 2 ranks: [400, 5] and [300, 10] instead of [400, 300] and [10, 5].
    assert balanced_order([400, 300, 10, 5], 2, 4) == [0, 3, 1, 2]


def test_micro_batch_groups_by_rows_or_tokens_and_outputs_come_back_in_row_order():
    mask = torch.zeros(6, 10, dtype=torch.long)
    for row, length in enumerate([9, 2, 3, 8, 1, 4]):
        mask[row, :length] = 1
    batch = Batch({"attention_mask": mask, "x": torch.arange(6.0)})
    assert micro_batch_groups(batch, 4, None, data_parallel=False) == [[0, 1, 2, 3], [4, 5]]
    assert micro_batch_groups(batch, None, None, data_parallel=False) == [list(range(6))]
    groups = micro_batch_groups(batch, 4, 10, data_parallel=False)  # the row size is ignored
    assert all(sum(mask[g].sum().item() for g in [grp]) <= 10 for grp in groups if len(grp) > 1)
    assert len(groups) == 3
    outputs = [batch["x"][g] * 10 for g in groups]
    assert torch.equal(restore_order(groups, outputs), torch.arange(6.0) * 10)


def test_log_prob_budgets_follow_the_actor_unless_set():
    cfg = TrainerConfig(actor_rollout_ref=dict(actor=dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=300),
                                               ref=dict(log_prob_max_token_len_per_gpu=500),
                                               rollout=dict(log_prob_use_dynamic_bsz=False)))
    arr = cfg.actor_rollout_ref
    assert log_prob_token_budget(arr, "ref") == 500
    assert log_prob_token_budget(arr, "rollout") is None
    assert log_prob_token_budget(TrainerConfig().actor_rollout_ref, "ref") is None
    cfg = TrainerConfig(actor_rollout_ref=dict(actor=dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=300)))
    assert log_prob_token_budget(cfg.actor_rollout_ref, "rollout") == 300
    with pytest.raises(ConfigError, match="critic.ppo_max_token_len_per_gpu=0 must be >= 1"):
        TrainerConfig(critic=dict(ppo_max_token_len_per_gpu=0)).validate(dp_size=1)


# ---------------------------------------------------------------------------- actor and critic
def make_batch(model_dir) -> Batch:
    torch.manual_seed(0)
    prompts = collate_prompts([dict(input_ids=[10 + i, 20 + i, 30, 31][: 1 + i % 4], raw_prompt="", data_source="t",
                                    ground_truth="", extra_info={}, index=i) for i in range(len(RESPONSES))], PAD)
    responses = torch.tensor([r + [PAD] * (RESPONSE_LENGTH - len(r)) for r in RESPONSES])
    batch = assemble_rollout(prompts, responses, RESPONSE_LENGTH, [EOS], PAD)
    mask = batch["response_mask"]
    with torch.no_grad():
        old, _ = PolicyModel(load_causal_lm(str(model_dir)), CPU).compute_log_prob(batch)
    batch["old_log_probs"] = (old + 0.05 * torch.randn_like(old)) * mask
    batch["ref_log_prob"] = (old + 0.1 * torch.randn_like(old)) * mask
    batch["advantages"] = torch.randn(len(RESPONSES), RESPONSE_LENGTH) * mask
    batch["values"] = 0.1 * torch.randn(len(RESPONSES), RESPONSE_LENGTH) * mask
    batch["returns"] = torch.randn(len(RESPONSES), RESPONSE_LENGTH) * mask
    return batch


def role_config(mode: str, max_token_len: int | None) -> TrainerConfig:
    # eps=1: AdamW's step is about lr * gradient, so the weights show any error in the gradient.
    role = dict(ppo_epochs=1, shuffle=False, loss_agg_mode=mode, grad_clip=1e6, optim=dict(lr=0.1, eps=1.0),
                use_dynamic_bsz=max_token_len is not None, ppo_max_token_len_per_gpu=max_token_len or 16384)
    return TrainerConfig(data=dict(max_response_length=RESPONSE_LENGTH),
                         actor_rollout_ref=dict(actor=dict(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1,
                                                           **role)),
                         critic=role)


def update(role, mode, model_dir, batch, *, micro_batch_size=None, max_token_len=None):
    cfg = role_config(mode, max_token_len)
    common = dict(samples_per_mini_batch=4, total_steps=1, norm_len=RESPONSE_LENGTH)
    model = load_causal_lm(str(model_dir))
    if role == "actor":
        worker = Actor(model, cfg.actor_rollout_ref.actor, CPU, **common)
    else:
        worker = Critic(ValueModel(model), cfg.critic, CPU, ppo_epochs=1, **common)
    metrics = worker.update(batch, micro_batch_size=micro_batch_size)
    return full_state_dict(worker.model), metrics


@pytest.mark.parametrize("role", ["actor", "critic"])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_dynamic_micro_batches_give_the_update_of_fixed_micro_batches(tiny_model_dir, role, mode):
    batch = make_batch(tiny_model_dir)
    fixed, fixed_metrics = update(role, mode, tiny_model_dir, batch, micro_batch_size=1)
    # 20 tokens: each mini-batch of 4 rows (8-17 tokens each) is cut into 2-3 uneven micro-batches.
    dynamic, dynamic_metrics = update(role, mode, tiny_model_dir, batch, micro_batch_size=1, max_token_len=20)
    initial = load_causal_lm(str(tiny_model_dir)).state_dict()
    if role == "actor":
        assert max((fixed[k] - v).abs().max() for k, v in initial.items()) > 1e-3  # it moved
    for key, value in fixed.items():
        torch.testing.assert_close(dynamic[key], value, atol=1e-6, rtol=0, msg=key)
    for key in (k for k in fixed_metrics if k.endswith(("_loss", "grad_norm"))):
        assert dynamic_metrics[key] == pytest.approx(fixed_metrics[key], rel=1e-5, abs=1e-7), key


def test_dynamic_log_prob_and_value_passes_return_rows_in_their_order(tiny_model_dir):
    batch = make_batch(tiny_model_dir)
    model = load_causal_lm(str(tiny_model_dir))
    whole, whole_ent = PolicyModel(model, CPU).compute_log_prob(batch, with_entropy=True)
    cut, cut_ent = PolicyModel(model, CPU, max_token_len=12).compute_log_prob(batch, with_entropy=True)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(cut[mask], whole[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(cut_ent[mask], whole_ent[mask], atol=1e-5, rtol=0)

    cfg = TrainerConfig(critic=dict(use_dynamic_bsz=True, forward_max_token_len_per_gpu=12)).critic
    value_model = ValueModel(load_causal_lm(str(tiny_model_dir)))
    torch.nn.init.normal_(value_model.model.get_output_embeddings().weight)  # values that differ by row
    plain = Critic(value_model, TrainerConfig().critic, CPU, samples_per_mini_batch=8, ppo_epochs=1, total_steps=1)
    dynamic = Critic(value_model, cfg, CPU, samples_per_mini_batch=8, ppo_epochs=1, total_steps=1)
    expected = plain.compute_values(batch)
    assert expected.abs().sum() > 0
    torch.testing.assert_close(dynamic.compute_values(batch), expected, atol=1e-5, rtol=0)
