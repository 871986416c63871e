"""Log-probs of responses that share prompts, with each distinct prompt run once.

GRPO and its relatives sample ``n`` responses per prompt, so a batch holds every prompt ``n``
times. Under a causal mask a prompt's tokens attend only to the prompt, so their hidden states,
keys and values are the same in all ``n`` rows: the plain forward computes them ``n`` times.
Here each distinct prompt but its last token runs once (``[U, T_prompt - 1]``, with the cache
kept), its keys and values are gathered out to the ``B`` rows that hold it, and the last prompt
token and the responses run on top (``[B, T_resp]``, attending to the gathered prompt): that pass's
logits predict the response tokens. Gradients flow
back through the gather, so each prompt token receives the sum over its rows: the same gradient as
the plain forward, up to float rounding (tested). With 8 samples of 13-token prompts and 4-token
responses, the forward and backward cost about a third of the plain ones on a CPU.

This is verl's ``actor_rollout_ref.actor.use_prefix_grouper`` (verl patches the attention instead;
the result is the same). :func:`prompt_sharing_unsupported` says why a model cannot (its cache is
not returned, a sliding window, gradient checkpointing) and checks on the model itself that both
ways give the same log-probs.

Rows whose prompts all differ still take two passes (the same FLOPs, more calls): which path runs
never depends on the data, so that FSDP ranks always run the same forward calls.
"""

from __future__ import annotations

import functools
import inspect
import logging

import torch

from verl.errors import VerlError

logger = logging.getLogger(__name__)


def _forward_parameters(model) -> frozenset[str]:
    """The keyword names ``model.forward`` takes (a PEFT wrapper's base model's, which it passes on)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _parameters_of(type(base))


@functools.lru_cache(maxsize=None)
def _parameters_of(cls) -> frozenset[str]:
    return frozenset(inspect.signature(cls.forward).parameters)


def cache_kwarg(model) -> str:
    """transformers renamed the forward's ``past_key_values`` to ``cache`` (the old name warns, then goes)."""
    return "cache" if "cache" in _forward_parameters(model) else "past_key_values"


def keeps_logits(model) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (the LM head runs only on the last positions)."""
    return "logits_to_keep" in _forward_parameters(model)


def distinct_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, inverse)`` of prompts ``[B, T_prompt]``: the first row of each distinct prompt ``[U]``,
    in increasing order, and for every row the position of its prompt among them, so that
    ``prompts[first][inverse] == prompts``. Two rows hold the same prompt when their masks and their
    unmasked tokens agree (a pad's id does not count). All rows distinct: both are ``arange(B)``."""
    mask = attention_mask.to(input_ids.dtype)
    _, groups = torch.unique(torch.cat([input_ids * mask, mask], dim=1), dim=0, return_inverse=True)
    index = torch.arange(len(groups), device=groups.device)
    first = torch.full((int(groups.max()) + 1,), len(groups), dtype=torch.long, device=groups.device)
    first.scatter_reduce_(0, groups, index, reduce="amin")  # each group's smallest row
    order = first.argsort()
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=order.device)
    return first[order], rank[groups]


def shared_prompt_logits(model, input_ids, attention_mask, position_ids, response_length: int) -> torch.Tensor:
    """Logits ``[B, T_resp, V]`` that predict each response token, each distinct prompt run once.

    The layout is :mod:`verl.protocol`'s: a left-padded prompt, then a right-padded response.
    """
    window = sliding_window(model.config)
    prompt_length = input_ids.shape[1] - response_length
    if window is not None and input_ids.shape[1] > window:
        # Sharing was switched on because the run's sequences fit in the window; a longer batch (an image's
        # tokens, a multi-turn sample) runs every prompt with each sample, as a model without sharing does.
        reason = (f"a batch of {input_ids.shape[1]}-token sequences is longer than the model's {window}-token "
                  f"sliding window")
        if f"window {window}" not in _reported:
            _reported.add(f"window {window}")
            logger.warning("%s: %s, so its prompts run with each sample (the same numbers, more time); said once "
                           "a process", KEY, reason)
        return _plain_logits(model, input_ids, attention_mask, position_ids, response_length)
    if prompt_length < 2:  # nothing before the last prompt token to share
        return _plain_logits(model, input_ids, attention_mask, position_ids, response_length)
    first, inverse = distinct_prompts(input_ids[:, :prompt_length], attention_mask[:, :prompt_length])
    # The prompt pass stops one token short: the last prompt token (never padding, the prompt being
    # left-padded) runs again in every row with the responses, so that all the logits come from one
    # LM-head product over B x T_resp rows. Then they do not depend on how many distinct prompts a
    # micro-batch holds (a product over U rows rounds differently for each U), and the reference's pass
    # and the update's micro-batches give the same numbers for the same rows.
    shared = prompt_length - 1
    kwarg = cache_kwarg(model)
    prompt = model(input_ids=input_ids[first, :shared], attention_mask=attention_mask[first, :shared],
                   position_ids=position_ids[first, :shared], use_cache=True, logits_to_keep=1)
    cache = prompt.get(kwarg)
    if cache is None:
        raise RuntimeError(f"{type(model).__name__} returned no cache from a forward with use_cache=True")
    cache.batch_select_indices(inverse)
    end = input_ids.shape[1] - 1  # the last response token predicts nothing
    rest = model(input_ids=input_ids[:, shared:end], attention_mask=attention_mask[:, :end],
                 position_ids=position_ids[:, shared:end], use_cache=False, **{kwarg: cache})
    if not torch.is_grad_enabled():
        return rest.logits
    # The backward reaches the prompt pass through its keys and values only. FSDP gathers a layer's
    # weights for the backward when the gradient arrives at the layer's output, so the prompt pass's
    # own output stays in the graph, with weight zero (adding 0 changes no logit).
    return rest.logits + 0 * prompt.logits.sum()


def _plain_logits(model, input_ids, attention_mask, position_ids, response_length: int) -> torch.Tensor:
    from verl.models.logprob import response_logits

    return response_logits(model, input_ids, attention_mask, position_ids, response_length)


def _dropout_settings(config, prefix: str = "") -> list[str]:
    """The config's nonzero dropout probabilities (``dropout``, ``attention_dropout``, ``resid_pdrop``, ...,
    in sub-configs too), as ``name=value``."""
    found = []
    for key, value in vars(config).items():
        if ("dropout" in key or key.endswith("pdrop")) and isinstance(value, float) and value > 0:
            found.append(f"{prefix}{key}={value:g}")
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):  # a nested config (text, vision)
            found += _dropout_settings(value, f"{prefix}{key}.")
    return found


def sliding_window(config) -> int | None:
    """The sliding window of the model's attention (0 when it has one of unknown size), or None (full attention)."""
    layer_types = getattr(config, "layer_types", None) or ()
    sliding = any("sliding" in str(t) for t in layer_types)
    if not layer_types and getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        sliding = True
    return int(getattr(config, "sliding_window", None) or 0) if sliding else None


def _static_reason(model, max_length: int | None = None) -> str | None:
    config = model.config
    if any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
        return "gradient checkpointing is on (it drops the prompt's cache)"
    dropouts = _dropout_settings(config) + [name for name, m in model.named_modules()
                                            if isinstance(m, torch.nn.Dropout) and m.p > 0]
    if dropouts:
        return (f"dropout is on ({', '.join(dropouts[:3])}: the n samples of a prompt would share one dropout "
                f"mask; actor_rollout_ref.model.disable_dropout=true sets it to 0)")
    # Sequences that fit in the window attend as with full attention, and the prompt's cache keeps all of them.
    window = sliding_window(config)
    if window is not None and (max_length is None or max_length > window):
        longer = f"the run's sequences of up to {max_length} tokens" if max_length else "sequences of any length"
        return (f"{config.model_type} has sliding-window attention of {window} tokens (its cache keeps only the "
                f"window) and {longer} may not fit in it")
    if not keeps_logits(model):
        return f"{type(model).__name__}.forward takes no logits_to_keep"
    return None


def prompt_sharing_unsupported(model, device, max_length: int | None = None) -> str | None:
    """Why ``model`` cannot run :func:`shared_prompt_logits`, or None: the static reasons above, then
    the model itself, on three rows (two sharing a prompt, one left-padded), must give the plain
    forward's log-probs. ``max_length``: the longest sequence (prompt + response) the run passes (a model with a
    sliding window shares prompts when the window holds it). A collective under FSDP: every rank checks at the
    same time."""
    reason = _static_reason(model, max_length)
    if reason is not None:
        return reason
    vocab = model.config.vocab_size
    prompts = [[(7 * i + 3) % vocab for i in range(5)]] * 2 + [[0] + [(5 * i + 1) % vocab for i in range(4)]]
    responses = [[(11 * i + 5) % vocab for i in range(3)], [(13 * i + 2) % vocab for i in range(3)],
                 [(3 * i + 7) % vocab for i in range(3)]]
    ids = torch.tensor([p + r for p, r in zip(prompts, responses)], device=device)
    mask = torch.ones_like(ids)
    mask[2, 0] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            plain = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits[:, -4:-1]
            shared = shared_prompt_logits(model, ids, mask, positions, 3)
    except Exception as exc:  # noqa: BLE001 - any failure means "not supported", with its reason
        return f"its forward with a gathered prompt cache failed ({type(exc).__name__}: {exc})"
    finally:
        model.train(was_training)
    plain, shared = plain.float().log_softmax(-1), shared.float().log_softmax(-1)
    error = (plain - shared).abs().max().item()
    tolerance = 1e-4 if next(model.parameters()).dtype == torch.float32 else 5e-2
    if not error <= tolerance * (plain.abs().max().item() + 1e-6):
        return f"its log-probs with a shared prompt differ from the plain forward's by {error:.3g}"
    return None


KEY = "actor_rollout_ref.actor.use_prefix_grouper"
_reported: set[str] = set()


def resolve_prompt_sharing(model, device, setting: bool | None, *, remove_padding: bool,
                           max_length: int | None = None) -> bool:
    """Whether the forward passes of ``model`` share prompts, from ``setting`` (the key's value: None =
    where the model allows it, True = required, False = off). Packed sequences (``remove_padding``)
    take their own path. A model that cannot share is named once in the log (None) or refused (True).
    ``max_length``: the longest sequence the run passes, as :func:`prompt_sharing_unsupported` takes it."""
    if setting is False or remove_padding:
        return False
    reason = prompt_sharing_unsupported(model, device, max_length)
    if reason is None:
        return True
    if setting:
        raise VerlError(f"{KEY}=true, but {type(model).__name__} cannot run shared prompts: {reason}. "
                        f"Set it to false, or leave it null (on wherever it can be)")
    if reason not in _reported:
        _reported.add(reason)
        logger.warning("%s: each sample's prompt runs on its own, because %s", KEY, reason)
    return False
