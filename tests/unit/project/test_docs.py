"""The docs name only what exists: make targets, CLI flags, CRD fields and links.

README.md and docs/*.md are read as a user reads them: every ``make <target>`` in code is a
Makefile target; every ``tfdata-operator <command> --flag`` and ``tfdata-server ... --flag`` is an
option of that click command (a bare ``--flag`` counts for the last command named in the same
paragraph); every ``spec.<path>``/``status.<path>`` is a field of the CRD's schema; every relative
link is a file, and its ``#anchor`` a heading there; every docs page is linked from the README; and
docs/api.md is what hack/api-docs.py writes from the CRD. Each check is also run once on a wrong
name, and on enough of the real docs that a pattern which finds nothing fails.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from tfdata_operator import cli
from tfdata_operator.server import main as server_main

from fixtures.cases import CRD_PATH, ROOT

DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
COMMANDS: dict[str, click.Command] = {"tfdata-operator": cli.main, "tfdata-server": server_main.main}

_FENCE = re.compile(r"^(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_MAKE = re.compile(r"(?:^|[\s;&|(])make\s+(.*)")
_COMMAND = re.compile(r"(?:^|[\s$(])(?:\S*bin/)?(tfdata-operator|tfdata-server)\s+(.*)")
_BARE_FLAG = re.compile(r"^(--?[A-Za-z][\w-]*)")
# A field path: not part of a longer name (api.spec.parse, plan/status.py), but ".status.x" is one.
_FIELD = re.compile(r"(?:(?<![\w/.-])|(?<=[^\w/.-]\.))((?:spec|status)(?:\.[A-Za-z][A-Za-z0-9]*(?:\[[^\]\s]*\])?)+)")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def _blocks(text: str) -> Iterator[tuple[bool, str]]:
    """The text in paragraphs: (is code, text); each line of a fenced block is one code paragraph."""
    prose: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            if prose:
                yield False, "\n".join(prose)
                prose = []
            continue
        if fenced:
            yield True, line
        elif line.strip():
            prose.append(line)
        elif prose:
            yield False, "\n".join(prose)
            prose = []
    if prose:
        yield False, "\n".join(prose)


def code(text: str) -> Iterator[list[str]]:
    """Per paragraph, its pieces of code in order: inline code spans, or a fenced block's line
    (joined with the next ones while it ends with a backslash)."""
    pending = ""
    for is_code, block in _blocks(text):
        if is_code:
            if block.rstrip().endswith("\\"):
                pending += block.rstrip()[:-1] + " "
                continue
            yield [pending + block]
            pending = ""
        else:
            yield [" ".join(m.group(2).split()) for m in _INLINE_CODE.finditer(block)]


def prose(text: str) -> str:
    """The text without its code (links in code are no links)."""
    return "\n".join(_INLINE_CODE.sub("", b) for is_code, b in _blocks(text) if not is_code)


def _tokens(command_line: str) -> list[str]:
    line = re.split(r"\s(?:\||;|&&)\s", command_line)[0]
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return line.split()


@cache
def makefile_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return frozenset(re.findall(r"^([A-Za-z0-9][A-Za-z0-9_-]*)\s*:(?!=)", text, re.MULTILINE))


def make_targets_named(text: str) -> list[str]:
    return [
        token
        for paragraph in code(text)
        for piece in paragraph
        for match in _MAKE.finditer(piece)
        for token in _tokens(match.group(1))
        if "=" not in token and not token.startswith("-")
    ]


def make_problems(text: str, targets: frozenset[str]) -> list[str]:
    return [f"make {t}: no such target in the Makefile" for t in make_targets_named(text) if t not in targets]


def _options(command: click.Command) -> set[str]:
    ctx = click.Context(command)
    return {opt for param in command.get_params(ctx) for opt in (*param.opts, *param.secondary_opts)}


def flags_named(text: str) -> list[tuple[str, click.Command, str]]:
    """Every (command as written, click command, flag) in the code of ``text``, and each
    subcommand as (command, group, ``<subcommand>``) so that a missing one can be told."""
    found: list[tuple[str, click.Command, str]] = []
    for paragraph in code(text):
        current: tuple[str, click.Command] | None = None
        for piece in paragraph:
            bare = _BARE_FLAG.match(piece)
            if bare and current is not None:
                found.append((*current, bare.group(1)))
                continue
            for match in _COMMAND.finditer(piece):
                name, command = match.group(1), COMMANDS[match.group(1)]
                written = name
                for token in _tokens(match.group(2)):
                    if token.startswith("-") and token != "-":
                        found.append((written, command, token.split("=", 1)[0]))
                    elif isinstance(command, click.Group):
                        found.append((written, command, f"<{token}>"))
                        sub = command.commands.get(token)
                        if sub is None:
                            break
                        written, command = f"{name} {token}", sub
                current = (written, command)
    return found


def flag_problems(text: str) -> list[str]:
    problems = []
    for written, command, flag in flags_named(text):
        if flag.startswith("<"):
            assert isinstance(command, click.Group)
            if flag[1:-1] not in command.commands:
                problems.append(f"{written} {flag[1:-1]}: no such command (has {', '.join(sorted(command.commands))})")
        elif flag not in _options(command):
            problems.append(f"{written} {flag}: no such option")
    return problems


@cache
def crd_schema(path: Path = CRD_PATH) -> Mapping[str, Any]:
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    schema: Mapping[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def both_schemas() -> Mapping[str, Any]:
    """A field named in the docs may be a TFDataService's or a TFDataSnapshot's: one schema whose
    ``spec`` and ``status`` have the properties of both."""
    service, snapshot = crd_schema(), crd_schema(ROOT / "crds" / "tfdata.dev_tfdatasnapshots.yaml")
    properties = dict(service["properties"])
    for part in ("spec", "status"):
        merged = {**snapshot["properties"][part]["properties"], **service["properties"][part]["properties"]}
        properties[part] = {**service["properties"][part], "properties": merged}
    return {**service, "properties": properties}


def field_paths_named(text: str) -> list[str]:
    return [m.group(1) for m in _FIELD.finditer(text) if not m.group(1).endswith(".py")]


def resolves(path: str, schema: Mapping[str, Any]) -> bool:
    for segment in re.findall(r"[A-Za-z][A-Za-z0-9]*(?:\[[^\]]*\])?", path):
        name, _, index = segment.partition("[")
        properties = schema.get("properties") or {}
        if name in properties:
            schema = properties[name]
        elif isinstance(schema.get("additionalProperties"), Mapping):
            schema = schema["additionalProperties"]
        else:
            return False
        if index:
            if not isinstance(schema.get("items"), Mapping):
                return False
            schema = schema["items"]
    return True


def field_problems(text: str, schema: Mapping[str, Any]) -> list[str]:
    return [f"{p}: no such field in the CRD" for p in field_paths_named(text) if not resolves(p, schema)]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings."""
    found: set[str] = set()
    for is_code, block in _blocks(page.read_text(encoding="utf-8")):
        for line in [] if is_code else block.splitlines():
            if heading := _HEADING.match(line):
                text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).replace("`", "")
                slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
                n = 1
                unique = slug
                while unique in found:
                    unique, n = f"{slug}-{n}", n + 1
                found.add(unique)
    return found


def links(page: Path, text: str) -> list[tuple[str, Path]]:
    """Every relative link of a page with the file it points at."""
    found = []
    for target in _LINK.findall(prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        path = target.split("#", 1)[0]
        found.append((target, (page.parent / path).resolve() if path else page.resolve()))
    return found


def link_problems(page: Path, text: str) -> list[str]:
    problems = []
    for target, path in links(page, text):
        anchor = target.partition("#")[2]
        if not path.exists():
            problems.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            problems.append(f"{target}: no heading with anchor #{anchor} in {path.relative_to(ROOT)}")
    return problems


def _read(page: Path) -> str:
    return page.read_text(encoding="utf-8")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_make_target_the_docs_name_exists(page: Path) -> None:
    assert make_problems(_read(page), makefile_targets()) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_and_flag_the_docs_name_exists(page: Path) -> None:
    assert flag_problems(_read(page)) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_field_the_docs_name_is_in_the_crd(page: Path) -> None:
    assert field_problems(_read(page), both_schemas()) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert link_problems(page, _read(page)) == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {path for _, path in links(README, _read(README))}
    assert [p.name for p in DOCS.glob("*.md") if p.resolve() not in linked] == []


def test_the_api_reference_is_what_hack_api_docs_writes_from_the_crd() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "api-docs.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr


def test_the_checks_read_enough_of_the_docs_to_mean_something() -> None:
    text = "\n".join(_read(p) for p in PAGES)
    assert len(set(make_targets_named(text))) >= 20
    assert {flag for _, _, flag in flags_named(text)} >= {"<run>", "<render>", "<verify-tfrecords>", "--config"}
    assert len(set(field_paths_named(text))) >= 50
    assert sum(len(links(p, _read(p))) for p in PAGES) >= 50


WRONG = """\
Run `make tset-unit`, then `tfdata-operator run --metrics-prot 9090` and `tfdata-operator rnder -f x.yaml`.
The operator with `tfdata-operator run --log-format json` also takes `--resync-second`.

```sh
tfdata-server worker --confg FILE
make dev-cluster KWOK_NODES=2 && make lint
```

Set `spec.workers.replica` and read `.status.held.mesage`; see [the API](nope.md) and
[concepts](concepts.md#no-such-heading).
"""


def test_the_checks_find_a_wrong_name() -> None:
    assert make_problems(WRONG, makefile_targets()) == ["make tset-unit: no such target in the Makefile"]
    assert flag_problems(WRONG) == [
        "tfdata-operator run --metrics-prot: no such option",
        "tfdata-operator rnder: no such command (has render, run, verify-tfrecords)",
        "tfdata-operator run --resync-second: no such option",
        "tfdata-server --confg: no such option",
    ]
    assert field_problems(WRONG, crd_schema()) == [
        "spec.workers.replica: no such field in the CRD",
        "status.held.mesage: no such field in the CRD",
    ]
    assert link_problems(DOCS / "page.md", WRONG) == [
        "nope.md: no such file",
        "concepts.md#no-such-heading: no heading with anchor #no-such-heading in docs/concepts.md",
    ]


def test_the_checks_accept_what_exists() -> None:
    right = WRONG.replace("tset-unit", "test-unit").replace("prot", "port").replace("rnder", "render")
    right = right.replace("second`", "seconds`").replace("confg", "config").replace("replica`", "replicas`")
    right = right.replace("mesage", "message").replace("nope.md", "api.md").replace("no-such-heading", "status")
    assert make_problems(right, makefile_targets()) == []
    assert flag_problems(right) == []
    assert field_problems(right, crd_schema()) == []
    assert link_problems(DOCS / "page.md", right) == []
