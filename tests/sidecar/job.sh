#!/usr/bin/env bash
# An RL job written in shell: ITERATIONS iterations of a generation then a training phase, each reported
# to the job's eerl sidecar with curl (no Python). It never fails because of eerl: a call that gets no
# answer within a second is logged with code 000 and the job goes on.
#
#   EERL_SIDECAR=unix:/path/to/sidecar.sock ITERATIONS=3 bash job.sh
#   EERL_SIDECAR=http://127.0.0.1:PORT EERL_SIDECAR_TOKEN=... ITERATIONS=3 bash job.sh   (a TCP sidecar)
#
# One line per call on stdout: "<begin|end> <kind> <iteration> <HTTP code> <seconds> <answer JSON>".
# HOLD_AT=i HOLD_FILE=f: inside the generation phase of iteration i, wait until f exists (for a test that
# kills the sidecar mid-phase). WORK_S: seconds of "work" in each phase (default 0.05).
set -u
url=${EERL_SIDECAR:?EERL_SIDECAR: the sidecar (eerl-sidecar -- command sets it)}
iterations=${ITERATIONS:-3}
work_s=${WORK_S:-0.05}
body=$(mktemp)
trap 'rm -f "$body"' EXIT

if [[ $url == unix:* ]]; then
  where=(--unix-socket "${url#unix:}")
  base=http://localhost
else
  where=()
  base=$url
fi
# A TCP sidecar demands its secret; curl reads the header from a file, so it never shows in `ps`.
if [[ -n ${EERL_SIDECAR_TOKEN:-} ]]; then
  auth=$(mktemp)
  trap 'rm -f "$body" "$auth"' EXIT
  printf 'Authorization: Bearer %s\n' "$EERL_SIDECAR_TOKEN" >"$auth"
  where+=(-H "@$auth")
fi

# post EDGE JSON: one phase event; prints its line.
post() {
  local edge=$1 json=$2 meta
  : >"$body"
  meta=$(curl -s --max-time 1 "${where[@]}" -o "$body" -w '%{http_code} %{time_total}' \
    -H 'Content-Type: application/json' --data "$json" "$base/v1/phases/$edge") || true
  [[ -n $meta ]] || meta="000 0"
  printf '%s %s\n' "$meta" "$(tr -d '\n' <"$body")"
}

for ((i = 0; i < iterations; i++)); do
  echo "begin generation $i $(post begin "{\"kind\":\"generation\",\"iteration\":$i}")"
  if [[ -n ${HOLD_FILE:-} && ${HOLD_AT:--1} == "$i" ]]; then
    for ((w = 0; w < 600; w++)); do
      [[ -e $HOLD_FILE ]] && break
      sleep 0.05
    done
  fi
  sleep "$work_s"
  tokens=$((4096 + i))
  echo "end generation $i $(post end "{\"kind\":\"generation\",\"iteration\":$i,\"tokens\":$tokens,\"sequences\":16,\"max_response_tokens\":512,\"prompt_tokens\":1024}")"
  echo "begin training $i $(post begin "{\"kind\":\"training\",\"iteration\":$i,\"hints\":{\"tokens\":$((tokens + 1024))}}")"
  sleep "$work_s"
  echo "end training $i $(post end "{\"kind\":\"training\",\"iteration\":$i,\"tokens\":$((tokens + 1024)),\"valid_tokens\":$tokens,\"sequences\":16}")"
done
echo "done $iterations"
