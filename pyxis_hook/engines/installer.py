"""`install` and `uninstall` of one engine: what changes (a list of `Change`), then doing it.

`plan_install` compares each file the engine's install writes
(engines/enginefiles.py) with the node's, `apply_install` writes the ones
that differ and records what was there before (engines/installstate.py);
`uninstall` restores it once no other installed engine needs the file.
Both print one line per change and never write under `dry_run`.
"""

from __future__ import annotations

from pyxis_hook.engines import enginefiles as ef
from pyxis_hook.engines.filetexts import InstallContext, text
from pyxis_hook.engines.installstate import BACKUP_DIR, RECORD, NodeTree, digest, load_record, save_record
from pyxis_hook.errors import UsageError
from pyxis_hook.record import record


@record
class Change:
    """One file `install` writes: `path` (the node's), its `role`, `content` (a link's target when mode is 0)."""

    path: str
    role: str
    content: str
    mode: int
    existed: bool


def _variant_conflict(engine: str, doc: dict) -> None:
    """Apptainer's CDI spec has no hooks, containerd's and CRI-O's has: one spec file cannot be both."""
    mine = "cdi-spec-nohooks" if "cdi-spec-nohooks" in ef.ENGINE_ROLES[engine] else "cdi-spec"
    users = doc["paths"].get(ef.CDI_SPEC, {}).get("users", [])
    other = [u for u in users if u != engine and mine not in ef.ENGINE_ROLES[u]]
    if other:
        raise UsageError(f"{engine}: {ef.CDI_SPEC} is {other[0]}'s CDI spec "
                         f"({'with' if mine == 'cdi-spec-nohooks' else 'without'} hooks); "
                         f"`pyxis-hook uninstall {other[0]}` first")


def plan_install(engine: str, tree: NodeTree, ctx: InstallContext) -> tuple[list[Change], dict]:
    """The files that must change for `engine`, and the record as it will be after (users added)."""
    doc = load_record(tree)
    _variant_conflict(engine, doc)
    changes = []
    for role in ef.roles(engine):
        path, mode = ef.ROLE_FILES[role]
        cur = tree.get(path)
        if role in ef.EDITS | {"containerd-config"} and cur is not None and cur[0] == "link":
            raise UsageError(f"{path}: a symbolic link; {engine} needs it edited, which install leaves to you")
        backup = BACKUP_DIR + path
        want = text(role, ctx, cur[1] if cur and cur[0] == "file" else None, backup)
        entry = doc["paths"].get(path)
        if want is None:
            if entry is None and cur is None and role in ef.REGENERATED:  # the unit writes it later: ours
                entry = doc["paths"][path] = {"users": [], "origin": None, "wrote": None}
            if entry is not None and engine not in entry["users"]:
                entry["users"].append(engine)
            continue
        if role in ef.EDITS or role == "containerd-config":
            mode = cur[2] if cur else mode
        same = cur is not None and cur[1] == want and (cur[0] == "link") == (mode == 0) and cur[2] == mode
        if not same:
            changes.append(Change(path, role, want, mode, cur is not None))
        if entry is None:
            if same:
                continue  # the node already has it, not from us: never ours to remove
            entry = doc["paths"][path] = {"users": [], "origin": None}
        if engine not in entry["users"]:
            entry["users"].append(engine)
        entry["wrote"] = None if role in ef.REGENERATED else digest(want)
    return changes, doc


def _origin(tree: NodeTree, path: str, doc: dict) -> dict | None:
    """Copy what `path` holds now to the backup tree; the record's 'origin' for it (directories made: `doc`)."""
    cur = tree.get(path)
    if cur is None:
        return None
    if cur[0] == "link":
        return {"link": cur[1]}
    backup = BACKUP_DIR + path
    for d in tree.missing_dirs(backup):
        tree.mkdir(d)
        doc["dirs"][d] = []
    tree.put(backup, cur[1], cur[2])
    return {"backup": backup, "mode": cur[2]}


def apply_install(engine: str, tree: NodeTree, changes: list[Change], doc: dict, out) -> None:
    """Write `changes` and the record `doc` (from `plan_install`); directories made are recorded too.

    A write that fails stops the install with its error; the record is saved
    all the same, for what was written, so `uninstall` takes that back.
    """
    before = load_record(tree)
    missing = [d for path in [RECORD, *(c.path for c in changes)] for d in tree.missing_dirs(path)]  # all checked first
    written: set[str] = set()
    try:
        for d in dict.fromkeys(missing):  # one a previous install made and someone removed is made again
            tree.mkdir(d)
            doc["dirs"].setdefault(d, [])
            out(f"created directory {d}")
        for c in changes:
            entry = doc["paths"][c.path]
            if c.path not in before["paths"] and c.existed:
                entry["origin"] = _origin(tree, c.path, doc)
            if c.mode == 0:
                tree.link(c.path, c.content)
            else:
                tree.put(c.path, c.content, c.mode)
            written.add(c.path)
            out(f"{'replaced' if c.existed else 'wrote'} {c.path}")
    except BaseException:
        for c in changes:  # not written: as the record had it before
            if c.path not in written:
                if c.path in before["paths"]:
                    doc["paths"][c.path] = before["paths"][c.path]
                    continue
                origin = doc["paths"].pop(c.path).get("origin")
                if origin and "backup" in origin:  # kept, but the original was never replaced
                    tree.remove(origin["backup"])
        raise
    finally:
        for users in doc["dirs"].values():
            if engine not in users:
                users.append(engine)
        save_record(tree, doc)


def _restore(tree: NodeTree, path: str, entry: dict, out) -> None:
    cur = tree.get(path)
    ours = entry.get("wrote") is None or (cur is not None and digest(cur[1]) == entry["wrote"])
    origin = entry.get("origin")
    if cur is not None and not ours:
        out(f"left {path}: changed since install" + (f" (the original is {origin['backup']})"
                                                     if origin and "backup" in origin else ""))
        return
    if origin is None:
        tree.remove(path)
        out(f"removed {path}")
    elif "link" in origin:
        tree.link(path, origin["link"])
        out(f"restored {path}")
    else:
        got = tree.get(origin["backup"])
        if got is None:
            raise UsageError(f"{origin['backup']}: the copy of {path} install kept is gone")
        tree.put(path, got[1], origin["mode"])
        tree.remove(origin["backup"])
        out(f"restored {path}")


def uninstall(engine: str, tree: NodeTree, out, dry_run: bool = False) -> bool:
    """Undo `install engine`; False when it was not installed (nothing changes)."""
    doc = load_record(tree)
    mine = [p for p, e in doc["paths"].items() if engine in e.get("users", [])]
    if not mine:
        return False
    for path in mine:
        entry = doc["paths"][path]
        entry["users"].remove(engine)
        if not entry["users"]:
            if dry_run:
                out(f"would restore {path}")
            else:
                _restore(tree, path, entry, out)
            del doc["paths"][path]
    for users in doc["dirs"].values():
        if engine in users:
            users.remove(engine)
    if dry_run:
        return True
    if doc["paths"]:
        save_record(tree, doc)
        return True
    tree.remove(RECORD)
    for d in sorted(doc["dirs"], key=len, reverse=True):
        if not doc["dirs"][d] and tree.rmdir(d):
            out(f"removed directory {d}")
    return True
