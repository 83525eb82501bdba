#!/usr/bin/env bash
# A real multi-node Slurm on this one machine (Debian's slurmctld, munge and one slurmd per node: Debian's
# Slurm 22.05 is built for several slurmd on one host) for the Slurm-labelled tests.
#   slurm_cluster.sh start DIR       writes DIR/slurm.conf and DIR/gres.conf, starts munged (unless one runs),
#                                    slurmctld and `slurmd -N nK` for K = 1..BERTSWEEP_SLURM_NODES (default 3),
#                                    waits until every node is idle; DIR/status is "up" or "unavailable: <why>"
#   slurm_cluster.sh stop DIR        cancels every job of the test cluster and stops what start started, by pid
#   slurm_cluster.sh kill-node DIR NODE   kills node NODE as a power cut would: its slurmd, its slurmstepd and
#                                    every process they started (SIGKILL); slurmctld marks it DOWN after
#                                    SlurmdTimeout (10 s) and ends its jobs with NODE_FAIL
#   slurm_cluster.sh start-node DIR NODE  starts NODE's slurmd again (ReturnToService=2 makes it usable)
# Every node has 2 CPUs (config_overrides: they share this machine's cores) and two `gpu` GRES whose device
# files are stand-ins (DIR/dev/nK/nvidia0-1, char devices like /dev/null), so that Slurm's own GPU allocation
# and the CUDA_VISIBLE_DEVICES it sets can be tested without a GPU. Per-node paths (spool, pid, log, TmpFS)
# contain %n, so the PMIx sockets of two nodes never collide. Tests read DIR/status, DIR/nodes (the node
# names) and SLURM_CONF=DIR/slurm.conf. Where the daemons cannot start (not root, no packages) start writes
# the reason and exits 0, so the tests skip with it; under CI=true that is a failure.
set -uo pipefail
usage="usage: slurm_cluster.sh start|stop DIR | kill-node|start-node DIR NODE"
cmd=${1:?$usage}
dir=${2:?$usage}
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

# kill_node NODE: SIGKILL everything that runs on the node: its slurmd, its slurmstepds and their tasks are
# exactly the processes in the node's UTS namespace (start_node below), recorded in DIR/slurmd-NODE.uts.
kill_node() {
  local node=$1 ns pid
  ns=$(cat "$dir/slurmd-$node.uts" 2>/dev/null)
  [ -n "$ns" ] || { echo "slurm_cluster: no node $node in $dir" >&2; return 1; }
  for _ in 1 2 3; do  # again: a process may fork while the first round kills
    for pid in $(ls /proc | grep -E '^[0-9]+$'); do
      [ "$(readlink "/proc/$pid/ns/uts" 2>/dev/null)" = "$ns" ] && kill -9 "$pid" 2>/dev/null
    done
  done
  rm -f "$dir/slurmd-$node.pid"
}

# Each slurmd runs in its own UTS namespace with the node's name as hostname, so that what runs on node nK
# sees hostname nK, as on a real cluster (OpenMPI names its shared-memory segments and session folders
# after the host: two nodes of one hostname would share them).
start_node() {
  local node=$1
  unshare --uts -- sh -c 'hostname "$1" && readlink /proc/self/ns/uts > "$3" && exec slurmd -D -f "$2" -N "$1"' \
    sh "$node" "$SLURM_CONF" "$dir/slurmd-$node.uts" > "$dir/slurmd-$node.out" 2>&1 &
  echo $! > "$dir/slurmd-$node.pid"
}

case "$cmd" in
  kill-node) kill_node "${3:?$usage}"; exit 0 ;;
  start-node) PATH=$PATH:/usr/sbin; start_node "${3:?$usage}"; exit 0 ;;
esac

if [ "$cmd" = stop ]; then
  if [ -f "$SLURM_CONF" ] && [ -f "$dir/slurmctld.pid" ]; then
    scancel --full --quiet --signal=KILL -u "$(id -un)" 2>/dev/null
    scancel --quiet -u "$(id -un)" 2>/dev/null
    sleep 1
  fi
  for f in "$dir"/slurmd-*.pid; do [ -e "$f" ] && stop_pid "$f"; done
  # Whatever still runs on a node (a slurmstepd a killed slurmd left behind) goes with it.
  for f in "$dir"/slurmd-*.uts; do
    [ -e "$f" ] || continue
    f=${f##*/slurmd-}
    kill_node "${f%.uts}"
    rm -f "$dir/slurmd-${f%.uts}.uts"
  done
  stop_pid "$dir/slurmd.pid"   # a single-node cluster of an earlier version
  stop_pid "$dir/slurmctld.pid"
  stop_pid "$dir/munged.pid"   # only when start started it
  echo "stopped" > "$dir/status"
  exit 0
fi
[ "$cmd" = start ] || { echo "$usage" >&2; exit 2; }

[ "$(id -u)" = 0 ] || unavailable "the test cluster runs its daemons as root (run the tests as root, as CI does)"
for p in slurmctld slurmd munged srun sbatch squeue scontrol sinfo; do
  command -v "$p" >/dev/null 2>&1 || [ -x "/usr/sbin/$p" ] ||
    unavailable "$p not found (scripts/bootstrap installs slurmctld slurmd slurm-client munge)"
done
PATH=$PATH:/usr/sbin
"$0" stop "$dir" >/dev/null 2>&1   # leftovers of an earlier run in the same folder
n_nodes=${BERTSWEEP_SLURM_NODES:-3}
nodes=$(seq -f 'n%g' 1 "$n_nodes" | tr '\n' ' ')
rm -rf "$dir/state" "$dir/spool" "$dir/tmp" "$dir/dev"
mkdir -p "$dir/state"
for node in $nodes; do
  mkdir -p "$dir/spool/$node" "$dir/tmp/$node" "$dir/dev/$node"
  for g in 0 1; do mknod "$dir/dev/$node/nvidia$g" c 1 3 || unavailable "mknod of a stand-in GPU device failed"; done
done

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

host=$(hostname -s)
mem_mb=$(awk -v n="$n_nodes" '/MemTotal/ {print int($2 / 1024 * 0.8 / n)}' /proc/meminfo)
cpus=2
cat > "$SLURM_CONF" <<CONF
# bertsweep's test cluster: $n_nodes nodes ($nodes), all on this machine ($(date -u +%FT%TZ))
ClusterName=bertsweep-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pidfile
SlurmdPidFile=$dir/slurmd-%n.pidfile
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
TmpFS=$dir/tmp/%n
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$((mem_mb / cpus / 2))
GresTypes=gpu
MailProg=/bin/true
MpiDefault=none
ReturnToService=2
SlurmdTimeout=10
KillWait=2
MinJobAge=600
InactiveLimit=0
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
CONF
port=16818
: > "$dir/gres.conf"
for node in $nodes; do
  echo "NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1 Port=$port CPUs=$cpus RealMemory=$mem_mb Gres=gpu:2 State=UNKNOWN" >> "$SLURM_CONF"
  echo "NodeName=$node Name=gpu File=$dir/dev/$node/nvidia[0-1]" >> "$dir/gres.conf"
  port=$((port + 1))
done
echo "PartitionName=debug Nodes=$(echo $nodes | tr ' ' ',') Default=YES MaxTime=INFINITE State=UP" >> "$SLURM_CONF"
echo "$nodes" > "$dir/nodes"

slurmctld -D -i -f "$SLURM_CONF" > "$dir/slurmctld.out" 2>&1 &
echo $! > "$dir/slurmctld.pid"
for node in $nodes; do start_node "$node"; done
for _ in $(seq 150); do
  states=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u | tr '\n' ' ')
  idle=$(sinfo -h -N -t idle,mixed,allocated -o %N 2>/dev/null | sort -u | wc -l)
  if [ "$idle" = "$n_nodes" ]; then
    echo up > "$dir/status"
    echo "slurm_cluster: $n_nodes nodes up ($states), $cpus CPUs and 2 stand-in GPUs each, SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 0.2
done
reason=$(tail -n 3 "$dir/slurmctld.log" "$dir"/slurmd-*.log 2>/dev/null | tr '\n' ' ')
"$0" stop "$dir" >/dev/null 2>&1
unavailable "the nodes did not become idle within 30 s (states '${states:-none}'; logs: $reason)"
