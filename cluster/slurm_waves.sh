#!/usr/bin/env bash
# Submit one or more job lists to SLURM: one job array per wave (sbatch --array=FIRST-LAST), each
# wave after the one before has succeeded (afterok), each task running cluster/task.sh LIST
# $SLURM_ARRAY_TASK_ID in the folder it was submitted from (docs/IMAGENET.md, "On a cluster").
# Options after -- go to every sbatch, e.g. the partition, a GPU and the time limit:
#
#   cluster/slurm_waves.sh jobs.json -- --partition gpu --gres gpu:1 --time 02:00:00
#   cluster/slurm_waves.sh extract.jobs train.jobs report.jobs -- --gres gpu:1
#
# Submit from the folder the lists were written in.  A task that fails stops the later waves
# (afterok); fix the cause and submit again: finished jobs are skipped, interrupted ones resume.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/waves.sh"
lists=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do lists+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#lists[@]} -ge 1 ] || { echo "usage: cluster/slurm_waves.sh JOB_LIST... [-- SBATCH OPTIONS]" >&2; exit 2; }
previous=""
while read -r first last name list; do
    after=()
    if [ -n "$previous" ]; then after=(--dependency="afterok:$previous"); fi
    previous=$(sbatch --parsable "${after[@]}" --array="$first-$last" --job-name="$name" \
        "$@" --wrap "$here/task.sh $list \$SLURM_ARRAY_TASK_ID")
    previous=${previous%%;*}            # "ID;cluster" on a federation
    echo "wave: jobs $first-$last of $list ($name): array job $previous"
done < <(waves "${lists[@]}")
