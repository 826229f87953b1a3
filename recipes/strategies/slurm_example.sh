#!/bin/bash
# Multi-node skip-aware fine-tuning under SLURM: 2 nodes x 8 GPUs, OPT-6.7B on CNN/DailyMail, FSDP full shard.
# Lightning reads the SLURM environment (SLURMEnvironment): one task per GPU, started by srun; the node count and
# GPUs per node given to the trainer must match the allocation below.
#
#   sbatch recipes/strategies/slurm_example.sh                       # FSDP (default)
#   STRATEGY=deepspeed_zero3 sbatch recipes/strategies/slurm_example.sh
#
#SBATCH --job-name=skiptrain-opt6.7b-cnndm
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8          # one task per GPU: Lightning maps SLURM_LOCALID to the GPU
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --mem=0                      # all of each node's memory (ZeRO offload and checkpoint consolidation use it)
#SBATCH --time=24:00:00
#SBATCH --signal=SIGUSR1@90          # 90 s before the time limit: Lightning checkpoints and requeues (below)
#SBATCH --requeue
#SBATCH --output=runs/slurm-%j.out
set -euo pipefail

STRATEGY=${STRATEGY:-fsdp}           # fsdp | deepspeed_zero2 | deepspeed_zero3 | deepspeed_zero3_offload | ddp
cd "${SLURM_SUBMIT_DIR}"
source .venv/bin/activate            # pip install -e '.[deepspeed]' on a shared filesystem

export HF_HOME=${HF_HOME:-$PWD/.hf}  # model and dataset cache on the shared filesystem (download once, beforehand)
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1  # a failed collective ends the job instead of hanging it
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK}

CONFIGS=(--config recipes/opt6.7b_cnndm.yaml)
if [[ ${STRATEGY} == ddp ]]; then
    CONFIGS+=(--config recipes/fragments/lora.yaml)  # a full fine-tuning replica of 6.7B does not fit one GPU
fi
# Stable across requeues: on SIGUSR1 Lightning writes hpc_ckpt_<n>.ckpt here and requeues the job; the requeued
# job resumes from it automatically.
RUN_DIR="runs/opt6.7b_cnndm_${STRATEGY}"

srun python -m skiptrain fit \
    "${CONFIGS[@]}" \
    --config "recipes/strategies/${STRATEGY}.yaml" \
    --trainer.num_nodes "${SLURM_JOB_NUM_NODES}" \
    --trainer.devices "${SLURM_NTASKS_PER_NODE}" \
    --trainer.default_root_dir "${RUN_DIR}" \
    --trainer.logger.save_dir "${RUN_DIR}"
