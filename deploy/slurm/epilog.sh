#!/bin/sh
# ranksight Slurm epilog: end the job's GPU bindings written by prolog.sh (see there).
# It never fails the job: it exits 0 whatever happens.
set -u
[ -r "${RANKSIGHT_SLURM_ENV:-/etc/ranksight/slurm.env}" ] && . "${RANKSIGHT_SLURM_ENV:-/etc/ranksight/slurm.env}"
job="${SLURM_JOB_ID:-}"
case "$job" in ''|*[!0-9_]*) exit 0 ;; esac
dir="${RANKSIGHT_RUNTIME_DIR:-/run/ranksight}/bindings"
rm -f "$dir"/slurm-"$job"-gpu*.json
if [ -r "$dir/.slurm-$job.holder" ]; then
  holder=$(cat "$dir/.slurm-$job.holder")
  # only our holder: a sleep started by the prolog (a reused pid is left alone)
  case "$holder" in ''|*[!0-9]*) ;; *)
    grep -q '^sleep$' "/proc/$holder/comm" 2>/dev/null && kill "$holder" 2>/dev/null ;;
  esac
  rm -f "$dir/.slurm-$job.holder"
fi
exit 0
