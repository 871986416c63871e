"""Continuous batching across requests (verl.rollout.row_decoder, verl.distributed.rollout_rows): the rows of
several requests share the native engine's decode batch, and each row still draws what it draws alone.

* the decoder: rows added while others decode (also longer ones, and with a slot bound), rows continued
  from a prompt + tokens with their seeds going on, each row handed out the step it ends;
* the rollout server: requests answered in order with the batches a request-at-a-time server gives, in
  fewer decode steps; a request with weights (or other sampling) waits for the rows before it; with
  partial rollouts, weights that arrive mid-generation are taken at the next step (the same weights change
  no token) and every row says which versions drew its first and last token.
"""

import copy
import dataclasses
import queue
import threading

import pytest
import torch

from verl import TrainerConfig
from verl.distributed.rollout_rows import RowServer
from verl.distributed.rollout_server import RolloutRequest, WeightUpdate, _Inbox, serve, WorkerSpec
from verl.distributed.weight_sync import WeightMessage
from verl.models.loading import load_causal_lm, load_tokenizer
from verl.rollout import SamplingParams
from verl.rollout.native import NativeRollout
from verl.rollout.row_decoder import Finished, Rows, assemble
from verl.workers.rollout_worker import RolloutWorker

from test_rollout_native import LONG_TAIL, TEXTS, eos_prone, make_prompts, qwen2  # noqa: F401 - the fixture

PARAMS = SamplingParams(max_new_tokens=14, n=3, temperature=0.9, logprobs=True)


def rows_of(engine, prompts, params, base=0):
    batch, seeds = engine.sample_rows(prompts, params)
    n = len(batch)
    return batch, Rows(batch["input_ids"], batch["attention_mask"], seeds, base + torch.arange(n),
                       torch.zeros(n, dtype=torch.long), torch.full((n,), params.max_new_tokens))


def decode_steps(decoder, count):
    """``count`` decode steps: every row draws a token, then the drawn tokens are fed."""
    for _ in range(count):
        decoder.draw()
        decoder.advance()


def decoded(decoder, base, rows, params, engine):
    """The rows ``base .. base + rows - 1`` the decoder handed out, as one generation's output."""
    parts = []
    for p in decoder.out:
        mine = (p.tags >= base) & (p.tags < base + rows)
        parts.append(Finished(p.tags[mine] - base, p.tokens[mine], p.log_probs[mine], p.lengths[mine]))
    return assemble(parts, rows, params.max_new_tokens, engine.pad_token_id, torch.tensor(engine.eos_token_ids),
                    "cpu")


# --------------------------------------------------------------------------- the decoder


@pytest.mark.parametrize("cap", [None, 4, 7])
def test_rows_added_while_others_decode_draw_what_they_draw_alone(qwen2, cap):  # noqa: F811
    model, tokenizer = qwen2
    engine = NativeRollout(model, tokenizer, max_num_seqs=cap)
    short = make_prompts(tokenizer, ["x", "5+6="])  # shorter prompts first: later rows are longer than the cache
    later = make_prompts(tokenizer, LONG_TAIL)
    later["rollout_seed"] = later["rollout_seed"] + 5
    alone = [engine.generate(p, PARAMS) for p in (short, later)]
    first, first_rows = rows_of(engine, short, PARAMS)
    second, second_rows = rows_of(engine, later, PARAMS, base=100)
    with torch.inference_mode():
        decoder = engine.row_decoder(PARAMS, later["input_ids"].shape[1] + PARAMS.max_new_tokens)
        decoder.add(first_rows)
        for _ in range(3):  # the first request's rows have drawn 3 tokens when the second's arrive
            assert decoder.draw()
            decoder.advance()
        decoder.add(second_rows)
        assert decoder.run()
    for out, base, alone_out in ((first, 0, alone[0]), (second, 100, alone[1])):
        responses, log_probs, _ = decoded(decoder, base, len(out), PARAMS, engine)
        assert torch.equal(responses, alone_out["responses"][:, :responses.shape[1]])
        assert not alone_out["responses"][:, responses.shape[1]:].ne(engine.pad_token_id).any()
        torch.testing.assert_close(log_probs, alone_out["rollout_log_probs"][:, :log_probs.shape[1]], atol=1e-5,
                                   rtol=0)
    lengths = alone[1]["response_mask"].sum(1)
    assert lengths.min() < lengths.max(), "want a long tail"
    assert sorted(t for p in decoder.out for t in p.tags.tolist()) == list(range(6)) + list(range(100, 124))


def test_a_row_continued_from_its_tokens_draws_the_rest_of_its_response(qwen2):  # noqa: F811
    """A partial rollout's row: prompt + the tokens drawn so far, its seeds going on at the step of its next
    token, with the tokens it has left: the same response as drawing it in one go."""
    model, tokenizer = qwen2
    engine = NativeRollout(model, tokenizer)
    prompts = make_prompts(tokenizer, TEXTS)
    whole = engine.generate(prompts, PARAMS)
    batch, rows = rows_of(engine, prompts, PARAMS)
    with torch.inference_mode():
        decoder = engine.row_decoder(PARAMS, 64)
        decoder.add(rows)
        decode_steps(decoder, 4)
        decoder.draw()
        stopped = decoder.flush()
    going = stopped.tags
    assert 0 < len(going) < len(batch), "want rows that ended in the first 5 tokens and rows still going"
    drawn = stopped.lengths
    assert (drawn == 5).all()
    ids, mask = batch["input_ids"][going], batch["attention_mask"][going]
    continued = Rows(torch.cat([ids, stopped.tokens[:, :5]], dim=1), torch.cat([mask, torch.ones_like(mask[:, :5])], 1),
                     rows.seeds[going], going, drawn, PARAMS.max_new_tokens - drawn)
    with torch.inference_mode():
        again = engine.row_decoder(PARAMS, 64)
        again.add(continued)
        assert again.run()
    rest = {int(t): (tok, n) for p in again.out for t, tok, n in zip(p.tags, p.tokens, p.lengths)}
    for row in going.tolist():
        tokens, n = rest[row]
        expected = whole["responses"][row, 5:5 + int(n)]
        assert torch.equal(tokens[:int(n)], expected)


# --------------------------------------------------------------------------- the server

@pytest.fixture(scope="module")
def eos_prone_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model, scaled to end some responses early (a long tail of lengths), as a folder."""
    folder = tmp_path_factory.mktemp("eos-prone")
    model = eos_prone(load_causal_lm(str(tiny_model_dir)))
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_model_dir / name).exists():
            (folder / name).write_bytes((tiny_model_dir / name).read_bytes())
    return folder


def worker_config(folder, **rollout):
    return TrainerConfig(data=dict(max_response_length=PARAMS.max_new_tokens), trainer=dict(device="cpu"),
                         actor_rollout_ref=dict(model={"path": str(folder)},
                                                rollout=dict(name="native", **rollout))).actor_rollout_ref


class Script:
    """A request queue that lets item ``k`` out only once the server has polled ``after[k]`` times (so weights
    arrive mid-generation), the rest at once; it ends with None."""

    def __init__(self, items, after=None):
        self.items, self.after, self.polls = list(items) + [None], after or {}, 0
        self.done = threading.Event()

    def _ready(self):
        return bool(self.items) and self.items[0] is not None and self.polls >= self.after.get(id(self.items[0]), 0)

    def get_nowait(self):
        self.polls += 1
        if not self._ready():
            raise queue.Empty  # not yet; and the end waits for the test to take every answer
        return self.items.pop(0)

    def get(self):
        while not self._ready():
            if self.items[0] is None:
                self.done.wait()
                return self.items.pop(0)
            self.polls += 1
        return self.items.pop(0)


def answers(worker, items, count, *, partial=False, after=None, groups=False):
    """Run a RowServer of ``worker`` over ``items``; its first ``count`` answers and the server."""
    script, results = Script(items, after), queue.Queue()
    server = RowServer(worker, _Inbox(script, worker, None), results, None, partial, groups=groups)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    out = [results.get(timeout=120) for _ in range(count)]
    script.done.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    for answer in out:
        assert answer.error is None, answer.error
    return out, server


def one_at_a_time(worker, requests, groups=False):
    """What the request-at-a-time server answers (continuous=False)."""
    spec = WorkerSpec(None, device="cpu", max_response_length=PARAMS.max_new_tokens, seed=1, continuous=False,
                      groups=groups)
    spec.build = lambda: worker
    inbox, results = queue.Queue(), queue.Queue()
    for request in list(requests) + [None]:
        inbox.put(request)
    serve(spec, inbox, results)
    assert results.get() == "ready"
    return [results.get() for _ in range(results.qsize())]


def seeded(tokenizer, texts, offset):
    prompts = make_prompts(tokenizer, texts)
    prompts["rollout_seed"] = prompts["rollout_seed"] + offset
    return prompts


def test_requests_share_the_decode_batch_and_are_answered_as_one_at_a_time(eos_prone_dir):
    worker = RolloutWorker(worker_config(eos_prone_dir, max_num_seqs=12), device="cpu")
    tok = worker.tokenizer
    greedy = dataclasses.replace(PARAMS, n=1, do_sample=False, logprobs=False)
    requests = [RolloutRequest(1, seeded(tok, LONG_TAIL, 0), PARAMS),
                RolloutRequest(2, seeded(tok, LONG_TAIL[::-1], 7), PARAMS),
                RolloutRequest(2, seeded(tok, LONG_TAIL[::-1], 7), greedy),  # ReMax's baseline: waits its turn
                RolloutRequest(3, seeded(tok, TEXTS, 3), PARAMS)]
    got, server = answers(worker, [copy.copy(r) for r in requests], len(requests))
    expected = one_at_a_time(worker, [copy.copy(r) for r in requests])
    assert [a.step for a in got] == [1, 2, 2, 3]
    for a, e in zip(got, expected):
        assert torch.equal(a.batch["responses"], e.batch["responses"])
        assert torch.equal(a.batch["response_mask"], e.batch["response_mask"])
        if "rollout_log_probs" in e.batch:
            torch.testing.assert_close(a.batch["rollout_log_probs"], e.batch["rollout_log_probs"], atol=1e-5, rtol=0)
        assert a.batch.keys() == e.batch.keys()
        assert (a.batch["policy_version_first"] == -1).all() and (a.batch["policy_version_last"] == -1).all()
        assert a.gen_seconds > 0
    # Rows of the next request took the slots of finished ones: fewer decode steps than the same server given
    # one request at a time (each answered before the next arrives).
    alone = sum(answers(worker, [copy.copy(r)], 1)[1].decode_steps for r in requests)
    assert server.decode_steps < alone, (server.decode_steps, alone)


def test_a_request_with_weights_waits_for_the_rows_before_it(eos_prone_dir):
    """Without partial rollouts every row is drawn by one version: a request that brings weights starts after
    the rows before it are done, and its rows are the new weights' alone."""
    worker = RolloutWorker(worker_config(eos_prone_dir), device="cpu")
    tok = worker.tokenizer
    new = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
           for k, v in worker.rollout.model.state_dict().items()}
    weights = WeightMessage(1, "memory", tensors=new)
    requests = [RolloutRequest(1, seeded(tok, LONG_TAIL, 0), PARAMS),
                RolloutRequest(2, seeded(tok, LONG_TAIL, 0), PARAMS, weights)]
    got, _ = answers(worker, requests, 2)
    assert (got[0].batch["policy_version_first"] == -1).all() and (got[0].batch["policy_version_last"] == -1).all()
    assert (got[1].batch["policy_version_first"] == 1).all() and (got[1].batch["policy_version_last"] == 1).all()
    assert got[1].load_seconds > 0
    # the same prompts and seeds under other weights: other tokens
    assert not torch.equal(got[0].batch["responses"], got[1].batch["responses"])


@pytest.mark.parametrize("same", [True, False], ids=["same-weights", "new-weights"])
def test_partial_rollouts_take_weights_at_the_next_decode_step(eos_prone_dir, same):
    worker = RolloutWorker(worker_config(eos_prone_dir, max_num_seqs=12), device="cpu")
    tok = worker.tokenizer
    state = worker.rollout.model.state_dict()
    if not same:
        state = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v for k, v in state.items()}
    update = WeightUpdate(WeightMessage(1, "memory", tensors={k: v.clone() for k, v in state.items()}))
    requests = [RolloutRequest(1, seeded(tok, LONG_TAIL, 0), PARAMS), RolloutRequest(2, seeded(tok, TEXTS, 9), PARAMS)]
    expected = one_at_a_time(copy.deepcopy(worker), [copy.copy(r) for r in requests])
    # the weights come after the server has polled 6 times: each request's rows have begun by then
    got, _ = answers(worker, [copy.copy(requests[0]), copy.copy(requests[1]), update], 2, partial=True,
                     after={id(update): 6})
    assert worker.version == 1
    first = torch.cat([a.batch["policy_version_first"] for a in got])
    last = torch.cat([a.batch["policy_version_last"] for a in got])
    assert (last >= first).all()
    assert (first == -1).any() and (last == 1).any(), "want rows begun before the swap and ended after it"
    spanned = (first == -1) & (last == 1)
    assert spanned.any()
    ended_before = last == -1
    for a, e in zip(got, expected):
        rows = slice(None)
        if same:  # a swap to the same weights changes no token
            assert torch.equal(a.batch["responses"], e.batch["responses"])
            torch.testing.assert_close(a.batch["rollout_log_probs"], e.batch["rollout_log_probs"], atol=1e-5, rtol=0)
        else:  # rows that ended before the swap are the old weights' own
            keep = (a.batch["policy_version_last"] == -1)
            assert torch.equal(a.batch["responses"][keep], e.batch["responses"][keep][rows])
    if not same:
        assert ended_before.any()


def test_a_validations_rows_are_drawn_by_the_weights_it_came_after_alone(eos_prone_dir):
    """Partial rollouts take weights mid-generation, but not into a validation's rows (a request of a negative
    step): weights that come with a later request wait until those rows are done."""
    worker = RolloutWorker(worker_config(eos_prone_dir, max_num_seqs=12), device="cpu")
    tok = worker.tokenizer
    new = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
           for k, v in worker.rollout.model.state_dict().items()}
    greedy = dataclasses.replace(PARAMS, n=1, do_sample=False, logprobs=False)
    validation = RolloutRequest(-1, seeded(tok, LONG_TAIL, 5), greedy)
    expected = one_at_a_time(copy.deepcopy(worker), [copy.copy(validation)])[0]
    later = RolloutRequest(2, seeded(tok, TEXTS, 9), PARAMS, WeightMessage(1, "memory", tensors=new))
    # the weights come after 6 polls, while the rows before the validation (or its own) are being drawn
    got, _ = answers(worker, [RolloutRequest(1, seeded(tok, LONG_TAIL, 0), PARAMS), validation, later], 3,
                     partial=True, after={id(later): 6})
    assert [a.step for a in got] == [1, -1, 2]
    assert (got[1].batch["policy_version_first"] == -1).all() and (got[1].batch["policy_version_last"] == -1).all()
    assert torch.equal(got[1].batch["responses"], expected.batch["responses"])
    assert (got[2].batch["policy_version_first"] == 1).all() and worker.version == 1


def test_without_partial_rollouts_weights_that_come_alone_wait_for_the_rows_before_them(eos_prone_dir):
    """A pool's process gets weights alone when it had no prompts of the request that brought them: rows of the next
    request wait for the rows going to end, then start on the new weights, every one."""
    worker = RolloutWorker(worker_config(eos_prone_dir, max_num_seqs=12), device="cpu")
    tok = worker.tokenizer
    new = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
           for k, v in worker.rollout.model.state_dict().items()}
    update = WeightUpdate(WeightMessage(1, "memory", tensors=new))
    later = RolloutRequest(2, seeded(tok, TEXTS, 9), PARAMS)
    got, _ = answers(worker, [RolloutRequest(1, seeded(tok, LONG_TAIL, 0), PARAMS), update, later], 2,
                     after={id(update): 4, id(later): 4})  # both arrive while the first rows are going
    assert (got[0].batch["policy_version_last"] == -1).all()
    assert (got[1].batch["policy_version_first"] == 1).all() and (got[1].batch["policy_version_last"] == 1).all()


def test_without_a_slot_bound_rows_that_arrive_get_slots_of_their_own(qwen2):  # noqa: F811
    model, tokenizer = qwen2
    engine = NativeRollout(model, tokenizer)  # no max_num_seqs: every row decodes at once
    prompts, later = make_prompts(tokenizer, TEXTS), make_prompts(tokenizer, LONG_TAIL)
    _, first_rows = rows_of(engine, prompts, PARAMS)
    second, second_rows = rows_of(engine, later, PARAMS, base=100)
    with torch.inference_mode():
        decoder = engine.row_decoder(PARAMS, 64)
        decoder.add(first_rows)
        decoder.draw()
        decoder.advance()
        decoder.add(second_rows)
        decoder.draw()
        decoder.advance()  # the new rows get slots at once, none waits for a finished row
        assert not decoder.waiting
        assert decoder.run()
    responses, _, _ = decoded(decoder, 100, len(second), PARAMS, engine)
    alone = engine.generate(later, PARAMS)["responses"]
    assert torch.equal(responses, alone[:, :responses.shape[1]])


def test_each_prompt_is_answered_on_its_own_as_soon_as_its_samples_are_done(eos_prone_dir):
    """async_training.stream_samples: one answer per prompt (its n samples, its sample_key), from the row server as
    prompts finish and from the request-at-a-time server after each request; together they are the request's
    batch."""
    worker = RolloutWorker(worker_config(eos_prone_dir, max_num_seqs=12), device="cpu")
    prompts = seeded(worker.tokenizer, LONG_TAIL, 0)
    prompts["sample_key"] = 100 + torch.arange(len(prompts))
    request = RolloutRequest(1, prompts, PARAMS)
    whole = one_at_a_time(worker, [copy.copy(request)])[0].batch
    streamed, _ = answers(worker, [copy.copy(request)], len(prompts), groups=True)
    by_request = one_at_a_time(worker, [copy.copy(request)], groups=True)
    for got in (streamed, by_request):
        assert sorted(a.key for a in got) == list(range(100, 108))
        assert all(len(a.batch) == PARAMS.n and (a.batch["sample_key"] == a.key).all() for a in got)
        ordered = sorted(got, key=lambda a: a.key)
        assert torch.equal(torch.cat([a.batch["responses"] for a in ordered]), whole["responses"])
    # the row server answers the prompts that end first first: not in the order they were asked
    assert [a.key for a in streamed] != sorted(a.key for a in streamed)


def test_rows_that_arrive_at_a_batch_with_room_get_new_slots_at_once(tiny_model_dir):
    """48 rows decoding (none ends early: no token stops them), room for 64: 3 more rows get slots of their own at
    once, without waiting for finished rows to gather (compact_fraction)."""
    model, tokenizer = load_causal_lm(str(tiny_model_dir)).eval(), load_tokenizer(str(tiny_model_dir))
    engine = NativeRollout(model, tokenizer, max_num_seqs=64)
    engine.eos_token_ids = [10 ** 6]  # no token ends a row: each runs to max_new_tokens
    many, few = make_prompts(tokenizer, LONG_TAIL * 2), make_prompts(tokenizer, ["x"])
    _, many_rows = rows_of(engine, many, PARAMS)
    few_batch, few_rows = rows_of(engine, few, PARAMS, base=1000)
    with torch.inference_mode():
        decoder = engine.row_decoder(PARAMS, 64)
        decoder.add(many_rows)
        decode_steps(decoder, 3)
        decoder.add(few_rows)
        decoder.draw()
        assert bool(decoder.live.all()) and len(decoder.tags) == 48
        decoder.advance()
        assert not decoder.waiting and len(decoder.tags) == 51 and (decoder.tags >= 1000).sum() == 3
        assert decoder.run()
    responses, _, _ = decoded(decoder, 1000, len(few_batch), PARAMS, engine)
    alone = engine.generate(few, PARAMS)["responses"]
    assert torch.equal(responses, alone[:, :responses.shape[1]])


def test_rows_added_after_every_row_left_start_a_batch_of_their_own(qwen2):  # noqa: F811
    model, tokenizer = qwen2
    engine = NativeRollout(model, tokenizer)
    first, later = make_prompts(tokenizer, ["x"]), make_prompts(tokenizer, TEXTS)
    _, first_rows = rows_of(engine, first, PARAMS)
    later_batch, later_rows = rows_of(engine, later, PARAMS, base=50)
    with torch.inference_mode():
        decoder = engine.row_decoder(PARAMS, 64)
        decoder.add(first_rows)
        while decoder.draw():
            decoder.advance()
        decoder.advance()  # every row has left the batch
        decoder.add(later_rows)
        assert decoder.run()
    responses, _, _ = decoded(decoder, 50, len(later_batch), PARAMS, engine)
    alone = engine.generate(later, PARAMS)["responses"]
    assert torch.equal(responses, alone[:, :responses.shape[1]])


def thread_pool(folder, continuous: bool = True):
    """A RolloutPool of three rollout threads over the model in ``folder``, started."""
    from verl.distributed.rollout_stream import RolloutPool, ThreadRolloutStream

    spec = WorkerSpec(worker_config(folder), device="cpu", max_response_length=PARAMS.max_new_tokens, seed=1,
                      continuous=continuous)
    members = []
    for _ in range(3):  # one at a time: models are not loaded by two threads at once
        members.append(ThreadRolloutStream(spec, 60))
        members[-1].start()
    return RolloutPool(members, 60)


def test_a_pool_sends_a_request_of_fewer_prompts_than_processes_to_as_many_processes(eos_prone_dir):
    """A prompt dropped and sent again alone (stream_samples), or a step's tail shorter than the pool: the first
    processes take one prompt each, the others nothing, and every answer comes back."""
    pool = thread_pool(eos_prone_dir)
    try:
        prompts = seeded(load_tokenizer(str(eos_prone_dir)), TEXTS[:2], 0)
        prompts["sample_key"] = torch.tensor([7, 8])
        pool.submit(RolloutRequest(1, prompts, PARAMS))
        whole = pool.result()
        assert len(whole.batch) == 2 * PARAMS.n and pool.routes == []
        pool.submit(RolloutRequest(2, prompts.index(slice(0, 1)), PARAMS), each_prompt=True)
        pool.submit(RolloutRequest(3, prompts, PARAMS), each_prompt=True)
        got = [pool.any_result() for _ in range(3)]
        assert sorted((a.step, a.key) for a in got) == [(2, 7), (3, 7), (3, 8)] and not pool.submitted
    finally:
        pool.close()


@pytest.mark.parametrize("continuous", [True, False], ids=["rows", "request-at-a-time"])
def test_a_pools_processes_without_prompts_of_a_request_take_its_weights_all_the_same(eos_prone_dir, continuous):
    """A request of one prompt that brings weights goes to the first process alone; the others get its weights on
    their own and the next request's rows are the new version's everywhere."""
    pool = thread_pool(eos_prone_dir, continuous=continuous)
    try:
        tok = load_tokenizer(str(eos_prone_dir))
        state = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
                 for k, v in load_causal_lm(str(eos_prone_dir)).state_dict().items()}
        pool.submit(RolloutRequest(1, seeded(tok, TEXTS[:1], 0), PARAMS, WeightMessage(1, "memory", tensors=state)))
        assert (pool.result().batch["policy_version_first"] == 1).all()
        pool.submit(RolloutRequest(2, seeded(tok, TEXTS[:3], 0), PARAMS))
        after = pool.result().batch
        assert len(after) == 3 * PARAMS.n and (after["policy_version_first"] == 1).all()
        assert (after["policy_version_last"] == 1).all()
    finally:
        pool.close()
