"""GQA decode, long context: the reference kernel with SPEC.md's six defects fixed.

Written in the kernel DSL only (``tl`` is the argument, nothing is imported), so it is
the patch a kernel author can take home; its :class:`Partial` (the sweep, and the calls
that move a partial) is what the other shipped kernels build their reductions on. Run it with
``mpirun -n 16 python -m gqa_mpi --kernel-source builtin:corrected``. Defect by defect:

1. Short last PE row (P = 5, 6, 7): each row's own length ``min(4, P - 4*row)`` decides
   who receives from ``intra_E``, so no PE waits for a neighbour that does not exist.
2. Tail tokens: every token belongs to one rank, and the kernel reads all of its
   slice: ``tl.local_tokens()`` where the backend has it (gqa_mpi's, for --split and
   a decode loop's placements), else SPEC's balanced split,
   ``S_local = S_kv // n + (r < S_kv % n)``.
3. float16 overflow of ``l`` and ``O``: the running partial and the wire are float32.
4. Scale: scores are ``q.k / sqrt(d)``.
5. Layout: per head. Rows of K and V are loaded whole, ``(tile, h_kv*d)``, and each KV
   head's ``(tile, d)`` columns are sliced off; K is transposed, not reshaped. Q is
   loaded ``(T_q, h_q*d)`` and the G query heads of KV head ``h`` are its columns
   ``h*G*d .. (h+1)*G*d``, reshaped to ``(T_q*G, d)`` (row ``t*G + g``); O is stored
   back in the same order.
6. Empty slices: the sweep runs over ``ceil(S_local / TILE)`` tiles, none for an empty
   slice, whose partial stays the merge's identity ``(-inf, 0, 0)``; the merge and the
   sweep subtract ``0`` instead of ``-inf`` so that identity never makes NaN.
"""

TILE_S_KV = 1024


def _merge(m_a, l_a, O_a, m_b, l_b, O_b, *, tl):
    """Online-softmax merge of two float32 partials; the identity (-inf, 0, 0) is safe."""
    m = tl.maximum(m_a, m_b)
    shift = tl.where(m == float("-inf"), 0.0, m)
    a = tl.exp(m_a - shift)
    b = tl.exp(m_b - shift)
    return m, l_a * a + l_b * b, O_a * a + O_b * b


def _fold(m, l, O, m_o, l_o, O_o, *, tl):
    m_n, l_n, O_n = _merge(m, l, O, m_o, l_o, O_o, tl=tl)
    tl.copy_to(m, m_n)
    tl.copy_to(l, l_n)
    tl.copy_to(O, O_n)


class Partial:
    """This PE's running ``(m, l, O)``, one float32 triple per KV head, and the calls that
    move it: the sweep of its slice, a neighbour's partial received and folded in, its
    own sent on, the root's ``O / l`` stored."""

    def __init__(self, q_ptr, k_ptr, v_ptr, T_q, S_kv, h_q, h_kv, d_head, C, P, *, tl):
        self.tl, self.h_kv, self.d, self.T_q, self.h_q = tl, h_kv, d_head, T_q, h_q
        self.G = G = h_q // h_kv
        self.R = R = G * T_q
        self.pe, self.cube = tl.program_id(axis=0), tl.program_id(axis=1)
        n, rank = C * P, self.cube * P + self.pe
        if hasattr(tl, "local_tokens"):
            S_local = tl.local_tokens()
        else:
            S_local = S_kv // n + (1 if rank < S_kv % n else 0)
        self.scale = 1.0 / d_head ** 0.5
        Q = tl.load(q_ptr, shape=(T_q, h_q * d_head), dtype="f16")
        self.Qh = [tl.cast(tl.reshape(Q[:, h * G * d_head:(h + 1) * G * d_head],
                                      (R, d_head)), "f32") for h in range(h_kv)]
        self.m = [tl.full((R,), float("-inf"), "f32") for _ in range(h_kv)]
        self.l = [tl.zeros((R,), "f32") for _ in range(h_kv)]
        self.O = [tl.zeros((R, d_head), "f32") for _ in range(h_kv)]
        self.sweep(k_ptr, v_ptr, S_local)

    def tiles(self, S_local):
        """``(first token, tokens)`` of each tile of this PE's slice."""
        return [(t0, min(TILE_S_KV, S_local - t0)) for t0 in range(0, S_local, TILE_S_KV)]

    def load(self, k_ptr, v_ptr, t0, ts):
        """The K and V rows of one tile, ``(ts, h_kv*d)`` each, in the dtype memory
        holds them as (the pointer's element type where it has one, else float16)."""
        tl, width = self.tl, self.h_kv * self.d
        kv = k_ptr.dtype.element_ty if hasattr(k_ptr, "dtype") else "f16"
        row = width * (kv.primitive_bitwidth // 8 if hasattr(kv, "primitive_bitwidth") else 2)
        return (tl.load(k_ptr + t0 * row, shape=(ts, width), dtype=kv),
                tl.load(v_ptr + t0 * row, shape=(ts, width), dtype=kv))

    def sweep(self, k_ptr, v_ptr, S_local):
        """The local sweep: scratch bounded by the tile, whatever S_local is."""
        for t0, ts in self.tiles(S_local):
            with self.tl.scratch_scope():
                self.tile(*self.load(k_ptr, v_ptr, t0, ts))

    def tile(self, K, V):
        """Fold one tile's K and V into the running partial, head by head."""
        tl, d = self.tl, self.d
        for h in range(self.h_kv):
            K_h = tl.cast(K[:, h * d:(h + 1) * d], "f32")
            V_h = tl.cast(V[:, h * d:(h + 1) * d], "f32")
            s = tl.dot(self.Qh[h], tl.trans(K_h)) * self.scale
            m_t = tl.max(s, axis=-1)
            p = tl.exp(s - m_t)
            _fold(self.m[h], self.l[h], self.O[h], m_t, tl.sum(p, axis=-1),
                  tl.dot(p, V_h), tl=tl)

    def receive(self, direction):
        """Fold in the partial of the neighbour in ``direction``."""
        tl = self.tl
        with tl.scratch_scope():
            for h in range(self.h_kv):
                m_o = tl.recv(dir=direction, shape=(self.R,), dtype="f32")
                l_o = tl.recv(dir=direction, shape=(self.R,), dtype="f32")
                O_o = tl.recv(dir=direction, shape=(self.R, self.d), dtype="f32")
                _fold(self.m[h], self.l[h], self.O[h], m_o, l_o, O_o, tl=tl)

    def send(self, direction):
        """This partial to the neighbour in ``direction``."""
        for h in range(self.h_kv):
            self.tl.send(dir=direction, src=self.m[h])
            self.tl.send(dir=direction, src=self.l[h])
            self.tl.send(dir=direction, src=self.O[h])

    def relay(self, inbound, outbound):
        """Pass a partial from ``inbound`` on to ``outbound`` untouched."""
        tl = self.tl
        with tl.scratch_scope():
            for h in range(self.h_kv):
                for shape in ((self.R,), (self.R,), (self.R, self.d)):
                    tl.send(dir=outbound, src=tl.recv(dir=inbound, shape=shape, dtype="f32"))

    def store(self, o_ptr):
        """The root: O / l, stored head by head in Q's layout."""
        tl, G, d = self.tl, self.G, self.d
        for h in range(self.h_kv):
            out = self.O[h] / tl.where(self.l[h] == 0.0, 1.0, self.l[h])
            for t in range(self.T_q):
                tl.store(o_ptr + (t * self.h_q + h * G) * d * 2, out[t * G:(t + 1) * G, :])


def reduce_to_root(part, o_ptr, C, P):
    """The chain to the root: row chain, column bridge, inter-cube chain; the root
    stores O."""
    pe, cube = part.pe, part.cube
    col, row = pe % 4, pe // 4
    row_len = min(4, P - 4 * row)
    rows = (P + 3) // 4
    if col < row_len - 1:
        part.receive("intra_E")
    if col > 0:
        part.send("intra_W")
        return
    if row < rows - 1:
        part.receive("intra_S")
    if row > 0:
        part.send("intra_N")
        return
    if cube < C - 1:
        part.receive("E")
    if cube > 0:
        part.send("W")
        return
    part.store(o_ptr)


def gqa_decode_corrected_kernel(q_ptr, k_ptr, v_ptr, o_ptr, T_q, S_kv, h_q, h_kv, d_head,
                                C, P, *, tl):
    part = Partial(q_ptr, k_ptr, v_ptr, T_q, S_kv, h_q, h_kv, d_head, C, P, tl=tl)
    reduce_to_root(part, o_ptr, C, P)
