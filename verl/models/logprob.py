"""Per-token log-probabilities and entropies of responses under a causal LM.

Sequences are laid out as in :mod:`verl.protocol`: a left-padded prompt followed by a
right-padded response. The logits at position t predict token t+1, so the response's
log-probs come from the T_resp positions that end one before the last.

Remove padding (``actor_rollout_ref.model.use_remove_padding``): the valid tokens of all rows are
concatenated into one row ``[1, N]`` with each sequence's own position ids (0, 1, ...) and no
attention mask. Hugging Face models that build their causal mask with ``masking_utils`` read the
sequence boundaries from where the position ids restart: a block-diagonal causal mask for
sdpa/eager (exact, though it saves no attention compute on CPU), varlen kernels for
flash_attention_2 (which is where the time is saved). :func:`check_packing` verifies this on the
model itself before a run relies on it; models that ignore the position ids when masking (OPT,
for one) are refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl.algorithms import entropy_from_logits
from verl.errors import VerlError
from verl.models.shared_prompt import keeps_logits, shared_prompt_logits
from verl.models.vision import (forbid_placeholders, forward_inputs, packed_forward_inputs, packed_position_ids,
                                 placeholder_ids)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] for each position: ``[..., V]``, ``[...]`` -> ``[...]``."""
    # cross_entropy fuses log_softmax and gather without materialising a second [.., V] tensor.
    flat = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), reduction="none")
    return -flat.view(labels.shape)


def response_logits(model, input_ids, attention_mask, position_ids, response_length: int, **extra):
    """Logits ``[B, T_resp, V]`` that predict each response token (the LM head runs on those
    positions only where the model takes ``logits_to_keep``: a vocabulary of 150k makes it most of
    the forward's memory). ``extra``: more inputs of the forward (a vision-language model's images)."""
    keep = {"logits_to_keep": response_length + 1} if keeps_logits(model) else {}
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                **extra, **keep)
    return out.logits[:, -response_length - 1:-1, :]


# ---------------------------------------------------------------------------- packing
class Packing:
    """Where the valid tokens of a padded batch ``[B, T]`` sit in its packed row ``[1, N]``.

    ``input_ids`` / ``position_ids``: the packed row. ``response_index`` ``[B, T_resp]``: the packed
    position whose output predicts (logits) or values (critic) each response token, and ``response_valid``
    where that exists (the response token and the one before it are both real tokens).
    """

    def __init__(self, input_ids, attention_mask, position_ids, response_length: int):
        valid = self.valid = attention_mask.bool()
        positions = position_ids[valid]
        # Boundaries are found where the position ids restart, so each sequence must count 0, 1, ...
        starts = torch.cumsum(valid.sum(-1), 0) - valid.sum(-1)
        expected = torch.arange(positions.numel(), device=positions.device) - starts.repeat_interleave(valid.sum(-1))
        if not torch.equal(positions, expected):
            raise VerlError("actor_rollout_ref.model.use_remove_padding=true needs position ids that count "
                            "0, 1, 2, ... over each row's real tokens (the cumulative sum of the attention "
                            "mask minus one); these do not, so the packed sequences cannot be told apart")
        self.input_ids = input_ids[valid].unsqueeze(0)
        self.position_ids = positions.unsqueeze(0)
        flat = (torch.cumsum(valid.flatten(), 0) - 1).view(valid.shape)
        before = slice(-response_length - 1, -1)
        self.response_valid = valid[:, before] & valid[:, -response_length:]
        self.response_index = flat[:, before][self.response_valid]

    def responses(self, packed: torch.Tensor) -> torch.Tensor:
        """Per-packed-token outputs ``[1, N, ...]`` -> those of the valid response positions ``[M, ...]``."""
        return packed[0, self.response_index]

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """``[M]`` values of the valid response positions -> ``[B, T_resp]``, 0 elsewhere (with gradients)."""
        out = values.new_zeros(self.response_valid.shape)
        return out.masked_scatter(self.response_valid, values)


def check_packing(model, device, key: str, *, forward=None) -> None:
    """Raise a VerlError naming ``key`` unless ``model`` keeps packed sequences apart.

    Two short sequences run packed into one row and each on its own; their outputs must agree.
    ``forward(input_ids, position_ids)`` returns per-token outputs ``[1, N, ...]`` (default: the
    causal LM's logits). A collective under FSDP: every rank checks at the same time.
    """
    forward = forward or (lambda ids, pos: model(input_ids=ids, position_ids=pos, use_cache=False).logits)
    vocab = model.config.get_text_config().vocab_size  # a vision-language model's: its language model's
    first, second = [(7 * i + 3) % vocab for i in range(5)], [(11 * i + 5) % vocab for i in range(4)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ids = torch.tensor([first + second], device=device)
            pos = torch.tensor([list(range(len(first))) + list(range(len(second)))], device=device)
            packed = forward(ids, packed_position_ids(model, pos)).float()
            alone_pos = packed_position_ids(model, torch.arange(len(second), device=device)[None])
            alone = forward(torch.tensor([second], device=device), alone_pos).float()
    finally:
        model.train(was_training)
    error = (packed[0, len(first):] - alone[0]).abs().max().item()
    scale = alone.abs().max().item() + 1e-6
    # Rounding alone stays near the dtype's epsilon; attention leaking across sequences does not.
    tolerance = 1e-4 if next(model.parameters()).dtype == torch.float32 else 3e-2
    if not error <= tolerance * scale:
        raise VerlError(
            f"{key}=true: {model.config.model_type} with attn_implementation="
            f"{model.config._attn_implementation} does not keep packed sequences apart "
            f"(a packed sequence's outputs differ from its own by {error:.3g}, relative {error / scale:.3g}); "
            f"packing needs a model whose causal mask follows the position ids (Hugging Face models built on "
            f"masking_utils.create_causal_mask with position_ids, e.g. Llama, Qwen2, GPT-2; or flash_attention_2). "
            f"Set {key}=false")


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """sum_v softmax(logits)_v^2 at each position: ``[..., V]`` -> ``[...]`` (read by the optimal
    token baseline estimator)."""
    return torch.softmax(logits.float(), dim=-1).pow(2).sum(dim=-1)


def compute_response_logprobs(model, input_ids, attention_mask, position_ids, responses, *,
                              temperature: float = 1.0, with_entropy: bool = False, remove_padding: bool = False,
                              with_sum_pi_squared: bool = False, share_prompts: bool = False, media=None):
    """Log-probs ``[B, T_resp]`` of ``responses`` (and entropies when asked) under ``model``.

    Logits are divided by the sampling temperature so the numbers describe the distribution the
    rollout actually sampled from (for greedy decoding pass 1.0). With ``remove_padding`` the
    forward pass runs on the packed sequences and padding positions get 0. With
    ``with_sum_pi_squared`` a third value is returned: sum_v pi(v)^2 at each response token.
    With ``share_prompts`` each distinct prompt runs once (:mod:`verl.models.shared_prompt`).
    ``media``: the rows' ``multi_modal_inputs`` (a vision-language model, :mod:`verl.models.vision`):
    the forward (padded or packed) with the images and the model's M-RoPE positions (shared prompts
    do not apply to rows with images).
    """
    extra = {} if remove_padding else forward_inputs(media, input_ids, attention_mask, model)
    if extra:
        logits = response_logits(model, input_ids, attention_mask, extra.pop("position_ids"), responses.shape[1],
                                 **extra)
        labels = responses
    elif remove_padding:
        packing = Packing(input_ids, attention_mask, position_ids, responses.shape[1])
        out = model(input_ids=packing.input_ids, use_cache=False,
                    **packed_forward_inputs(media, input_ids, attention_mask, packing.position_ids, model))
        logits = packing.responses(out.logits)
        labels = responses[packing.response_valid]
    elif share_prompts:
        logits = shared_prompt_logits(model, input_ids, attention_mask, position_ids, responses.shape[1])
        labels = responses
    else:
        logits = response_logits(model, input_ids, attention_mask, position_ids, responses.shape[1])
        labels = responses
    # A vision-language policy never emits its image placeholders (the rollout forbids them): a
    # text model has none.
    logits = forbid_placeholders(logits, placeholder_ids(model))
    if temperature != 1.0 and temperature > 0:
        logits = logits / temperature
    log_probs = logprobs_from_logits(logits, labels)
    entropy = entropy_from_logits(logits.float()) if with_entropy else None
    spp = sum_pi_squared_from_logits(logits) if with_sum_pi_squared else None
    if remove_padding:
        log_probs = packing.unpack(log_probs)
        entropy = packing.unpack(entropy) if with_entropy else None
        spp = packing.unpack(spp) if with_sum_pi_squared else None
    if with_sum_pi_squared:
        return log_probs, entropy, spp
    return log_probs, entropy
