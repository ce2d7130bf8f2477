"""docs/architecture.md names every module of the package and every SQL file."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = (ROOT / "docs" / "architecture.md").read_text()


def built(path: Path) -> bool:
    """A dotfile, or what `make` writes from the others (pgmq--<version>.sql)."""
    return path.name.startswith(".") or "--" in path.name


def named(text: str) -> bool:
    return f"`{text}`" in MAP


def test_every_module_is_on_the_map() -> None:
    package = ROOT / "pgqueue"
    missing = [
        path.relative_to(package).as_posix()
        for path in sorted(package.rglob("*.py"))
        # an empty package marker holds no code: its package is on the map
        if path.stat().st_size and not named(path.relative_to(package).as_posix())
    ]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_every_sql_file_and_the_extension_is_on_the_map() -> None:
    files = [
        *sorted((ROOT / "sql").glob("*.sql")),
        *sorted((ROOT / "sql" / "schema").glob("*.sql")),
        *sorted((ROOT / "sql" / "pgmq").glob("*.sql")),
        *[
            p
            for p in sorted((ROOT / "extension").iterdir())
            if p.name[0] != "." and "--" not in p.name
        ],
    ]
    assert len(files) > 30
    missing = [p.relative_to(ROOT).as_posix() for p in files if not named(p.name)]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_every_folder_of_the_repository_is_on_the_map() -> None:
    made = {"build", "dist", "__pycache__"}  # what builds and runs leave behind
    folders = [
        p.name
        for p in ROOT.iterdir()
        if p.is_dir()
        and p.name[0] not in "._"
        and p.name not in made
        and not p.name.endswith(".egg-info")
    ]
    assert "sql" in folders
    missing = [f for f in folders if not named(f"{f}/")]
    assert not missing, f"docs/architecture.md does not name {missing}"
