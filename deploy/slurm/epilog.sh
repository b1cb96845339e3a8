#!/usr/bin/env bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/eerl/epilog.sh; install reset-gpus.sh next to it).
# When the job ends its worker socket goes and its GPUs go back to default clocks, even if it was killed
# before closing its session.
set -u
# shellcheck source=deploy/slurm/reset-gpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/reset-gpus.sh"
eerl_reset_job_gpus epilog
eerl_remove_job_dir
exit 0
