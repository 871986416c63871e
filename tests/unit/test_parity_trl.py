"""benchmarks/parity_trl.py and parity_trl_fixed.py without running anything: the agreement arithmetic
(against numbers worked by hand), the arguments, both sides' command lines and the reading of their metrics.

TRL is not needed (the benchmark runs it from its own virtualenv).
"""

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def parity(load_benchmark):
    return load_benchmark("parity_trl")


@pytest.fixture(scope="module")
def fixed(load_benchmark):
    return load_benchmark("parity_trl_fixed")


def test_window_means_by_hand(parity):
    assert parity.window_means([1, 2, 3, 4, 5], 2) == [1.5, 3.5]  # the short last window (5) is dropped
    assert parity.window_means([1, 2], 5) == [1.5]  # unless it is the only one
    assert parity.window_means([], 3) == []
    with pytest.raises(ValueError):
        parity.window_means([1.0], 0)


def test_per_step_and_moving_average_by_hand(parity):
    assert parity.per_step([[1, 2], [3, 6]]) == [(2, 1, 3), (4, 2, 6)]
    with pytest.raises(ValueError):
        parity.per_step([[1, 2], [3]])
    assert parity.moving_average([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]


def test_compare_windows_by_hand(parity):
    ours = [[0.1, 0.3, 0.5, 0.7], [0.3, 0.5, 0.7, 0.9]]  # seed window means (0.2, 0.6) and (0.4, 0.8)
    trl = [[0.2, 0.2, 0.6, 0.6], [0.4, 0.4, 0.8, 1.0]]  # (0.2, 0.6) and (0.4, 0.9)
    first, second = parity.compare_windows(ours, trl, 2)
    assert (first["first_step"], first["last_step"], second["first_step"], second["last_step"]) == (1, 2, 3, 4)
    # Window 1: ours 0.3 (range 0.2), TRL 0.3 (range 0.2): gap 0 <= 0.2.
    assert first["ours"] == pytest.approx(0.3) and first["trl"] == pytest.approx(0.3)
    assert first["gap"] == pytest.approx(0.0) and first["spread"] == pytest.approx(0.2) and first["agree"]
    # Window 2: ours 0.7 (range 0.2), TRL 0.75 (range 0.3): gap -0.05, spread 0.3.
    assert second["gap"] == pytest.approx(-0.05) and second["spread"] == pytest.approx(0.3) and second["agree"]
    assert second["ours_spread"] == pytest.approx(0.2) and second["trl_spread"] == pytest.approx(0.3)
    # TRL 0.5 higher everywhere: gaps -0.5 and -0.55 against spreads 0.2 and 0.3.
    shifted = [[x + 0.5 for x in seed] for seed in trl]
    rows = parity.compare_windows(ours, shifted, 2)
    assert [r["gap"] for r in rows] == pytest.approx([-0.5, -0.55])
    assert [r["agree"] for r in rows] == [False, False]


def test_metric_verdict_by_hand(parity):
    # Window 1 step: ours 0.5 (range 1) at every step; TRL 0.5 (range 1), and 2.5 at step 5: 4 of 5 windows agree.
    ours = [[0, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    trl = [[0, 0, 0, 0, 2], [1, 1, 1, 1, 3]]
    verdict = parity.metric_verdict(ours, trl, 1, 0.8)
    assert verdict["windows_agree"] == 4 and len(verdict["windows"]) == 5
    # Whole run: ours seeds 0 and 1 (0.5, range 1), TRL 0.4 and 1.4 (0.9, range 1): gap -0.4 <= 1.
    assert verdict["whole"]["gap"] == pytest.approx(-0.4) and verdict["whole"]["agree"]
    assert verdict["agree"]  # 4 >= 0.8 x 5
    assert not parity.metric_verdict(ours, trl, 1, 0.9)["agree"]  # 4 < 4.5
    # The whole run alone can fail the verdict: TRL 3 higher on every step.
    far = [[x + 3 for x in seed] for seed in ours]
    assert not parity.metric_verdict(ours, far, 5, 0.0)["agree"]


def test_arguments(parity):
    args = parity.parse_args([])
    assert args.settings == ["grpo", "dr_grpo", "grpo_seqmean"]
    assert (args.seeds, args.steps, args.window, args.jobs, args.threads) == ([1, 2, 3], 300, 20, 2, 1)
    assert args.min_fraction == 0.8 and args.lr == 1e-4
    assert args.trl_venv == Path("/tmp/verl-bench-trl")
    for bad in (["--seeds", "1"], ["--seeds", "2", "2"], ["--min-fraction", "1.5"], ["--steps", "0"],
                ["--settings", "ppo"]):
        with pytest.raises(SystemExit):
            parity.parse_args(bad)


def test_commands_match_each_setting(parity, tmp_path):
    from verl.trainer.demo import DEMO_PRESET

    args = parity.parse_args(["--steps", "7"])
    for setting, spec in parity.SETTINGS.items():
        cmd = parity.ours_command(args, tmp_path / "model", tmp_path / "run", setting, 3)
        assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
        keys = [k.split("=", 1)[0] for k in cmd[3:]]
        assert len(keys) == len(set(keys)), "a key given twice"
        assert set(spec["ours"]) <= set(cmd)
        # The seed sets the prompt order too (data.seed defaults to a fixed 1; TRL's sampler follows its seed).
        assert {"trainer.seed=3", "data.seed=3", "trainer.total_training_steps=7",
                "actor_rollout_ref.actor.ppo_epochs=1",
                f"actor_rollout_ref.model.path={tmp_path / 'model'}"} <= set(cmd)
        # Every key the demo preset sets is given explicitly (the preset does not apply to a model folder).
        assert {k.split("=", 1)[0] for k in DEMO_PRESET} <= set(keys)
        trl = parity.trl_command(Path("/venv/python"), tmp_path / "s.py", args, tmp_path / "model", tmp_path,
                                 setting, 3)
        cfg = json.loads(trl[2])
        assert {k: cfg[k] for k in spec["trl"]} == spec["trl"]
        assert (cfg["seed"], cfg["steps"], cfg["optim"], cfg["epsilon"]) == (3, 7, "adamw_torch", 0.2)
        assert (cfg["prompts_per_step"], cfg["samples_per_prompt"], cfg["max_new_tokens"]) == (16, 8, 6)
    # The KL term is on in grpo alone, with the same coefficient on both sides, and TRL logs its k3 clamped
    # at verl's bound too.
    assert parity.SETTINGS["grpo"]["trl"]["beta"] == 0.001
    assert parity.SETTINGS["grpo"]["trl"]["log_clamped_kl"] == 10.0
    # k3's own gradient on both sides: TRL's default multiplies k3 by the differentiable ratio.
    assert parity.SETTINGS["grpo"]["trl"]["use_bias_correction_kl"] is False
    assert "actor_rollout_ref.actor.use_kl_loss=true" in parity.SETTINGS["grpo"]["ours"]
    assert all(parity.SETTINGS[s]["trl"]["beta"] == 0 for s in ("dr_grpo", "grpo_seqmean"))


def test_load_curves_reads_both_sides(parity, tmp_path):
    ours = tmp_path / "ours" / "run"
    ours.mkdir(parents=True)
    rows = [{"step": 2, "critic/score/mean": 0.5, "actor/entropy": 0.4, "response_length/mean": 3.5,
             "actor/grad_norm": 2.0},
            {"step": 1, "critic/score/mean": 0.25, "actor/entropy": 0.5, "response_length/mean": 3.0,
             "actor/grad_norm": 1.0}]
    (ours / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    curves = parity.load_curves(tmp_path / "ours", "ours")
    assert curves == {"reward": [0.25, 0.5], "entropy": [0.5, 0.4], "response_length": [3.0, 3.5],
                      "grad_norm": [1.0, 2.0]}  # in step order; no KL logged, none read
    trl = tmp_path / "trl"
    trl.mkdir()
    history = [{"step": 1, "reward": 0.5, "kl": 12.0, "kl_clamped": 10.0, "entropy": 0.6,
                "completions/mean_length": 4.0, "grad_norm": 3.0},
               {"step": 1, "train_runtime": 9.0}]  # the closing summary has no reward: skipped
    (trl / "log_history.json").write_text(json.dumps(history))
    # The compared KL is TRL's k3 clamped as ours is; its own (unclamped) kl is kept beside it.
    assert parity.load_curves(trl, "TRL") == {"reward": [0.5], "kl": [10.0], "entropy": [0.6],
                                              "response_length": [4.0], "grad_norm": [3.0], "kl_unclamped": [12.0]}
    assert parity.load_curves(tmp_path / "missing", "TRL") == {}


def test_our_command_is_a_valid_config(parity, tmp_path):
    from verl.config import TrainerConfig

    args = parity.parse_args([])
    expected = {"grpo": ("token-mean", True, True), "dr_grpo": ("seq-mean-token-sum-norm", False, False),
                "grpo_seqmean": ("seq-mean-token-mean", True, False)}
    for setting, (agg, std, kl) in expected.items():
        cfg = TrainerConfig.from_cli(parity.ours_command(args, tmp_path / "m", tmp_path / "r", setting, 2)[3:])
        actor = cfg.actor_rollout_ref.actor
        assert (actor.loss_agg_mode, cfg.algorithm.norm_adv_by_std_in_grpo, actor.use_kl_loss) == (agg, std, kl)
        assert (cfg.data.seed, cfg.trainer.seed, cfg.data.max_response_length) == (2, 2, parity.MAX_NEW_TOKENS)
        assert (actor.optim.weight_decay, list(actor.optim.betas), actor.optim.eps) == (0.0, [0.9, 0.999], 1e-8)


def test_fixed_batches_arithmetic_and_arguments(fixed):
    assert fixed.relative_difference(4.0, 5.0) == pytest.approx(0.2)  # |4 - 5| / 5
    assert fixed.relative_difference(-2.0, 2.0) == pytest.approx(2.0)
    assert fixed.relative_difference(0.0, 0.0) == 0.0
    args = fixed.parse_args([])
    assert (args.steps, args.seed, args.tolerance, args.kl_coef) == (3, 0, 1e-3, None)
    assert args.settings == ["grpo", "dr_grpo", "grpo_seqmean"]
    for bad in (["--steps", "0"], ["--tolerance", "0"]):
        with pytest.raises(SystemExit):
            fixed.parse_args(bad)
