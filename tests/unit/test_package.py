"""The package surface: a light `import verl`, lazy top-level names, the torch version gate at
import, and the tutorial's `verl.utils.model.load_hf_model`."""

import importlib.util
import logging
import subprocess
import sys

import pytest
import torch

import verl
from verl.errors import ModelLoadError


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_verl_gives_the_version_without_importing_torch_or_transformers():
    proc = run_python("import sys, verl; print(verl.__version__, 'torch' in sys.modules, "
                      "'transformers' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [verl.__version__, "False", "False"]


def test_tutorial_imports_resolve_to_the_real_classes():
    from verl import ActorRolloutRefWorker, TrainerConfig
    from verl.config import TrainerConfig as ConfigTrainerConfig
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker as WorkerClass

    assert TrainerConfig is ConfigTrainerConfig
    assert ActorRolloutRefWorker is WorkerClass


def test_every_name_in_all_resolves_and_unknown_names_raise_attribute_error():
    for name in verl.__all__:
        assert getattr(verl, name) is not None, name
        assert name in dir(verl)
    with pytest.raises(AttributeError, match="no attribute 'NotAThing'"):
        verl.NotAThing  # noqa: B018


def test_too_old_torch_fails_at_import_naming_the_minimum_version_and_the_install_command():
    proc = run_python(
        "import importlib.metadata as m\n"
        "real = m.version\n"
        "m.version = lambda name: '2.3.1+cu121' if name == 'torch' else real(name)\n"
        "import verl\n")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:")
    assert "2.6" in last and "2.3.1+cu121" in last and "pip install --upgrade 'torch>=2.6'" in last


@pytest.mark.skipif(torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None,
                    reason="flash-attention can run here, so there is no fallback to see")
def test_load_hf_model_as_the_tutorial_writes_it_gives_bf16_weights_and_falls_back_to_sdpa(tiny_model_dir, caplog):
    from verl.utils.model import load_hf_model

    with caplog.at_level(logging.WARNING, logger="verl.models.loading"):
        model = load_hf_model(model_name_or_path=str(tiny_model_dir), torch_dtype=torch.bfloat16,
                              attn_implementation="flash_attention_2", trust_remote_code=True)
    assert next(model.parameters()).dtype == torch.bfloat16
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "flash_attention_2" in warnings[0].getMessage()
    assert model.config._attn_implementation == "sdpa"


def test_load_hf_model_takes_dtype_names_and_the_dtype_keyword(tiny_model_dir):
    from verl.utils.model import load_hf_model

    assert next(load_hf_model(str(tiny_model_dir), "bf16").parameters()).dtype == torch.bfloat16
    assert next(load_hf_model(str(tiny_model_dir), dtype="float16").parameters()).dtype == torch.float16
    assert next(load_hf_model(str(tiny_model_dir)).parameters()).dtype == torch.float32
    with pytest.raises(ModelLoadError, match="give one of them"):
        load_hf_model(str(tiny_model_dir), torch_dtype=torch.bfloat16, dtype=torch.float16)


def test_load_hf_model_on_a_missing_folder_names_the_argument(tmp_path):
    from verl.utils.model import load_hf_model

    with pytest.raises(ModelLoadError, match="model_name_or_path") as err:
        load_hf_model(str(tmp_path / "no-such-model"))
    assert "no-such-model" in str(err.value)


def test_load_hf_tokenizer_pads_on_the_left_with_a_pad_token(tiny_model_dir):
    from verl.utils.model import load_hf_tokenizer

    tok = load_hf_tokenizer(str(tiny_model_dir), trust_remote_code=True)
    assert tok.padding_side == "left" and tok.pad_token is not None
    assert tok.decode(tok("hi")["input_ids"], skip_special_tokens=True) == "hi"
