#!/usr/bin/env bash
# bench/netsim leaves nothing behind: after a short real MPI run across its namespaces, and after a run
# interrupted by SIGINT and one by SIGTERM, no namespace of its prefix is left, and the root namespace's
# links and qdiscs are exactly as before. Exit 77 (CTest: skipped) where it cannot run (not root, no
# iproute2 or mpirun), except under CI=true.
set -uo pipefail
netsim=${1:?usage: netsim_cleanup.sh path/to/bench/netsim}
skip() {
  echo "netsim_cleanup: $*" >&2
  if [ "${CI:-}" = true ]; then exit 1; fi
  exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null && command -v tc >/dev/null || skip "needs iproute2"
command -v mpirun >/dev/null || skip "needs mpirun"
prefix="nst$$"
prefix=${prefix:0:8}
root_state() { ip -o link show | sed 's/ state [A-Z]*//'; tc qdisc show; }
before=$(root_state)
fail=0
check_clean() {  # check_clean WHAT
  if ! "$netsim" check --prefix "$prefix" >/dev/null; then
    echo "FAIL after $1: $("$netsim" check --prefix "$prefix")"
    fail=1
  fi
  if [ "$(root_state)" != "$before" ]; then
    echo "FAIL after $1: the root namespace's links or qdiscs changed"
    diff <(echo "$before") <(root_state)
    fail=1
  fi
}

# 1. A short run: each rank sees only its own address on its shaped link.
out=$("$netsim" run --ranks 3 --rate 100mbit --prefix "$prefix" -- \
      /bin/sh -c 'echo "rank $OMPI_COMM_WORLD_RANK $(ip -4 -o addr show eth0 | awk "{print \$4}") $(tc qdisc show dev eth0 | grep -o "tbf.*rate [0-9A-Za-z]*") session $(ls -d "$TMPDIR"/ompi.* 2>/dev/null)"' 2>&1)
status=$?
echo "$out"
[ $status = 0 ] || { echo "FAIL: netsim run exited $status"; fail=1; }
for r in 0 1 2; do
  echo "$out" | grep -q "rank $r 198.18.0.$((r + 1))/24 tbf.*rate 100Mbit" ||
    { echo "FAIL: rank $r is not on 198.18.0.$((r + 1)) behind a 100 Mbit/s tbf"; fail=1; }
done
# Each host keeps OpenMPI's session directory in a temporary directory of its own, as separate machines do
# (a shared one let one daemon's tree vanish under another's during orte_init).
sessions=$(echo "$out" | grep -o 'session /[^ ]*' | sort -u | wc -l)
[ "$sessions" = 3 ] || { echo "FAIL: the 3 hosts have $sessions distinct OpenMPI session directories, not 3"; fail=1; }
check_clean "a completed run"

# 2. Interrupted runs: the program is still running when the signal comes. (Job control on: a background
# job of a script would otherwise start with SIGINT ignored, which no trap can undo.)
set -m
for sig in INT TERM; do
  "$netsim" run --ranks 2 --rate 1gbit --prefix "$prefix" -- sleep 60 > /dev/null 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ -n "$(ip netns list | grep "^${prefix}-1")" ] && break; sleep 0.1; done
  sleep 1
  kill -s "$sig" "$pid"
  started=$SECONDS
  wait "$pid"
  code=$?
  echo "run interrupted by SIG$sig: exit $code after $((SECONDS - started)) s"
  [ $code -gt 128 ] || { echo "FAIL: an interrupted run exited $code"; fail=1; }
  [ $((SECONDS - started)) -lt 30 ] || { echo "FAIL: the run went on for $((SECONDS - started)) s after SIG$sig"; fail=1; }
  sleep 0.5
  check_clean "SIG$sig"
done
"$netsim" cleanup --prefix "$prefix"
[ $fail = 0 ] && echo "netsim_cleanup: OK (prefix $prefix)"
exit $fail
