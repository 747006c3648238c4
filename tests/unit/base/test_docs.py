"""The docs name only what exists: every code reference in docs/*.md, README.md and bench/README.md resolves.

What is checked (anything else in backticks is prose and left alone: environment
variables, paths on a node, other projects' files, shell commands of other tools):

* a backticked path of ours: a token ending in `.py` (`plan/build.py`, `rootfs.py`:
  a file of the repository whose path ends so), or starting with one of the
  repository's top-level directories (`tests/...`, `schemas/...`, `hook.d/...`);
  a `.md` token is a doc beside the file or in docs/;
* a backticked dotted name whose first part is `pyxis_hook`, the name of one of its
  modules or packages, or one of its classes (`snapshot.stale_reason`,
  `spec.config.Config`, `RootFS.open`, `host/snapshot.load_or_build`): its longest
  prefix naming a module (by dotted suffix) is imported and the rest looked up as
  an attribute chain, in any module of that suffix;
* a command line, backticked or in a fenced block (`pyxis-hook ...`,
  `... __main__.py ...`, `-m pyxis_hook ...`, or a backticked `COMMAND --option`):
  the command is one of `cli.COMMANDS` or an alias, a `cdi` action one of its
  sub-parsers, each option one that command's parser takes, an option's or a
  positional's value one of its choices where it has choices;
* pyxis.conf keys: the first column of docs/configuration.md's table, a backticked
  `key = value` (the value must be valid for the key too), a backticked key said to
  be "in pyxis.conf" or "key", and the keys of an unsectioned ```toml block: each
  one the schema (`schemas/pyxis-conf.schema.json`) knows; every key it knows is in the table;
* relative markdown links: the file exists, and a `#fragment` is one of its headings;
* docs/design.md's "Modules" section names every module of the package.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "pyxis_hook"
# docs/decisions/ holds dated records: they name the code as it was on their date, so they are not checked
DOC_FILES = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md", REPO / "bench" / "README.md"]

#: Names a change may leave unresolved for a while, as (doc, name); test_allowances_are_still_needed
#: fails once an entry resolves or is no longer named.
BEING_REWRITTEN: set[tuple[str, str]] = set()

_SKIP_DIRS = {".git", "__pycache__", ".tox", ".venv", "venv", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
_FILE_EXTENSIONS = {"md", "json", "conf", "sh", "c", "h", "so", "bin", "go", "cpp", "toml", "yaml", "yml",
                    "fstab", "sqsh", "shtml", "proto", "txt", "d", "cfg", "ini", "log", "real", "sif", "py"}
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\.\.\.|…)?$|[<>$…*]|\.\.\.")
_SEPARATORS = {"&&", "||", "|", ";", ">", ">>", "2>", "<", "2>&1"}


# --- the repository and the package, as the checks see them -----------------------------------------

@cache
def repo_files() -> tuple[str, ...]:
    """Every file of the repository, as a path relative to its root."""
    out = []
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if any(part in _SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.is_file():
            out.append(rel.as_posix())
    return tuple(out)


@cache
def top_dirs() -> frozenset[str]:
    return frozenset(p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith("."))


@cache
def modules() -> tuple[str, ...]:
    """The dotted names of pyxis_hook's modules and packages (found on disk, nothing imported)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        parts = list(rel.parts)
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return tuple(out)


@cache
def module_words() -> frozenset[str]:
    return frozenset(part for name in modules() for part in name.split("."))


@cache
def classes() -> dict[str, tuple[str, ...]]:
    """Top-level class name -> the modules that define one so named."""
    found: dict[str, list[str]] = {}
    for name in modules():
        rel = Path(*name.split("."))
        path = REPO / rel.with_suffix(".py")
        if not path.exists():
            path = REPO / rel / "__init__.py"
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(name)
    return {k: tuple(v) for k, v in found.items()}


def _modules_ending(parts: list[str]) -> list[str]:
    dotted = ".".join(parts)
    return [m for m in modules() if m == dotted or m.endswith("." + dotted)]


def _has_chain(obj: object, chain: list[str]) -> bool:
    for name in chain:
        if hasattr(obj, name):
            obj = getattr(obj, name)
        elif name in getattr(obj, "__annotations__", {}):
            return chain[-1] == name  # a record's field: nothing to look up below it
        else:
            return False
    return True


def _resolve_in(module_names: list[str] | tuple[str, ...], chain: list[str]) -> bool:
    if "pyxis_hook.__main__" in module_names and not chain:
        return True
    return any(_has_chain(importlib.import_module(m), chain) for m in module_names if m != "pyxis_hook.__main__")


# --- what counts as a code reference, and whether it resolves ----------------------------------------

_DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
_SLASHED_ATTR = re.compile(r"^(\w+(?:/\w+)+)\.([A-Za-z_]\w*)$")
_PATHLIKE = re.compile(r"^[\w.-]+(?:/[\w.-]+)*/?$")


def _file_exists(token: str, doc: Path) -> bool:
    token = token.rstrip("/")
    if token.endswith(".md") and "/" not in token:
        return (doc.parent / token).exists() or (REPO / "docs" / token).exists()
    if (REPO / token).exists():
        return True
    return any(f.endswith("/" + token) for f in repo_files())


def check_token(token: str, doc: Path) -> bool | None:
    """Whether a backticked token names existing code; None when it names nothing of ours."""
    token = re.sub(r"\(.*\)$", "", token.strip())
    if token.startswith("pyxis_hook.") and _DOTTED.match(token):
        return check_dotted(token.split("."))
    if _PATHLIKE.match(token) and ("/" in token or token.endswith((".py", ".md"))):
        first = token.split("/", 1)[0]
        ours = token.endswith(".py") or (token.endswith(".md") and "/" not in token) or (
            "/" in token and first in top_dirs())
        if ours:
            return _file_exists(token, doc)
        m = _SLASHED_ATTR.match(token)
        if m and m.group(1).split("/", 1)[0] in module_words() and m.group(2) not in _FILE_EXTENSIONS:
            path = m.group(1) + ".py"
            if not _file_exists(path, doc):
                return False
            return _resolve_in(_modules_ending(m.group(1).split("/")), [m.group(2)])
        return None
    if _DOTTED.match(token):
        parts = token.split(".")
        if parts[-1] in _FILE_EXTENSIONS:  # a file name (`oci.conf`, `mounts.d`): not a dotted name
            return None
        if parts[0] in _CONFIG_JSON_FIELDS:  # `process.env`: config.json's field, not `kernel.process`
            return None
        if parts[0] in module_words() or parts[0] in classes():
            return check_dotted(parts)
    return None


#: config.json's top-level fields (the OCI runtime spec): `process.env` names the field
_CONFIG_JSON_FIELDS = {"process", "root", "linux", "hooks", "annotations", "mounts"}


def check_dotted(parts: list[str]) -> bool:
    for k in range(len(parts), 0, -1):
        found = _modules_ending(parts[:k])
        if found:
            return _resolve_in(found, parts[k:])
    owners = classes().get(parts[0], ())
    return _resolve_in(owners, parts) if owners else False


# --- command lines ---------------------------------------------------------------------------------

_COMMAND_START = re.compile(r"(?:(?<![\w/.-])pyxis-hook|__main__\.py|-m pyxis_hook)[ \t]+(.*)")
_GLOBAL_WITH_VALUE = {"--config"}
_GLOBAL_FLAGS = {"--debug", "--version", "--help", "-h"}
#: commands that share their name with another program (`enroot start --env ...`, `ldd --version`):
#: a backticked line starting with one is that program's unless `pyxis-hook` precedes it
_OTHER_PROGRAMS = {"enroot", "ldd", "info", "list"}


@cache
def command_names() -> dict[str, str]:
    """Every name and alias of a command -> its name."""
    from pyxis_hook.cli import COMMANDS

    out = {name: name for name in COMMANDS}
    for name, (_module, _help, aliases) in COMMANDS.items():
        out.update(dict.fromkeys(aliases, name))
    return out


@cache
def command_parser(name: str) -> argparse.ArgumentParser:
    from pyxis_hook.cli import build_parser

    parser = build_parser(name)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _words(rest: str) -> list[str]:
    rest = re.sub(r"\s#.*$", "", rest)  # a shell comment
    words = []
    for word in rest.replace('"', " ").replace("'", " ").replace(",", " ").split():
        if word in _SEPARATORS or word.startswith(">"):
            break
        word = word.strip("[]()")
        if word:
            words.append(word)
    return words


def _value_ok(value: str, choices) -> bool:
    if choices is None or _PLACEHOLDER.search(value):
        return True
    return all(v in choices for v in value.split("|"))


def check_command(words: list[str]) -> list[str]:
    """The names of a command line (the words after `pyxis-hook`) that the parser does not know."""
    bad = []
    it = iter(words)
    for word in it:
        if word.split("=", 1)[0] in _GLOBAL_WITH_VALUE:
            if "=" not in word:
                next(it, None)
            continue
        if word in _GLOBAL_FLAGS:
            continue
        if word.startswith("-"):
            return [f"pyxis-hook {word}"]
        if _PLACEHOLDER.search(word):
            return []
        if word not in command_names():
            return [f"pyxis-hook {word}"]
        return _check_arguments(word, command_parser(command_names()[word]), list(it))
    return bad


def _check_arguments(prog: str, parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    bad = []
    positionals = [a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]
    sub = _subparsers(parser)
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("-") and len(word) > 1 and not word[1:2].isdigit():
            name, eq, value = word.partition("=")
            action = parser._option_string_actions.get(name)
            if action is None:
                bad.append(f"pyxis-hook {prog} {name}")
                continue
            if action.nargs == 0:
                continue
            if not eq and i < len(words):
                value = words[i]
                i += 1
            if not _value_ok(value, action.choices):
                bad.append(f"pyxis-hook {prog} {name} {value}")
            continue
        if sub is not None:
            if _PLACEHOLDER.search(word):
                return bad
            if word not in sub.choices:
                return [*bad, f"pyxis-hook {prog} {word}"]
            return bad + _check_arguments(f"{prog} {word}", sub.choices[word], words[i:])
        if positionals:
            action = positionals.pop(0)
            if action.nargs in ("*", "+", argparse.REMAINDER):
                positionals.insert(0, action)
            if not _value_ok(word, action.choices):
                bad.append(f"pyxis-hook {prog} {word}")
    return bad


def command_lines(text: str, inline: bool) -> list[list[str]]:
    """The command lines a span or a fenced line holds, each as the words after the program."""
    # `# pyxis-hook for enroot/Pyxis ...`: a shell comment's prose naming the program, not a command line
    out = [_words(m.group(1)) for m in _COMMAND_START.finditer(text)
           if not (text[:m.start()].rstrip().endswith("#") and m.group(1).split(" ", 1)[0] not in command_names())]
    # `journalctl -t pyxis-hook --since today`: a tag, not our command (whose first word is a command or
    # one of its global options)
    out = [w for w in out if not w or not w[0].startswith("-") or w[0] in _GLOBAL_FLAGS | _GLOBAL_WITH_VALUE]
    if inline and not out:
        first, _, rest = text.partition(" ")
        if first in command_names() and first not in _OTHER_PROGRAMS and re.search(r"(^|\s|\[)--?\w", rest):
            out.append(_words(text))
    return out


# --- pyxis.conf keys -------------------------------------------------------------------------------

@cache
def schema_keys() -> frozenset[str]:
    from pyxis_hook.spec.schemafiles import load_schema

    return frozenset(load_schema("pyxis-conf.schema.json")["properties"])


def check_setting(token: str) -> str | None:
    """For a backticked `key = value` of ours: None when valid, else the bad name; also None when not ours."""
    m = re.match(r"^([a-z][a-z0-9-]*) = ", token)
    if not m:
        return None
    from pyxis_hook.spec import confcheck
    from pyxis_hook.spec.config import toml_reader

    tomllib = toml_reader()
    try:
        data = tomllib.loads(token)
    except tomllib.TOMLDecodeError:
        return None  # prose shaped like a setting (`key = value`)

    key = m.group(1)
    if key not in schema_keys():
        return key
    return f"{key} = {data[key]!r}" if confcheck.problem(data) else None


_KEY_MENTION = re.compile(r"`([a-z][a-z0-9-]*)`(?= (?:in|of) (?:the |its |a )?pyxis\.conf| key\b)"
                          r"|pyxis\.conf's `([a-z][a-z0-9-]*)`|\bkey `([a-z][a-z0-9-]*)`")


def table_keys(path: Path) -> list[tuple[int, str]]:
    """The keys in the first column of the configuration table."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = re.match(r"^\|\s*`([^`]+)`\s*\|", line)
        if m:
            out.append((number, m.group(1)))
    return out


# --- markdown ------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for _number, line, fenced in _lines(path.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not fenced:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def _lines(text: str):
    """(line number, line, fence) for each line, fence = (the block's first line, its language) or None.

    The fence markers themselves are left out.
    """
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s*(```+|~~~+)\s*(\S*)", line)
        if m:
            fence = (number, m.group(2) or "text") if fence is None else None
            continue
        yield number, line, fence


def scan(path: Path, text: str | None = None) -> list[tuple[int, str]]:
    """(line, name) for each reference in one markdown file that does not resolve."""
    text = path.read_text() if text is None else text
    problems: list[tuple[int, str]] = []
    prose: list[tuple[int, str]] = []
    toml_blocks: dict[int, list[tuple[int, str]]] = {}
    pending, pending_line = "", 0
    for number, line, fence in _lines(text):
        if fence is None:
            prose.append((number, line))
            continue
        if fence[1] == "toml":
            toml_blocks.setdefault(fence[0], []).append((number, line))
        if line.rstrip().endswith("\\"):
            pending_line = pending_line or number
            pending += line.rstrip()[:-1] + " "
            continue
        full, start = pending + line, pending_line or number
        pending, pending_line = "", 0
        for words in command_lines(full, inline=False):
            problems += [(start, name) for name in check_command(words)]
    lines = [line for _n, line in prose]
    numbers = [n for n, _line in prose]
    joined = "\n".join(lines)

    def line_of(offset: int) -> int:
        return numbers[joined.count("\n", 0, offset)]

    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", joined):
        token, number = m.group(1).replace("\n", " "), line_of(m.start())
        if check_token(token, path) is False:
            problems.append((number, token))
        for words in command_lines(token, inline=True):
            problems += [(number, name) for name in check_command(words)]
        bad_setting = check_setting(token)
        if bad_setting:
            problems.append((number, bad_setting))
    for m in _KEY_MENTION.finditer(joined):
        key = next(g for g in m.groups() if g)
        if key not in schema_keys():
            problems.append((line_of(m.start()), key))
    code_free = re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), joined)
    for m in re.finditer(r"\]\(([^)\s]+)\)", code_free):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part) if file_part else path
        if not dest.exists():
            problems.append((line_of(m.start()), target))
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.resolve()):
            problems.append((line_of(m.start()), target))
    for block in toml_blocks.values():
        if any(re.match(r"^\s*\[", line) for _n, line in block):
            continue  # another program's configuration
        for number, line in block:
            key = re.match(r"^\s*([A-Za-z0-9_-]+)\s*=", line)
            if key and key.group(1) not in schema_keys():
                problems.append((number, key.group(1)))
    if path.name == "configuration.md" and path.parent.name == "docs":
        problems += [(n, key) for n, key in table_keys(path) if key not in schema_keys()]
    return sorted(set(problems))


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@cache
def all_problems() -> tuple[tuple[str, int, str], ...]:
    return tuple((_rel(doc), n, name) for doc in DOC_FILES for n, name in scan(doc))


# --- the tests -----------------------------------------------------------------------------------

def test_docs_name_only_what_exists():
    unresolved = [f"{doc}:{n}: {name}" for doc, n, name in all_problems() if (doc, name) not in BEING_REWRITTEN]
    assert not unresolved, "docs name what does not exist:\n" + "\n".join(unresolved)


def test_allowances_are_still_needed():
    named = {(doc, name) for doc, _n, name in all_problems()}
    stale = sorted(BEING_REWRITTEN - named)
    assert not stale, f"resolved or no longer named, drop from BEING_REWRITTEN: {stale}"


def test_every_config_key_is_documented():
    documented = {key for _n, key in table_keys(REPO / "docs" / "configuration.md")}
    missing = sorted(schema_keys() - documented)
    assert not missing, f"pyxis.conf keys missing from docs/configuration.md's table: {missing}"


def _section(path: Path, heading: str) -> str:
    """The text under a `## heading` line, up to the next `## ` heading."""
    text = path.read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_design_maps_every_module():
    """docs/design.md's "Modules" section names each module's file; `commands/` lists its modules by name."""
    section = _section(REPO / "docs" / "design.md", "## Modules")
    named = set(re.findall(r"`([^`]+)`", section))
    listed = set(re.findall(r"`([^`]+)`", section[section.index("`commands/`:"):].split("\n\n", 1)[0]))
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if "__pycache__" in rel.parts or rel.name == "__init__.py":
            continue
        if rel.parts[0] == "commands":
            if rel.stem not in listed:
                missing.append(rel.as_posix())
        elif rel.as_posix() not in named:
            missing.append(rel.as_posix())
    assert not missing, f"modules docs/design.md's map does not name: {missing}"


# --- the checker itself: it flags what is wrong, and leaves prose alone ---------------------------

@pytest.mark.parametrize("token", [
    "freshness.stale_reason", "host/artifact.py", "spec.config.Config", "pyxis_hook.spec.config.Config",
    "lookup.openat2", "RootFS.open", "Config.driver_root", "host/freshness.stale_reason", "cli.main",
    "rootfs.py", "tests/conftest.py", "schemas/pyxis-conf.schema.json", "configuration.md", "plan.container",
    "startimage.image_path(entry)",
])
def test_checker_resolves_real_names(token):
    assert check_token(token, REPO / "docs" / "design.md") is True


@pytest.mark.parametrize("token", [
    "artifact.no_such_thing", "host/no_such.py", "spec.config.NOPE", "pyxis_hook.nope", "RootFS.nope",
    "tests/unit/nope.py", "nope.md", "host/artifact.nope", "plan.no_such_module", "no_such_module_anywhere.py",
])
def test_checker_flags_missing_names(token):
    assert check_token(token, REPO / "docs" / "design.md") is False


@pytest.mark.parametrize("token", [
    "NVIDIA_VISIBLE_DEVICES", "/etc/pyxis-hook/pyxis.conf", "os.path", "json.loads", "ld.so.cache",
    "elf/dl-cache.c", "mounts.d", "oci.conf", "nvidia.com/gpu", "gc.disable()", "process.env", "cdi.k8s.io/",
    "bash .ci/run", "srun --gres=gpu:1 nvidia-smi", "elf/cache.c", "src/plugins/task/cgroup/x.c",
])
def test_checker_leaves_prose_alone(token):
    assert check_token(token, REPO / "docs" / "design.md") is None


@pytest.mark.parametrize(("line", "expected"), [
    ("pyxis-hook plan --bundle DIR", []),
    ("pyxis-hook --config /x cdi generate --output F --format yaml --no-hooks", []),
    ("pyxis-hook cdi hook update-ldcache --host-driver-version=V --folder DIR", []),
    ("pyxis-hook createRuntime", []),
    ("pyxis-hook hookd --stage createRuntime", []),
    ("pyxis-hook frobnicate", ["pyxis-hook frobnicate"]),
    ("pyxis-hook plan --no-such-option", ["pyxis-hook plan --no-such-option"]),
    ("pyxis-hook cdi make", ["pyxis-hook cdi make"]),
    ("pyxis-hook cdi generate --format xml", ["pyxis-hook cdi generate --format xml"]),
    ("pyxis-hook cdi hook bogus-step", ["pyxis-hook cdi hook bogus-step"]),
    ("pyxis-hook hookd --stage poststop", ["pyxis-hook hookd --stage poststop"]),
])
def test_checker_reads_command_lines(line, expected):
    (words,) = command_lines(line, inline=True)
    assert check_command(words) == expected


@pytest.mark.parametrize(("span", "expected"), [
    ("ldcheck ROOTFS --env LD_LIBRARY_PATH=...", []),
    ("ldcheck ROOTFS --no-such", ["pyxis-hook ldcheck --no-such"]),
    ("python -I -S .../__main__.py frob", ["pyxis-hook frob"]),
    ("enroot start --env NAME=value", None),
    ("plan", None),
])
def test_checker_finds_command_lines_in_spans(span, expected):
    found = command_lines(span, inline=True)
    assert (None if not found else check_command(found[0])) == expected


def test_checker_scans_markdown(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "# Title\n\nSee [there](x.md#title), [gone](gone.md), [bad anchor](x.md#nope) and `host/nope.py`.\n"
        "Set `cuda-compat = \"sometimes\"` or `no-such-key = true`; the `log-levels` key; `ldcache = \"merge\"`.\n"
        "```sh\npyxis-hook info --frob \\\n  --x\n```\n"
        "```toml\nnot-a-key = 1\n```\n"
        "```toml\n[plugins]\nenable_cdi = true\n```\n")
    assert scan(doc) == [
        (3, "gone.md"), (3, "host/nope.py"), (3, "x.md#nope"),
        (4, "cuda-compat = 'sometimes'"), (4, "log-levels"), (4, "no-such-key"),
        (6, "pyxis-hook info --frob"), (6, "pyxis-hook info --x"),
        (10, "not-a-key"),
    ]
