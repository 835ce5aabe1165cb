#!/usr/bin/env bash
# A strong-scaling study across the hosts of a hostfile, one launch per point.
#
#   launch/study_hostfile.sh hostfiles/mpich.hosts [OUT.csv]
#
# The hostfile decides where ranks go (see hostfiles/); the study asks for 1, 2, 4, ...
# ranks and the launcher fills the first host first, so small points stay on one host
# and the inter-cube chain crosses the network once a second cube starts. Kill it at
# any time: the same command resumes from OUT.csv. Knobs: RANKS, SEQ_LEN, REPEATS.
set -euo pipefail
hostfile=${1:?usage: $0 HOSTFILE [OUT.csv]}
out=${2:-study-hosts.csv}
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
    launcher="mpirun --hostfile $hostfile --map-by slot -n {n}"      # Open MPI
else
    launcher="mpiexec -f $hostfile -n {n}"                           # MPICH / Hydra
fi
python -m gqa_mpi.study run --kind strong --ranks "${RANKS:-1,2,4,8,16}" \
    --seq-len "${SEQ_LEN:-1048576}" --repeats "${REPEATS:-3}" --timeout 900 \
    --launcher "$launcher" --out "$out" -- --no-check
python -m gqa_mpi.study plot "$out"
