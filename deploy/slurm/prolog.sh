#!/bin/sh
# ranksight Slurm prolog: bind the job's GPUs to the job for the node agent's attribution.
#
# slurm.conf:  Prolog=/etc/ranksight/slurm/prolog.sh   Epilog=/etc/ranksight/slurm/epilog.sh
# (slurmd runs them as root on each node of the job, at its start and its end.)
#
# The agent attributes a GPU to the job whose processes use it (their cgroup or SLURM_JOB_ID); a
# GPU the job holds but no process uses yet (a job stuck before CUDA init, a rank that died) has
# no such process. This prolog writes one binding per GPU of the job (SLURM_JOB_GPUS) in the
# format the training SDK writes (producers/training/bindings.py) into /run/ranksight/bindings,
# which the agent reads: job, run and GPU UUID, held by a small process that lives until the
# epilog ends it (a binding counts only while its process lives, so a node that reboots or a
# holder that dies leaves nothing stale). The SDK's own bindings (default: /run/user/<uid> or
# /tmp) are read after these and win for the same GPU.
#
# Settings (environment, or /etc/ranksight/slurm.env): RANKSIGHT_RUNTIME_DIR (default /run/ranksight),
# RANKSIGHT_GPU_UUIDS: a file of "index, uuid" lines instead of asking nvidia-smi.
# It never fails the job: any problem is logged to syslog (logger) and the prolog exits 0.
set -u
[ -r "${RANKSIGHT_SLURM_ENV:-/etc/ranksight/slurm.env}" ] && . "${RANKSIGHT_SLURM_ENV:-/etc/ranksight/slurm.env}"
warn() { logger -t ranksight-prolog "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || true; }

job="${SLURM_JOB_ID:-}"
gpus="${SLURM_JOB_GPUS:-}"
case "$job" in ''|*[!0-9_]*) exit 0 ;; esac
[ -n "$gpus" ] || exit 0
dir="${RANKSIGHT_RUNTIME_DIR:-/run/ranksight}/bindings"
mkdir -p "$dir" && chmod 755 "$dir" || { warn "cannot create $dir"; exit 0; }

# index -> UUID of this node's GPUs
if [ -n "${RANKSIGHT_GPU_UUIDS:-}" ]; then
  uuids=$(cat "$RANKSIGHT_GPU_UUIDS" 2>/dev/null)
else
  uuids=$(nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>/dev/null)
fi
[ -n "$uuids" ] || { warn "no GPU UUIDs (nvidia-smi failed)"; exit 0; }

# The holder: its pid and start time make the bindings live; the epilog ends it.
setsid sleep 2147483647 </dev/null >/dev/null 2>&1 &
holder=$!
start=$(sed 's/^.*) //' "/proc/$holder/stat" 2>/dev/null | cut -d' ' -f20)
echo "$holder" > "$dir/.slurm-$job.holder"

# The SDK's run id for a Slurm job: "" until the first requeue, then restart-<n>.
run=""
restarts="${SLURM_JOB_RESTART_COUNT:-${SLURM_RESTART_COUNT:-0}}"  # the prolog's name, the job's name
[ "$restarts" = "0" ] || run="restart-$restarts"
node=$(hostname -s 2>/dev/null || hostname)

for index in $(echo "$gpus" | tr ',' ' '); do
  case "$index" in ''|*[!0-9]*) continue ;; esac
  uuid=$(echo "$uuids" | awk -F', *' -v i="$index" '$1 == i {print $2; exit}')
  case "$uuid" in GPU-*|MIG-*) ;; *) warn "GPU $index has no UUID"; continue ;; esac
  tmp="$dir/.slurm-$job-gpu$index.json.tmp"
  printf '{"pid": %s, "job_id": "%s", "run_id": "%s", "gpu_uuid": "%s", "gpu_index": %s, "node": "%s", "start_time": %s}\n' \
    "$holder" "$job" "$run" "$uuid" "$index" "$node" "${start:-null}" > "$tmp" \
    && chmod 644 "$tmp" && mv "$tmp" "$dir/slurm-$job-gpu$index.json" || warn "cannot write the binding of GPU $index"
done
exit 0
