#!/usr/bin/env bash
# Shared by prolog.sh and epilog.sh: a job's GPUs on default clocks, and a worker socket of its own.
#
# Which GPUs: SLURM_JOB_GPUS (set for prolog/epilog when gres/gpu is configured), else
# CUDA_VISIBLE_DEVICES; a job with neither has no GPU and nothing is touched (never "all": other jobs
# may share the node).
#
# Prolog: the job's GPUs are reset (a previous job's session or lock is gone), then the job gets a
# grant: `eerlctl grant --gpus G --uid SLURM_JOB_UID --job-id SLURM_JOB_ID --replace`, a socket
# /run/eerld/grants/job-<id>.sock owned by the job's user (mode 0600) through which sessions may claim
# exactly these GPUs. The eerl client finds it by the job id (SLURM_JOB_ID) without configuration.
# Epilog: the job's grant is revoked (its sessions close, its socket goes), then its GPUs are reset.
# With eerld running, `eerlctl reset --keep-pins` also closes any session still holding those GPUs and
# releases their locks, but never removes an operator's admin pin (a pinned GPU goes back to its pin) nor
# ends a drain (`eerlctl drain`): those last until the operator removes them or they expire. Only when
# eerld is not running at all (no admin socket) does `eerld --reset-clocks` reset every GPU of the node:
# locks whose owner died with the daemon (the pins stay in the state directory for the next start).
# Never fails the job: Slurm drains a node whose prolog or epilog fails, and a clock left at its default
# is no reason for that. Problems are logged to syslog (tag eerl-slurm) and stderr.
#
# The job's directory (eerl_make_job_dir, eerl_remove_job_dir): the prolog makes $EERL_JOBS_DIR/<job id>
# (default /run/eerl-jobs), owned by the job's user, mode 0700, in a directory of root's that only root may
# write, so that no other user can make it (or a socket in it) first; eerl-sidecar listens there by default
# and `eerl phase` looks there, both by the job id. The epilog removes it.
#
# Environment (all optional): EERLCTL (path of eerlctl), EERLD (path of eerld), EERLCTL_SOCKET,
# EERL_STATE_DIR (default /var/lib/eerld), EERL_SLURM_TIMEOUT_S (default 10), EERL_SLURM_GRANT
# (default 1; 0 on nodes whose daemon runs --tenancy single and needs no grants), EERL_JOBS_DIR.

eerl_job_gpus() {
    if [[ -n "${SLURM_JOB_GPUS+set}" ]]; then
        printf '%s' "${SLURM_JOB_GPUS}"
    elif [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
        printf '%s' "${CUDA_VISIBLE_DEVICES}"
    fi
}

eerl_reset_job_gpus() {
    local when="$1"
    local gpus
    local socket="${EERLCTL_SOCKET:-/run/eerld/admin.sock}"
    local eerlctl="${EERLCTL:-eerlctl}"
    local eerld="${EERLD:-eerld}"
    local state_dir="${EERL_STATE_DIR:-/var/lib/eerld}"
    local timeout_s="${EERL_SLURM_TIMEOUT_S:-10}"
    local reason="slurm ${when} job ${SLURM_JOB_ID:-unknown}"
    local output

    gpus="$(eerl_job_gpus)"
    # An empty or "NoDevFiles" list means the job has no GPU: nothing to do.
    if [[ -z "${gpus}" || "${gpus}" == "NoDevFiles" ]]; then
        return 0
    fi
    if [[ -S "${socket}" ]]; then
        if [[ "${when}" == "epilog" ]]; then
            eerl_revoke_job_grant "${eerlctl}" "${socket}" "${timeout_s}" "${reason}"
        fi
        if ! output="$("${eerlctl}" --socket "${socket}" --timeout "${timeout_s}" reset --gpus "${gpus}" \
            --keep-pins --reason "${reason}" 2>&1)"; then
            # A running daemon owns its locks; resetting behind its back would race it. Log and leave it.
            eerl_log "eerlctl reset --gpus ${gpus} --keep-pins failed: ${output}"
            return 0
        fi
        if [[ "${when}" == "prolog" ]]; then
            eerl_grant_job "${eerlctl}" "${socket}" "${timeout_s}" "${gpus}" "${reason}"
        fi
        return 0
    fi
    if output="$("${eerld}" --state-dir "${state_dir}" --reset-clocks 2>&1)"; then
        return 0
    fi
    eerl_log "eerld --reset-clocks failed: ${output}"
    return 0
}

eerl_grant_job() {
    local eerlctl="$1" socket="$2" timeout_s="$3" gpus="$4" reason="$5"
    local output
    if [[ "${EERL_SLURM_GRANT:-1}" == "0" ]]; then
        return 0
    fi
    if [[ -z "${SLURM_JOB_UID:-}" || -z "${SLURM_JOB_ID:-}" ]]; then
        eerl_log "no SLURM_JOB_UID or SLURM_JOB_ID: job gets no eerl grant"
        return 0
    fi
    if ! output="$("${eerlctl}" --socket "${socket}" --timeout "${timeout_s}" grant --gpus "${gpus}" \
        --uid "${SLURM_JOB_UID}" --job-id "${SLURM_JOB_ID}" --replace --reason "${reason}" 2>&1)"; then
        eerl_log "eerlctl grant --gpus ${gpus} --uid ${SLURM_JOB_UID} failed: ${output}"
    fi
    return 0
}

eerl_revoke_job_grant() {
    local eerlctl="$1" socket="$2" timeout_s="$3" reason="$4"
    local output
    if [[ "${EERL_SLURM_GRANT:-1}" == "0" || -z "${SLURM_JOB_ID:-}" ]]; then
        return 0
    fi
    if ! output="$("${eerlctl}" --socket "${socket}" --timeout "${timeout_s}" revoke \
        --job-id "${SLURM_JOB_ID}" --reason "${reason}" 2>&1)"; then
        case "${output}" in
            *"no grant for job"*) ;;  # the prolog made none (grants off, or it failed): nothing to undo
            *) eerl_log "eerlctl revoke --job-id ${SLURM_JOB_ID} failed: ${output}" ;;
        esac
    fi
    return 0
}

eerl_job_dir() {
    local jobs="${EERL_JOBS_DIR:-/run/eerl-jobs}"
    if [[ -z "${SLURM_JOB_ID:-}" || ! "${SLURM_JOB_ID}" =~ ^[A-Za-z0-9_.-]+$ || "${SLURM_JOB_ID}" == .* ]]; then
        return 1
    fi
    printf '%s/%s' "${jobs}" "${SLURM_JOB_ID}"
}

eerl_make_job_dir() {
    local jobs="${EERL_JOBS_DIR:-/run/eerl-jobs}"
    local dir gid output
    if [[ -z "${SLURM_JOB_UID:-}" ]] || ! dir="$(eerl_job_dir)"; then
        return 0
    fi
    gid="${SLURM_JOB_GID:-$(id -g "${SLURM_JOB_UID}" 2>/dev/null || printf '%s' "${SLURM_JOB_UID}")}"
    # root's, mode 0755: nobody else may make a job's directory in it.
    if ! output="$(install -d -m 0755 -o 0 -g 0 "${jobs}" 2>&1)"; then
        eerl_log "cannot make ${jobs}: ${output}"
        return 0
    fi
    rm -rf --one-file-system -- "${dir}"  # left by a job whose epilog never ran: never reused
    if ! output="$(mkdir -m 0700 -- "${dir}" 2>&1 && chown -- "${SLURM_JOB_UID}:${gid}" "${dir}" 2>&1)"; then
        eerl_log "cannot make ${dir} for the job's sidecar: ${output}"
        rm -rf --one-file-system -- "${dir}"
    fi
    return 0
}

eerl_remove_job_dir() {
    local dir
    if dir="$(eerl_job_dir)"; then
        rm -rf --one-file-system -- "${dir}"
    fi
    return 0
}

eerl_log() {
    if command -v logger >/dev/null 2>&1; then
        logger -t eerl-slurm -- "$1" || true
    fi
    printf 'eerl-slurm: %s\n' "$1" >&2
}
