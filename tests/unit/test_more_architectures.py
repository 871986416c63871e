"""Hugging Face families beyond the four the other tests run (verl.models.tiny.MORE_ARCHITECTURES: q/k
norms, sliding windows, learned positions, partial rotary, fused qkv, mixtures of experts): the native
engine samples what hf samples and reports the log-probs the actor recomputes; ``rollout.name=auto``
picks native only where its fast decoder covers the family; packed sequences (remove padding) and
shared prompts give the plain forward's log-probs and gradients, or the path says why it is off."""

import pytest
import torch

from verl.models.loading import load_causal_lm, load_tokenizer
from verl.models.logprob import check_packing, compute_response_logprobs
from verl.models.shared_prompt import prompt_sharing_unsupported
from verl.models.tiny import MORE_ARCHITECTURES, make_tiny_model_folder
from verl.rollout import HFRollout, SamplingParams, auto_engine
from verl.rollout.fast_decoder import FAMILIES
from verl.rollout.native import NativeRollout

from tests.unit.test_rollout_native import eos_prone, make_prompts

torch.set_num_threads(1)
SAMPLED = SamplingParams(max_new_tokens=8, n=2, temperature=0.9, logprobs=True)
# Why shared prompts are off for a family (None: on, and exact).
SHARING_OFF = {"gemma2": "sliding-window attention"}


@pytest.fixture(scope="module", params=MORE_ARCHITECTURES)
def arch_model(request, tmp_path_factory):
    path = make_tiny_model_folder(tmp_path_factory.mktemp(f"more-{request.param}"), arch=request.param,
                                  num_layers=2, hidden_size=32, intermediate_size=64)
    # As the trainer loads a policy (actor_rollout_ref.model.disable_dropout=true): GPT-2 ships dropout.
    return eos_prone(load_causal_lm(str(path), disable_dropout=True)), load_tokenizer(str(path))


@pytest.fixture(scope="module")
def rollout(arch_model):
    """The native engine's rollout of the test prompts, after checking it against the hf engine's."""
    model, tokenizer = arch_model
    prompts = make_prompts(tokenizer)
    hf = HFRollout(model, tokenizer).generate(prompts, SAMPLED)
    engine = NativeRollout(model, tokenizer)
    native = engine.generate(prompts, SAMPLED)
    fast = model.config.model_type in FAMILIES
    assert engine.last_path == ("fast" if fast else "hf"), engine.fallback_reason
    assert auto_engine(model.config.model_type)[0] == ("native" if fast else "hf")
    assert torch.equal(native["responses"], hf["responses"])
    torch.testing.assert_close(native["rollout_log_probs"], hf["rollout_log_probs"], atol=1e-5, rtol=0)
    lengths = native["response_mask"].sum(1)
    assert lengths.min() < lengths.max(), "want responses of different lengths"
    return native


def test_the_rollouts_log_probs_are_the_actors(arch_model, rollout):
    model, _ = arch_model
    with torch.no_grad():
        actor, _ = compute_response_logprobs(model, rollout["input_ids"], rollout["attention_mask"],
                                             rollout["position_ids"], rollout["responses"], temperature=0.9)
    mask = rollout["response_mask"].bool()
    torch.testing.assert_close(rollout["rollout_log_probs"][mask], actor[mask], atol=1e-4, rtol=0)
    # Both equal the model's own forward of each sequence alone, without padding and with its default positions
    # (learned positions, GPT-2 and OPT, must not count the left padding).
    for row in range(len(mask)):
        ids = rollout["input_ids"][row][rollout["attention_mask"][row].bool()][None]
        length = int(mask[row].sum())
        with torch.no_grad():
            alone = torch.log_softmax(model(input_ids=ids).logits[0, -length - 1:-1].float() / 0.9, dim=-1)
        torch.testing.assert_close(actor[row, :length], alone.gather(-1, ids[0, -length:, None])[:, 0],
                                   atol=1e-4, rtol=0, msg=f"row {row}")


def test_packed_and_shared_prompt_passes_equal_the_plain_one_or_say_why_not(arch_model, rollout):
    model, _ = arch_model
    arch = model.config.model_type
    mask = rollout["response_mask"].bool()

    def run(**path):
        model.zero_grad()
        log_probs, entropy = compute_response_logprobs(
            model, rollout["input_ids"], rollout["attention_mask"], rollout["position_ids"], rollout["responses"],
            with_entropy=True, **path)
        (-(log_probs * mask).sum() / mask.sum() + 0.1 * (entropy * mask).mean()).backward()
        return log_probs.detach()[mask], [p.grad.clone() for p in model.parameters() if p.grad is not None]

    model.eval()
    plain, plain_grads = run()
    check_packing(model, torch.device("cpu"), "actor_rollout_ref.model.use_remove_padding")  # raises if unfit
    paths = {"packed": dict(remove_padding=True)}
    reason = prompt_sharing_unsupported(model, "cpu")
    if SHARING_OFF.get(arch) is None:
        assert reason is None
        paths["shared"] = dict(share_prompts=True)
    else:
        assert SHARING_OFF[arch] in reason
    for name, path in paths.items():
        log_probs, grads = run(**path)
        torch.testing.assert_close(log_probs, plain, atol=2e-5, rtol=0, msg=f"{name} log-probs")
        assert len(grads) == len(plain_grads)
        for got, want in zip(grads, plain_grads):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4, msg=f"{name} gradients")
