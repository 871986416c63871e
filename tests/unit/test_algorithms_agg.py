"""Masked statistics and loss aggregation, against numbers worked out by hand."""

import math

import pytest
import torch

from verl.algorithms.utils import AGG_MODES, agg_loss, masked_mean, masked_sum, masked_var, masked_whiten

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])  # valid: 1, 2 | 4


@pytest.mark.parametrize("mask", [MASK, MASK.bool(), MASK.float()])
def test_masked_sum_and_mean_accept_int_bool_and_float_masks(mask):
    # sum = 1 + 2 + 4 = 7, count = 3
    assert masked_sum(X, mask).item() == pytest.approx(7.0)
    assert masked_mean(X, mask).item() == pytest.approx(7.0 / 3.0)
    # per row: (1 + 2) / 2 = 1.5 and 4 / 1 = 4
    assert torch.allclose(masked_sum(X, mask, dim=-1), torch.tensor([3.0, 4.0]))
    assert torch.allclose(masked_mean(X, mask, dim=-1), torch.tensor([1.5, 4.0]))


def test_masked_mean_of_nothing_is_zero_with_finite_gradient():
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    mean = masked_mean(x, torch.zeros(1, 2))
    mean.backward()
    assert mean.item() == 0.0
    assert torch.equal(x.grad, torch.zeros(1, 2))
    # A row with no valid token gives 0 in the per-row mean, the other row is untouched.
    rows = masked_mean(X, torch.tensor([[0, 0, 0], [1, 1, 0]]), dim=-1)
    assert torch.allclose(rows, torch.tensor([0.0, 4.5]))  # (4 + 5) / 2


def test_nan_in_padding_does_not_leak_into_values_or_gradients():
    x = torch.tensor([[1.0, float("nan")]], requires_grad=True)
    mean = masked_mean(x, torch.tensor([[1, 0]]))
    mean.backward()
    assert mean.item() == 1.0
    assert torch.equal(x.grad, torch.tensor([[1.0, 0.0]]))


def test_masked_var_unbiased_and_biased():
    # valid 1, 2, 4: mean 7/3; deviations -4/3, -1/3, 5/3; squares 16/9 + 1/9 + 25/9 = 42/9 = 14/3
    assert masked_var(X, MASK).item() == pytest.approx(14.0 / 3.0 / 2.0)  # / (n - 1) = 7/3
    assert masked_var(X, MASK, unbiased=False).item() == pytest.approx(14.0 / 3.0 / 3.0)  # / n = 14/9


def test_masked_var_with_too_few_elements_is_zero():
    one = torch.tensor([[1, 0, 0], [0, 0, 0]])
    assert masked_var(X, one).item() == 0.0  # n - 1 = 0: no spread information
    assert masked_var(X, torch.zeros_like(MASK), unbiased=False).item() == 0.0


def test_masked_whiten():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 0]])
    # valid 1, 3: mean 2; unbiased var ((-1)^2 + 1^2) / 1 = 2; std sqrt(2)
    s = 1.0 / math.sqrt(2.0)
    assert torch.allclose(masked_whiten(x, mask), torch.tensor([[-s, s, 0.0]]), atol=1e-6)
    # shift_mean=False adds the mean 2 back; padding still 0
    assert torch.allclose(masked_whiten(x, mask, shift_mean=False), torch.tensor([[2 - s, 2 + s, 0.0]]), atol=1e-6)
    # a single valid element has var 0 and whitens to 0, not NaN
    assert torch.equal(masked_whiten(x, torch.tensor([[1, 0, 0]])), torch.zeros(1, 3))


def test_agg_loss_modes_by_hand():
    # valid losses: row 0 -> 1, 2 ; row 1 -> 4; B = 2, T = 3
    assert agg_loss(X, MASK, "token-mean").item() == pytest.approx(7.0 / 3.0)  # (1+2+4) / 3 tokens
    assert agg_loss(X, MASK, "seq-mean-token-sum").item() == pytest.approx(3.5)  # (3 + 4) / 2 seqs
    assert agg_loss(X, MASK, "seq-mean-token-mean").item() == pytest.approx(2.75)  # (1.5 + 4) / 2
    assert agg_loss(X, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(7.0 / 6.0)  # 7 / (2 * 3)
    assert agg_loss(X, MASK, "seq-mean-token-sum-norm", norm_len=7).item() == pytest.approx(0.5)  # 7 / (2 * 7)
    # explicit global counts replace the local ones
    assert agg_loss(X, MASK, "token-mean", global_tokens=10).item() == pytest.approx(0.7)  # 7 / 10
    assert agg_loss(X, MASK, "seq-mean-token-sum", global_seqs=4).item() == pytest.approx(1.75)  # 7 / 4
    assert agg_loss(X, MASK, "token-mean", global_tokens=torch.tensor(14.0)).item() == pytest.approx(0.5)


def test_agg_loss_counts_empty_rows_as_sequences():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # seq-mean-token-mean: (1.5 + 0) / 2 rows; token-mean only sees the 2 real tokens: 3 / 2
    assert agg_loss(X, mask, "seq-mean-token-mean").item() == pytest.approx(0.75)
    assert agg_loss(X, mask, "token-mean").item() == pytest.approx(1.5)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_agg_loss_fully_masked_and_zero_length_are_zero_not_nan(mode):
    x = torch.ones(2, 3, requires_grad=True)
    loss = agg_loss(x, torch.zeros(2, 3), mode)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(x.grad, torch.zeros(2, 3))
    empty = agg_loss(torch.zeros(2, 0), torch.zeros(2, 0), mode)
    assert empty.item() == 0.0


def test_agg_loss_unknown_mode_names_the_allowed_ones():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        agg_loss(X, MASK, "token_mean")


def _whole_and_micro_grads(mode, use_global_counts):
    torch.manual_seed(0)
    w = torch.randn(5, 4, requires_grad=True)
    target = torch.randn(5, 4)
    # lengths 4, 1, 3, 0, 2: uneven, with an empty row
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]])

    def loss_mat(rows):
        return (w[rows] - target[rows]) ** 2

    whole = agg_loss(loss_mat(slice(0, 5)), mask, mode)
    (g_whole,) = torch.autograd.grad(whole, w)

    counts = dict(global_tokens=mask.sum(), global_seqs=5) if use_global_counts else {}
    micro = sum(agg_loss(loss_mat(rows), mask[rows], mode, **counts) for rows in (slice(0, 2), slice(2, 5)))
    (g_micro,) = torch.autograd.grad(micro, w)
    return whole, micro, g_whole, g_micro


@pytest.mark.parametrize("mode", AGG_MODES)
def test_summed_micro_batch_losses_equal_the_whole_batch_loss(mode):
    # Micro-batches of 2 and 3 rows, each reduced with the mini-batch's token and sequence counts.
    whole, micro, g_whole, g_micro = _whole_and_micro_grads(mode, use_global_counts=True)
    assert torch.allclose(micro, whole, atol=1e-6)
    assert torch.allclose(g_micro, g_whole, atol=1e-6)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_local_counts_would_break_gradient_accumulation(mode):
    # Guards the test above against passing vacuously: with per-micro-batch denominators the
    # summed gradient is not the whole-batch gradient.
    _, _, g_whole, g_micro = _whole_and_micro_grads(mode, use_global_counts=False)
    assert not torch.allclose(g_micro, g_whole, atol=1e-3)
