"""The package layout's import rules: cli → tasks → (encoders, heads, embedders, data) → kernels, with
training used by tasks and the CLI. Read from each module's syntax tree (imports inside functions
count too), so a lazy import cannot slip past."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "seqzoo"


def _imports(path: Path) -> set[str]:
    """Every ``seqzoo...`` module that ``path`` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "seqzoo" or name.startswith("seqzoo.")}


def _modules(*parts: str) -> list[Path]:
    return sorted(p for part in parts for p in (PACKAGE / part).rglob("*.py")) if parts else []


def _offending(paths: list[Path], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for path in paths:
        hits = sorted(n for n in _imports(path) if any(n == f or n.startswith(f + ".") for f in forbidden))
        if hits:
            bad[str(path.relative_to(PACKAGE.parent))] = hits
    return bad


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("encoders", ("seqzoo.tasks", "seqzoo.training", "seqzoo.cli", "seqzoo.api", "seqzoo.analysis")),
        ("heads", ("seqzoo.tasks", "seqzoo.training", "seqzoo.cli", "seqzoo.api", "seqzoo.analysis")),
        ("kernels", ("seqzoo.encoders", "seqzoo.heads", "seqzoo.tasks", "seqzoo.training", "seqzoo.cli")),
        ("data", ("seqzoo.encoders", "seqzoo.heads", "seqzoo.tasks", "seqzoo.training", "seqzoo.cli")),
        ("training", ("seqzoo.tasks", "seqzoo.cli", "seqzoo.api")),
    ],
)
def test_a_layer_imports_nothing_above_it(layer, forbidden):
    assert _offending(_modules(layer), forbidden) == {}


def test_the_embedder_imports_no_task_trainer_or_cli():
    paths = [PACKAGE / "embedders.py"]
    assert _offending(paths, ("seqzoo.tasks", "seqzoo.training", "seqzoo.cli", "seqzoo.api")) == {}


def test_no_model_or_task_module_imports_the_trainer_for_a_helper():
    """Devices, optimisers, StepLoss and statistics have modules of their own; only the runner (and the
    CLI, for its error type) reach into the trainer's module."""
    paths = _modules("encoders", "heads", "tasks", "analysis", "data", "kernels")
    assert _offending(paths, ("seqzoo.training.trainer",)) == {}


def test_the_checker_sees_lazy_imports(tmp_path):
    """The rule tests above can fail: an import inside a function is found."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from seqzoo.training.trainer import Trainer\n    import seqzoo.cli\n")
    assert _imports(module) == {"seqzoo.training.trainer", "seqzoo.training.trainer.Trainer", "seqzoo.cli"}
