"""The rollout server's continuous loop: the rows of request after request share one decode batch.

:func:`verl.distributed.rollout_server.serve` runs :class:`RowServer` when the rollout's engine takes
rows as they come (the native engine on a model its fast decoder runs, no multi-turn agent loop;
``async_training.continuous_batching``). A request's rows (prompts x n) join the engine's
:class:`~verl.rollout.row_decoder.RowDecoder` as soon as the request arrives: they take the slots of
the rows that finish, so the next step's rows decode while this step's longest response is still
going, and the engine's batch stays full across a step's long tail. Requests are still answered
one by one, in order, each once all its rows are done; each row's tokens are what a request
generated alone gives (its prompt, seed and weights decide them).

Weights. Without partial rollouts a request that carries weights, or samples differently (ReMax's
greedy baseline), waits until the rows before it are done: every row is drawn by one version. With
partial rollouts (``async_training.partial_rollout``) weights that arrive are taken at the next
decode step: the rows going stop there, the weights are loaded, and they go on from their prompt
and the tokens they drew, prefilled again, their seeds continued, ahead of the rows still waiting
for a slot, which then start on the new weights. Every row is stamped with the version that drew its
first token (when it got its slot) and its last.
"""

from __future__ import annotations

import time
import traceback
from collections import deque

import torch
import torch.nn.functional as F

from verl.distributed.rollout_server import RolloutRequest, RolloutResult, answer, prompt_groups
from verl.distributed.weight_sync import unpack
from verl.protocol import Batch
from verl.rollout.row_decoder import Finished, Rows, assemble

UNSET = -2  # a row not yet started (versions start at -1: the model folder's weights)


class _Open:
    """A request whose rows are in the decoder (decoding or waiting for a slot), until every one is done."""

    def __init__(self, request: RolloutRequest, rows: Batch, seeds: torch.Tensor, base: int, pad_token_id: int):
        self.request, self.rows, self.seeds, self.base, self.pad = request, rows, seeds.cpu(), base, pad_token_id
        n, max_new = len(rows), request.params.max_new_tokens
        self.tokens = torch.full((n, max_new), pad_token_id, dtype=torch.long)
        self.log_probs = torch.zeros(n, max_new)
        self.drawn = torch.zeros(n, dtype=torch.long)
        self.done = torch.zeros(n, dtype=torch.bool)
        self.first = torch.full((n,), UNSET, dtype=torch.long)
        self.last = torch.full((n,), UNSET, dtype=torch.long)
        self.answered = torch.zeros(n // request.params.n, dtype=torch.bool)
        """Each prompt's: answered on its own (:attr:`RowServer.groups`)."""

    def owns(self, tag: int) -> bool:
        return self.base <= tag < self.base + len(self.drawn)

    def decoder_rows(self) -> Rows:
        n = len(self.drawn)
        return Rows(self.rows["input_ids"], self.rows["attention_mask"], self.seeds, self.base + torch.arange(n),
                    torch.zeros(n, dtype=torch.long), torch.full((n,), self.request.params.max_new_tokens))

    def record(self, i: int, tokens: torch.Tensor, log_probs: torch.Tensor, count: int, version: int,
               finished: bool) -> None:
        at = int(self.drawn[i])
        self.tokens[i, at:at + count], self.log_probs[i, at:at + count] = tokens[:count], log_probs[:count]
        self.drawn[i] += count
        self.last[i] = version
        self.done[i] = finished

    def continued(self, index: list[int]) -> Rows:
        """Rows ``index`` (stopped midway) as new rows: prompt + the tokens drawn so far, left-padded to one
        length, their seeds going on at the step of their next token, with the tokens they have left."""
        ids, mask = self.rows["input_ids"].cpu(), self.rows["attention_mask"].cpu()
        texts = [torch.cat([ids[i][mask[i].bool()], self.tokens[i, :int(self.drawn[i])]]) for i in index]
        width = max(len(t) for t in texts)
        device = self.rows["input_ids"].device
        padded = torch.stack([F.pad(t, (width - len(t), 0), value=self.pad) for t in texts])
        new_mask = torch.stack([F.pad(torch.ones(len(t), dtype=mask.dtype), (width - len(t), 0)) for t in texts])
        index_t = torch.tensor(index)
        drawn = self.drawn[index_t]
        return Rows(padded.to(device), new_mask.to(device), self.seeds[index_t], self.base + index_t, drawn,
                    self.request.params.max_new_tokens - drawn)


class RowServer:
    """Answers the requests of ``inbox`` (a :class:`~verl.distributed.rollout_server._Inbox`) through one row
    decoder of ``worker`` at a time (module docstring); ``score``: the rollout's reward stage, or None."""

    def __init__(self, worker, inbox, results, score, partial: bool, channel=None, groups: bool = False):
        """``groups``: each prompt's samples are answered as soon as they are all done, in any order
        (:attr:`~verl.distributed.rollout_server.WorkerSpec.groups`); else each request once all its rows are."""
        self.worker, self.inbox, self.results, self.score = worker, inbox, results, score
        self.groups = groups
        self.eos = torch.tensor(worker.rollout.eos_token_ids)
        self.partial, self.channel = partial, channel
        self.decoder = None
        self.params = None
        self.held: deque[tuple[RolloutRequest, bool]] = deque()
        """Requests received, not yet admitted (in order), each with whether its rows can join the decoder."""
        self.open: deque[_Open] = deque()
        """Requests admitted, not yet answered (in order)."""
        self.next_tag = 0
        self.decode_steps = 0
        self.idle = self.load = self.scoring = 0.0
        self.since = time.perf_counter()

    @property
    def version(self) -> int:
        return -1 if self.worker.version is None else self.worker.version

    def run(self) -> None:
        try:
            while self._receive():
                self._admit()
                if self.decoder is not None and self.decoder.busy:
                    self._step()
                self._answer()
        except BaseException:  # noqa: BLE001 - reported to the trainer, which raises it with context
            step = self.open[0].request.step if self.open else self.held[0][0].step if self.held else 0
            self.results.put(RolloutResult(step, None, -1, error=traceback.format_exc()))

    # ------------------------------------------------------------------ requests in
    def _receive(self) -> bool:
        """Take what has arrived (waiting for it when there is nothing to do); False: the trainer closed."""
        if not self.held and not self.open:
            start = time.perf_counter()
            item = self.inbox.next()
            self.idle += time.perf_counter() - start
            if item is None:
                return False
            self._hold(item)
        self.inbox.pending()
        while self.inbox.backlog:
            item = self.inbox.backlog.popleft()
            if item is None:
                return False
            self._hold(item)
        return True

    def _hold(self, request: RolloutRequest) -> None:
        # Partial rollouts take a request's weights at the next decode step, like weights sent alone; not while a
        # validation (step < 0) is waiting or going: its rows are drawn by the weights it came with, every token.
        if self.partial and request.weights is not None and not self._validating():
            self.inbox.stash(request.weights)
            request.weights = None
        self.held.append((request, self.worker.takes_rows(request.prompts, request.params)))

    def _admit(self) -> None:
        """Requests join the decoder in order: at once where they can; one with weights to load (without partial
        rollouts) or other sampling parameters once the rows before it are done."""
        while self.held:
            request, joins = self.held[0]
            busy = self.decoder is not None and self.decoder.busy
            # a validation starts on an empty decoder, once the weights before it are in
            # (weights that came alone wait for an empty decoder too, without partial rollouts)
            if busy and (request.weights is not None or request.params != self.params or not joins or request.step < 0
                         or (not self.partial and self.inbox.weights is not None)):
                return
            if not busy:
                self.decoder = None
                if self.inbox.weights is not None:
                    self._load(self.inbox.apply)
                if request.weights is not None:
                    weights, request.weights = request.weights, None
                    self._load(lambda: self.worker.load_weights(unpack(weights, self.channel), weights.version))
            self.held.popleft()
            if not joins:
                self._whole(request)
                continue
            rows, seeds = self.worker.rows_of(request.prompts, request.params)
            if self.decoder is None:
                self.decoder, self.params = self.worker.row_decoder(request.prompts, request.params), request.params
            opened = _Open(request, rows, seeds, self.next_tag, self.worker.rollout.pad_token_id)
            self.next_tag += len(rows)
            self.open.append(opened)
            with torch.inference_mode():
                self.decoder.add(opened.decoder_rows())
            self._stamp_started()

    def _validating(self) -> bool:
        return any(request.step < 0 for request, _ in self.held) or any(o.request.step < 0 for o in self.open)

    def _load(self, load) -> None:
        start = time.perf_counter()
        load()
        self.load += time.perf_counter() - start

    # ------------------------------------------------------------------ decoding
    def _step(self) -> None:
        """One decode step: every row draws a token; rows that end go to their request. Weights that arrived
        (partial rollouts) are taken here, else the drawn tokens are fed and slots refilled."""
        with torch.inference_mode():
            going = self.decoder.draw()
        self.decode_steps += 1
        self._collect(self.decoder.out, finished=True)
        if not going:
            self.decoder = None
            return
        if self.partial and self.inbox.weights is not None:  # arrived by this step's poll (_receive)
            self._swap()
            return
        with torch.inference_mode():
            self.decoder.advance()
        self._stamp_started()

    def _swap(self) -> None:
        """New weights mid-generation: the rows going stop, the weights are loaded, and those rows go on under
        them from where they stopped, ahead of the rows still waiting for a slot."""
        stopped, waiting = self.decoder.flush(), list(self.decoder.waiting)
        tags = [] if stopped is None else stopped.tags.tolist()
        if stopped is not None:
            self._collect([stopped], finished=False)
        self._load(self.inbox.apply)
        self.decoder = self.worker.row_decoder(self.open[0].request.prompts, self.params)
        with torch.inference_mode():
            for opened in self.open:
                index = [tag - opened.base for tag in tags if opened.owns(tag)]
                if index:
                    self.decoder.add(opened.continued(index))
            for rows in waiting:
                self.decoder.add(rows)
        self._stamp_started()

    def _collect(self, parts: list[Finished], finished: bool) -> None:
        """Rows handed out by the decoder into their requests (``finished``: done; else stopped midway)."""
        version = self.version
        for part in parts:
            tags, lengths = part.tags.tolist(), part.lengths.tolist()
            tokens, log_probs = part.tokens.cpu(), part.log_probs.float().cpu()
            for k, tag in enumerate(tags):
                opened = self._owner(tag)
                opened.record(tag - opened.base, tokens[k], log_probs[k], lengths[k], version, finished)
        if finished:
            parts.clear()

    def _stamp_started(self) -> None:
        """Rows that got a slot: the version now held drew their first token (unless they continue a response)."""
        version = self.version
        for tags in self.decoder.started if self.decoder is not None else ():
            for tag in tags.tolist():
                opened = self._owner(tag)
                if opened.first[tag - opened.base] == UNSET:
                    opened.first[tag - opened.base] = version
        if self.decoder is not None:
            self.decoder.started.clear()

    def _owner(self, tag: int) -> _Open:
        for opened in self.open:
            if opened.owns(tag):
                return opened
        raise RuntimeError(f"row {tag} belongs to no open request")

    # ------------------------------------------------------------------ answers out
    def _answer(self) -> None:
        """Answer the requests whose rows are all done, in order (with :attr:`groups`: every prompt whose samples
        are all done, as they come)."""
        if self.groups:
            for opened in list(self.open):
                n = opened.request.params.n
                ready = opened.done.view(-1, n).all(dim=1) & ~opened.answered
                for g in ready.nonzero().flatten().tolist():
                    self._answer_rows(opened, slice(g * n, (g + 1) * n))
                    opened.answered[g] = True
                if bool(opened.answered.all()):
                    self.open.remove(opened)
            return
        while self.open and bool(self.open[0].done.all()):
            opened = self.open.popleft()
            self._answer_rows(opened, slice(None))

    def _answer_rows(self, opened: _Open, rows: slice) -> None:
        params = opened.request.params
        drawn = opened.drawn[rows]
        responses, log_probs, _ = assemble([Finished(torch.arange(len(drawn)), opened.tokens[rows],
                                                     opened.log_probs[rows], drawn)], len(drawn),
                                           params.max_new_tokens, self.worker.rollout.pad_token_id, self.eos, "cpu")
        device = opened.rows["input_ids"].device
        batch = self.worker.finish(opened.rows.index(rows), responses.to(device), log_probs.to(device), params,
                                   opened.first[rows], opened.last[rows])
        self._put(opened.request.step, batch)

    def _whole(self, request: RolloutRequest) -> None:
        """A request the decoder cannot take (images, a sequence the fast decoder cannot run): generated alone,
        now that the rows before it are done."""
        batch = self.worker.generate_sequences(request.prompts, request.params,
                                               swap=self.inbox if self.partial else None)
        for part in prompt_groups(batch, request.params.n) if self.groups else [batch]:
            self._put(request.step, part)

    def _put(self, step: int, batch: Batch) -> None:
        scoring = 0.0
        if self.score is not None:
            start = time.perf_counter()
            batch = batch.union(self.score(batch))
            scoring = time.perf_counter() - start
        now = time.perf_counter()
        self.scoring += scoring
        busy = now - self.since - self.idle - self.load - self.scoring
        self.results.put(answer(step, batch, self.worker, gen_seconds=max(busy, 0.0), idle_seconds=self.idle,
                                load_seconds=self.load, score_seconds=self.scoring))
        self.since, self.idle, self.load, self.scoring = time.perf_counter(), 0.0, 0.0, 0.0
