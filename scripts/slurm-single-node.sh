#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for ftprof's `slurm` tests (and for trying `ftprof bench --launcher slurm`).
#   scripts/slurm-single-node.sh start   install (apt-get, as root) if needed, configure, start, wait for the node
#   scripts/slurm-single-node.sh stop    stop the daemons this script started
# munged, slurmctld and slurmd are started directly (no systemd). Needs root. State: $FTPROF_SLURM_DIR (default
# /tmp/ftprof-slurm). Exit status 0 when the node is idle in sinfo; otherwise 1 with one line saying why.
set -euo pipefail
STATE=${FTPROF_SLURM_DIR:-/tmp/ftprof-slurm}
CONF_DIR=/etc/slurm
PARTITION=${FTPROF_SLURM_PARTITION:-debug}

die() { echo "slurm-single-node: $*" >&2; exit 1; }

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
    && command -v munged >/dev/null && return 0
  command -v apt-get >/dev/null || die "Slurm is not installed and apt-get is not available"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || die "apt-get update failed"
  apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null || die "apt-get install slurm failed"
}

write_config() {
  local host cpus mem_mb
  host=$(hostname -s)
  cpus=$(nproc --all)
  mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))  # leave the OS 1 GiB
  mkdir -p "$CONF_DIR" "$STATE"/{ctld,d,log} /run/munge
  cat >"$CONF_DIR/slurm.conf" <<CONF
# Written by ftprof scripts/slurm-single-node.sh: one node, no accounting, no cgroups. DefMemPerCPU: a job that
# names no --mem gets its CPUs' share of the node's memory, not all of it (which would run array tasks one by one).
ClusterName=ftprof
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=3600
KillWait=10
InactiveLimit=0
SchedulerParameters=sched_interval=2
MaxArraySize=10001
DefMemPerCPU=$(( mem_mb / cpus ))
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  echo "# no cgroups" >"$CONF_DIR/cgroup.conf"
}

start() {
  [ "$(id -u)" = 0 ] || die "needs root (to install and run the Slurm daemons)"
  install
  write_config
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
  fi
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
  if ! pgrep -x munged >/dev/null; then
    runuser -u munge -- munged --force 2>/dev/null || munged --force || die "munged did not start"
    touch "$STATE/munged.ours"  # stop stops it only if this script started it
  fi
  [ -f "$STATE/slurmctld.pid" ] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null || slurmctld \
    || die "slurmctld did not start (see $STATE/log/slurmctld.log)"
  [ -f "$STATE/slurmd.pid" ] && kill -0 "$(cat "$STATE/slurmd.pid")" 2>/dev/null || slurmd \
    || die "slurmd did not start (see $STATE/log/slurmd.log)"
  for _ in $(seq 1 90); do
    state=$(sinfo -h -o %t 2>/dev/null | head -1 || true)
    case "$state" in
      idle|mix|alloc) echo "slurm-single-node: node $(hostname -s) is $state (partition $PARTITION)"; return 0 ;;
      down*|drain*) scontrol update nodename="$(hostname -s)" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
  done
  die "the node did not come up within 90 s (sinfo: '${state:-nothing}'; logs in $STATE/log)"
}

stop_pid() {  # SIGTERM, then up to 15 s for it to exit, then SIGKILL
  local pid=$1
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 15); do kill -0 "$pid" 2>/dev/null || return 0; sleep 1; done
  kill -9 "$pid" 2>/dev/null || true
}

stop() {
  for pidfile in "$STATE/slurmd.pid" "$STATE/slurmctld.pid"; do
    if [ -f "$pidfile" ]; then
      stop_pid "$(cat "$pidfile")"
      rm -f "$pidfile"
    fi
  done
  if [ -f "$STATE/munged.ours" ] && [ -f /run/munge/munged.pid ]; then
    stop_pid "$(cat /run/munge/munged.pid)"
    rm -f "$STATE/munged.ours"
  fi
  echo "slurm-single-node: stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
