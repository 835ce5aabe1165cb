#!/bin/bash
# One decode step on 2 nodes = 2 cubes of 8 PEs under PBS Pro / Torque. Copy and edit.
#
#   qsub launch/pbs.sh
#
#PBS -N gqa_mpi
#PBS -l select=2:ncpus=8:mpiprocs=8
# Torque uses the older form instead of the line above: #PBS -l nodes=2:ppn=8
#PBS -l walltime=00:15:00
#PBS -j oe
set -euo pipefail
cd "${PBS_O_WORKDIR:-.}"

# module load mpi
# source ~/venvs/gqa_mpi/bin/activate
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

nodes=$(sort -u "$PBS_NODEFILE" | wc -l)
ranks=$(wc -l < "$PBS_NODEFILE")         # PBS lists each node once per mpiprocs
# $PBS_NODEFILE lists node01 8 times, then node02 8 times: block placement, so ranks
# 0-7 (cube 0) share node01. Your MPI's mpirun aborts the job when a rank fails.
mpirun -n "$ranks" -machinefile "$PBS_NODEFILE" \
    python -m gqa_mpi --cubes "$nodes" --pes $((ranks / nodes)) \
    --seq-len "${SEQ_LEN:-1048576}" --no-check --json "gqa_mpi-${PBS_JOBID:-local}.json"
