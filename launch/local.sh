#!/usr/bin/env bash
# Strong- and weak-scaling study on one machine with real cores (one rank per core).
#
#   launch/local.sh [OUTDIR]        # default OUTDIR: study-$(hostname)
#
# Knobs (environment): RANKS (1,2,4,... up to the cores this machine has, at most 16:
# more ranks than cores time shared cores, and the report says so),
# SEQ_LEN (1048576, strong scaling),
# TOKENS_PER_RANK (65536, weak scaling), REPEATS (3), HEADS_KV (8), HEAD_DIM (128).
# Results: OUTDIR/strong.csv, OUTDIR/weak.csv and PNGs beside them. Re-running the same
# command resumes: finished runs are kept and skipped.
set -euo pipefail
out=${1:-study-$(hostname)}
mkdir -p "$out"
cores=$(nproc)
ranks=1
for r in 2 4 8 16; do [ "$r" -le "$cores" ] && ranks="$ranks,$r"; done
common=(--ranks "${RANKS:-$ranks}" --repeats "${REPEATS:-3}"
        --heads-kv "${HEADS_KV:-8}" --head-dim "${HEAD_DIM:-128}" --timeout 900)
# No float64 check in a timing study: it would add about as long as the inputs to every launch.
python -m gqa_mpi.study run --kind strong --seq-len "${SEQ_LEN:-1048576}" \
    --out "$out/strong.csv" "${common[@]}" -- --no-check
python -m gqa_mpi.study run --kind weak --tokens-per-rank "${TOKENS_PER_RANK:-65536}" \
    --out "$out/weak.csv" "${common[@]}" -- --no-check
python -m gqa_mpi.study plot "$out/strong.csv"
python -m gqa_mpi.study plot "$out/weak.csv"
