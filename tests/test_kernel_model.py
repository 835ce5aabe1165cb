"""The float64 model of the accelerator kernel (``gqa_mpi.check.kernel_model``), on its
own: against SPEC's index rules, exact attention where no defect shows, and the
kernel's operands as the retired faithful mode swept them (no MPI)."""
import numpy as np
import pytest

from gqa_mpi.step.attention import finalize, local_attention, merge
from gqa_mpi.check.kernel_model import kernel_output, kernel_token_range
from whole_reference import attention_reference

from kernel_model_extras import kernel_operands, kernel_reference
from util import spec_kernel_model


@pytest.mark.parametrize("S,n,tile,h_kv,T_q,G", [(203, 4, 24, 2, 2, 4), (64, 1, 64, 1, 1, 4),
                                               (100, 3, 7, 4, 1, 2), (35, 5, 100, 1, 3, 1)])
def test_model_follows_the_spec_index_rules(S, n, tile, h_kv, T_q, G):
    rng = np.random.default_rng(S + n)
    d = 8
    q = rng.standard_normal((T_q, G * h_kv * d)) / 3
    k, v = (rng.standard_normal((S, h_kv * d)) for _ in "kv")
    got = kernel_reference(q, k, v, h_kv=h_kv, n_ranks=n, tile=tile)
    np.testing.assert_allclose(got, spec_kernel_model(q, k, v, h_kv=h_kv, n=n, tile=tile),
                               rtol=1e-12, atol=1e-12)
    assert got.shape == q.shape and not got.ravel()[G * T_q * d:].any()


def test_no_defect_shows_on_symmetric_single_head_inputs():
    """T_q = 1, h_kv = 1, S_kv a multiple of n, symmetric d x d K tiles: exact attention
    with scale 1 (on the float16-rounded inputs)."""
    rng = np.random.default_rng(0)
    d, n = 8, 4
    S = n * 3 * d
    blocks = rng.standard_normal((S // d, d, d))
    k = (blocks + blocks.transpose(0, 2, 1)).reshape(S, d).astype(np.float16)
    v = rng.standard_normal((S, d)).astype(np.float16)
    q = rng.standard_normal((1, 4 * d)).astype(np.float16)
    model = kernel_reference(q, k, v, h_kv=1, n_ranks=n, tile=d)
    exact = attention_reference(q, k, v, h_kv=1, scale=1.0)
    np.testing.assert_allclose(model[:, :d], exact[:, :d], rtol=1e-12, atol=1e-12)


def test_tail_tokens_and_later_queries_are_ignored():
    rng = np.random.default_rng(2)
    d, n, S = 4, 3, 30
    q = rng.standard_normal((2, 16))
    k, v = (rng.standard_normal((S + 2, 8)) for _ in "kv")
    base = kernel_reference(q, k[:S], v[:S], h_kv=2, n_ranks=n, tile=4)
    # 32 tokens: the slices hold 11, 11, 10 and the kernel reads 10 of each, so the
    # 11th of the first two slices (tokens 10 and 21) is dropped
    rest = [i for i in range(S + 2) if i not in (10, 21)]
    kept = kernel_reference(q, k[rest], v[rest], h_kv=2, n_ranks=n, tile=4)
    k2, v2 = k.copy(), v.copy()
    k2[[10, 21]], v2[[10, 21]] = 100.0, 100.0
    assert np.array_equal(kernel_reference(q, k2, v2, h_kv=2, n_ranks=n, tile=4), kept)
    q2 = q.copy()
    q2.ravel()[2 * 2 * d:] = 50.0                   # past the first G*T_q*d values
    assert np.array_equal(kernel_reference(q2, k[:S], v[:S], h_kv=2, n_ranks=n, tile=4), base)
    assert [kernel_token_range(32, 3, r) for r in range(3)] == [(0, 10), (11, 21), (22, 32)]


def test_faithful_operands_swept_and_merged_equal_the_model():
    """The kernel's operands swept by the NumPy sweep, merged over ranks, are the model."""
    rng = np.random.default_rng(3)
    d, h_kv, G, T_q, n, tile, S = 8, 2, 2, 2, 3, 5, 50
    q = rng.standard_normal((1, T_q, G * h_kv * d)).astype(np.float32) / 2
    k, v = (rng.standard_normal((1, S, h_kv * d)).astype(np.float32) for _ in "kv")
    partials = []
    for r in range(n):
        a, b = kernel_token_range(S, n, r)
        qk, kk, vk = kernel_operands(q, k[:, a:b], v[:, a:b], group=G, d=d, tile=tile)
        partials.append(local_attention(qk, kk, vk, scale=1.0, tile=tile))
    total = partials[0]
    for p in partials[1:]:
        total = merge(total, p)
    got = kernel_output(finalize(total), q.shape)
    model = kernel_reference(q, k, v, h_kv=h_kv, n_ranks=n, tile=tile)
    np.testing.assert_allclose(got, model, atol=1e-5 * np.abs(model).max())
