#!/usr/bin/env bash
# Shared by prolog.sh and epilog.sh: return the job's GPUs to their default clocks through eerld.
#
# Which GPUs: SLURM_JOB_GPUS (set for prolog/epilog when gres/gpu is configured), else
# CUDA_VISIBLE_DEVICES; a job with neither has no GPU and nothing is touched (never "all": other jobs
# may share the node). With eerld running, `eerlctl reset` also closes any session still holding those
# GPUs (and removes admin pins on them). Only when eerld is not running at all (no admin socket) does
# `eerld --reset-clocks` reset what its ledger names: locks whose owner died with the daemon.
# Never fails the job: Slurm drains a node whose prolog or epilog fails, and a clock left at its default
# is no reason for that. Problems are logged to syslog (tag eerl-slurm) and stderr.
#
# Environment (all optional): EERLCTL (path of eerlctl), EERLD (path of eerld), EERLCTL_SOCKET,
# EERL_STATE_DIR (default /var/lib/eerld), EERL_SLURM_TIMEOUT_S (default 10).

eerl_reset_job_gpus() {
    local when="$1"
    local gpus=""
    local socket="${EERLCTL_SOCKET:-/run/eerld/admin.sock}"
    local eerlctl="${EERLCTL:-eerlctl}"
    local eerld="${EERLD:-eerld}"
    local state_dir="${EERL_STATE_DIR:-/var/lib/eerld}"
    local timeout_s="${EERL_SLURM_TIMEOUT_S:-10}"
    local reason="slurm ${when} job ${SLURM_JOB_ID:-unknown}"
    local output

    if [[ -n "${SLURM_JOB_GPUS+set}" ]]; then
        gpus="${SLURM_JOB_GPUS}"
    elif [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
        gpus="${CUDA_VISIBLE_DEVICES}"
    fi
    # An empty or "NoDevFiles" list means the job has no GPU: nothing to do.
    if [[ -z "${gpus}" || "${gpus}" == "NoDevFiles" ]]; then
        return 0
    fi
    if [[ -S "${socket}" ]]; then
        if output="$("${eerlctl}" --socket "${socket}" --timeout "${timeout_s}" reset --gpus "${gpus}" \
            --reason "${reason}" 2>&1)"; then
            return 0
        fi
        # A running daemon owns its locks; resetting behind its back would race it. Log and leave it.
        eerl_log "eerlctl reset --gpus ${gpus} failed: ${output}"
        return 0
    fi
    if output="$("${eerld}" --state-dir "${state_dir}" --reset-clocks 2>&1)"; then
        return 0
    fi
    eerl_log "eerld --reset-clocks failed: ${output}"
    return 0
}

eerl_log() {
    if command -v logger >/dev/null 2>&1; then
        logger -t eerl-slurm -- "$1" || true
    fi
    printf 'eerl-slurm: %s\n' "$1" >&2
}
