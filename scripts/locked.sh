#!/usr/bin/env bash
# scripts/locked.sh LOCK STAMP PREREQ -- COMMAND...: run COMMAND under an exclusive lock on LOCK unless STAMP is
# already newer than PREREQ (another make built it while this one waited), then touch STAMP. Used by the Makefile
# so that two makes in one clone never build .venv at the same time: the second says so in one line and waits.
set -euo pipefail
lock="$1" stamp="$2" prereq="$3"
shift 3
[ "$1" = "--" ] && shift
exec 9>"$lock"
if ! flock -n 9; then
    echo "make: another make is building $(dirname "$stamp") in this clone; waiting for it" >&2
    flock 9
fi
[ -e "$stamp" ] && [ "$stamp" -nt "$prereq" ] && exit 0
"$@"
touch "$stamp"
