#!/bin/bash
# Submit with: sbatch batch.sh [trainer options]   (docs/auto-resume.md)
#SBATCH --job-name=train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=train-%j.out
#
# --requeue: hma srun requeues this job after a hardware fault; it then restarts from the top on
# healthy nodes (the faulty ones are drained) and SLURM_RESTART_COUNT tells the attempt.
# --open-mode=append keeps the output of every attempt in one file.
set -euo pipefail
echo "job ${SLURM_JOB_ID} attempt ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST}"
# Put the example scripts next to the submitted copy, or set EXAMPLES to their folder.
EXAMPLES=${EXAMPLES:-${SLURM_SUBMIT_DIR}}
# --kill-on-bad-exit=1 is srun's own option: one dead rank ends the whole step at once.
hma srun --auto-resume=1 --kill-on-bad-exit=1 "${EXAMPLES}/train_auto_resume.sh" "$@"
