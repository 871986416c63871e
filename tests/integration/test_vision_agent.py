"""Multi-turn rollouts of a vision-language policy (issue 27): a tiny Qwen2-VL taught one trace looks at
the prompt's picture, calls a tool that returns another picture, reads it and answers. The tool's image
joins the conversation (its pad tokens in the response, out of the loss, its pixels after the prompt's),
the second turn reads it, and the engines' log-probs equal the actor's over the whole trajectory, padded
and packed. A text policy refuses a tool's image with one line."""

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from agent_models import TOOL_CONVERSATION, fit, memorize
from rl_compare import run_plain, step_metrics
from verl.agent.agent_loop import AgentLoop, AgentSettings
from verl.data import RLDataset, collate_prompts, write_parquet
from verl.errors import VerlError
from verl.models.tiny_vision import make_tiny_vl_model_folder
from verl.models.vision import load_processor, media_of
from verl.rollout import HFRollout, SamplingParams
from verl.rollout.native import NativeRollout
from verl.tools.function_tool import tools_from_functions
from verl.tools.registry import load_tools
from verl.tools.schemas import ToolResponse
from verl.workers.actor import PolicyModel

pytestmark = pytest.mark.slow

CALL = '<tool_call>{"name": "zoom", "arguments": {"factor": 2}}</tool_call>'
ZOOM_SIZE = (56, 56)  # 4 image tokens after the 2 x 2 merge
TOOLS = '''
import numpy as np
from PIL import Image

from verl.tools.schemas import ToolResponse


def zoom(factor: int) -> ToolResponse:
    """Look closer at the picture.

    Args:
        factor: How much to magnify.
    """
    rng = np.random.default_rng(factor)
    return ToolResponse(text="zoomed", image=[Image.fromarray((rng.random((56, 56, 3)) * 255).astype("uint8"))])
'''
REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str.rstrip().endswith(ground_truth) else 0.0
'''


def picture(seed: int, size=(56, 56)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((size[1], size[0], 3)) * 255).astype("uint8"))


def zoomed(factor: int = 2) -> Image.Image:  # what the tool of TOOLS returns
    return picture(factor, ZOOM_SIZE)


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def vl_agent(tmp_path_factory):
    """A tiny Qwen2-VL that memorized: the question with a picture, the zoom call, the zoomed picture (a
    tool message), the answer; the task's files beside it."""
    from transformers import AutoModelForImageTextToText

    folder = tmp_path_factory.mktemp("vl-agent")
    base = make_tiny_vl_model_folder(folder / "base", arch="qwen2_vl")
    processor = load_processor(str(base))
    conversation = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]},
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "zoomed"}]},
        {"role": "assistant", "content": "red"}]
    text = processor.apply_chat_template(conversation, tokenize=False)
    inputs = processor(text=[text], images=[picture(0), zoomed()], return_tensors="pt", add_special_tokens=False)
    labels = inputs["input_ids"].masked_fill(inputs["input_ids"] == processor.image_token_id, -100)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(base)
    assert fit(model, inputs, labels, steps=300) < 0.05
    path = folder / "model"
    model.save_pretrained(path)
    processor.save_pretrained(path)
    (folder / "tools.py").write_text(TOOLS)
    (folder / "reward.py").write_text(REWARD)
    rows = [{"prompt": [{"role": "user", "content": "<image>colour?"}], "images": [{"bytes": png(picture(0))}],
             "data_source": "zoom", "reward_model": {"style": "rule", "ground_truth": "red"}} for _ in range(4)]
    write_parquet(rows, folder / "train.parquet")
    return model, load_processor(str(path)), folder


def _prompts(processor, folder):
    data = RLDataset(str(folder / "train.parquet"), processor.tokenizer, processor=processor, max_prompt_length=64)
    prompts = collate_prompts([data[i] for i in range(2)], processor.tokenizer.pad_token_id)
    prompts["rollout_seed"] = torch.arange(2, dtype=torch.int64) + 5
    return prompts


@pytest.mark.parametrize("engine", [HFRollout, NativeRollout])
def test_a_tools_image_joins_the_conversation_and_the_next_turn_reads_it(vl_agent, engine):
    model, processor, folder = vl_agent
    tok = processor.tokenizer
    loop = AgentLoop(engine(model, tok), tok, load_tools(None, str(folder / "tools.py")),
                     AgentSettings(max_assistant_turns=2))
    out = loop.generate(_prompts(processor, folder), SamplingParams(max_new_tokens=120, do_sample=False,
                                                                    logprobs=True))
    pad = processor.image_token_id
    media = media_of(out)
    for i in range(2):
        seen = out["attention_mask"][i, out["prompts"].shape[1]:].bool()
        trained = out["response_mask"][i].bool()
        # the call, the tool's message with its picture's 4 pads (read, not trained on), the answer
        assert tok.decode(out["responses"][i][trained]) == f"{CALL}</s>red</s>"
        assert (out["responses"][i][seen & ~trained] == pad).sum() == 4
        assert not (out["responses"][i][trained] == pad).any()
        # the prompt's picture, then the tool's, in order
        assert media[i]["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]
        expected = processor.image_processor(images=[picture(0), zoomed()], return_tensors="pt")["pixel_values"]
        torch.testing.assert_close(media[i]["pixel_values"], expected)
    assert out["agent_tool_calls"].tolist() == [1.0, 1.0] and out["agent_tool_errors"].tolist() == [0.0, 0.0]

    # The engine's log-probs of the model's tokens are the actor's over the whole trajectory, images
    # included (padded and packed), and the answer depends on the tool's picture.
    mask = out["response_mask"].bool()
    actor = {}
    for packed in (False, True):
        actor[packed], _ = PolicyModel(model, torch.device("cpu"), remove_padding=packed).compute_log_prob(out)
        torch.testing.assert_close(out["rollout_log_probs"][mask], actor[packed][mask], atol=1e-4, rtol=0)
    other = out.index(list(range(2)))
    other["multi_modal_inputs"] = [
        {"pixel_values": torch.cat([m["pixel_values"][:16], processor.image_processor(
            images=[picture(9, ZOOM_SIZE)], return_tensors="pt")["pixel_values"]]),
         "image_grid_thw": m["image_grid_thw"]} for m in media]
    changed, _ = PolicyModel(model, torch.device("cpu"), remove_padding=False).compute_log_prob(other)
    answer = mask & (out["responses"] != pad)
    answer[:, :len(tok(CALL + "</s>", add_special_tokens=False)["input_ids"])] = False  # the second turn only
    # How far the picture moves the answer (the memorized "red" leans on it weakly: 7e-4 on an AMD EPYC,
    # over 1e-3 on a Xeon) against how far packing alone moves it (float rounding, ~1e-6).
    moved = (changed[answer] - actor[False][answer]).abs().max()
    rounding = (actor[True][answer] - actor[False][answer]).abs().max()
    assert moved > 1e-4 and moved > 20 * rounding, (moved, rounding)



class SameWeightsEvery:
    """The rollout's side of new weights (verl.rollout.partial.WeightSwap), the same weights again, pending
    every ``k``-th time the engine asks (before a generation and after each decode step)."""

    def __init__(self, k: int):
        self.k, self.calls, self.version = k, 0, 0

    def pending(self) -> bool:
        self.calls += 1
        return self.calls % self.k == 0

    def apply(self) -> None:
        self.version += 1


@pytest.mark.parametrize("engine", [HFRollout, NativeRollout])
def test_weights_arriving_mid_turn_stop_it_and_it_goes_on_reading_its_pictures(vl_agent, engine):
    # Asynchronous RL's partial rollouts: every few decode steps the turn stops and goes on, prefilled again
    # with the prompt's picture and the tool's; with the same weights nothing changes.
    model, processor, folder = vl_agent
    tok = processor.tokenizer
    params = SamplingParams(max_new_tokens=120, do_sample=False, logprobs=True)

    def loop():
        return AgentLoop(engine(model, tok), tok, load_tools(None, str(folder / "tools.py")),
                         AgentSettings(max_assistant_turns=2))
    whole = loop().generate(_prompts(processor, folder), params)
    swap = SameWeightsEvery(3)
    parts = loop().generate(_prompts(processor, folder), params, swap=swap)
    assert swap.version > 4 and parts["policy_version_last"].tolist() == [swap.version] * 2
    assert torch.equal(parts["responses"], whole["responses"])
    mask = whole["response_mask"].bool()
    torch.testing.assert_close(parts["rollout_log_probs"][mask], whole["rollout_log_probs"][mask], atol=1e-4, rtol=0)


def test_a_text_policy_refuses_a_tools_image_with_one_line(tmp_path_factory):
    model, tok, _ = memorize(tmp_path_factory, "text-tool-model", [TOOL_CONVERSATION])

    def multiply(a: int, b: int) -> ToolResponse:
        """Multiply two whole numbers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        return ToolResponse(text=str(a * b), image=[picture(1)])

    loop = AgentLoop(HFRollout(model, tok), tok, {t.name: t for t in tools_from_functions([multiply])},
                     AgentSettings(max_assistant_turns=2))
    text = tok.apply_chat_template([{"role": "user", "content": "12*34="}], tokenize=False, add_generation_prompt=True)
    prompts = collate_prompts([{"input_ids": torch.tensor(tok(text, add_special_tokens=False)["input_ids"]),
                                "raw_prompt": None, "data_source": "t", "ground_truth": "408", "extra_info": {},
                                "index": 0}], tok.pad_token_id)
    with pytest.raises(VerlError, match=r"tool multiply returned 1 image\(s\), and the policy \(qwen2\) is a text "
                                        r"model that cannot read them"):
        loop.generate(prompts, SamplingParams(max_new_tokens=120, do_sample=False))


def test_grpo_trains_a_vision_language_agent_whose_tool_returns_pictures(vl_agent, tmp_path):
    _, _, folder = vl_agent
    out = tmp_path / "run"
    done = run_plain([f"actor_rollout_ref.model.path={folder / 'model'}", f"data.train_files={folder / 'train.parquet'}",
                      f"data.val_files={folder / 'train.parquet'}", f"custom_reward_function.path={folder / 'reward.py'}",
                      "actor_rollout_ref.rollout.multi_turn.enable=true",
                      f"actor_rollout_ref.rollout.multi_turn.function_tool_path={folder / 'tools.py'}",
                      "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2", "algorithm.adv_estimator=grpo",
                      "data.train_batch_size=2", "data.max_prompt_length=32", "data.max_response_length=120",
                      "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.temperature=1.0",
                      "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.optim.lr=1e-3",
                      "actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.rollout.calculate_log_probs=true",
                      "trainer.total_training_steps=2",
                      "trainer.test_freq=2", f"trainer.default_local_dir={out}", "trainer.progress_bar=false",
                      "trainer.write_report=false"])
    assert "Vision-language policy (qwen2_vl)" in done.stdout
    metrics = step_metrics(out)
    assert all(metrics[step]["agent/tool_calls/mean"] > 0 for step in (1, 2))
    assert all(metrics[step]["actor/rollout_log_prob_diff"] < 1e-4 for step in (1, 2))
    assert "val-core/zoom/reward/mean@1" in metrics[2]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows and (out / "huggingface" / "preprocessor_config.json").exists()


def test_a_tool_message_with_images_goes_in_whole_or_ends_the_trajectory():
    from verl.agent.trajectory import Trajectory

    first = {"pixel_values": torch.ones(16, 3), "image_grid_thw": torch.tensor([[1, 4, 4]])}
    tool = {"pixel_values": torch.zeros(4, 3), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    fits = Trajectory([1, 2], seed=0, row=0, tokens=[5] * 10, mask=[1] * 10, logprobs=[0.0] * 10, media=first)
    fits.splice([7, 6, 6, 8], max_new_tokens=14, media=tool)
    assert fits.tokens[-4:] == [7, 6, 6, 8] and fits.done  # the budget is spent: nothing left to generate
    assert fits.media["image_grid_thw"].tolist() == [[1, 4, 4], [1, 2, 2]] and len(fits.media["pixel_values"]) == 20
    cut = Trajectory([1, 2], seed=0, row=0, tokens=[5] * 10, mask=[1] * 10, logprobs=[0.0] * 10, media=first)
    cut.splice([7, 6, 6, 8], max_new_tokens=13, media=tool)  # one token short: an image cut would not match
    assert cut.done and len(cut.tokens) == 10 and cut.media is first


def test_a_tools_video_is_refused_with_one_line(vl_agent):
    model, processor, _ = vl_agent
    loop = AgentLoop(HFRollout(model, processor.tokenizer), processor.tokenizer, {})
    with pytest.raises(VerlError, match=r"tool clip returned 1 video\(s\): a tool's videos are not supported"):
        loop._check_images("clip", ToolResponse(video=[picture(0)]))
    assert loop._check_images("zoom", ToolResponse(text="no picture")) == []


def test_an_environments_first_message_for_a_prompt_with_images_is_refused(vl_agent):
    model, processor, folder = vl_agent

    class Greeter:
        def reset(self, sample):
            return "look closely"

        def step(self, text):
            return None, 0.0, True

    loop = AgentLoop(HFRollout(model, processor.tokenizer), processor.tokenizer, {}, environment=Greeter)
    with pytest.raises(VerlError, match=r"Greeter.reset returned a first message for row 0, whose prompt has images"):
        loop.generate(_prompts(processor, folder), SamplingParams(max_new_tokens=8, do_sample=False))


def test_a_tools_image_may_be_bytes_or_a_path_and_anything_else_is_named(vl_agent, tmp_path):
    model, processor, _ = vl_agent
    loop = AgentLoop(HFRollout(model, processor.tokenizer), processor.tokenizer, {})
    (tmp_path / "zoom.png").write_bytes(png(zoomed()))
    images = loop._check_images("zoom", ToolResponse(image=[{"bytes": png(zoomed())}, str(tmp_path / "zoom.png")]))
    assert [image.size for image in images] == [ZOOM_SIZE, ZOOM_SIZE] and images[0].mode == "RGB"
    with pytest.raises(VerlError, match=r"tool zoom's image 0: int 7 is not an image"):
        loop._check_images("zoom", ToolResponse(image=[7]))
