"""Cuts the excerpts of NeMo-RL and slime that tests/frameworks checks the hooks against.

Neither framework is installable from the package index, so their tests cannot import them: the hooks are
tested on stand-ins shaped from the source, and the call sites the hooks rely on are checked in these
excerpts — whole functions and classes, cut with :mod:`ast` from one commit of each public repository (both
Apache-2.0) and stored with a header naming the repository, commit, path, and lines. Run from the
repository root with git mirrors of the two repositories (``git clone --mirror``)::

    python tests/frameworks/sources/vendor.py NVIDIA-NeMo/RL /path/to/RL.git 7ea279ab...
    python tests/frameworks/sources/vendor.py THUDM/slime /path/to/slime.git 624b824a...
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent

SHORT = {"NVIDIA-NeMo/RL": "nemo_rl", "THUDM/slime": "slime"}

PIECES: dict[str, list[tuple[str, list[str]]]] = {
    "NVIDIA-NeMo/RL": [
        ("nemo_rl/algorithms/grpo.py", ["grpo_train", "async_grpo_train", "validate"]),
        ("nemo_rl/models/generation/interfaces.py", ["GenerationInterface", "GenerationOutputSpec"]),
        ("nemo_rl/models/policy/interfaces.py", ["PolicyInterface"]),
        ("nemo_rl/experience/rollouts.py", ["generate_responses", "generate_responses_async"]),
        ("examples/run_grpo.py", ["_select_trainer"]),
    ],
    "THUDM/slime": [
        ("train.py", ["train"]),
        ("train_async.py", ["train"]),
        ("slime/ray/rollout.py", ["RolloutManager"]),
        ("slime/ray/actor_group.py", ["RayTrainGroup"]),
        ("slime/backends/megatron_utils/actor.py", ["MegatronTrainRayActor.train"]),
        ("slime/utils/data.py", ["process_rollout_data"]),
        ("slime/ray/placement_group.py", ["_get_placement_group_layout", "create_placement_groups"]),
    ],
}


def excerpt(source: str, qualname: str) -> tuple[int, int, str]:
    """The lines of the top-level function or class ``qualname`` (``Class.method`` for a method)."""
    body: list[ast.stmt] = ast.parse(source).body
    node: ast.AST | None = None
    for part in qualname.split("."):
        node = next(
            n
            for n in body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == part
        )
        body = node.body if isinstance(node, ast.ClassDef) else []
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    lines = source.splitlines()[first - 1 : node.end_lineno]
    return first, int(node.end_lineno or first), "\n".join(lines)


def main(repo: str, git_dir: str, commit: str) -> None:
    for path, names in PIECES[repo]:
        source = subprocess.run(
            ["git", "-C", git_dir, "show", f"{commit}:{path}"], capture_output=True, text=True, check=True
        ).stdout
        for name in names:
            first, last, text = excerpt(source, name)
            out = HERE / f"{SHORT[repo]}-{commit[:12]}__{path.replace('/', '__')}__{name}.py.txt"
            header = f"# {repo}@{commit}:{path} lines {first}-{last} ({name}); "
            header += "Apache-2.0, excerpt for tests\n"
            out.write_text(header + text + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
