"""PGMQ's own regression files, run as pg_regress runs them, on real PGMQ and on pgqueue's facade.

    python -m benchmarks.pgmq_suites --suites /tmp/pgmq-suites/1.13.0
    python -m benchmarks.pgmq_suites --suites DIR --only base,topic_tests --out /tmp/x/diff.md

`--suites DIR` holds `sql/*.sql` and `expected/*.out` of PGMQ's pgmq-extension/test
(this project ships none). Each file runs on two fresh databases of one server, made as
pg_regress makes them: *real* gets the `pgmq` package's pgmq.sql, *facade* `pgqueue
migrate` and the facade. psql runs as pg_regress runs it (`psql -X -a -q`, the file on
stdin, stderr into stdout, PGTZ=PST8PDT, PGDATESTYLE='Postgres, MDY', intervalstyle
postgres_verbose, LC_MESSAGES=C), and its echoed output is cut per statement. Per file:
the statements, how many print on the facade exactly what real PGMQ prints, how many
differ, and how many print on real PGMQ other than `expected/` says (version drift);
`--out` gets a side-by-side diff of each, psql's outputs go beside it.

The one rewrite, the same on both sides: a server holds one extension named pgmq, so
both sides install PGMQ as SQL; `CREATE EXTENSION [IF NOT EXISTS] pgmq ...` becomes
"install it unless schema pgmq exists" (real: pgmq.sql; facade: `pgqueue pgmq install`)
and `DROP EXTENSION [IF EXISTS] pgmq ...` "remove it if there" (real: DROP SCHEMA pgmq
CASCADE, which unlike DROP EXTENSION drops the queue tables too; facade: `pgqueue pgmq
uninstall`), run by psql's `\\!` with the echo off, and not compared. A file that makes
partitioned queues without creating pg_partman gets it first, if the server has it.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

from benchmarks.common import DEFAULT_DSN, with_db
from benchmarks.pgmq_facade import install_facade, install_real

SIDES = ("real", "facade")
# what pg_regress sets on each database it creates
DB_SETTINGS = [f"{name} TO 'C'" for name in ("lc_messages", "lc_monetary", "lc_numeric", "lc_time")]
DB_SETTINGS += ["bytea_output TO 'hex'", "timezone_abbreviations TO 'Default'"]
EXTENSION = re.compile(
    r"\s*(CREATE|DROP)\s+EXTENSION\s+(IF\s+(NOT\s+)?EXISTS\s+)?\"?pgmq\"?(\s[^;]*)?;\s*$", re.I
)
PARTMAN_USED = re.compile(r"create_partitioned|convert_archive_partitioned", re.I)
PARTMAN_MADE = re.compile(r"CREATE\s+EXTENSION\s+(IF\s+NOT\s+EXISTS\s+)?\"?pg_partman", re.I)
DOLLAR = re.compile(r"\$([A-Za-z_]\w*)?\$")
FUNCTION = re.compile(r"\bpgmq\.\"?([a-z_]+)\"?\s*\(", re.I)
WRITE = re.compile(r"\b(UPDATE|INSERT\s+INTO|DELETE\s+FROM|TRUNCATE)\s+pgmq\.(q_|a_|\w+)", re.I)
SEVERITY = {"ERROR:": "error", "NOTICE:": "notice", "WARNING:": "notice", "INFO:": "notice"}
DETAIL = ("DETAIL:", "HINT:", "CONTEXT:", "SQL statement", "SQL function", "PL/pgSQL", "LINE ")


@dataclass
class Unit:
    """One statement of a test file, with the comment and meta-command lines before it."""

    line: int
    lead: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    action: str | None = None  # "create" or "drop": a rewritten CREATE/DROP EXTENSION pgmq

    @property
    def sql(self) -> str:
        """The statement's own text."""
        return "\n".join(self.body)

    def echo(self, rewritten: bool) -> list[str]:
        """The non-blank lines psql echoes for this unit, as written or as rewritten."""
        shown = self._marker() if rewritten and self.action else [*self.lead, *self.body]
        return [line for line in shown if line.strip()]

    def script(self, hook: dict[str, str]) -> list[str]:
        """The lines fed to psql: the statement, or its rewrite running a `hook` command."""
        if not self.action:
            return [*self.lead, *self.body]
        there = "SELECT to_regnamespace('pgmq') IS NOT NULL AS pgmq_suites_there \\gset"
        branch = ["\\if :pgmq_suites_there", *(["\\else"] if self.action == "create" else [])]
        return [
            *self._marker(),
            there,
            *branch,
            f"\\! {hook[self.action]}",
            "\\endif",
            "\\set ECHO all",
        ]

    def _marker(self) -> list[str]:
        """What a rewritten statement echoes: its comments, what it was, echo going off."""
        said = " ".join(self.sql.split())
        return [*self.lead, f"-- pgmq_suites rewrote: {said}", "\\set ECHO none"]


def _scan(line: str, state: str) -> tuple[str, bool]:
    """Carry the quoting state over one line; True when a statement ends on it."""
    i, ended = 0, False
    while i < len(line):
        if state == "":
            if line.startswith("--", i):
                break
            if line[i] in "'\"":
                state = line[i]
            elif line.startswith("/*", i):
                state, i = "/*", i + 1
            elif (m := DOLLAR.match(line, i)) and not (
                i and (line[i - 1].isalnum() or line[i - 1] == "_")
            ):
                state, i = m.group(), m.end() - 1
            elif line[i] == ";":
                ended = True
            elif line[i] == "\\":
                return state, True  # a meta-command such as \gset sends the query
        elif state in "'\"":
            state = "" if line[i] == state else state
        elif state == "/*":
            state, i = ("", i + 1) if line.startswith("*/", i) else (state, i)
        elif line.startswith(state, i):
            state, i = "", i + len(state) - 1
        i += 1
    return state, ended


def split_units(text: str) -> list[Unit]:
    """The statements of a test file, in the order psql sends them."""
    units, unit, state = [], Unit(1), ""
    for number, line in enumerate(text.splitlines(), 1):
        if not unit.body and line.lstrip().startswith(("--", "\\")):
            unit.lead.append(line)
            continue
        if not line.strip() and state == "":
            continue  # psql neither sends nor echoes a blank line outside quotes
        unit.line = unit.line if unit.body else number
        unit.body.append(line)
        state, ended = _scan(line, state)
        if ended and state == "":
            units.append(unit)
            unit = Unit(number + 1)
    if units and not unit.body:
        units[-1].body += unit.lead  # comments after the last statement print after it
    elif unit.lead or unit.body:
        units.append(unit)
    for unit in units:
        if found := EXTENSION.match(unit.sql):
            unit.action = found.group(1).lower()
    return units


def split_output(text: str, units: list[Unit], rewritten: bool) -> list[str | None]:
    """Each unit's share of psql's output, from its echo to the next unit's; None if not there."""
    lines, starts, at = text.splitlines(), [], 0
    for unit in units:
        echo, start = unit.echo(rewritten), None
        for i in range(at, len(lines)):
            following = [x for x in lines[i + 1 : i + 1 + 4 * len(echo)] if x.strip()]
            if lines[i] == echo[0] and following[: len(echo) - 1] == echo[1:]:
                start, at = i, i + 1
                break
        starts.append(start)
    chunks: list[str | None] = []
    for k, start in enumerate(starts):
        end = next((s for s in starts[k + 1 :] if s is not None), len(lines))
        chunks.append(None if start is None else "\n".join(lines[start:end]).rstrip("\n"))
    return chunks


def regress_env(test: str) -> dict[str, str]:
    """pg_regress's environment for psql: C messages, its time zone, date and interval styles."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("LANGUAGE", "LC_ALL", "PGCLIENTENCODING")
    }
    env.update(LC_MESSAGES="C", PGTZ="PST8PDT", PGDATESTYLE="Postgres, MDY")
    env["PGOPTIONS"] = f"{os.environ.get('PGOPTIONS', '')} -c intervalstyle=postgres_verbose"
    env["PGAPPNAME"] = f"pg_regress/{test}"
    return env


def hooks(side: str, dsn: str, log: Path) -> dict[str, str]:
    """The shell commands that install and remove this side's PGMQ (a rewritten statement's)."""
    q, tail = shlex.quote, f" < /dev/null >> {shlex.quote(str(log))} 2>&1"
    if side == "real":
        psql = f"psql -X -q -v ON_ERROR_STOP=1 -d {q(dsn)} -c 'SET client_min_messages = warning'"
        create = f"{psql} -f {q(str(files('pgmq').joinpath('sql', 'pgmq.sql')))}"
        drop = f"{psql} -c 'DROP SCHEMA pgmq CASCADE'"
    else:
        cli = f"{q(sys.executable)} -m pgqueue pgmq"
        create, drop = f"{cli} install --dsn {q(dsn)}", f"{cli} uninstall --yes --dsn {q(dsn)}"
    return {"create": create + tail, "drop": drop + tail}


def new_database(server: str, side: str, test: str, partman: bool) -> str:
    """A database made as pg_regress makes one, holding this side's PGMQ; its DSN."""
    name = f"pgmq_suites_{side}_{test}_{uuid.uuid4().hex[:6]}".lower()[:63]
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        for setting in DB_SETTINGS:
            admin.execute(f'ALTER DATABASE "{name}" SET {setting}')
    dsn = with_db(server, name)
    if partman:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_partman")
    (install_real if side == "real" else install_facade)(dsn)
    return dsn


def run_side(
    side: str, test: str, units: list[Unit], args: argparse.Namespace, partman: bool
) -> str:
    """Run one test file on a fresh database of one side; psql's output."""
    dsn = new_database(args.dsn, side, test, partman)
    log = args.out.parent / side / f"{test}.hooks.log"
    log.unlink(missing_ok=True)
    script = [line for unit in units for line in unit.script(hooks(side, dsn, log))]
    try:
        done = subprocess.run(
            [args.psql, "-X", "-a", "-q", "-d", dsn],
            input="\n".join(script).encode() + b"\n",
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=regress_env(test),
            timeout=args.timeout,
        )
    finally:
        if not args.keep:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(
                    f'DROP DATABASE IF EXISTS "{conninfo_to_dict(dsn)["dbname"]}" WITH (FORCE)'
                )
    output = done.stdout.decode(errors="replace")
    (args.out.parent / side / f"{test}.out").write_text(output)
    return output


def _kind(line: str) -> str:
    """What one output line is: error, notice, detail (context, hint, caret) or rows."""
    if line.startswith(DETAIL) or line.strip() == "^":
        return "detail"
    return SEVERITY.get(line.split(" ", 1)[0], "rows")


def tags(unit: Unit, left: str | None, right: str | None) -> list[str]:
    """A differing statement's labels: the PGMQ functions it calls, its writes, what differs."""
    called = sorted({f"pgmq.{name.lower()}" for name in FUNCTION.findall(unit.sql)})
    wrote = sorted(
        {f"writes pgmq.{t.lower()}{'*' * (t in ('q_', 'a_'))}" for _, t in WRITE.findall(unit.sql)}
    )
    if left is None or right is None:
        return [*called, *wrote, "missing"]
    a, b = ([(_kind(x), x) for x in text.splitlines()] for text in (left, right))
    kinds = ("error", "notice", "detail", "rows")
    differ = [k for k in kinds if [x for x in a if x[0] == k] != [x for x in b if x[0] == k]]
    return [*called, *wrote, *(differ or ["whitespace"])]


def side_by_side(left: str | None, right: str | None, titles: tuple[str, str]) -> list[str]:
    """The lines two outputs share at the top, then the rest in columns marked | < >."""
    a, b = (t.splitlines() if t is not None else ["(not in the output)"] for t in (left, right))
    common = next(
        (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    a, b = a[common:], b[common:]
    width = max([len(titles[0]), *map(len, a)])
    rows = [f"{titles[0]:<{width}}   {titles[1]}", f"{'-' * width}   {'-' * len(titles[1])}"]
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        mark = {"equal": " ", "replace": "|", "delete": "<", "insert": ">"}[op]
        for k in range(max(i2 - i1, j2 - j1)):
            x, y = a[i1 + k] if i1 + k < i2 else "", b[j1 + k] if j1 + k < j2 else ""
            rows.append(f"{x:<{width}} {mark} {y}".rstrip())
    shared = (left or right or "").splitlines()[:common]
    return ["```sql", *shared, "```", "", "```", *rows, "```", ""]


@dataclass
class FileResult:
    """The per-statement outcome of one test file."""

    test: str
    statements: int
    rewritten: int = 0
    same: int = 0
    differ: list[tuple[Unit, str | None, str | None]] = field(default_factory=list)
    drift: list[tuple[Unit, str | None, str | None]] = field(default_factory=list)

    def row(self) -> list[int]:
        """The table's figures: statements, rewritten, same, differ, drift."""
        return [self.statements, self.rewritten, self.same, len(self.differ), len(self.drift)]


def compare(test: str, units: list[Unit], outputs: dict[str, str], expected: str) -> FileResult:
    """Compare each statement's print: facade against real, real against expected/."""
    real, facade = (split_output(outputs[side], units, True) for side in SIDES)
    want = split_output(expected, units, False)
    result = FileResult(test, len(units))
    for unit, r, f, w in zip(units, real, facade, want, strict=True):
        if unit.action:
            result.rewritten += 1
            continue
        if r is not None and r == f:
            result.same += 1
        else:
            result.differ.append((unit, r, f))
        if w is None or r != w:
            result.drift.append((unit, w, r))
    return result


def report(results: list[FileResult], header: list[str], out: Path) -> str:
    """Write the table, every differing statement's diff and a tally to `out`; the table."""
    table = ["| file | statements | rewritten | same on facade | differ | real ≠ expected |"]
    table.append("|---|---:|---:|---:|---:|---:|")
    table += [f"| {r.test} | " + " | ".join(map(str, r.row())) + " |" for r in results]
    total = [sum(column) for column in zip(*(r.row() for r in results), strict=True)]
    table.append("| **total** | " + " | ".join(f"**{n}**" for n in total) + " |")
    body = ["# PGMQ's regression files: real PGMQ and pgqueue's facade", "", *header, "", *table]
    tally: Counter[str] = Counter()
    for title, pick, titles in (
        ("Facade against real PGMQ", "differ", ("real PGMQ", "pgqueue facade")),
        ("Real PGMQ against expected/ (drift)", "drift", ("expected/", "real PGMQ")),
    ):
        body += ["", f"## {title}", ""]
        for r in results:
            for unit, left, right in getattr(r, pick):
                labels = tags(unit, left, right)
                tally.update(labels if pick == "differ" else [])
                body += [f"### {r.test}.sql:{unit.line} ({', '.join(labels)})", ""]
                body += side_by_side(left, right, titles)
    body += ["## Statements that differ on the facade, by function and kind", ""]
    body += [f"- {name}: {n}" for name, n in sorted(tally.items(), key=lambda x: (-x[1], x[0]))]
    out.write_text("\n".join(body) + "\n")
    return "\n".join(table)


def main(argv: list[str] | None = None) -> None:
    """Run every selected test file on both sides; print the table, write the diffs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--suites", type=Path, required=True, help="a folder with sql/ and expected/"
    )
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="a superuser's DSN to the server")
    parser.add_argument("--out", type=Path, default=Path("/tmp/pgmq_suites/diff.md"))
    parser.add_argument("--only", default="", help="file names without .sql, comma-separated")
    parser.add_argument("--psql", default="psql", help="the psql to run (pg_regress: the server's)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per file and side")
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    args = parser.parse_args(argv)
    only = {name for name in args.only.split(",") if name}
    tests = [p for p in sorted((args.suites / "sql").glob("*.sql")) if not only or p.stem in only]
    if not tests:
        raise SystemExit(f"no test files in {args.suites / 'sql'}")
    for side in SIDES:
        (args.out.parent / side).mkdir(parents=True, exist_ok=True)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        server = conn.execute("SHOW server_version").fetchone()
        found = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_partman'")
        partman = found.fetchone() is not None
    version = files("pgmq").joinpath("sql", "VERSION").read_text().strip()
    header = [
        f"- server: PostgreSQL {server[0] if server else '?'}; pg_partman: "
        + ("available" if partman else "NOT available (partitioned queues fail on both sides)"),
        f"- real: PGMQ {version}, pgmq.sql of the `pgmq` package; facade: `pgqueue pgmq install`",
        f"- suites: {args.suites.resolve()}; psql -X -a -q in pg_regress's environment",
        "- rewritten on both sides: CREATE/DROP EXTENSION pgmq -> install/remove PGMQ as SQL",
    ]
    print("\n".join(header), flush=True)
    results = []
    for path in tests:
        text = path.read_text()
        units = split_units(text)
        partman_first = (
            partman and bool(PARTMAN_USED.search(text)) and not PARTMAN_MADE.search(text)
        )
        with ThreadPoolExecutor(len(SIDES)) as pool:
            runs = {
                s: pool.submit(run_side, s, path.stem, units, args, partman_first) for s in SIDES
            }
            outputs = {side: run.result() for side, run in runs.items()}
        expected = args.suites / "expected" / f"{path.stem}.out"
        results.append(
            compare(path.stem, units, outputs, expected.read_text() if expected.exists() else "")
        )
        r = results[-1]
        print(f"{r.test}: {r.same} of {r.statements} same, {len(r.differ)} differ", flush=True)
    print(report(results, header, args.out))
    print(f"diffs: {args.out}; psql's outputs: {args.out.parent}/{{real,facade}}/")


if __name__ == "__main__":
    main()
