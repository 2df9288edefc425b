#!/usr/bin/env bash
# The waves of job lists, one "FIRST LAST NAME" line each: a demo job list's own waves (JSON),
# or a text file of commands as one wave of all its lines.  Sourced by run_waves.sh and
# slurm_waves.sh.
waves() {
    local list
    for list in "$@"; do
        case "$list" in
            *.json) "${PYTHON:-python}" -c 'import json, sys
for w in json.load(open(sys.argv[1]))["waves"]:
    print(w["first"], w["last"], w["stage"])' "$list" | sed "s|\$| $list|" ;;
            *) echo "0 $(($(grep -Evc '^[[:space:]]*(#|$)' "$list") - 1)) commands $list" ;;
        esac
    done
}
