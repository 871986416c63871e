"""The reward-model role: scores (prompt, response) pairs with a learned sequence classifier.

Any Hugging Face ``AutoModelForSequenceClassification`` with one output works (a DeBERTa
reward model such as OpenAssistant/reward-model-deberta-v3-base, or a Llama/Qwen2 one). It reads
text through its own tokenizer, never the policy's ids:

1. Each response is decoded with the policy's tokenizer (valid tokens only, special tokens
   skipped). The prompt is the row's ``raw_prompt`` (chat messages or text) when the batch has
   one; otherwise the decoded prompt tokens (left padding stripped), as one user turn.
2. An RM tokenizer with a chat template gets the conversation ``[prompt messages..., assistant:
   response]`` rendered by that template. One without a template (DeBERTa-style classifiers) gets
   ``(prompt, response)`` as a text pair, the way those models were trained; a tokenizer without
   a pair format joins the two.
3. Truncation to ``max_length`` tokens cuts the start of the input, so the response, which is
   what is judged, is kept: a rendered conversation loses its first tokens; a pair loses the start
   of its prompt, and the start of its response only when the response alone is too long.
4. Micro batches are padded on the right whatever the tokenizer's own setting, so every
   architecture sees its tokens at positions 0..n-1 (learned position tables) and its first token
   where a [CLS] pooler looks; the score of a sample does not depend on its neighbours.

The score is ``logits[:, 0]`` in float32; where it is placed on the tokens is the reward role's
business (:mod:`verl.workers.reward`).
"""

from __future__ import annotations

import logging

import torch

from verl.errors import ModelLoadError
from verl.models.loading import load_sequence_classifier, load_tokenizer, resolve_device
from verl.protocol import Batch

logger = logging.getLogger(__name__)

CONFIG_KEY = "reward_model.model.path"


class RewardModelWorker:
    """Scores rollout batches with a learned reward model.

    Args:
        config: a ``RewardModelConfig`` node (``reward_model.*``): ``model.path``,
            ``model.tokenizer_path``, ``model.trust_remote_code``, ``micro_batch_size_per_gpu``,
            ``max_length``.
        device: where the reward model runs; "auto" = cuda when visible, else cpu (see also :meth:`to`).
        policy_tokenizer: decodes the batch's prompt and response ids.
        default_max_length: the truncation length when ``config.max_length`` is null (the
            trainer passes prompt + response limits); None = never truncate.
        dtype: the reward model's parameter dtype.
    """

    def __init__(self, config, device: torch.device | str = "auto", *, policy_tokenizer,
                 default_max_length: int | None = None, dtype: str | torch.dtype = "float32"):
        if not config.model.path:
            raise ModelLoadError(f"reward_model.enable=true but `{CONFIG_KEY}` is not set; give the folder or hub "
                                 f"id of a sequence-classification reward model, or set reward_model.enable=false")
        path = str(config.model.path)
        tokenizer_path = str(config.model.tokenizer_path or path)
        trust = config.model.trust_remote_code
        self.device = resolve_device(device)
        self.policy_tokenizer = policy_tokenizer
        self.micro_batch_size = config.micro_batch_size_per_gpu
        self.max_length = config.max_length or default_max_length

        self.tokenizer = load_tokenizer(
            tokenizer_path, trust_remote_code=trust,
            config_key="reward_model.model.tokenizer_path" if config.model.tokenizer_path else CONFIG_KEY)
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"

        self.model = load_sequence_classifier(path, dtype=dtype, trust_remote_code=trust, config_key=CONFIG_KEY)
        head = self.model.config.num_labels
        if head != 1:
            raise ModelLoadError(
                f"{path!r} (from `{CONFIG_KEY}`) has a classification head with {head} outputs (logits "
                f"[B, {head}]); a reward model gives one score per sample (logits [B, 1]). Use a model trained as "
                f"a reward model (num_labels=1), or turn this classifier into one by fine-tuning a 1-output head.")
        # Decoder classifiers find each sample's last token by looking for the pad id in
        # config.pad_token_id: it must be the id the tokenizer pads with, and many configs leave it unset.
        text_config = self.model.config.get_text_config()
        if text_config.pad_token_id != self.tokenizer.pad_token_id:
            logger.info("reward model config.pad_token_id=%s; using the tokenizer's pad id %d",
                        text_config.pad_token_id, self.tokenizer.pad_token_id)
            text_config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(self.device)

    def to(self, device: torch.device | str) -> RewardModelWorker:
        """Move the reward model to ``device`` (scores still come back on the batch's device)."""
        self.device = torch.device(device)
        self.model.to(self.device)
        return self

    # ------------------------------------------------------------------ text
    def _prompts_and_responses(self, batch: Batch) -> tuple[list, list[str]]:
        """Per row: the prompt (a list of chat messages, or text) and the decoded response text."""
        responses, response_mask = batch["responses"], batch["response_mask"].bool()
        size = len(batch)
        response_texts = self.policy_tokenizer.batch_decode(
            [responses[i][response_mask[i]].tolist() for i in range(size)], skip_special_tokens=True)
        if "raw_prompt" in batch:
            return list(batch["raw_prompt"]), response_texts
        prompts = batch["prompts"]
        prompt_mask = batch["attention_mask"][:, :prompts.shape[1]].bool()
        prompt_texts = self.policy_tokenizer.batch_decode(
            [prompts[i][prompt_mask[i]].tolist() for i in range(size)], skip_special_tokens=True)
        return prompt_texts, response_texts

    def render(self, batch: Batch) -> list[str] | list[tuple[str, str]]:
        """What the RM tokenizer reads, per row: the conversation rendered by its chat template, or
        ``(prompt, response)`` text pairs when it has no template (see the module doc)."""
        prompts, responses = self._prompts_and_responses(batch)
        if self.tokenizer.chat_template is None:
            return [(p if isinstance(p, str) else "\n".join(str(m["content"]) for m in p), r)
                    for p, r in zip(prompts, responses)]
        conversations = [([{"role": "user", "content": p}] if isinstance(p, str) else [dict(m) for m in p])
                         + [{"role": "assistant", "content": r}] for p, r in zip(prompts, responses)]
        return [self.tokenizer.apply_chat_template(c, tokenize=False) for c in conversations]

    def encode(self, batch: Batch) -> list[dict[str, list[int]]]:
        """Per row, the RM tokenizer's unpadded encoding (``input_ids``, ``attention_mask``, and
        ``token_type_ids`` where the tokenizer makes them), truncated to ``max_length``."""
        limit = {"truncation": True, "max_length": self.max_length} if self.max_length else {}
        rendered = self.render(batch)
        if self.tokenizer.chat_template is not None:
            # A rendered template holds its own special tokens (BOS and the like).
            return [self.tokenizer(text, add_special_tokens=False, **limit).data for text in rendered]
        encodings = []
        for prompt, response in rendered:
            if limit:
                # Cut the prompt only, unless the response alone is too long (then both, longest first).
                response_len = len(self.tokenizer(response, add_special_tokens=False)["input_ids"])
                fits = response_len + self.tokenizer.num_special_tokens_to_add(pair=True) <= self.max_length
                limit["truncation"] = "only_first" if fits else "longest_first"
            encodings.append(self.tokenizer(prompt, response, **limit).data)
        return encodings

    # ----------------------------------------------------------------- score
    @torch.no_grad()
    def score(self, batch: Batch) -> torch.Tensor:
        """One reward per row: ``[B]`` float32 on the device of ``batch["responses"]``."""
        encodings = self.encode(batch)
        size = self.micro_batch_size or len(encodings)
        scores = []
        for start in range(0, len(encodings), size):
            inputs = self.tokenizer.pad(encodings[start:start + size], return_tensors="pt")
            logits = self.model(**{k: v.to(self.device) for k, v in inputs.items()}).logits
            scores.append(logits[:, 0].float())
        return torch.cat(scores).to(batch["responses"].device)
