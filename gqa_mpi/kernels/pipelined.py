"""GQA decode, long context, reduced by the kernel's chain with O sent in pieces, so
that the hops pipeline.

The local sweep is the corrected kernel's (:class:`gqa_mpi.kernels.corrected.Partial`)
and the chain the same (row chain, column bridge, inter-cube chain), but a PE folds
every partial it is sent in one pass, piece by piece: it takes ``m`` and ``l`` from
each neighbour that sends to it, sends on the merged ``m`` and ``l`` at once, then for
each of :data:`PIECES` row blocks of ``O`` takes that block from each neighbour, merges
it and sends it on before the next block arrives. A block crosses the next hop while
the one behind it is still on its way: with large ``O`` (many query rows), the chain's
time goes from ``hops x (all of O)`` towards ``hops x (one block) + all of O``.

Run it with ``--kernel-source builtin:pipelined``; it passes the exact check on the
grids the corrected kernel passes.
"""
from gqa_mpi.kernels.corrected import Partial

PIECES = 4
"""Row blocks of O per message (fewer when O has fewer rows)."""


def gqa_decode_pipelined_kernel(q_ptr, k_ptr, v_ptr, o_ptr, T_q, S_kv, h_q, h_kv, d_head,
                                C, P, *, tl):
    part = Partial(q_ptr, k_ptr, v_ptr, T_q, S_kv, h_q, h_kv, d_head, C, P, tl=tl)
    pe, cube, R, G = part.pe, part.cube, part.R, part.G
    col, row = pe % 4, pe // 4
    row_len, rows = min(4, P - 4 * row), (P + 3) // 4
    inbound = ([d for d, has in (("intra_E", col < row_len - 1),
                                 ("intra_S", col == 0 and row < rows - 1),
                                 ("E", pe == 0 and cube < C - 1)) if has])
    outbound = "intra_W" if col > 0 else "intra_N" if row > 0 else "W" if cube > 0 else None
    # row blocks of whole query tokens where there are enough of them, so that the root
    # stores each token's rows at once
    unit = G if T_q >= PIECES else 1
    cuts = sorted({R // unit * i // PIECES * unit for i in range(PIECES + 1)} | {R})
    for h in range(h_kv):
        with tl.scratch_scope():
            ms, ls = [part.m[h]], [part.l[h]]
            for direction in inbound:
                ms.append(tl.recv(dir=direction, shape=(R,), dtype="f32"))
                ls.append(tl.recv(dir=direction, shape=(R,), dtype="f32"))
            m = ms[0]
            for other in ms[1:]:
                m = tl.maximum(m, other)
            shift = tl.where(m == float("-inf"), 0.0, m)     # the identity makes no NaN
            weights = [tl.exp(x - shift) for x in ms]
            l = ls[0] * weights[0]
            for l_o, w in zip(ls[1:], weights[1:]):
                l = l + l_o * w
            if outbound:
                tl.send(dir=outbound, src=m)
                tl.send(dir=outbound, src=l)
            for r0, r1 in zip(cuts, cuts[1:]):
                block = part.O[h][r0:r1] * weights[0][r0:r1]
                for direction, w in zip(inbound, weights[1:]):
                    O_o = tl.recv(dir=direction, shape=(r1 - r0, d_head), dtype="f32")
                    block = block + O_o * w[r0:r1]
                if outbound:
                    tl.send(dir=outbound, src=block)
                    continue
                out = block / tl.where(l[r0:r1] == 0.0, 1.0, l[r0:r1])   # the root
                a = r0
                while a < r1:                    # rows of one query token are contiguous
                    t, g = divmod(a, G)
                    b = min(r1, (t + 1) * G)
                    tl.store(o_ptr + (t * h_q + h * G + g) * d_head * 2,
                             out[a - r0:b - r0, :])
                    a = b
