"""ld.so.conf inside a root, read the way glibc's ldconfig reads it (elf/ldconfig.c parse_conf).

Why our own parser: `ldcheck` must tell which directories a *container's*
ldconfig will index without running anything inside the container, and the
driver root's configuration decides where its libraries live.  Rules kept
from glibc 2.36:

* text after `#` is dropped, leading blanks skipped, blank lines ignored, a
  NUL ends the line;
* `include` + blank + one or more glob patterns separated by spaces/tabs;
  relative patterns are relative to the including file's directory; matches
  are read in `glob` order (sorted, `LC_COLLATE=C`); no match is silent;
* `hwcap ...` lines (any case) are ignored;
* anything else is a directory: `dir=TYPE` loses `=TYPE`, trailing blanks and
  slashes are stripped (so `/` alone is dropped);
* a missing configuration file is silent.

Every path is resolved inside the root with `rootfs.resolve_in_root`, so a
symlink in an image cannot make us read the host's files.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from pyxis_hook.rootfs import resolve_in_root

_SPACE = " \t\n\v\f\r"
_BLANK = " \t"
_MAGIC = "*?["
#: ldconfig has no limits (a self-including file exhausts its descriptors); we
#: stop at these so a hostile image cannot make `ldcheck` run for ever.
MAX_INCLUDE_DEPTH = 64
MAX_FILES = 1024


@dataclass(frozen=True)
class LdSoConf:
    """What an ld.so.conf tree says.

    `dirs`: configured directories in ldconfig's order, duplicates (same
    string) dropped, first occurrence kept.  `indexed`: those of `dirs` that
    exist inside the root as directories, deduplicated by inode as ldconfig
    does (what it would actually scan, before its built-in dirs).
    `unmatched_includes`: (file, line, pattern) for include patterns that
    matched nothing.  `files_read`: root-relative config files read, in order.
    `truncated`: an include loop hit MAX_INCLUDE_DEPTH or MAX_FILES.
    """

    dirs: tuple[str, ...]
    unmatched_includes: tuple[tuple[str, int, str], ...]
    files_read: tuple[str, ...]
    indexed: tuple[str, ...] = ()
    truncated: bool = False


def read_ld_so_conf(root: str, conf: str = "/etc/ld.so.conf") -> LdSoConf:
    """Parse `conf` (a path inside `root`) and its includes."""
    state = _State(root)
    state.parse(conf, 0)
    return LdSoConf(tuple(state.dirs), tuple(state.unmatched), tuple(state.files), tuple(state.indexed()),
                    state.truncated)


class _State:
    def __init__(self, root: str) -> None:
        self.root = root
        self.dirs: list[str] = []
        self.unmatched: list[tuple[str, int, str]] = []
        self.files: list[str] = []
        self.attempts = 0
        self.truncated = False

    def parse(self, filename: str, depth: int) -> None:
        self.attempts += 1
        if depth > MAX_INCLUDE_DEPTH or self.attempts > MAX_FILES:
            self.truncated = True
            return
        host = resolve_in_root(self.root, filename)
        try:
            with open(host, "rb") as f:
                raw = f.read()
        except OSError:
            return  # missing (silent in ldconfig), unreadable or a directory (warned/ignored)
        self.files.append(filename)
        for lineno, line in enumerate(raw.split(b"\n"), 1):
            line = line.split(b"\0", 1)[0].split(b"#", 1)[0]
            text = os.fsdecode(line).lstrip(_SPACE)
            if not text:
                continue
            if text.startswith("include") and len(text) > 7 and text[7] in _BLANK:
                for pattern in _strsep(text[8:]):
                    self.include(filename, lineno, pattern, depth)
            elif text[:5].lower() == "hwcap" and len(text) > 5 and text[5] in _BLANK:
                continue
            else:
                self.add_dir(text)

    def include(self, filename: str, lineno: int, pattern: str, depth: int) -> None:
        full = pattern
        if not pattern.startswith("/") and "/" in filename:
            full = os.path.dirname(filename) + "/" + pattern
        matches = self.glob(full)
        if not matches:
            self.unmatched.append((filename, lineno, pattern))
        for m in matches:
            self.parse(m, depth + 1)

    def add_dir(self, text: str) -> None:
        path = text.split("=", 1)[0].rstrip(_SPACE).rstrip("/")
        if path and path not in self.dirs:
            self.dirs.append(path)

    def glob(self, pattern: str) -> list[str]:
        """glob(3) inside the root, results sorted bytewise (C collation)."""
        if not any(c in pattern for c in _MAGIC):
            return [pattern] if os.path.lexists(resolve_in_root(self.root, pattern)) else []
        import fnmatch

        absolute = pattern.startswith("/")
        parts = [p for p in pattern.split("/") if p]
        found = ["/" if absolute else ""]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            nxt = []
            for base in found:
                joined = (base.rstrip("/") + "/" if base else "")
                if not any(c in part for c in _MAGIC):
                    cand = joined + part
                    host = resolve_in_root(self.root, cand)
                    if os.path.lexists(host) and (last or os.path.isdir(host)):
                        nxt.append(cand)
                    continue
                try:
                    names = os.listdir(resolve_in_root(self.root, base or "."))
                except OSError:
                    continue
                for name in names:
                    if name.startswith(".") and not part.startswith("."):
                        continue
                    if fnmatch.fnmatchcase(name, part):
                        cand = joined + name
                        if last or os.path.isdir(resolve_in_root(self.root, cand)):
                            nxt.append(cand)
            found = nxt
        return sorted(found, key=os.fsencode)

    def indexed(self) -> list[str]:
        seen: set[tuple[int, int]] = set()
        out = []
        for d in self.dirs:
            try:
                st = os.stat(resolve_in_root(self.root, d))
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            out.append(d)
        return out


def _strsep(text: str) -> list[str]:
    """strsep(" \\t") keeping only non-empty tokens (the other whitespace stays in the token)."""
    out = []
    token = []
    for c in text:
        if c in _BLANK:
            if token:
                out.append("".join(token))
            token = []
        else:
            token.append(c)
    if token:
        out.append("".join(token))
    return out
