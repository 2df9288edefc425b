#!/usr/bin/env bash
# Job N of a job list, in the folder it was written in (docs/IMAGENET.md, "On a cluster"):
#   *.json  a `cli.py demo --job-list` file: `python cli.py demo --job LIST N`
#   other   a text file of shell commands, one per line (e.g. a runbook loop listed with
#           LAUNCH="echo python"; blank lines and # comments skipped): command N + 1, by bash
# Jobs are numbered from 0, as SLURM_ARRAY_TASK_ID; PYTHON picks the interpreter.
set -euo pipefail
list=${1:?usage: cluster/task.sh JOB_LIST N}
n=${2:?usage: cluster/task.sh JOB_LIST N}
python=${PYTHON:-python}
cli=$(cd "$(dirname "$0")/.." && pwd)/cli.py       # this repository's command line
case "$list" in
    *.json) exec "$python" "$cli" demo --job "$list" "$n" ;;
    *) line=$(grep -Ev '^[[:space:]]*(#|$)' "$list" | sed -n "$((n + 1))p")
       if [ -z "$line" ]; then echo "error: $list has no job $n" >&2; exit 1; fi
       echo "[job $n] $line"
       exec bash -c "$line" ;;
esac
