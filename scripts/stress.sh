#!/usr/bin/env bash
# Run the whole test suite N times in a row (default 10) while another process keeps one
# core busy, as a busy CI machine would; stop at the first failing run. A flaky test is a
# broken build: this is how we look for one. Prints one line per run and exits non-zero
# if any run failed.
#   bash scripts/stress.sh [N] [extra pytest arguments]
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
shift || true
.venv/bin/python -c "while True: pass" &
burner=$!
trap 'kill $burner 2>/dev/null' EXIT
status=0
for i in $(seq 1 "$runs"); do
  log=$(mktemp)
  .venv/bin/python -m pytest -q -p no:cacheprovider "$@" >"$log" 2>&1
  rc=$?
  echo "run $i/$runs: rc=$rc $(tail -n 1 "$log")"
  if [ $rc -ne 0 ]; then
    grep -E "^(FAILED|ERROR)" "$log"
    status=1
    break
  fi
  rm -f "$log"
done
exit $status
