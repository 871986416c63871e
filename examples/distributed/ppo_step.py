"""The tutorial's PPO update on a batch you bring, run as-is under torchrun (its section 5).

    python examples/distributed/ppo_step.py                              # one process
    torchrun --nproc_per_node=2 examples/distributed/ppo_step.py         # 2 ranks (GPUs, or CPU ranks)
    torchrun --nproc_per_node=4 --nnodes=2 --node_rank=0 --master_addr=10.0.0.1 examples/distributed/ppo_step.py

Nothing in the script knows how many processes run it: each rank builds the same worker, the
model is sharded over ``fsdp_size`` ranks (-1: all of them), and ``PPOTrainer.step`` gives each
rank its part of the batch. The losses printed are those of the whole batch: the same as in one
process, up to the rounding of bf16 compute. A tiny local OPT model stands in for
``facebook/opt-125m`` (no network needed).
"""

import sys

import torch

from verl import ActorRolloutRefWorker, TrainerConfig
from verl.distributed.process_group import leave_job
from verl.models.tiny import make_tiny_model_folder
from verl.trainer.ppo import PPOTrainer


def main(folder: str) -> None:
    torch.manual_seed(0)
    opt_path = str(make_tiny_model_folder(folder, arch="opt"))  # stands in for "facebook/opt-125m"

    config = TrainerConfig(actor_rollout_ref=dict(model=dict(path=opt_path), rollout=dict(name="hf")))
    # The tutorial's section 5.1, as written:
    config.actor_rollout_ref.actor.fsdp_config = dict(
        fsdp_size=-1,                # all ranks of the job
        param_offload=True,          # parameters in CPU memory between uses
        optimizer_offload=True,      # optimiser state in CPU memory between steps
        mixed_precision=dict(param_dtype="bf16", reduce_dtype="fp32"))
    worker = ActorRolloutRefWorker(config=config.actor_rollout_ref)

    # Four prompt+response rows; prompt_mask marks the prompt tokens, one reward per row.
    input_ids = torch.randint(3, 200, (4, 12))
    prompt_mask = torch.zeros(4, 12, dtype=torch.long)
    prompt_mask[:, :8] = 1
    batch = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), prompt_mask=prompt_mask,
                 reward=torch.tensor([1.0, 0.0, 0.5, -1.0]))

    trainer = PPOTrainer(actor_rollout_ref_worker=worker, config=dict(kl_coef=0.1, ppo_epochs=2, mini_batch_size=2))
    for step in range(2):
        loss = trainer.step(batch)
        if torch.distributed.get_rank() == 0:
            print(f"step {step}: policy_loss {loss['policy_loss']:.6f} value_loss {loss['value_loss']:.6f} "
                  f"grad_norm {loss['policy_grad_norm']:.6f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny-opt")
    leave_job()
