"""Tiny models that have memorized a tool-use conversation, and the tool and reward files that go
with them: shared by the multi-turn tests here and in tests/with_vllm (which import this file by path)."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.models.tiny import make_tiny_model_folder

CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>'
TOOL_CONVERSATION = [{"role": "user", "content": "12*34="}, {"role": "assistant", "content": CALL},
                     {"role": "tool", "content": "408"}, {"role": "assistant", "content": "408"}]


def fit(model, inputs, labels, steps: int, lr: float = 1e-2) -> float:
    """Train ``model`` on ``inputs`` (AdamW) until the loss is below 0.01 or ``steps`` are done;
    leaves it in eval mode and returns the last loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = model(**inputs, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:
            break
    model.eval()
    return loss.item()


def _determined(labels: torch.Tensor) -> torch.Tensor:
    """``labels`` with -100 at each token that its beginning does not determine (another row has the
    same tokens before it and a different one there)."""
    rows = labels.tolist()
    following: dict[tuple, set] = {}
    for row in rows:
        for i, token in enumerate(row):
            following.setdefault(tuple(row[:i]), set()).add(token)
    return torch.tensor([[t if len(following[tuple(row[:i])]) == 1 else -100 for i, t in enumerate(row)]
                         for row in rows])


def memorize(tmp_path_factory, name: str, conversations: list[list[dict]], hidden_size: int = 64):
    """The tiny model, trained until it reproduces ``conversations`` (the whole rendered text, every
    token the greedy choice, except where two conversations share a beginning and then part: "target 7"
    and "target 8"). lr 1e-2 memorizes in ~100 steps, but at hidden 128 it diverged on an AMD EPYC with
    AVX2 (loss 0.13 after 600 steps; 3e-3 reached 0.01 at step 119): a lower rate is tried next, and a
    model that memorized nothing stops the test here, not in a rollout's figures."""
    path = make_tiny_model_folder(tmp_path_factory.mktemp(name), num_layers=2, hidden_size=hidden_size,
                                  intermediate_size=2 * hidden_size)
    tok = AutoTokenizer.from_pretrained(path)
    texts = [tok.apply_chat_template(chat, tokenize=False) for chat in conversations]
    batch = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    wanted = _determined(labels)[:, 1:]
    for lr in (1e-2, 3e-3, 1e-3):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(path)
        loss = fit(model, batch, labels, steps=400, lr=lr)
        with torch.no_grad():
            greedy = model(**batch).logits[:, :-1].argmax(-1)
        if bool((greedy == wanted)[wanted != -100].all()):
            break
    else:
        raise AssertionError(f"the tiny model did not memorize {name} (loss {loss:.3f} at lr {lr})")
    folder = tmp_path_factory.mktemp(f"{name}-trained")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model, tok, folder


TOOLS_FILE = '''
def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b
'''
REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # The whole trajectory's text: the call, the tool's result, the answer after it.
    return 1.0 if solution_str.count(ground_truth) >= 2 and solution_str.rstrip().endswith(ground_truth) else 0.0
'''


def write_tool_task(folder, n_rows: int = 8) -> None:
    """``tools.py``, ``reward.py`` and ``train.parquet`` (the question of TOOL_CONVERSATION) in ``folder``."""
    from verl.data import write_parquet

    (folder / "tools.py").write_text(TOOLS_FILE)
    (folder / "reward.py").write_text(REWARD_FILE)
    rows = [{"prompt": [{"role": "user", "content": "12*34="}], "data_source": "calc",
             "reward_model": {"style": "rule", "ground_truth": "408"}} for _ in range(n_rows)]
    write_parquet(rows, folder / "train.parquet")


# The multi-turn run the placements compare (conftest.tool_run): sampled at temperature 1 the memorized
# model calls the tool in some trajectories and not in others, so rewards differ within a group and
# the update has something to learn.
SCALE_OUT_KEYS = ["actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.actor.optim.lr=1e-2",
                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "trainer.total_training_steps=2"]


def tool_task_args(model_dir, folder, out, *extra) -> list[str]:
    """``main_ppo`` keys for multi-turn GRPO on ``write_tool_task(folder)``: 4 prompts x 2 samples a step."""
    return [f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={folder / 'train.parquet'}",
            f"data.val_files={folder / 'train.parquet'}", f"custom_reward_function.path={folder / 'reward.py'}",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.tool_functions={folder / 'tools.py'}",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3", "data.train_batch_size=4",
            "data.max_prompt_length=32", "data.max_response_length=100", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "algorithm.adv_estimator=grpo",
            f"trainer.default_local_dir={out}", "trainer.progress_bar=false", "trainer.write_report=false", *extra]
