#!/usr/bin/env bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/eerl/epilog.sh; install reset-gpus.sh next to it).
# The job's GPUs go back to default clocks when it ends, even if it was killed before closing its session.
set -u
# shellcheck source=deploy/slurm/reset-gpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/reset-gpus.sh"
eerl_reset_job_gpus epilog
exit 0
