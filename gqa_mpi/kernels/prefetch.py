"""GQA decode, long context, with a double-buffered sweep: the next tile's K and V are
loaded before the current tile is computed.

The corrected kernel (:mod:`gqa_mpi.kernels.corrected`) loads a tile and computes it
before it asks for the next. Here the loads of tile ``j + 1`` are issued first, then
tile ``j``'s scores, softmax and ``P @ V``, so that on an accelerator whose DMA engine
runs beside its matrix and vector units the next tile arrives while this one is
computed. The reduction to the root is the corrected kernel's chain.

Two tiles are held at once: each tile's K and V live in a scratch scope of their own,
opened before the tile is loaded and closed once it has been computed (so the scopes
overlap, and the scratch high-water mark is two tiles' loads and one tile's work).

Run it with ``--kernel-source builtin:prefetch``, and predict it with a profile whose
engines overlap (``[pe] overlap = true``); it passes the exact check on the grids the
corrected kernel passes.
"""
from gqa_mpi.kernels.corrected import Partial, reduce_to_root


class Prefetched(Partial):
    """The corrected kernel's partial, its sweep double-buffered."""

    def sweep(self, k_ptr, v_ptr, S_local):
        tl, tiles = self.tl, self.tiles(S_local)
        if not tiles:
            return
        held = tl.scratch_scope()            # the buffer of the tile being computed
        held.__enter__()
        K, V = self.load(k_ptr, v_ptr, *tiles[0])
        for j in range(len(tiles)):
            ahead = tl.scratch_scope()       # the other buffer: the next tile
            ahead.__enter__()
            if j + 1 < len(tiles):
                K_next, V_next = self.load(k_ptr, v_ptr, *tiles[j + 1])
            with tl.scratch_scope():
                self.tile(K, V)
            held.__exit__(None, None, None)  # tile j's buffer is free again
            held = ahead
            if j + 1 < len(tiles):
                K, V = K_next, V_next
        held.__exit__(None, None, None)


def gqa_decode_prefetch_kernel(q_ptr, k_ptr, v_ptr, o_ptr, T_q, S_kv, h_q, h_kv, d_head,
                               C, P, *, tl):
    part = Prefetched(q_ptr, k_ptr, v_ptr, T_q, S_kv, h_q, h_kv, d_head, C, P, tl=tl)
    reduce_to_root(part, o_ptr, C, P)
