#!/usr/bin/env bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/eerl/prolog.sh; install reset-gpus.sh next to it).
# A job starts on default clocks even if the previous job's daemon session or an admin pin was left over.
set -u
# shellcheck source=deploy/slurm/reset-gpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/reset-gpus.sh"
eerl_reset_job_gpus prolog
exit 0
