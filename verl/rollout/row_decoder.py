"""The native engine's decode loop over rows that come and go: continuous batching.

A :class:`RowDecoder` holds at most ``cap`` rows in its decode batch (``rollout.max_num_seqs``). Rows are
added at any time (:meth:`RowDecoder.add`); those that find no slot wait, and take the slots of rows
that finish (prefilled into them in place, :meth:`verl.rollout.fast_decoder.FastDecoder.refill`), or new
slots while the batch is below ``cap``. Every row is handed out once (:attr:`RowDecoder.out`): the step
it finishes (its first stop token, or its budget), or, for a row still going, when the caller stops
the loop (:meth:`RowDecoder.flush`, which returns them). A row's tokens depend on its prompt, its seed and the weights
only, never on when it got its slot or which rows it decoded beside.

:meth:`NativeRollout._generate <verl.rollout.native.NativeRollout>` runs one batch through it; the
asynchronous rollout server (:mod:`verl.distributed.rollout_rows`) feeds it the rows of request after
request, so the next step's rows take the places of this step's finished ones.

A row may continue a response (a partial rollout after a weight swap): its prompt is then the original
prompt and the tokens drawn so far, ``first`` the decode step of its next token (its seeds go on from
there) and ``budget`` the tokens it has left.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from verl.models.shared_prompt import distinct_prompts
from verl.models.vision import forbid_placeholders


@dataclass
class Rows:
    """Left-padded rows (one padded length) with their seeds and the caller's tags."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    seeds: torch.Tensor
    tags: torch.Tensor
    """The caller's id of each row ([n] int64): how it finds the row in :attr:`RowDecoder.out`."""
    first: torch.Tensor
    """The decode step of each row's first token here ([n]; 0 unless it continues a response)."""
    budget: torch.Tensor
    """The most tokens each row may draw here ([n])."""

    def __len__(self) -> int:
        return len(self.tags)

    def part(self, index) -> "Rows":
        return Rows(*(getattr(self, name)[index] for name in ("input_ids", "attention_mask", "seeds", "tags", "first",
                                                               "budget")))

    @property
    def positions(self) -> torch.Tensor:
        """RoPE positions: 0 at the first real token; a pad attends nowhere (as transformers' generate does)."""
        mask = self.attention_mask
        return (mask.cumsum(dim=1) - 1).masked_fill(mask == 0, 1)


@dataclass
class Finished:
    """Rows handed out: their tags, tokens and log-probs ``[k, max_new]`` (pad and 0 after their end) and how
    many tokens each drew ``[k]``."""

    tags: torch.Tensor
    tokens: torch.Tensor
    log_probs: torch.Tensor
    lengths: torch.Tensor


class RowDecoder:
    """Decode rows through ``steps`` (a :class:`~verl.rollout.fast_decoder.FastDecoder`, whose cache takes
    new rows; the model-forward steps only when every row fits at once) with ``engine``'s sampling."""

    def __init__(self, engine, steps, params, cap: int | None, forbidden=None, decode_rows: list | None = None):
        self.engine, self.steps, self.params = engine, steps, params
        self.max_new = params.max_new_tokens
        self.cap = cap
        self.forbidden = forbidden
        self.device = engine.device
        self.eos = torch.tensor(engine.eos_token_ids, device=self.device)
        self.waiting: deque[Rows] = deque()
        self.out: list[Finished] = []
        self.decode_rows = decode_rows
        """Rows of each decode forward (the engine's ``last_decode_rows``), when given."""
        self.tags: torch.Tensor | None = None  # the slots' rows (-1: a slot no row holds)
        self.started: list[torch.Tensor] = []
        """Tags of the rows that got a slot, in order (the caller reads and clears it)."""

    # ------------------------------------------------------------------ rows in
    def add(self, rows: Rows) -> None:
        """Queue ``rows``; a decoder with no batch yet prefills the first ``cap`` of them at once."""
        if len(rows):
            self.waiting.append(rows)
        if self.tags is None or not len(self.tags):  # no batch yet, or every row of it left
            self._start()

    def _start(self) -> None:
        """A batch of the first ``cap`` waiting rows, prefilled (none without waiting rows)."""
        self.tags = None
        if self.waiting:
            first = self._take(self.cap or self.waiting_rows)
            padded = _pad_to_one_length(first, self.engine.pad_token_id)
            logits = self.engine._prefill(self.steps, padded.input_ids, padded.attention_mask, padded.positions,
                                          padded.input_ids.shape[1] + self.max_new)
            self.begin(logits, padded, padded.attention_mask.sum(dim=1))

    def begin(self, logits: torch.Tensor, rows: Rows, next_position: torch.Tensor) -> None:
        """The batch after a prefill the caller ran: each row's first logits and the position of its next token."""
        n = len(rows)
        self.started.append(rows.tags)
        self.logits, self.tags, self.seeds = logits, rows.tags.to(self.device), rows.seeds.to(self.device)
        self.first, self.budget = rows.first.to(self.device), rows.budget.to(self.device)
        self.live = torch.ones(n, dtype=torch.bool, device=self.device)
        self.drawn = torch.zeros(n, dtype=torch.long, device=self.device)
        self.next_position = next_position.to(self.device)
        # Each slot's tokens and log-probs, a column per token it drew (one more column takes the draws of a
        # row that has finished and still holds its slot: they are never handed out).
        self.step_tokens = torch.full((n, self.max_new + 1), self.engine.pad_token_id, dtype=torch.long,
                                      device=self.device)
        self.step_log_probs = torch.zeros(n, self.max_new + 1, device=self.device)

    @property
    def waiting_rows(self) -> int:
        return sum(len(rows) for rows in self.waiting)

    @property
    def busy(self) -> bool:
        """Whether any row is decoding or waiting for a slot."""
        return bool(self.waiting) or (self.tags is not None and bool(self.live.any()))

    def _take(self, count: int) -> list[Rows]:
        """The first ``count`` waiting rows, as parts of one padded length each."""
        parts = []
        while count and self.waiting:
            rows = self.waiting.popleft()
            if len(rows) > count:
                self.waiting.appendleft(rows.part(slice(count, None)))
                rows = rows.part(slice(0, count))
            parts.append(rows)
            count -= len(rows)
        return parts

    # ------------------------------------------------------------------ the loop
    def draw(self) -> bool:
        """Draw every slot's next token; rows that stop are handed out. False once no row is going or waiting."""
        tokens, log_probs = self.engine._pick(forbid_placeholders(self.logits, self.forbidden), self.params,
                                              self.seeds, self.first + self.drawn)
        index = (torch.arange(len(self.tags), device=self.device), self.drawn.clamp(max=self.max_new))
        self.step_tokens[index], self.step_log_probs[index] = tokens, log_probs
        self.drawn = self.drawn + 1
        was_live = self.live
        self.live = was_live & ~torch.isin(tokens, self.eos) & (self.drawn < self.budget)
        self.tokens = tokens
        self._hand_out((was_live & ~self.live).nonzero().squeeze(-1))
        return self.busy

    def advance(self) -> None:
        """Feed the drawn tokens (the next logits); finished rows free their slots once enough of them gather
        (each change costs a cache copy or a prefill, each dead row one row of decode compute per step): while
        rows wait they take those slots (and new ones, up to ``cap``), else the finished rows leave the batch."""
        if not len(self.tags):  # every row left: the waiting ones start a batch of their own
            self._start()
            return
        # Slots for the waiting rows beyond those free already, up to cap; filled at once.
        room = self.waiting_rows - int((~self.live).sum())
        if self.cap is not None:
            room = min(room, self.cap - len(self.tags))
        grew = bool(self.waiting) and room > 0
        if grew:
            self._grow(room)
        still_going = int(self.live.sum())
        enough = len(self.tags) - still_going >= max(1, int(self.engine.compact_fraction * len(self.tags)))
        if enough and not self.waiting:
            keep = self.live.nonzero().squeeze(-1)
            self.steps.select(keep)
            for name in ("tags", "live", "next_position", "tokens", "step_tokens", "step_log_probs", "drawn", "seeds",
                         "first", "budget", "logits"):
                setattr(self, name, getattr(self, name)[keep])
        if still_going:
            if self.decode_rows is not None:
                self.decode_rows.append(len(self.tags))
            self.logits = self.steps.decode(self.tokens, self.next_position)
            self.next_position = self.next_position + self.live  # a finished row's draws are never handed out
        if (enough or grew) and self.waiting:
            self._refill((~self.live).nonzero().squeeze(-1))

    def run(self, pause=None) -> bool:
        """Decode until no row is going or waiting (True), or until ``pause()`` says stop (False: the rows still
        going are handed out as they stand, the waiting ones stay queued)."""
        while self.draw():
            if pause is not None and pause():
                stopped = self.flush()
                if stopped is not None:
                    self.out.append(stopped)
                return False
            self.advance()
        return True

    def flush(self) -> Finished | None:
        """The rows still going, as they stand (stopped midway; not in :attr:`out`); none goes on here."""
        if self.tags is None:
            return None
        going = self.live.nonzero().squeeze(-1)
        self.live = torch.zeros_like(self.live)
        return self._finished(going) if len(going) else None

    # ------------------------------------------------------------------ slots
    def _hand_out(self, index: torch.Tensor) -> None:
        if len(index):
            self.out.append(self._finished(index))

    def _finished(self, index: torch.Tensor) -> Finished:
        return Finished(self.tags[index], self.step_tokens[index, :self.max_new],
                        self.step_log_probs[index, :self.max_new], self.drawn[index])

    def _grow(self, count: int) -> None:
        """``count`` more slots, held by no row (they copy slot 0's cache until refilled)."""
        n = len(self.tags)
        self.steps.select(torch.cat([torch.arange(n, device=self.device),
                                     torch.zeros(count, dtype=torch.long, device=self.device)]))
        fill = {"tags": -1, "live": False, "next_position": 0, "tokens": self.engine.pad_token_id, "drawn": 0,
                "seeds": 0, "first": 0, "budget": 0}
        for name, value in fill.items():
            tensor = getattr(self, name)
            setattr(self, name, torch.cat([tensor, tensor.new_full((count,), value)]))
        for name, value in (("step_tokens", self.engine.pad_token_id), ("step_log_probs", 0.0), ("logits", 0.0)):
            tensor = getattr(self, name)
            setattr(self, name, torch.cat([tensor, tensor.new_full((count,) + tensor.shape[1:], value)]))

    def _refill(self, slots: torch.Tensor) -> None:
        """Waiting rows into ``slots`` (slots of no running row), in order."""
        at = 0
        for rows in self._take(len(slots)):
            taken, at = slots[at:at + len(rows)], at + len(rows)
            self.started.append(rows.tags)
            first, samples = distinct_prompts(rows.input_ids, rows.attention_mask)
            ids, mask = rows.input_ids.to(self.device), rows.attention_mask.to(self.device)
            self.logits[taken] = self.steps.refill(taken, ids[first], mask[first], rows.positions.to(self.device)[first],
                                                   samples, self.max_new)
            self.tags[taken], self.live[taken], self.drawn[taken] = rows.tags.to(self.device), True, 0
            self.seeds[taken], self.first[taken] = rows.seeds.to(self.device), rows.first.to(self.device)
            self.budget[taken] = rows.budget.to(self.device)
            self.next_position[taken] = mask.sum(dim=1)
            self.step_tokens[taken], self.step_log_probs[taken] = self.engine.pad_token_id, 0.0


def _pad_to_one_length(parts: list[Rows], pad_token_id: int) -> Rows:
    """Parts of different padded lengths as one batch, each left-padded to the longest."""
    if len(parts) == 1:
        return parts[0]
    width = max(p.input_ids.shape[1] for p in parts)
    pad = torch.nn.functional.pad
    return Rows(torch.cat([pad(p.input_ids, (width - p.input_ids.shape[1], 0), value=pad_token_id) for p in parts]),
                torch.cat([pad(p.attention_mask, (width - p.attention_mask.shape[1], 0)) for p in parts]),
                *(torch.cat([getattr(p, name) for p in parts]) for name in ("seeds", "tags", "first", "budget")))


def assemble(out: list[Finished], rows: int, max_new: int, pad_token_id: int, eos: torch.Tensor,
             device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows ``0 .. rows - 1`` (tags) from what a decoder handed out: responses and log-probs ``[rows, W]``
    (W: the longest response; everything after a row's first stop token pad and 0) and each row's length."""
    responses = torch.full((rows, max_new), pad_token_id, dtype=torch.long, device=device)
    log_probs = torch.zeros(rows, max_new, device=device)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)
    for part in out:
        tags = part.tags.to(device)
        responses[tags], log_probs[tags] = part.tokens.to(device), part.log_probs.to(device)
        lengths[tags] = part.lengths.to(device)
    stopped = torch.isin(responses, eos.to(device)).long()
    after = (stopped.cumsum(dim=1) - stopped) > 0
    responses.masked_fill_(after, pad_token_id)
    log_probs.masked_fill_(after, 0.0)
    ended = torch.where(stopped.any(dim=1), stopped.argmax(dim=1) + 1, lengths)
    width = int(torch.minimum(ended, lengths).max()) if rows else 0
    return responses[:, :width], log_probs[:, :width], lengths
