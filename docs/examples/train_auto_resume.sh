#!/bin/bash
# The entry script of a training job, one task per node, written as managed clusters ask for it:
#     srun --auto-resume=1 train_auto_resume.sh [trainer options]     (the srun plugin)
#     hma srun --auto-resume=1 train_auto_resume.sh [trainer options] (without it; batch.sh)
# All set-up happens here, inside the step, because after a hardware fault the step starts again
# (on other nodes) and this script runs again from the top: nothing may come from the first
# start. It recomputes the node list and the master address from the controller and resumes from
# the last checkpoint. docs/auto-resume.md.
set -euo pipefail

# --- environment set-up (site specific: modules, virtualenv, NCCL/EFA variables) ---
# module load cuda; source ~/venv/bin/activate
export CKPT_DIR=${CKPT_DIR:-${SLURM_SUBMIT_DIR}/checkpoints}
export MASTER_PORT=${MASTER_PORT:-29500}

# NODE_LIST, MASTER_NODE, MASTER_ADDR, NNODES, NODE_RANK, fresh from the controller: after a
# resume the job runs on other nodes than it was started on, and SLURM_JOB_NODELIST may be stale.
eval "$(hma job-env)"
echo "${SLURMD_NODENAME}: node ${NODE_RANK} of ${NNODES} (${NODE_LIST}), master ${MASTER_NODE} at ${MASTER_ADDR}:${MASTER_PORT}"

# The trainer resumes from the newest checkpoint in CKPT_DIR (shared storage) when there is one.
if command -v torchrun >/dev/null 2>&1 && [ -z "${HMA_EXAMPLE_TRAINER:-}" ]; then
    exec torchrun --nnodes="${NNODES}" --node-rank="${NODE_RANK}" \
        --nproc-per-node="${GPUS_PER_NODE:-8}" \
        --master-addr="${MASTER_ADDR}" --master-port="${MASTER_PORT}" \
        train.py --checkpoint-dir "${CKPT_DIR}" "$@"
fi
# Without torch (and in the tests): the small checkpointing trainer next to this script.
exec python3 "$(dirname "$0")/trainer.py" --dir "${CKPT_DIR}" \
    --rank "${NODE_RANK}" --world "${NNODES}" "$@"
