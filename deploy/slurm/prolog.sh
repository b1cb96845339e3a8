#!/usr/bin/env bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/eerl/prolog.sh; install reset-gpus.sh next to it).
# A job starts on default clocks (whatever the previous job left) with a worker socket of its own: its
# user may then control the clocks of exactly its GPUs, and nobody else may. It also gets a directory of its
# own for its eerl-sidecar's socket, which no other user can make first.
set -u
# shellcheck source=deploy/slurm/reset-gpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/reset-gpus.sh"
eerl_reset_job_gpus prolog
eerl_make_job_dir
exit 0
