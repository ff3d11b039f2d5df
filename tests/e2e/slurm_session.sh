# Sourced by the e2e case scripts (run_case.sh, elastic_join.sh), which set SRC: a single-node SLURM
# for one case, through tests/e2e/slurm_local.sh.
#   slurm_session TEST   starts it in a fresh SLURM_DIR and exports SLURM_CONF and Open MPI's
#                        loopback settings; without SLURM, prints that TEST is skipped and exits 77
#   slurm_session_stop   stops it and removes SLURM_DIR (a no-op when none was started; safe twice)
# The caller sets its EXIT trap to call slurm_session_stop before it calls slurm_session, so a start
# that fails halfway stops what it started.
SLURM_DIR=""
slurm_session() {
  if ! command -v srun > /dev/null || ! command -v slurmd > /dev/null; then
    echo "$1 SKIPPED: SLURM is not installed (apt-get install slurmctld slurmd slurm-client munge)"
    exit 77
  fi
  SLURM_DIR=$(mktemp -d /tmp/troupe-slurm.XXXXXX)  # short: the daemons' unix sockets live here
  SLURM_CONF=$(bash "$SRC/tests/e2e/slurm_local.sh" start "$SLURM_DIR") || exit $?
  export SLURM_CONF OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
}
slurm_session_stop() {
  [ -n "$SLURM_DIR" ] || return 0
  bash "$SRC/tests/e2e/slurm_local.sh" stop "$SLURM_DIR"
  rm -rf "$SLURM_DIR"
  SLURM_DIR=""
}
