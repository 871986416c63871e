"""verl.models.shared_prompt: each distinct prompt run once gives the plain forward's log-probs and
gradients (left-padded prompts, right-padded responses, groups in any order), and models or settings
that cannot share are named."""

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from verl.config import ConfigError, TrainerConfig
from verl.errors import VerlError
from verl.models import shared_prompt
from verl.models.logprob import compute_response_logprobs
from verl.models.shared_prompt import distinct_prompts, prompt_sharing_unsupported, resolve_prompt_sharing
from verl.models.tiny import build_tiny_config
from verl.workers.actor import PolicyModel

VOCAB = 259


def tiny(arch: str = "qwen2", **overrides):
    torch.manual_seed(0)
    config = build_tiny_config(VOCAB, arch, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                               intermediate_size=64)
    for key, value in overrides.items():
        setattr(config, key, value)
    return AutoModelForCausalLM.from_config(config)


def grouped_batch(groups: int = 3, n: int = 4, prompt: int = 6, response: int = 5, seed: int = 1):
    """``groups`` prompts of different lengths (left padding) x ``n`` responses of different lengths
    (right padding), rows shuffled so that a group's rows are not adjacent."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for k in range(groups):
        length = max(1, prompt - k % 3)
        ids = torch.randint(3, VOCAB, (length,), generator=g).tolist()
        for j in range(n):
            r_len = response - j % response
            resp = torch.randint(3, VOCAB, (r_len,), generator=g).tolist()
            rows.append(([0] * (prompt - length) + ids, [0] * (prompt - length) + [1] * length,
                         resp + [0] * (response - r_len), [1] * r_len + [0] * (response - r_len)))
    order = torch.randperm(len(rows), generator=g).tolist()
    rows = [rows[i] for i in order]
    input_ids = torch.tensor([p + r for p, _, r, _ in rows])
    mask = torch.tensor([pm + rm for _, pm, _, rm in rows])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    responses = torch.tensor([r for _, _, r, _ in rows])
    return input_ids, mask, positions, responses


def test_distinct_prompts_finds_each_prompt_once():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 5, 6], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1]])  # the last: a real token 0
    first, inverse = distinct_prompts(ids, mask)
    assert first.tolist() == [0, 2, 4]
    assert torch.equal(ids[first][inverse], ids) and torch.equal(mask[first][inverse], mask)
    assert inverse.tolist() == [0, 0, 1, 0, 2]
    first, inverse = distinct_prompts(ids[[2, 4, 0]], mask[[2, 4, 0]])
    assert first.tolist() == inverse.tolist() == [0, 1, 2]  # all distinct: no reordering at all


def test_distinct_prompts_by_hand():
    # Rows 0, 2 and 3 hold the same prompt; row 1 the same tokens with a different left padding (two
    # pads: its first real token is a different one); row 4 differs in a token. Responses never count.
    ids = torch.tensor([[0, 5, 6, 7, 9], [0, 0, 6, 7, 8], [0, 5, 6, 7, 1], [0, 5, 6, 7, 2], [0, 5, 6, 8, 9]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    # The pad's token id is ignored: a row whose pad holds another id is the same prompt.
    ids_other_pad = ids.clone()
    ids_other_pad[3, 0] = 42
    for tokens in (ids, ids_other_pad):
        first, inverse = distinct_prompts(tokens[:, :4], mask[:, :4])
        assert first.tolist() == [0, 1, 4] and inverse.tolist() == [0, 1, 0, 0, 2]
        assert all(inverse[f] == g for g, f in enumerate(first.tolist()))


@pytest.mark.parametrize("arch", ["qwen2", "llama", "phi3"])
def test_shared_prompts_give_the_plain_log_probs_and_gradients(arch):
    model = tiny(arch)
    input_ids, mask, positions, responses = grouped_batch()
    response_mask = mask[:, -responses.shape[1]:].bool()

    def run(share: bool):
        model.zero_grad()
        log_probs, entropy = compute_response_logprobs(model, input_ids, mask, positions, responses,
                                                       with_entropy=True, share_prompts=share, temperature=0.7)
        loss = -(log_probs * response_mask).sum() / response_mask.sum() + 0.1 * (entropy * response_mask).mean()
        loss.backward()
        return log_probs.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]

    plain_lp, plain_ent, plain_grads = run(False)
    shared_lp, shared_ent, shared_grads = run(True)
    torch.testing.assert_close(shared_lp[response_mask], plain_lp[response_mask], atol=2e-5, rtol=0)
    torch.testing.assert_close(shared_ent[response_mask], plain_ent[response_mask], atol=2e-5, rtol=0)
    for plain, shared in zip(plain_grads, shared_grads):
        torch.testing.assert_close(shared, plain, atol=1e-6, rtol=1e-4)
    # The check a run makes at start agrees.
    assert prompt_sharing_unsupported(model, "cpu") is None


def test_a_rows_log_probs_do_not_depend_on_the_other_rows_of_its_pass():
    # The reference's pass and the update's micro-batches hold different rows (and so a different number
    # of distinct prompts): each row must come out the same to the last bit, or an on-policy step's
    # ratio is not exactly 1 and AdamW turns the rounding into steps of size lr.
    model = tiny().eval()
    input_ids, mask, positions, responses = grouped_batch(groups=4, n=4)

    def log_probs(rows):
        with torch.no_grad():
            return compute_response_logprobs(model, input_ids[rows], mask[rows], positions[rows], responses[rows],
                                             share_prompts=True)[0]

    whole = log_probs(list(range(16)))
    for split in ([list(range(8)), list(range(8, 16))], [list(range(0, 16, 2)), list(range(1, 16, 2))],
                  [[i] for i in range(16)], [[0, 5, 9], list(range(16))]):
        for rows in split:
            assert torch.equal(log_probs(rows), whole[rows]), rows


def test_one_token_responses_and_rows_that_share_nothing():
    model = tiny().eval()
    with torch.no_grad():
        ids, mask, _, responses = grouped_batch(prompt=6)
        mask[:, :5] = 0  # every prompt is its last token alone: the prompt pass sees only padding
        one_token_prompt = (ids * mask, mask, (mask.cumsum(-1) - 1).clamp(min=0), responses)
        for input_ids, mask, positions, responses in (grouped_batch(response=1), grouped_batch(groups=5, n=1),
                                                      one_token_prompt, grouped_batch(prompt=1)):
            plain, _ = compute_response_logprobs(model, input_ids, mask, positions, responses)
            shared, _ = compute_response_logprobs(model, input_ids, mask, positions, responses, share_prompts=True)
            seen = mask[:, -responses.shape[1]:].bool()
            torch.testing.assert_close(shared[seen], plain[seen], atol=2e-5, rtol=0)


@pytest.mark.parametrize("arch", ["mistral", "phi3", "gemma2"])
def test_a_sliding_window_model_shares_prompts_when_the_runs_sequences_fit_in_its_window(arch, caplog, monkeypatch):
    """Mistral-7B-v0.1 (a 4096-token window), Phi-3-mini (2047) and Gemma 2 (4096) ran every prompt once per sample,
    whatever the run's lengths: sequences that fit in the window attend as with full attention, and the prompt's
    cache keeps them whole. Longer ones keep the refusal; a batch longer than the window takes the plain pass."""
    model = tiny(arch, sliding_window=12, attention_dropout=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    assert "sliding-window attention of 12 tokens" in prompt_sharing_unsupported(model, "cpu")
    assert "up to 13 tokens" in prompt_sharing_unsupported(model, "cpu", max_length=13)
    assert prompt_sharing_unsupported(model, "cpu", max_length=12) is None
    assert PolicyModel(model, torch.device("cpu"), share_prompts=None, max_length=12).share_prompts is True
    input_ids, mask, positions, responses = grouped_batch(prompt=6, response=5)  # 11 tokens
    response_mask = mask[:, -responses.shape[1]:].bool()
    with torch.no_grad():
        plain, shared = (compute_response_logprobs(model, input_ids, mask, positions, responses, share_prompts=share)[0]
                         for share in (False, True))
    torch.testing.assert_close(shared[response_mask], plain[response_mask], atol=2e-5, rtol=0)
    # A longer batch (an image's tokens, a multi-turn sample) takes the plain pass, said once: the same numbers.
    longer = grouped_batch(prompt=8, response=5)  # 13 tokens
    monkeypatch.setattr(shared_prompt, "_reported", set())  # said once a process: each family here anew
    with torch.no_grad(), caplog.at_level("WARNING", logger="verl.models.shared_prompt"):
        plain, shared = (compute_response_logprobs(model, *longer, share_prompts=share)[0] for share in (False, True))
        compute_response_logprobs(model, *longer, share_prompts=True)
    assert torch.equal(shared, plain)
    said = [r.getMessage() for r in caplog.records if "13-token sequences" in r.getMessage()]
    assert len(said) == 1 and "12-token sliding window" in said[0], said


def test_models_and_settings_that_cannot_share_are_named():
    assert "dropout=0.1" in prompt_sharing_unsupported(tiny("opt"), "cpu")
    assert "attention_dropout=0.2" in prompt_sharing_unsupported(tiny(attention_dropout=0.2), "cpu")
    sliding = tiny("qwen2", use_sliding_window=True, sliding_window=8, layer_types=["sliding_attention"] * 2)
    assert "sliding-window" in prompt_sharing_unsupported(sliding, "cpu")
    checkpointed = tiny()
    checkpointed.gradient_checkpointing_enable()
    assert "gradient checkpointing" in prompt_sharing_unsupported(checkpointed, "cpu")


def test_required_sharing_fails_by_name_and_automatic_sharing_says_once_why_not(caplog):
    opt = tiny("opt")
    with pytest.raises(VerlError, match=r"use_prefix_grouper=true, but OPTForCausalLM cannot run shared prompts: "
                                        r"dropout is on"):
        resolve_prompt_sharing(opt, "cpu", True, remove_padding=False)
    shared_prompt._reported.clear()
    with caplog.at_level(logging.WARNING, logger="verl.models.shared_prompt"):
        assert resolve_prompt_sharing(opt, "cpu", None, remove_padding=False) is False
        assert resolve_prompt_sharing(opt, "cpu", None, remove_padding=False) is False
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "each sample's prompt runs on its own, because dropout is on" in lines[0]
    assert resolve_prompt_sharing(opt, "cpu", False, remove_padding=False) is False
    qwen = tiny()
    assert PolicyModel(qwen, torch.device("cpu"), share_prompts=None).share_prompts is True
    assert PolicyModel(qwen, torch.device("cpu"), share_prompts=False).share_prompts is False
    # Packed sequences have their own path: sharing is off there.
    assert PolicyModel(qwen, torch.device("cpu"), share_prompts=None, remove_padding=True).share_prompts is False


@pytest.mark.parametrize("other", ["use_remove_padding", "enable_gradient_checkpointing"])
def test_required_sharing_with_packing_or_checkpointing_is_refused_by_the_config(other):
    cfg = TrainerConfig.from_cli(["actor_rollout_ref.actor.use_prefix_grouper=true",
                                  f"actor_rollout_ref.model.{other}=true"])
    with pytest.raises(ConfigError, match=rf"use_prefix_grouper=true cannot run with actor_rollout_ref.model.{other}"):
        cfg.validate()
    TrainerConfig.from_cli(["actor_rollout_ref.actor.use_prefix_grouper=null",
                            f"actor_rollout_ref.model.{other}=true"]).validate()
