"""FlashAttention decode as a Triton author writes it: tl.dot(q, tl.trans(k)), the
running output rescaled and accumulated with ``acc = tl.dot(p, v, acc)``, load hints,
list shapes with ``dtype=``; then the card's chain (tests/test_in_process.py)."""
import triton
import triton.language as tl


@triton.jit
def fa_kernel(Q, K, V, O, T_q, S_kv, h_q, h_kv, D, C, P, *, tl, BLOCK_N: tl.constexpr = 32):
    pid = tl.program_id(0)
    cid = tl.program_id(1)
    G = h_q // h_kv
    n = tl.local_tokens()
    stride = h_kv * D * 2
    offs_g = tl.arange(0, G)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    out = []
    for t in range(T_q):
        for hk in range(h_kv):
            q = tl.load(Q + ((t * h_q + hk * G + offs_g)[:, None] * D + offs_d[None, :]) * 2)
            m_i = tl.full([G], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([G], dtype=tl.float32)
            acc = tl.zeros([G, D], dtype=tl.float32)
            for start in range(0, n, BLOCK_N):
                rows = start + offs_n
                ptrs = rows[:, None] * stride + (hk * D + offs_d)[None, :] * 2
                ok = rows[:, None] < n
                k = tl.load(K + ptrs, mask=ok, other=0.0, eviction_policy="evict_first")
                v = tl.load(V + ptrs, mask=ok, other=0.0, cache_modifier=".cg")
                qk = tl.dot(q, tl.trans(k), out_dtype=tl.float32) * (D ** -0.5)
                qk = tl.where((rows < n)[None, :], qk, float("-inf"))
                m_ij = tl.maximum(m_i, tl.max(qk, 1))
                p = tl.exp(qk - m_ij[:, None])
                alpha = tl.exp(m_i - m_ij)
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None]
                acc = tl.dot(p.to(tl.float16), v, acc)
                m_i = m_ij
            out.append((t, hk, m_i, l_i, acc))
    col, row = pid % 4, pid // 4
    P_rows = tl.cdiv(P, 4)
    last = min(4, P - 4 * row) - 1
    for into, to, rcv, snd in (("intra_E", "intra_W", col < last, col > 0),
                               ("intra_S", "intra_N", col == 0 and row < P_rows - 1,
                                col == 0 and row > 0),
                               ("E", "W", pid == 0 and cid < C - 1, pid == 0 and cid > 0)):
        if rcv:
            new = []
            for t, hk, m, l, a in out:
                m2 = tl.recv(dir=into, shape=(G,), dtype=tl.float32)
                l2 = tl.recv(dir=into, shape=(G,), dtype=tl.float32)
                a2 = tl.recv(dir=into, shape=(G, D), dtype=tl.float32)
                mm = tl.maximum(m, m2)
                s = tl.where(mm == float("-inf"), 0.0, mm)
                e1, e2 = tl.exp(m - s), tl.exp(m2 - s)
                new.append((t, hk, mm, l * e1 + l2 * e2, a * e1[:, None] + a2 * e2[:, None]))
            out = new
        if snd:
            for _, _, m, l, a in out:
                tl.send(dir=to, src=m)
                tl.send(dir=to, src=l)
                tl.send(dir=to, src=a)
            return
    for t, hk, m, l, a in out:
        o_ptrs = O + ((t * h_q + hk * G + offs_g)[:, None] * D + offs_d[None, :]) * 2
        tl.store(o_ptrs, a / l[:, None])
