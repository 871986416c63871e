"""What a tokenizer's chat template says about turns: the token that closes an assistant turn (an eos a
response stops at, :func:`verl.rollout.base.policy_eos`; where an SFT conversation's assistant turn ends), and a
marker content to find an assistant turn by in a rendering."""

from __future__ import annotations

TURN_MARK = "\u2402verl-turn-end\u2402"  # an assistant message no template rewrites (a stand-in to find it by)


def chat_turn_end(tokenizer) -> int | None:
    """The special token a tokenizer's chat template puts right after an assistant message's content (the
    end-of-turn token), or None: no template, the template does not render a plain user/assistant pair, or
    what follows the content is text, not one special (or added) token."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "1"},
                                              {"role": "assistant", "content": TURN_MARK}], tokenize=False)
        cut = text.rfind(TURN_MARK)
        after = tokenizer(text[cut + len(TURN_MARK):], add_special_tokens=False)["input_ids"] if cut >= 0 else []
        # a special token, or any added one (some tokenizers add their turn markers as non-special tokens)
        special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    except Exception:  # a template with its own rules (a system turn first, typed content, ...)
        return None
    if not after:
        return None
    return after[0] if after[0] in special else None


def turn_end_ids(tokenizer) -> list[int]:
    """The tokens that end an assistant turn by the tokenizer alone, each once: its eos, then the token its chat
    template closes an assistant turn with (:func:`chat_turn_end`). A model's generation config may name more
    (:func:`verl.rollout.base.policy_eos`)."""
    return list(dict.fromkeys(i for i in (tokenizer.eos_token_id, chat_turn_end(tokenizer)) if i is not None))
