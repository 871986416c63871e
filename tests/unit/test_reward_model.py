"""verl.workers.reward_model: a learned reward model scores rollouts through its own tokenizer."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from verl.config.schema import RewardModelConfig
from verl.errors import ModelLoadError
from verl.models.loading import load_tokenizer
from verl.models.tiny import make_tiny_reward_model_folder
from verl.protocol import Batch
from verl.workers.reward_model import RewardModelWorker

DOC = Path(__file__).resolve().parents[2] / "docs" / "reward_model.md"
PROMPTS = ["12+3=", "7+8=", "What is the capital of France? Answer in one word:"]
RESPONSES = ["15", "15 because seven and eight make fifteen, which is what was asked", "Paris"]


@pytest.fixture(scope="module")
def policy_tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def rm_dirs(tmp_path_factory):
    """One tiny reward-model folder per architecture, written on first use."""
    root, made = tmp_path_factory.mktemp("reward-models"), {}

    def get(arch: str) -> Path:
        if arch not in made:
            made[arch] = make_tiny_reward_model_folder(root / arch, arch=arch)
        return made[arch]

    return get


def config(path, **kwargs) -> RewardModelConfig:
    cfg = RewardModelConfig()
    cfg.enable = True
    cfg.model.path = str(path)
    for key, value in kwargs.items():
        if key == "tokenizer_path":
            cfg.model.tokenizer_path = str(value)
        else:
            setattr(cfg, key, value)
    return cfg


def rollout_batch(tok, prompts, responses, *, prompt_width=None, response_width=None, raw_prompt=None) -> Batch:
    """A batch laid out as the rollout leaves it: prompts left-padded, responses (+ eos) right-padded."""
    prompt_ids = [tok(p)["input_ids"] for p in prompts]
    response_ids = [tok(r)["input_ids"] + [tok.eos_token_id] for r in responses]
    tp = prompt_width or max(map(len, prompt_ids))
    tr = response_width or max(map(len, response_ids))
    pad = tok.pad_token_id
    prompts_t = torch.tensor([[pad] * (tp - len(p)) + p for p in prompt_ids])
    responses_t = torch.tensor([r + [pad] * (tr - len(r)) for r in response_ids])
    response_mask = torch.tensor([[1] * len(r) + [0] * (tr - len(r)) for r in response_ids])
    prompt_mask = torch.tensor([[0] * (tp - len(p)) + [1] * len(p) for p in prompt_ids])
    batch = Batch({"prompts": prompts_t, "responses": responses_t, "response_mask": response_mask,
                   "attention_mask": torch.cat([prompt_mask, response_mask], 1),
                   "input_ids": torch.cat([prompts_t, responses_t], 1)})
    if raw_prompt is not None:
        batch["raw_prompt"] = raw_prompt
    return batch


# --------------------------------------------------------------------------- the tiny folders

@pytest.mark.parametrize("arch", ["qwen2", "deberta"])
def test_tiny_reward_model_folder_loads_with_from_pretrained_and_has_its_own_vocabulary(arch, rm_dirs,
                                                                                          policy_tokenizer):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(rm_dirs(arch))
    tok = AutoTokenizer.from_pretrained(rm_dirs(arch))
    assert type(model).__name__ == {"qwen2": "Qwen2ForSequenceClassification",
                                    "deberta": "DebertaV2ForSequenceClassification"}[arch]
    assert model.config.num_labels == 1
    assert tok("a", add_special_tokens=False)["input_ids"] == [ord("a") + 4]
    assert policy_tokenizer("a")["input_ids"] == [ord("a") + 3]
    assert (tok.chat_template is None) == (arch == "deberta")


# --------------------------------------------------------------------------- scoring

@pytest.mark.parametrize("arch", ["qwen2", "deberta"])
def test_scores_are_deterministic_and_do_not_depend_on_the_micro_batch_size(arch, rm_dirs, policy_tokenizer):
    worker = RewardModelWorker(config(rm_dirs(arch)), "cpu", policy_tokenizer=policy_tokenizer)
    batch = rollout_batch(policy_tokenizer, PROMPTS * 2, RESPONSES + RESPONSES[::-1])
    runs = {}
    for size in (1, 3, None):
        worker.micro_batch_size = size
        runs[size] = worker.score(batch)
    assert runs[None].shape == (6,) and runs[None].dtype == torch.float32
    # Rows 1 and 4 are the same (prompt, response); the other four pairs differ, and so do their scores.
    torch.testing.assert_close(runs[None][1], runs[None][4], rtol=1e-5, atol=1e-6)
    assert len(set(runs[None][[0, 1, 2, 3, 5]].tolist())) == 5
    assert torch.equal(worker.score(batch), runs[None])
    torch.testing.assert_close(runs[1], runs[None], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(runs[3], runs[None], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ["qwen2", "opt", "deberta"])
def test_a_sample_scores_the_same_alone_and_next_to_a_much_longer_one(arch, rm_dirs, policy_tokenizer):
    worker = RewardModelWorker(config(rm_dirs(arch)), "cpu", policy_tokenizer=policy_tokenizer)
    alone = worker.score(rollout_batch(policy_tokenizer, PROMPTS[:1], RESPONSES[:1]))
    long_prompt, long_response = "Please think step by step. " * 6 + PROMPTS[0], "Let me see. " * 10 + "15"
    padded = worker.score(rollout_batch(policy_tokenizer, [PROMPTS[0], long_prompt], [RESPONSES[0], long_response],
                                        prompt_width=200, response_width=160))
    torch.testing.assert_close(padded[0], alone[0], rtol=1e-5, atol=1e-6)
    assert not torch.isclose(padded[1], alone[0])


def test_scores_do_not_depend_on_the_padding_side_the_folder_asks_for(rm_dirs, policy_tokenizer, tmp_path):
    # DeBERTa pools its first token ([CLS]): left padding would put a pad there for short samples.
    left = tmp_path / "deberta-left"
    shutil.copytree(rm_dirs("deberta"), left)
    tok_config = json.loads((left / "tokenizer_config.json").read_text())
    (left / "tokenizer_config.json").write_text(json.dumps({**tok_config, "padding_side": "left"}))
    batch = rollout_batch(policy_tokenizer, PROMPTS, RESPONSES)
    right_scores = RewardModelWorker(config(rm_dirs("deberta")), "cpu", policy_tokenizer=policy_tokenizer).score(batch)
    left_scores = RewardModelWorker(config(left), "cpu", policy_tokenizer=policy_tokenizer).score(batch)
    torch.testing.assert_close(left_scores, right_scores, rtol=1e-5, atol=1e-6)


def test_a_model_config_without_pad_token_id_gets_the_tokenizers(rm_dirs, policy_tokenizer, tmp_path):
    folder = tmp_path / "no-pad-id"
    shutil.copytree(rm_dirs("qwen2"), folder)
    model_config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**model_config, "pad_token_id": None}))
    worker = RewardModelWorker(config(folder), "cpu", policy_tokenizer=policy_tokenizer)
    assert worker.model.config.pad_token_id == worker.tokenizer.pad_token_id == 0
    together = worker.score(rollout_batch(policy_tokenizer, PROMPTS, RESPONSES))
    alone = torch.cat([worker.score(rollout_batch(policy_tokenizer, [p], [r])) for p, r in zip(PROMPTS, RESPONSES)])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- text and ids

def test_the_rm_reads_the_text_through_its_own_tokenizer(rm_dirs, policy_tokenizer):
    worker = RewardModelWorker(config(rm_dirs("qwen2")), "cpu", policy_tokenizer=policy_tokenizer)
    batch = rollout_batch(policy_tokenizer, PROMPTS, RESPONSES)
    for row, (text, encoding) in enumerate(zip(worker.render(batch), worker.encode(batch))):
        ids = encoding["input_ids"]
        assert ids == worker.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert worker.tokenizer.decode(ids) == text == f"<|user|>\n{PROMPTS[row]}\n<|assistant|>\n{RESPONSES[row]}\n"
        # The policy's ids for the same text are different numbers: the RM did not get those.
        assert ids != policy_tokenizer(text)["input_ids"]


def test_render_applies_the_rm_chat_template_to_the_raw_prompt_when_the_batch_has_one(rm_dirs, policy_tokenizer):
    worker = RewardModelWorker(config(rm_dirs("qwen2")), "cpu", policy_tokenizer=policy_tokenizer)
    raw = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "12+3?"}], "7+8?"]
    # The policy's prompt ids hold its own template's rendering; the RM uses raw_prompt instead.
    batch = rollout_batch(policy_tokenizer, ["Q: 12+3?\nA:", "Q: 7+8?\nA:"], ["15", "15"], raw_prompt=raw)
    assert worker.render(batch) == ["<|system|>\nBe brief.\n<|user|>\n12+3?\n<|assistant|>\n15\n",
                                    "<|user|>\n7+8?\n<|assistant|>\n15\n"]


def test_a_tokenizer_without_chat_template_gets_prompt_response_pairs(rm_dirs, policy_tokenizer):
    worker = RewardModelWorker(config(rm_dirs("deberta")), "cpu", policy_tokenizer=policy_tokenizer)
    batch = rollout_batch(policy_tokenizer, PROMPTS[:2], RESPONSES[:2])
    assert worker.render(batch) == list(zip(PROMPTS[:2], RESPONSES[:2]))
    ids = worker.encode(batch)[0]["input_ids"]
    assert worker.tokenizer.decode(ids) == f"[CLS]{PROMPTS[0]}[SEP]{RESPONSES[0]}[SEP]"
    batch["raw_prompt"] = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "12+3?"}], "7+8?"]
    assert worker.render(batch) == [("Be brief.\n12+3?", RESPONSES[0]), ("7+8?", RESPONSES[1])]


def test_truncation_cuts_the_start_and_keeps_the_response(rm_dirs, policy_tokenizer):
    chat = RewardModelWorker(config(rm_dirs("qwen2"), max_length=20), "cpu", policy_tokenizer=policy_tokenizer)
    batch = rollout_batch(policy_tokenizer, PROMPTS[2:], RESPONSES[2:])
    assert chat.tokenizer.decode(chat.encode(batch)[0]["input_ids"]) == chat.render(batch)[0][-20:]

    pair = RewardModelWorker(config(rm_dirs("deberta"), max_length=12), "cpu", policy_tokenizer=policy_tokenizer)
    assert pair.tokenizer.decode(pair.encode(batch)[0]["input_ids"]) == "[CLS]ord:[SEP]Paris[SEP]"
    # A response longer than max_length on its own: both parts lose their start.
    long = rollout_batch(policy_tokenizer, ["2+2="], ["the answer is four"])
    text = pair.tokenizer.decode(pair.encode(long)[0]["input_ids"])
    assert len(pair.encode(long)[0]["input_ids"]) == 12 and text.endswith("four[SEP]")


# --------------------------------------------------------------------------- errors

def test_a_missing_folder_names_reward_model_model_path(policy_tokenizer, tmp_path):
    with pytest.raises(ModelLoadError, match=re.escape("reward_model.model.path")) as err:
        RewardModelWorker(config(tmp_path / "no-such-rm"), "cpu", policy_tokenizer=policy_tokenizer)
    assert "no-such-rm" in str(err.value)


def test_an_unset_path_says_how_to_fix_it(policy_tokenizer):
    with pytest.raises(ModelLoadError, match=r"reward_model.model.path.*not set.*reward_model.enable=false"):
        RewardModelWorker(RewardModelConfig(), "cpu", policy_tokenizer=policy_tokenizer)


def test_a_two_label_classifier_is_refused_naming_the_head_shape(policy_tokenizer, tmp_path):
    folder = make_tiny_reward_model_folder(tmp_path / "two-labels", num_labels=2, num_layers=1)
    with pytest.raises(ModelLoadError, match=r"2 outputs \(logits \[B, 2\]\).*num_labels=1"):
        RewardModelWorker(config(folder), "cpu", policy_tokenizer=policy_tokenizer)


def test_a_causal_lm_folder_is_refused_instead_of_scoring_with_a_random_head(tiny_model_dir, policy_tokenizer):
    with pytest.raises(ModelLoadError, match=r"reward_model\.model\.path.*would be random.*score\.weight"):
        RewardModelWorker(config(tiny_model_dir), "cpu", policy_tokenizer=policy_tokenizer)


def test_a_tokenizer_with_neither_pad_nor_eos_is_refused(rm_dirs, policy_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rm_dirs("qwen2"))
    tok.pad_token = tok.eos_token = None
    tok.save_pretrained(tmp_path / "no-pad")
    with pytest.raises(ModelLoadError, match=r"has neither an eos nor a pad token.*`reward_model.model.tokenizer_path`"):
        RewardModelWorker(config(rm_dirs("qwen2"), tokenizer_path=tmp_path / "no-pad"), "cpu",
                          policy_tokenizer=policy_tokenizer)


# --------------------------------------------------------------------------- a trained reward model

def test_a_reward_model_trained_on_a_toy_preference_ranks_held_out_pairs_by_a_wide_margin(rm_dirs, policy_tokenizer):
    """Bradley-Terry training through the worker's own encoding: "good" answers beat "poor" ones
    (same length, so only the word tells them apart; untrained, the margin is about 0.006)."""
    torch.manual_seed(0)
    worker = RewardModelWorker(config(rm_dirs("qwen2")), "cpu", policy_tokenizer=policy_tokenizer)
    questions = [f"Rate item {i}:" for i in range(16)]
    chosen = rollout_batch(policy_tokenizer, questions, [f"it is good, {i}" for i in range(16)])
    rejected = rollout_batch(policy_tokenizer, questions, [f"it is poor, {i}" for i in range(16)])
    inputs = [worker.tokenizer.pad(worker.encode(b), return_tensors="pt") for b in (chosen, rejected)]
    optimizer = torch.optim.AdamW(worker.model.parameters(), lr=3e-3)
    worker.model.train()
    for _ in range(20):
        good, bad = (worker.model(**x).logits[:, 0] for x in inputs)
        loss = -F.logsigmoid(good - bad).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    worker.model.eval()
    held_out = [f"Is answer {i} fine?" for i in (101, 202, 303, 404)]
    good = worker.score(rollout_batch(policy_tokenizer, held_out, ["this looks good to me"] * 4))
    bad = worker.score(rollout_batch(policy_tokenizer, held_out, ["this looks poor to me"] * 4))
    assert (good - bad).min() > 1.0, (good, bad)


# --------------------------------------------------------------------------- the doc

def test_the_docs_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert blocks, "docs/reward_model.md lost its example"
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__reward_model_doc__"}
    for block in blocks:
        exec(compile(block, "reward_model.md", "exec"), namespace)
    assert namespace["scores"].shape == (2,)
    # The rendering the doc shows in a comment is the real one.
    assert namespace["worker"].render(namespace["batch"]) == ["<|user|>\n12+3=\n<|assistant|>\n15\n",
                                                              "<|user|>\n7+8=\n<|assistant|>\n16\n"]
