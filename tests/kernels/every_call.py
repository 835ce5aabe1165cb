"""A GQA decode kernel that calls every name of tl's vocabulary (tl.VOCABULARY) and
still computes attention: the test that each name runs, on MPI, in a kernel that
passes the exact check. Where a call has no part in attention it is held to an
identity that must come out exact (device_assert) or folded in as a factor of 1."""
import triton
import triton.language as tl


@triton.jit
def every_call_kernel(q_ptr, k_ptr, v_ptr, o_ptr, T_q, S_kv, h_q, h_kv, d_head, C, P, *, tl,
                      BLOCK: tl.constexpr = 64):
    tl.static_assert(BLOCK > 0, "a tile of tokens")
    tl.static_print("every_call: BLOCK =", BLOCK)
    pe, cube = tl.program_id(axis=0), tl.program_id(axis=1)
    tl.static_assert(tl.num_programs(0) == P and tl.num_programs(1) == C)
    G, n = h_q // h_kv, tl.local_tokens()
    R = G * T_q
    elem = k_ptr.dtype.element_ty.primitive_bitwidth // 8
    row_bytes = h_kv * d_head * elem
    for dt in (tl.float16, tl.float32):
        one = tl.cast(tl.full((1,), 1.0, tl.float32), dt)       # 1 in both
        tl.device_assert(one.to(tl.float32) == 1.0, "1 survives the cast")
    # the narrow dtypes by name (their arithmetic is test_tl's: naming no value here
    # keeps ml_dtypes, which takes most of a second to import, out of 16 ranks)
    tl.static_assert(len({tl.bfloat16, tl.float8e4nv, tl.float8e5}) == 3)
    rows = tl.arange(0, R)
    tl.device_assert(tl.cast(rows >= 0, tl.int1) & (rows.to(tl.int32) < R))
    scale = tl.rsqrt(tl.full((1,), float(d_head), tl.float32))  # 1 / sqrt(d)
    states = []
    for h in tl.static_range(h_kv):
        # Q's rows of this KV head: (T_q, G*d) -> (R, d), through views
        Q = tl.load(q_ptr, shape=(T_q, h_q * d_head), dtype=tl.float16)
        q = tl.reshape(tl.ravel(Q[:, h * G * d_head:(h + 1) * G * d_head]), (R, d_head))
        q = tl.view(q, (R, 1, d_head))
        q = tl.permute(q, (1, 0, 2))                            # (1, R, d)
        q = tl.expand_dims(tl.reshape(q, (R * d_head,)), 0)     # (1, R*d)
        q = tl.reshape(q, (R, d_head)).to(tl.float32)
        m = tl.full_like(tl.zeros((R,), tl.float32), float("-inf"))
        l = tl.zeros((R,), tl.float32)
        acc = tl.zeros_like(tl.zeros((R, d_head), tl.float32))
        offs_n, offs_d = tl.arange(0, BLOCK), tl.arange(0, d_head)
        for j in tl.range(0, tl.cdiv(n, BLOCK)):
            with tl.scratch_scope():
                tokens = j * BLOCK + offs_n
                valid = tokens < n
                offs = (tokens[:, None] * row_bytes + (h * d_head + offs_d[None, :]) * elem)
                k = tl.load(k_ptr + offs, mask=valid[:, None], other=0.0).to(tl.float32)
                v = tl.load(v_ptr + offs, mask=valid[:, None], other=0.0).to(tl.float32)
                s = tl.dot(q, tl.trans(k)) * scale
                s = tl.where(tl.broadcast_to(valid[None, :], (R, BLOCK)), s, float("-inf"))
                m_t = tl.max(s, axis=1)
                tl.device_assert(tl.min(s, axis=1) <= m_t)
                at = tl.argmax(s, axis=1)
                tl.device_assert((at >= 0) & (tl.argmin(s, axis=1) < BLOCK))
                p = tl.exp2((s - m_t[:, None]) * 1.4426950408889634)
                p = tl.clamp(p, 0.0, 1.0)
                l_t = tl.sum(p, axis=1)
                last = tl.cumsum(p, axis=1)[:, BLOCK - 1]
                tl.device_assert(tl.abs(last - l_t) <= 1e-4 * l_t, "cumsum's last is the sum")
                sm = tl.softmax(s)
                tl.device_assert(tl.abs(sm - p / l_t[:, None]) <= 1e-5, "softmax")
                pv = tl.dot(p, v)
                # the merge, with log/log2/sqrt/sin/cos/floor/ceil/sigmoid/erf as identities
                m_new = tl.maximum(m, m_t)
                shift = tl.where(m_new == float("-inf"), 0.0, m_new)
                a = tl.exp(m - shift)
                b = tl.exp2(tl.log2(tl.exp(m_t - shift)))               # = exp(m_t - shift)
                x = tl.full((R,), 0.25, tl.float32)
                unit = tl.sin(x) * tl.sin(x) + tl.cos(x) * tl.cos(x)   # 1
                tl.device_assert(tl.abs(unit - 1.0) < 1e-6)
                tl.device_assert((tl.floor(x) == 0.0) & (tl.ceil(x) == 1.0))
                tl.device_assert((tl.sigmoid(x - x) == 0.5) & (tl.erf(x - x) == 0.0))
                l_new = tl.fma(l, a, l_t * b)
                l_new = tl.sqrt(l_new * l_new)                          # |l| = l
                l_new = tl.exp(tl.log(tl.maximum(l_new, 1e-30)))        # l, rounded once
                l_new = tl.where(l_new <= 1e-30, 0.0, l_new)
                acc_new = tl.fma(acc, a[:, None], pv * b[:, None])
                lo, hi = tl.split(tl.join(acc_new, acc_new * 2.0))
                tl.device_assert(hi == 2.0 * lo)
                tl.copy_to(acc, tl.minimum(lo, hi * 0.5 + 1.0))         # = lo
                tl.copy_to(l, l_new)
                tl.copy_to(m, m_new)
        states.append((m, l, acc))
    # ---- the chain to the root
    col, row = pe % 4, pe // 4
    row_len = min(4, P - 4 * row)
    for inbound, outbound, receives, sends in (
            ("intra_E", "intra_W", col < row_len - 1, col > 0),
            ("intra_S", "intra_N", row < tl.cdiv(P, 4) - 1, row > 0),
            ("E", "W", cube < C - 1, cube > 0)):
        if receives:
            for m, l, acc in states:
                with tl.scratch_scope():
                    m_b = tl.recv(dir=inbound, shape=(R,), dtype=tl.float32)
                    l_b = tl.recv(dir=inbound, shape=(R,), dtype=tl.float32)
                    acc_b = tl.recv(dir=inbound, shape=(R, d_head), dtype=tl.float32)
                    m_new = tl.maximum(m, m_b)
                    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
                    a, b = tl.exp(m - shift), tl.exp(m_b - shift)
                    tl.copy_to(l, l * a + l_b * b)
                    tl.copy_to(acc, acc * a[:, None] + acc_b * b[:, None])
                    tl.copy_to(m, m_new)
        if sends:
            for m, l, acc in states:
                for x in (m, l, acc):
                    tl.send(dir=outbound, src=x)
            return
    tl.device_print("root O rows", R)
    for h in tl.static_range(h_kv):
        m, l, acc = states[h]
        out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
        for t in range(T_q):
            tl.store(o_ptr + (t * h_q + h * G) * d_head * 2,
                     tl.reshape(out[t * G:(t + 1) * G, :], (G * d_head,)))
