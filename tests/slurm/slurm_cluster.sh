#!/usr/bin/env bash
# A real single-node Slurm (Debian's slurmctld, slurmd, munge) for the Slurm-labelled tests.
#   slurm_cluster.sh start DIR   writes DIR/slurm.conf, starts munged (unless one runs), slurmctld and slurmd,
#                                waits until the node is idle; DIR/status is "up" or "unavailable: <why>"
#   slurm_cluster.sh stop DIR    cancels every job of the test cluster and stops what start started, by pid
# Tests read DIR/status and SLURM_CONF=DIR/slurm.conf. Where the daemons cannot start (not root, no
# packages) start writes the reason and exits 0, so the tests skip with it; under CI=true that is a failure.
set -uo pipefail
cmd=${1:?usage: slurm_cluster.sh start|stop DIR}
dir=${2:?usage: slurm_cluster.sh start|stop DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
export SLURM_CONF="$dir/slurm.conf"

unavailable() {
  echo "unavailable: $*" > "$dir/status"
  echo "slurm_cluster: cannot start a test cluster: $*" >&2
  if [ "${CI:-}" = true ]; then exit 1; fi
  exit 0
}

stop_pid() {  # stop_pid FILE: TERM, then KILL after 5 s
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$f"
}

if [ "$cmd" = stop ]; then
  if [ -f "$SLURM_CONF" ] && [ -f "$dir/slurmctld.pid" ]; then
    scancel --full --quiet --signal=KILL -u "$(id -un)" 2>/dev/null
    scancel --quiet -u "$(id -un)" 2>/dev/null
    sleep 1
  fi
  stop_pid "$dir/slurmd.pid"
  stop_pid "$dir/slurmctld.pid"
  stop_pid "$dir/munged.pid"   # only when start started it
  echo "stopped" > "$dir/status"
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: slurm_cluster.sh start|stop DIR" >&2; exit 2; }

[ "$(id -u)" = 0 ] || unavailable "the test cluster runs its daemons as root (run the tests as root, as CI does)"
for p in slurmctld slurmd munged srun sbatch squeue scontrol sinfo; do
  command -v "$p" >/dev/null 2>&1 || [ -x "/usr/sbin/$p" ] ||
    unavailable "$p not found (scripts/bootstrap installs slurmctld slurmd slurm-client munge)"
done
PATH=$PATH:/usr/sbin
"$0" stop "$dir" >/dev/null 2>&1   # leftovers of an earlier run in the same folder
rm -rf "$dir/state" "$dir/spool"
mkdir -p "$dir/state" "$dir/spool"

# munge: Debian's generated key; munged runs as user munge. A munged that already runs is used as it is.
if ! pgrep -x munged >/dev/null; then
  [ -f /etc/munge/munge.key ] || mungekey --create >/dev/null 2>&1 || unavailable "no /etc/munge/munge.key"
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- munged --pid-file=/run/munge/munged.pid || unavailable "munged did not start"
  for _ in $(seq 50); do [ -f /run/munge/munged.pid ] && break; sleep 0.1; done
  cp /run/munge/munged.pid "$dir/munged.pid"
fi
munge -n >/dev/null 2>&1 || unavailable "munge does not work (munge -n failed)"

node=$(hostname -s)
cpus=$(nproc)
mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
cat > "$SLURM_CONF" <<CONF
# bertsweep's test cluster: one node, this machine ($(date -u +%FT%TZ))
ClusterName=bertsweep-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pidfile
SlurmdPidFile=$dir/slurmd.pidfile
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$((mem_mb / cpus / 2))
MailProg=/bin/true
MpiDefault=none
ReturnToService=2
KillWait=2
MinJobAge=600
InactiveLimit=0
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF

slurmctld -D -i -f "$SLURM_CONF" > "$dir/slurmctld.out" 2>&1 &
echo $! > "$dir/slurmctld.pid"
slurmd -D -f "$SLURM_CONF" -N "$node" > "$dir/slurmd.out" 2>&1 &
echo $! > "$dir/slurmd.pid"
for _ in $(seq 150); do
  state=$(sinfo -h -n "$node" -o %T 2>/dev/null)
  case "$state" in idle|mixed|allocated) echo up > "$dir/status"; echo "slurm_cluster: node $node $state ($cpus CPUs), SLURM_CONF=$SLURM_CONF"; exit 0 ;; esac
  sleep 0.2
done
reason=$(tail -n 3 "$dir/slurmctld.log" "$dir/slurmd.log" 2>/dev/null | tr '\n' ' ')
"$0" stop "$dir" >/dev/null 2>&1
unavailable "the node did not become idle within 30 s (state '${state:-none}'; logs: $reason)"
