#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for `make test-slurm` (docs/CLUSTER.md):
# munged, slurmctld and slurmd from Debian's packages, their config, keys, state and logs in one
# directory, every daemon started here recorded by pid, and only those stopped by --stop.
#
#   scripts/slurm_local.sh [--dir DIR]          install if missing, start (idempotent), then print
#                                              `export SLURM_CONF=DIR/slurm.conf` (eval it)
#   scripts/slurm_local.sh [--dir DIR] --stop [--only "NAMES"]
#                                              stop what this script started (or only NAMES of
#                                              munged slurmctld slurmd), by pid
#
# Starting prints, after the export line, `# started: NAMES` (the daemons this call started, none
# when all were running), for a caller that stops only what it started.
# DIR defaults to $ROUTERBENCH_SLURM_DIR, else /tmp/routerbench-slurm. One partition, `debug`, of
# this machine's CPUs (select/cons_tres, CR_CPU: one task per CPU asked for);
# a time limit of at most 60 min per job (EnforcePartLimits=ALL: sbatch refuses more);
# ProctrackType=proctrack/linuxproc and TaskPlugin=task/none (no cgroups, no systemd).
# Installing needs root (apt-get); a machine with the binaries already needs nothing else.
# Every failure is one line on stderr naming what failed and where its log is, exit 1.
set -euo pipefail

DIR="${ROUTERBENCH_SLURM_DIR:-/tmp/routerbench-slurm}"
STOP=0
ONLY="munged slurmctld slurmd"
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) DIR="$2"; shift 2 ;;
    --stop) STOP=1; shift ;;
    --only) ONLY="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "slurm_local.sh: unknown option $1 (--dir DIR, --stop)" >&2; exit 2 ;;
  esac
done
DIR="$(mkdir -p "$DIR" && cd "$DIR" && pwd)"
DAEMONS=(munged slurmctld slurmd)

alive() {  # alive NAME: the pid this script recorded for NAME runs NAME
  local f="$DIR/$1.pid" pid
  pid="$(cat "$f" 2>/dev/null)" || return 1  # a daemon removes its pid file as it ends
  [ -n "$pid" ] || return 1
  [ -d "/proc/$pid" ] && grep -q "$1" "/proc/$pid/comm" 2>/dev/null
}

if [ "$STOP" = 1 ]; then
  for d in slurmd slurmctld munged; do
    case " $ONLY " in *" $d "*) ;; *) continue ;; esac
    if alive "$d"; then
      pid="$(cat "$DIR/$d.pid")"
      kill "$pid" && echo "slurm_local.sh: stopped $d (pid $pid)"
      for _ in $(seq 50); do alive "$d" || break; sleep 0.1; done
    fi
    rm -f "$DIR/$d.pid"
  done
  exit 0
fi

fail() { echo "slurm_local.sh: $*" >&2; exit 1; }

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
   || ! command -v munged >/dev/null; then
  [ "$(id -u)" = 0 ] || fail "SLURM is not installed and installing it needs root (apt-get install slurmctld slurmd slurm-client munge)"
  command -v apt-get >/dev/null || fail "SLURM is not installed and there is no apt-get here; install slurmctld, slurmd, slurm-client and munge"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge \
    || { apt-get update && apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge; }; } \
    >"$DIR/apt.log" 2>&1 || fail "apt-get install of slurmctld slurmd slurm-client munge failed; see $DIR/apt.log"
fi

HOST="$(hostname -s)"
CPUS="$(nproc)"
MEM_MB="$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
USER_NAME="$(id -un)"
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/munge" "$DIR/run" "$DIR/log"
chmod 700 "$DIR/munge"
chmod 755 "$DIR/run"
if [ ! -s "$DIR/munge/munge.key" ]; then
  head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
  chmod 400 "$DIR/munge/munge.key"
fi
SOCK="$DIR/run/munge.socket"
# ports of this cluster's own, away from a real cluster's 6817/6818
CTLD_PORT="${ROUTERBENCH_SLURM_PORT:-16817}"
cat >"$DIR/slurm.conf" <<EOF
# written by scripts/slurm_local.sh: a one-node cluster for routerbench's tests
ClusterName=routerbench
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((CTLD_PORT + 1))
SlurmUser=$USER_NAME
SlurmdUser=$USER_NAME
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=30
KillWait=5
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
EnforcePartLimits=ALL
PartitionName=debug Nodes=$HOST Default=YES MaxTime=60 State=UP OverSubscribe=NO
EOF
export SLURM_CONF="$DIR/slurm.conf"

STARTED=""
if ! alive munged; then
  STARTED="$STARTED munged"
  munged --force --key-file="$DIR/munge/munge.key" --socket="$SOCK" --pid-file="$DIR/munged.pid" \
    --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" \
    || fail "munged did not start; see $DIR/log/munged.log"
fi
if ! alive slurmctld; then
  STARTED="$STARTED slurmctld"
  slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start; see $DIR/log/slurmctld.log"
fi
if ! alive slurmd; then
  STARTED="$STARTED slurmd"
  slurmd -f "$SLURM_CONF" || fail "slurmd did not start; see $DIR/log/slurmd.log"
fi
for _ in $(seq 100); do
  state="$(sinfo -h -N -o '%t' 2>/dev/null | head -1 || true)"
  case "$state" in
    idle|mix|alloc) echo "export SLURM_CONF=$SLURM_CONF"; echo "# started:${STARTED:- none}"; exit 0 ;;
    down*|drain*) scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 0.2
done
fail "the node did not come up (state '${state:-none}'); see $DIR/log/slurmctld.log and $DIR/log/slurmd.log"
