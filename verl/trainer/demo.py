"""The embedded default: what ``python -m verl.trainer.main_ppo`` runs with no model and no data.

A ~1M-parameter Qwen2 model learns 2-digit addition: a short supervised warm start (cached),
then GRPO with 32 prompts x 8 samples per step. Any key given on the command line overrides
the preset below.

The rollout engine is ``rollout.name=auto``'s pick for this Qwen2 model, the fastest for this
shape (256 samples of at most 6 tokens from a 1M model), as measured in docs/performance.md:
``native`` (0.03 s of generation a step), ahead of ``hf`` (0.07 s) and vLLM's CPU build (0.09 s:
per-request overhead outweighs its kernels on such short responses).
"""

from __future__ import annotations


# What both demos share: GRPO with a small KL loss to the reference, 8 samples per prompt,
# sampled validation next to greedy.
_GRPO_DEMO = [
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.optim.lr=1e-4",
    "actor_rollout_ref.actor.optim.weight_decay=0.0",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "algorithm.adv_estimator=grpo",
    "trainer.val_sampled=true",
]

DEMO_PRESET = _GRPO_DEMO + [
    "data.train_batch_size=32",
    "data.max_prompt_length=16",
    "data.max_response_length=6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "trainer.total_training_steps=200",
    "trainer.experiment_name=demo",
    "trainer.default_local_dir=outputs/demo",
]


def _builtin_tools_file() -> str:
    from verl.tools import builtin

    return builtin.__file__


# ``data.builtin_task=calculator``: the agentic demo. 3-digit times 2-digit multiplication, which the
# tiny model can only do by calling the calculator tool. The warm start has two phases: worked tool-use
# conversations until held-out sampled accuracy reaches 0.2 (the model has learnt to copy the tool's
# result), then conversations that answer at once (a guess), 15% of them still calling the tool, until
# greedy decoding opens a call on no held-out prompt and about one sampled response in ten still does
# (sft_warmstart.direct_tool_calls, measured after every step): a model that seldom calls the tool, so
# that held-out greedy accuracy starts near 0. Multi-turn GRPO then learns that calling the tool pays. A
# response is the call (~85 tokens in Hermes JSON), the result and the answer. See docs/agents.md.
CALCULATOR_PRESET = _GRPO_DEMO + [
    "data.train_batch_size=16",
    "data.max_prompt_length=32",
    "data.max_response_length=112",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "trainer.total_training_steps=30",
    "trainer.experiment_name=calculator",
    "trainer.default_local_dir=outputs/calculator",
    "actor_rollout_ref.rollout.multi_turn.enable=true",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
    # The first phase: 16 conversations a step at lr 2e-3 with the gradient norm clipped to 1 copies the
    # result after 340-420 steps (seeds 0-2); 32 a step at 1e-3 needed ~480, twice the time. Unclipped at 2e-3,
    # seed 2 was still on the plateau at step 1,700; at 3e-3 copying began only after ~1,200 steps. 128
    # samples per check tell 0.01 from 0.1; a multi-turn check costs ~100 generated tokens per sample, so
    # check every 20 steps.
    "sft_warmstart.lr=2e-3",
    "sft_warmstart.batch_size=16",
    "sft_warmstart.grad_clip=1.0",
    "sft_warmstart.target_accuracy=0.2",
    "sft_warmstart.eval_every=20",
    "sft_warmstart.eval_samples=128",
    # The second phase flips from calling on every prompt to calling on almost none within one or two
    # steps, then the share of calls climbs back and oscillates: it stops on the measured share, not after
    # a fixed count (40 steps was on one side of the flip or the other depending on the first phase).
    "sft_warmstart.direct_steps=200",
    "sft_warmstart.direct_lr=1e-3",
    "sft_warmstart.direct_batch_size=32",
    "sft_warmstart.direct_tool_share=0.15",
    "sft_warmstart.direct_tool_calls=0.1",
]

# ``data.builtin_task=spell``: numbers spelled digit by digit, 1 to 12 digits with a long tail of long ones
# (responses of 3 to ~66 characters): the workload of benchmarks/bench_async.py. A warm start to held-out
# sampled score 0.5 (graded word by word), then GRPO.
SPELL_PRESET = _GRPO_DEMO + [
    "data.train_batch_size=16",
    "data.max_prompt_length=32",
    "data.max_response_length=72",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "trainer.total_training_steps=60",
    "trainer.experiment_name=spell",
    "trainer.default_local_dir=outputs/spell",
    "sft_warmstart.lr=3e-3",
    "sft_warmstart.batch_size=32",
    "sft_warmstart.target_accuracy=0.5",
    "sft_warmstart.eval_every=20",
    "sft_warmstart.eval_samples=64",
]

# ``data.builtin_task=shapes``: the visual demo. The built-in tiny Qwen2-VL says the colour of the largest
# shape in a picture (docs/vision.md): a warm start with the pictures to held-out sampled accuracy 0.4,
# checked every 20 steps on 200 prompts (just past the jump below), then GRPO with the hf engine (native
# decodes text models). RL's lr (measured with the earlier stop at 0.3): 3e-4 rose steadily (sampled
# 0.32 -> 0.56), 1e-3 drifted (KL 0.2-0.7, no rise in 40), 1e-4 rose half as fast.
SHAPES_PRESET = _GRPO_DEMO + [
    "data.train_batch_size=16",
    "data.max_prompt_length=48",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.optim.lr=3e-4",
    "actor_rollout_ref.rollout.name=hf",
    "trainer.total_training_steps=100",
    "trainer.test_freq=20",
    "trainer.experiment_name=shapes",
    "trainer.default_local_dir=outputs/shapes",
    # The warm start's held-out sampled accuracy sits at 0.23-0.28 for 200-400 steps (one colour, whatever the
    # picture), then jumps to ~0.45 once the model reads the pictures. A stop at 0.3 on 64 samples (sd ~0.055
    # there) could come on that plateau: seeds 2 and 3 stopped at step 100, and seed 3's RL then stayed at
    # chance for 100 steps. 0.4 on 200 samples is 3.8 sds above the plateau.
    "sft_warmstart.lr=2e-3",
    "sft_warmstart.batch_size=16",
    "sft_warmstart.target_accuracy=0.4",
    "sft_warmstart.eval_every=20",
    "sft_warmstart.eval_samples=200",
]

PRESETS = {"addition": DEMO_PRESET, "calculator": CALCULATOR_PRESET, "spell": SPELL_PRESET, "shapes": SHAPES_PRESET}


def demo_preset(config) -> list[str] | None:
    """The preset of a built-in demo (the built-in model on a built-in task that has one), else None."""
    if config.actor_rollout_ref.model.path is not None or config.data.train_files is not None:
        return None
    preset = PRESETS.get(config.data.builtin_task)
    if preset is CALCULATOR_PRESET:
        preset = preset + [f"actor_rollout_ref.rollout.multi_turn.function_tool_path={_builtin_tools_file()}"]
    return preset


def is_demo(config) -> bool:
    """The built-in model on a built-in task with a preset: the case the presets and the warm start are for."""
    return demo_preset(config) is not None
