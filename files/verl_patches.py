#!/usr/bin/env python3
"""Apply p40fleet's verl capability patch rules to a verl checkout (runs on the host).

Standalone: standard library only, Python >= 3.8. The controller renders the rule set as JSON
(``p40fleet.verl_patches.ruleset_json``) and uploads it together with this file.

Usage::

    python3 verl_patch.py --rules RULES.json --checkout /home/verl/verl [--check]
    python3 verl_patch.py --checkout /home/verl/verl --guard COMMIT

RULES.json::

    {"format": 1, "ref": "v0.5.0", "profile": "pascal", "supported": true, "reason": "",
     "rules": [{"id": ..., "file": "verl/...", "old": ..., "new": ..., "count": 1,
                "why": ...}, ...]}

Per rule, on the file's current text: ``old`` found exactly ``count`` times -> replace it;
``old`` found 0 times and ``new`` exactly ``count`` times -> already applied; anything else ->
error. Every rule is checked before any file is written, so a failure leaves the checkout as it
was. Literal text only, never a regex, never a global search-and-replace.

What was applied is recorded in ``CHECKOUT/.p40fleet-patches.json`` (ref, profile, the rules
themselves, sha256 of every patched file after patching). On a later run with the same ref and
profile, a patched file whose sha256 differs from the record is a local edit: it is reported and
nothing is touched. Whoever resets the checkout (``git checkout -f``, a ref bump) owns the tree
state; a record written for another ref or profile whose hashes no longer match is stale and is
ignored. Rules recorded earlier but absent from the requested set (e.g. a profile change) are
reverted when their files still match the record.

Exit codes (one summary line starting ``verl-patch:`` on stdout in every case)::

    0    changed: files patched/reverted and/or the record written
    100  no change: every rule already applied and the record up to date
    2    a rule does not match the checkout (rule id, file, ref, expected vs found) or bad input
    3    local edits: a patched file differs from the recorded post-patch sha256
    4    the rule set says this ref/profile pair is unsupported (reason printed)

With ``--check`` nothing is written; the exit code says what a real run would do (0 = changes
pending, 100 = in sync, 2/3/4 as above).

``--guard COMMIT`` runs before the checkout moves to COMMIT (a ref change): every modified
tracked file must be one the record names, still at its recorded sha256 (our own patch), and no
untracked file may sit where COMMIT has a file; anything else is the user's and exits 3 naming
the files (one line on stdout, no ``verl-patch:`` prefix). Otherwise only our recorded patches
are restored (``git checkout -- FILES``), so the checkout that follows needs no ``-f``; exit 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

RECORD_NAME = ".p40fleet-patches.json"
RECORD_FORMAT = 1

EXIT_CHANGED = 0
EXIT_NO_CHANGE = 100
EXIT_MISMATCH = 2
EXIT_LOCAL_EDITS = 3
EXIT_UNSUPPORTED = 4

_RULE_KEYS = ("id", "file", "old", "new", "count", "why")


class PatchError(Exception):
    """A failure with an exit code; ``str()`` is the message for the operator."""

    def __init__(self, message, code=EXIT_MISMATCH, details=None):
        super().__init__(message)
        self.code = code
        self.details = list(details or [])


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def sha256_file(path):
    try:
        with open(path, "rb") as fh:
            return sha256_bytes(fh.read())
    except FileNotFoundError:
        return None


def validate_ruleset(ruleset):
    """Structural checks on a rule set dict; raises PatchError(code 2)."""
    if not isinstance(ruleset, dict):
        raise PatchError("rule set: expected a JSON object")
    for key in ("ref", "profile", "rules"):
        if key not in ruleset:
            raise PatchError(f"rule set: missing key {key!r}")
    if not isinstance(ruleset["rules"], list):
        raise PatchError("rule set: 'rules' must be a list")
    seen = set()
    for i, rule in enumerate(ruleset["rules"]):
        validate_rule(rule, f"rule #{i}")
        if rule["id"] in seen:
            raise PatchError("rule {}: duplicate id".format(rule["id"]))
        seen.add(rule["id"])


def validate_rule(rule, where="rule"):
    if not isinstance(rule, dict):
        raise PatchError(f"{where}: expected an object")
    missing = [k for k in _RULE_KEYS if k not in rule]
    if missing:
        raise PatchError("{}: missing {}".format(where, ", ".join(missing)))
    rid = rule["id"]
    path = rule["file"]
    if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
        raise PatchError(f"rule {rid}: file must be a relative path inside the checkout")
    if not isinstance(rule["old"], str) or not isinstance(rule["new"], str) or not rule["old"]:
        raise PatchError(f"rule {rid}: old/new must be strings, old non-empty")
    if rule["old"] == rule["new"]:
        raise PatchError(f"rule {rid}: old and new text are identical")
    if rule["old"] in rule["new"]:
        # the old text would still be found after patching: applied/unapplied indistinguishable
        raise PatchError(f"rule {rid}: new text contains the old text")
    if not isinstance(rule["count"], int) or isinstance(rule["count"], bool) or rule["count"] < 1:
        raise PatchError(f"rule {rid}: count must be an integer >= 1")


def read_record(checkout):
    path = os.path.join(checkout, RECORD_NAME)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError) as exc:
        raise PatchError(f"{path}: unreadable record ({exc})") from exc
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise PatchError(f"{path}: unknown record format")
    return record


def _same_rule(a, b):
    return all(a.get(k) == b.get(k) for k in ("file", "old", "new", "count"))


def plan(checkout, ruleset):
    """Decide everything without writing.

    Returns a dict: ``status`` ("changes" | "in-sync"), ``writes`` {relpath: new bytes},
    ``record`` (the record to write, or None when the current one is up to date), ``actions``
    [(rule id, "apply" | "applied" | "revert")], ``notes`` [str].
    Raises PatchError (code 2, 3 or 4) when nothing may be written.
    """
    validate_ruleset(ruleset)
    ref, profile = ruleset["ref"], ruleset["profile"]
    if ruleset.get("supported", True) is False:
        raise PatchError(
            "verl ref {} is unsupported for profile {}: {}".format(
                ref, profile, ruleset.get("reason") or "no reason given"
            ),
            code=EXIT_UNSUPPORTED,
        )
    rules = ruleset["rules"]
    notes = []
    record = read_record(checkout)
    prior = record  # kept for pre-patch hashes even when the record itself is set aside
    revert = []
    if record is not None:
        drifted = []
        for f, h in sorted(record.get("files", {}).items()):
            current = sha256_file(os.path.join(checkout, f))
            if current == h:
                continue
            if current is not None and current == record.get("original_files", {}).get(f):
                notes.append(f"{f} is back to its recorded pre-patch content; re-applying")
                continue
            drifted.append(f)
        same_target = record.get("ref") == ref and record.get("profile") == profile
        if drifted and same_target:
            raise PatchError(
                "local edits in {} (ref {}, profile {}): {} differ from the recorded post-patch "
                "sha256; nothing changed".format(checkout, ref, profile, ", ".join(drifted)),
                code=EXIT_LOCAL_EDITS,
                details=drifted,
            )
        if drifted:
            notes.append(
                "stale record for ref {} profile {} ignored (files changed since: {})".format(
                    record.get("ref"), record.get("profile"), ", ".join(drifted)
                )
            )
            record = None
        elif any(n.endswith("re-applying") for n in notes):
            record = None  # reset by its owner: the rules below decide, nothing to revert
        else:
            wanted = {r["id"]: r for r in rules}
            for old_rule in record.get("rules", []):
                keep = wanted.get(old_rule.get("id"))
                if keep is None or not _same_rule(keep, old_rule):
                    validate_rule(old_rule, "recorded rule {}".format(old_rule.get("id")))
                    revert.append(old_rule)

    originals = {}
    contents = {}

    def text_of(rel, rid):
        if rel not in contents:
            path = os.path.join(checkout, rel)
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except FileNotFoundError:
                raise PatchError(f"rule {rid}: {rel} not found in {checkout} (ref {ref})") from None
            originals[rel] = data
            contents[rel] = data.decode("utf-8")
        return contents[rel]

    errors = []
    actions = []
    for rule in reversed(revert):
        text = text_of(rule["file"], rule["id"])
        n_new, n_old = text.count(rule["new"]), text.count(rule["old"])
        if n_new == rule["count"] and n_old == 0:
            contents[rule["file"]] = text.replace(rule["new"], rule["old"])
            actions.append((rule["id"], "revert"))
        else:
            rid, rel, cnt = rule["id"], rule["file"], rule["count"]
            errors.append(
                f"revert of recorded rule {rid}: {rel} (ref {record.get('ref')}): expected the "
                f"patched text {cnt} time(s) and the original 0, found {n_new} and {n_old}"
            )
    for rule in rules:
        try:
            text = text_of(rule["file"], rule["id"])
        except PatchError as exc:
            errors.append(str(exc))
            continue
        n_old, n_new = text.count(rule["old"]), text.count(rule["new"])
        if n_old == rule["count"]:
            contents[rule["file"]] = text.replace(rule["old"], rule["new"])
            actions.append((rule["id"], "apply"))
        elif n_old == 0 and n_new == rule["count"]:
            actions.append((rule["id"], "applied"))
        else:
            rid, rel, cnt = rule["id"], rule["file"], rule["count"]
            errors.append(
                f"rule {rid}: {rel} (ref {ref}, profile {profile}): expected the old text {cnt} "
                f"time(s) (or the new text {cnt} time(s) when applied), found old {n_old}, "
                f"new {n_new}"
            )
    if errors:
        raise PatchError(
            f"{len(errors)} rule(s) do not match {checkout}; no file changed:\n  "
            + "\n  ".join(errors),
            code=EXIT_MISMATCH,
            details=errors,
        )

    writes = {}
    for rel in sorted(contents):
        data = contents[rel].encode("utf-8")
        if data != originals[rel]:
            writes[rel] = data
    patched_files = sorted({r["file"] for r in rules})
    new_record = {
        "format": RECORD_FORMAT,
        "tool": "p40fleet verl_patch",
        "ref": ref,
        "profile": profile,
        "rule_ids": [r["id"] for r in rules],
        "rules": [{k: r[k] for k in _RULE_KEYS} for r in rules],
        "files": {
            rel: sha256_bytes(contents[rel].encode("utf-8"))
            if rel in contents
            else sha256_file(os.path.join(checkout, rel))
            for rel in patched_files
        },
        "original_files": {rel: _original_hash(prior, rel, originals) for rel in patched_files},
    }
    if record is not None and _record_key(record) == _record_key(new_record):
        new_record = None
    elif record is None and not rules and not revert:
        new_record = None  # nothing to record: no rules, nothing applied before
    status = "changes" if writes or new_record is not None else "in-sync"
    return {
        "status": status,
        "writes": writes,
        "record": new_record,
        "actions": actions,
        "notes": notes,
    }


def _original_hash(prior, rel, originals):
    """sha256 of the file before any p40fleet patch: from the prior record when the file is
    still exactly what that record wrote, else the content found now."""
    before = sha256_bytes(originals[rel])
    if prior is not None and prior.get("files", {}).get(rel) == before:
        return prior.get("original_files", {}).get(rel, before)
    return before


def _record_key(record):
    return json.dumps(
        [record.get(k) for k in ("format", "ref", "profile", "rules", "files")], sort_keys=True
    )


def _atomic_write(path, data):
    directory = os.path.dirname(path) or "."
    mode = None
    if os.path.exists(path):
        mode = os.stat(path).st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=".p40fleet-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode if mode is not None else 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def apply(checkout, ruleset, check=False):
    """Plan, then (unless ``check``) write. Returns the plan dict; raises PatchError."""
    result = plan(checkout, ruleset)
    if check:
        return result
    for rel, data in sorted(result["writes"].items()):
        _atomic_write(os.path.join(checkout, rel), data)
    if result["record"] is not None:
        body = json.dumps(result["record"], indent=2, sort_keys=True) + "\n"
        _atomic_write(os.path.join(checkout, RECORD_NAME), body.encode("utf-8"))
    return result


def _git(checkout, *args):
    return subprocess.run(
        ["git", "-C", checkout, *args], check=True, capture_output=True, text=True
    ).stdout


def _recorded_files(checkout):
    """{path: sha256} of the files the record says we patched ({} without a readable record)."""
    try:
        with open(os.path.join(checkout, RECORD_NAME)) as fh:
            return json.load(fh).get("files", {})
    except (OSError, ValueError):
        return {}


def _sha_or_none(checkout, rel):
    try:
        with open(os.path.join(checkout, rel), "rb") as fh:
            return sha256_bytes(fh.read())
    except OSError:
        return None


def guard(checkout, target):
    """Before moving ``checkout`` to commit ``target``: refuse (exit 3, the message on stdout)
    what is not ours, else restore our recorded patches (see the module doc); returns the code.
    A failing git command raises (exit 1 with its traceback)."""
    entries = iter(
        _git(checkout, "status", "--porcelain", "-z", "--untracked-files=all").split("\0")
    )
    changed, untracked = [], set()
    for entry in entries:
        if not entry:
            continue
        if entry[:2] == "??":
            untracked.add(entry[3:])
            continue
        changed.append(entry[3:])
        if entry[0] in "RC":
            next(entries, None)  # the rename's source path
    recorded = _recorded_files(checkout)
    edits = [p for p in changed if p not in recorded or recorded[p] != _sha_or_none(checkout, p)]
    in_target = set(_git(checkout, "ls-tree", "-r", "-z", "--name-only", target).split("\0"))
    in_the_way = sorted(untracked & in_target)
    if edits:
        print(
            f"verl checkout {checkout} has local edits in: {', '.join(edits)}; commit or save "
            f"them elsewhere, then 'git -C {checkout} checkout -- <files>' and re-run"
        )
        return EXIT_LOCAL_EDITS
    if in_the_way:
        print(
            f"verl checkout {checkout}: untracked file(s) of yours where {target} has files: "
            f"{', '.join(in_the_way)}; move them elsewhere and re-run (they are never overwritten)"
        )
        return EXIT_LOCAL_EDITS
    if changed:
        _git(checkout, "checkout", "--", *changed)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description="apply p40fleet verl patch rules")
    parser.add_argument("--rules", help="rule set JSON file")
    parser.add_argument("--checkout", required=True, help="verl checkout directory")
    parser.add_argument("--check", action="store_true", help="report only, write nothing")
    parser.add_argument(
        "--guard", metavar="COMMIT", help="before a move to COMMIT: only our patches may differ"
    )
    args = parser.parse_args(argv)
    if args.guard is not None:
        return guard(args.checkout, args.guard)
    if args.rules is None:
        parser.error("--rules is required (or --guard COMMIT)")
    try:
        try:
            with open(args.rules, encoding="utf-8") as fh:
                ruleset = json.load(fh)
        except (OSError, ValueError) as exc:
            raise PatchError(f"cannot read rule set {args.rules}: {exc}") from exc
        if not os.path.isdir(args.checkout):
            raise PatchError(f"checkout {args.checkout} is not a directory")
        result = apply(args.checkout, ruleset, check=args.check)
    except PatchError as exc:
        print(f"verl-patch: error (exit {exc.code}): {exc}")
        return exc.code
    for note in result["notes"]:
        print(f"verl-patch: note: {note}")
    labels = {"apply": "patch", "applied": "already applied", "revert": "revert"}
    for rid, action in result["actions"]:
        print(f"verl-patch: {labels.get(action, action)} {rid}")
    files = ", ".join(sorted(result["writes"])) or "none"
    where = "ref {} profile {}".format(ruleset["ref"], ruleset["profile"])
    if result["status"] == "in-sync":
        print(f"verl-patch: no change ({where}: all rules applied, record up to date)")
        return EXIT_NO_CHANGE
    verb = "would change" if args.check else "changed"
    print(
        "verl-patch: {} ({}): files {}; record {}".format(
            verb, where, files, "updated" if result["record"] is not None else "unchanged"
        )
    )
    return EXIT_CHANGED


if __name__ == "__main__":
    sys.exit(main())
