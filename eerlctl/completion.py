"""Shell completion scripts for eerlctl (bash and zsh), generated from one table of commands.

Install: ``eerlctl completion bash > /etc/bash_completion.d/eerlctl`` or, for zsh,
``eerlctl completion zsh > "${fpath[1]}/_eerlctl"``.
"""

from __future__ import annotations

from eerld.errors import ValidationError

__all__ = ["COMMANDS", "GLOBAL_OPTIONS", "completion_script"]

GLOBAL_OPTIONS = ("--socket", "--json", "--debug", "--timeout", "--show-tokens", "--help")

COMMANDS: dict[str, tuple[str, ...]] = {
    "status": (),
    "pin": ("--gpus", "--sm-mhz", "--mem-mhz", "--for", "--reason", "--replace"),
    "unpin": ("--gpus",),
    "pins": (),
    "sessions": (),
    "decisions": ("--session", "--phase", "--limit"),
    "report": (),
    "reset": ("--gpus", "--reason", "--keep-pins"),
    "drain": ("--gpus", "--for", "--reason", "--keep-sessions"),
    "undrain": ("--gpus",),
    "grant": (
        "--gpus",
        "--uid",
        "--gid",
        "--job-id",
        "--name",
        "--for",
        "--until",
        "--reason",
        "--replace",
        "--own-directory",
    ),
    "revoke": ("--job-id", "--reason"),
    "grants": (),
    "health": ("--service",),
    "version": (),
    "completion": (),
}

_BASH = """\
# bash completion for eerlctl
_eerlctl() {
    local cur prev cmd i
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    cmd=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${COMP_WORDS[i]}" in
            -*) ;;
            *) if [[ "${COMP_WORDS[i-1]}" != "--socket" && "${COMP_WORDS[i-1]}" != "--timeout" ]]; then
                   cmd="${COMP_WORDS[i]}"; break
               fi ;;
        esac
    done
    case "$prev" in
        --socket) mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;
        --gpus) mapfile -t COMPREPLY < <(compgen -W "all" -- "$cur"); return ;;
        --phase) mapfile -t COMPREPLY < <(compgen -W "generation training" -- "$cur"); return ;;
    esac
    case "$cmd" in
        "") mapfile -t COMPREPLY < <(compgen -W "%(commands)s %(globals)s" -- "$cur") ;;
%(cases)s
    esac
}
complete -F _eerlctl eerlctl
"""

_ZSH = """\
#compdef eerlctl
# zsh completion for eerlctl
_eerlctl() {
    local -a commands
    commands=(%(commands)s)
    if (( CURRENT == 2 )); then
        _describe 'command' commands
        return
    fi
    case "${words[2]}" in
%(cases)s
    esac
}
_eerlctl "$@"
"""


def completion_script(shell: str) -> str:
    """The completion script for ``shell`` (``bash`` or ``zsh``)."""
    commands = " ".join(COMMANDS)
    if shell == "bash":
        words = {
            name: " ".join((*opts, *GLOBAL_OPTIONS)) if name != "completion" else "bash zsh"
            for name, opts in COMMANDS.items()
        }
        cases = "\n".join(
            f'        {name}) mapfile -t COMPREPLY < <(compgen -W "{w}" -- "$cur") ;;'
            for name, w in words.items()
        )
        return _BASH % {"commands": commands, "globals": " ".join(GLOBAL_OPTIONS), "cases": cases}
    if shell == "zsh":
        cases = "\n".join(
            f"        {name}) _values 'option' {' '.join((*opts, *GLOBAL_OPTIONS))} ;;"
            if name != "completion"
            else f"        {name}) _values 'shell' bash zsh ;;"
            for name, opts in COMMANDS.items()
        )
        return _ZSH % {"commands": commands, "cases": cases}
    raise ValidationError("shell", f"{shell!r} is not supported (bash or zsh)")
