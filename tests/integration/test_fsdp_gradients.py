"""FSDP2 over 2 CPU ranks gives the gradients of the unwrapped model, for OPT and Qwen2 (and Llama).

Each rank holds half of a batch; the sharded model's summed gradients must equal those of the
plain model on the whole batch. OPT's decoder layer returns a view tensor, which FSDP2 warns can
drop its backward all-gather: ``parallelize`` replaces such outputs by copies, so the warning
must not appear and the gradients must match.
"""

import textwrap

import pytest

from helpers import run_torchrun
from verl.models.tiny import make_tiny_model_folder

pytestmark = pytest.mark.slow

RANK_SCRIPT = textwrap.dedent('''
    import copy, sys, warnings
    import torch
    torch.set_num_threads(1)
    import torch.distributed as dist
    from verl.config import TrainerConfig
    from verl.distributed.fsdp import parallelize
    from verl.distributed.process_group import ensure_process_group
    from verl.models.loading import load_causal_lm

    warnings.simplefilter("always")
    ensure_process_group()
    rank = dist.get_rank()
    out = sys.argv[-1]
    report = []
    for path in sys.argv[1:-1]:
        plain = load_causal_lm(path, disable_dropout=True)
        with warnings.catch_warnings(record=True) as caught:
            wrapped = parallelize(copy.deepcopy(plain), TrainerConfig().actor_rollout_ref.actor.fsdp_config,
                                  device="cpu")
            ids = torch.randint(3, 200, (4, 10), generator=torch.Generator().manual_seed(0))
            weights = torch.linspace(0.5, 2.0, 200)

            def loss_of(model, rows):  # a loss that touches every logit, normalised by the whole batch
                logits = model(input_ids=ids[rows]).logits.float()
                return (logits.logsumexp(-1) * weights[ids[rows]]).sum() / 4

            loss_of(plain, slice(0, 4)).backward()
            loss_of(wrapped, slice(2 * rank, 2 * rank + 2)).backward()
        scale = max(p.grad.abs().max().item() for p in plain.parameters())
        worst = max((q.grad.full_tensor() - p.grad).abs().max().item()
                    for p, q in zip(plain.parameters(), wrapped.parameters()))
        views = [str(w.message) for w in caught if "view tensor" in str(w.message)]
        report.append(f"{path} scale={scale:.3e} worst={worst:.3e} view_warnings={len(views)}")
    if rank == 0:
        open(out, "w").write("\\n".join(report))
''')


def test_sharded_gradients_equal_the_unwrapped_models(tmp_path):
    folders = [make_tiny_model_folder(tmp_path / arch, arch=arch) for arch in ("opt", "qwen2", "llama")]
    report = tmp_path / "report.txt"
    run_torchrun(RANK_SCRIPT, *folders, report, tmp_path=tmp_path)
    lines = report.read_text().splitlines()
    assert len(lines) == 3
    for line in lines:
        fields = dict(part.split("=") for part in line.split()[1:])
        assert float(fields["scale"]) > 1e-3, line  # real gradients
        assert float(fields["worst"]) <= 1e-5 * float(fields["scale"]), line
        assert fields["view_warnings"] == "0", line
