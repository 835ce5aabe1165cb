"""GQA decode, long context, reduced by a tree instead of the chain (Tree Attention's
reduction, on the kernel's mesh).

The local sweep is the corrected kernel's (:class:`gqa_mpi.kernels.corrected.Partial`).
The partials then reach the root along three lines, as the chain's do (each PE row,
column 0, the row of cubes), but along each line by a binary tree: at level ``s = 1, 2,
4, ...`` node ``j`` with ``j % 2s == s`` sends its partial towards node ``j - s``, which
folds it in. The mesh has neighbour links only, so a message of a level above the first
hops through the nodes between, each passing it on untouched (no merge). A line of
``n`` nodes takes ``ceil(log2 n)`` merges on its critical path where the chain takes
``n - 1``, and as many hops.

Run it with ``--kernel-source builtin:tree``; it passes the exact check on the grids the
corrected kernel passes, and ``--predict`` compares the two.
"""
from gqa_mpi.kernels.corrected import Partial


def _tree_line(part, j, n, inward, outward):
    """Reduce a line of ``n`` nodes to node 0 by a binary tree of neighbour hops;
    ``j`` is this node, ``inward`` the direction towards node 0. True if ``j`` still
    holds a partial to pass on (it is node 0)."""
    holds, s = True, 1
    while s < n:
        low = j - j % (2 * s)                 # the receiver of this level's pair
        if low + s < n:
            if j == low:
                part.receive(outward)
            elif j == low + s:
                part.send(inward)
                holds = False
            elif low < j < low + s:
                part.relay(outward, inward)   # a message of this level passes through
        s *= 2
    return holds


def gqa_decode_tree_kernel(q_ptr, k_ptr, v_ptr, o_ptr, T_q, S_kv, h_q, h_kv, d_head, C, P,
                           *, tl):
    part = Partial(q_ptr, k_ptr, v_ptr, T_q, S_kv, h_q, h_kv, d_head, C, P, tl=tl)
    pe, cube = part.pe, part.cube
    col, row = pe % 4, pe // 4
    row_len = min(4, P - 4 * row)
    if not _tree_line(part, col, row_len, "intra_W", "intra_E") or col > 0:
        return
    if not _tree_line(part, row, (P + 3) // 4, "intra_N", "intra_S") or row > 0:
        return
    if not _tree_line(part, cube, C, "W", "E") or cube > 0:
        return
    part.store(o_ptr)
