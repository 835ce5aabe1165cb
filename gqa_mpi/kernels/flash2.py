"""GQA decode, long context, written the way a Triton author writes FlashAttention-2.

A worked example for kernel authors (docs/kernel-source.md): the file imports
``triton`` as a Triton kernel file does (gqa_mpi gives it a stand-in, so the file runs
unchanged), takes its tile as a ``tl.constexpr`` parameter, builds its pointers with
``tl.arange`` and masks the slice's last tile with ``mask=``/``other=``, folds
``log2(e)`` into the softmax scale and uses ``tl.exp2``, and unrolls its heads with
``tl.static_range``. It reads K and V in whatever dtype memory holds them
(``k_ptr.dtype.element_ty``: float16, bfloat16 or float8 with ``--kv-dtype``).

Each PE sweeps its slice of the KV cache in tiles of ``BLOCK_N`` tokens, one KV head
at a time, keeping a running max ``m`` (in base 2), sum ``l`` and float32 accumulator;
the partials then travel to the root along the design card's chain (row chain,
column bridge, inter-cube chain), each PE folding in what it receives. A tile's
tensors live in a scratch scope and the running partial is updated with
``tl.copy_to``, so the scratch high-water mark is one tile's, whatever the slice.

Run it with ``mpirun -n 16 python -m gqa_mpi --kernel-source builtin:flash2``; it passes
the exact check on the grids the corrected kernel passes.
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _fold(m, l, acc, m_b, l_b, acc_b, *, tl):
    """Merge the partial ``(m_b, l_b, acc_b)`` into ``(m, l, acc)`` in place (base 2;
    the empty partial ``(-inf, 0, 0)`` is safe)."""
    m_new = tl.maximum(m, m_b)
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    a = tl.exp2(m - shift)
    b = tl.exp2(m_b - shift)
    tl.copy_to(l, l * a + l_b * b)
    tl.copy_to(acc, acc * a[:, None] + acc_b * b[:, None])
    tl.copy_to(m, m_new)


@triton.jit
def gqa_decode_flash2_kernel(q_ptr, k_ptr, v_ptr, o_ptr, T_q, S_kv, h_q, h_kv, d_head, C, P,
                             *, tl, BLOCK_N: tl.constexpr = 128):
    pe = tl.program_id(axis=0)
    cube = tl.program_id(axis=1)
    G = h_q // h_kv
    R = G * T_q                                   # query rows of one KV head: t*G + g
    S_local = tl.local_tokens()
    elem = k_ptr.dtype.element_ty.primitive_bitwidth // 8   # bytes of a K or V element
    row_bytes = h_kv * d_head * elem
    qk_scale = LOG2E / d_head ** 0.5              # exp(x / sqrt(d)) = exp2(x * qk_scale)

    offs_r = tl.arange(0, R)
    offs_d = tl.arange(0, d_head)
    offs_n = tl.arange(0, BLOCK_N)
    q_rows = (offs_r // G) * h_q + offs_r % G     # Q's (T_q, h_q) head of each row, less h*G

    m_i, l_i, acc = [], [], []
    for h in tl.static_range(h_kv):
        q_ptrs = q_ptr + ((q_rows + h * G)[:, None] * d_head + offs_d[None, :]) * 2
        q = tl.load(q_ptrs).to(tl.float32)
        m = tl.full((R,), float("-inf"), tl.float32)
        l = tl.zeros((R,), tl.float32)
        o = tl.zeros((R, d_head), tl.float32)
        for start in range(0, S_local, BLOCK_N):
            with tl.scratch_scope():
                valid = start + offs_n < S_local
                # byte offsets within the tile (small: int32 is enough), added to the
                # tile's base address (a Python int)
                offs = offs_n[:, None] * row_bytes + (h * d_head + offs_d[None, :]) * elem
                base = start * row_bytes
                k = tl.load(k_ptr + base + offs, mask=valid[:, None], other=0.0).to(tl.float32)
                v = tl.load(v_ptr + base + offs, mask=valid[:, None], other=0.0).to(tl.float32)
                s = tl.dot(q, tl.trans(k)) * qk_scale
                s = tl.where(valid[None, :], s, float("-inf"))
                m_t = tl.max(s, axis=1)
                p = tl.exp2(s - m_t[:, None])
                _fold(m, l, o, m_t, tl.sum(p, axis=1), tl.dot(p, v), tl=tl)
        m_i.append(m)
        l_i.append(l)
        acc.append(o)

    # ---- the chain to the root: row chain, column bridge, inter-cube chain
    col, row = pe % 4, pe // 4
    row_len = min(4, P - 4 * row)
    for inbound, outbound, receives, sends in (
            ("intra_E", "intra_W", col < row_len - 1, col > 0),
            ("intra_S", "intra_N", row < tl.cdiv(P, 4) - 1, row > 0),
            ("E", "W", cube < C - 1, cube > 0)):
        if receives:
            for h in tl.static_range(h_kv):
                with tl.scratch_scope():
                    m_b = tl.recv(dir=inbound, shape=(R,), dtype=tl.float32)
                    l_b = tl.recv(dir=inbound, shape=(R,), dtype=tl.float32)
                    o_b = tl.recv(dir=inbound, shape=(R, d_head), dtype=tl.float32)
                    _fold(m_i[h], l_i[h], acc[h], m_b, l_b, o_b, tl=tl)
        if sends:
            for h in tl.static_range(h_kv):
                tl.send(dir=outbound, src=m_i[h])
                tl.send(dir=outbound, src=l_i[h])
                tl.send(dir=outbound, src=acc[h])
            return

    # ---- the root: O = acc / l, in Q's layout
    for h in tl.static_range(h_kv):
        o_ptrs = o_ptr + ((q_rows + h * G)[:, None] * d_head + offs_d[None, :]) * 2
        l_h = tl.where(l_i[h] == 0.0, 1.0, l_i[h])
        tl.store(o_ptrs, acc[h] / l_h[:, None])
