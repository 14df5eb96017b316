#!/bin/bash
# One task per node (started by hma srun in batch.sh): set up, then launch the trainer.
set -euo pipefail

# --- environment set-up (site specific: modules, virtualenv, NCCL/EFA variables) ---
# module load cuda; source ~/venv/bin/activate
export CKPT_DIR=${CKPT_DIR:-${SLURM_SUBMIT_DIR}/checkpoints}
export MASTER_PORT=${MASTER_PORT:-29500}

# NODE_LIST, MASTER_NODE, MASTER_ADDR, NNODES, NODE_RANK, fresh from the controller (a requeued
# job runs on other nodes than the ones it was submitted for).
eval "$(hma job-env)"
echo "${SLURMD_NODENAME}: node ${NODE_RANK} of ${NNODES} (${NODE_LIST}), master ${MASTER_NODE} at ${MASTER_ADDR}:${MASTER_PORT}"

if command -v torchrun >/dev/null 2>&1 && [ -z "${HMA_EXAMPLE_TRAINER:-}" ]; then
    exec torchrun --nnodes="${NNODES}" --node-rank="${NODE_RANK}" \
        --nproc-per-node="${GPUS_PER_NODE:-8}" \
        --master-addr="${MASTER_ADDR}" --master-port="${MASTER_PORT}" \
        train.py --checkpoint-dir "${CKPT_DIR}" "$@"
fi
# Without torch (and in the tests): the small checkpointing trainer next to this script.
exec python3 "$(dirname "$0")/trainer.py" --dir "${CKPT_DIR}" \
    --rank "${NODE_RANK}" --world "${NNODES}" "$@"
