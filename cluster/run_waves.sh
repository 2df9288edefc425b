#!/usr/bin/env bash
# Every job of one or more job lists on this machine, wave by wave, P jobs of a wave at a time
# (docs/IMAGENET.md, "On a cluster"); several lists run one after the other.  Run it in the
# folder the lists were written in.
#
#   cluster/run_waves.sh -P 4 jobs.json          # a `cli.py demo --job-list` file
#   cluster/run_waves.sh extract.jobs train.jobs # text files of commands: one wave each
#
# A job that fails stops the script after its wave; run it again: finished jobs are skipped,
# interrupted ones resume.  PYTHON picks the interpreter (default python).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/waves.sh"
parallel=2
if [ "${1:-}" = "-P" ]; then parallel=$2; shift 2; fi
[ $# -ge 1 ] || { echo "usage: cluster/run_waves.sh [-P N] JOB_LIST..." >&2; exit 2; }
waves "$@" | while read -r first last name list; do
    echo "== wave: jobs $first-$last of $list ($name)"
    seq "$first" "$last" | xargs -P "$parallel" -I{} "$here/task.sh" "$list" {}
done
