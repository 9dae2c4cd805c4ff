"""Which repositories write a storage namespace: one claim each, under ``_lakefuse/repos/``.

Garbage collection deletes the objects of a namespace that no commit or staged change of *its*
repository names. Two repositories on one namespace -- a refs dump restored into another home
(or another KV, ``kv copy``) while the first goes on, which is how a restore works -- each see
the other's objects as garbage: a ``gc`` of either deleted the other's committed and staged
files (found by a backup operator's tour). So every repository puts a claim in its namespace
(``<claim ID>.json``: its name and where its refs live, never a password), and ``gc`` refuses
to run while the namespace holds a claim other than its own, naming it. A claim goes with
``repo delete``; one whose repository is gone for good (another host's, a home thrown away)
is released by hand (``gc --release CLAIM``).

Copied refs (``kv copy``, a copied home) hold the first one's claim ID, but its claim names where
the first one's refs are: the copy takes a claim of its own at its first ``gc``, and each then
refuses while the other stands. A repository made before claims has none: its first ``gc`` (or anything that calls
:func:`own_claim`) makes it. A restore into a namespace whose refs dump came from a repository
that made no claim there claims for it too (``origin-...``): the restored repository's ``gc``
then waits until someone who knows that the first one is gone releases it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time

from graveler.errors import Conflict, GravelerError, NotFound
from graveler.objstore.uri import FILE, StorageURI

log = logging.getLogger(__name__)

CLAIMS_PREFIX = "_lakefuse/repos/"
_KV_KEY = b"claim"  # in the repository table: this repository's claim ID


def _claim_key(claim: str) -> str:
    return f"{CLAIMS_PREFIX}{claim}.json"


def own_claim(repo) -> str:
    """This repository's claim ID (made and put in its namespace if it has none yet)."""
    cid = repo.refs_value(_KV_KEY)
    if cid is None:
        cid = repo.refs_value(_KV_KEY, default=_new_id(repo))
    key = _claim_key(cid)
    try:
        body = json.loads(repo.store.get(key))
    except NotFound:
        body = None
    except ValueError:
        body = {}
    if isinstance(body, dict) and body.get("refs") not in (None, repo.refs_label):
        # the claim names refs elsewhere: these are a copy of them (kv copy, a copied home), which writes
        # the namespace beside the first -- another repository to gc, with a claim of its own
        cid = repo.refs_value(_KV_KEY, default=_new_id(repo), replace=True)
        key, body = _claim_key(cid), None
    if body is None:
        body = {"repository": repo.name, "refs": repo.refs_label, "host": socket.gethostname(),
                "claimed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        repo.store.put(key, json.dumps(body, indent=1).encode())
    return cid


def _new_id(repo) -> str:
    return f"{repo.name}-{os.urandom(6).hex()}"


def claim_origin(repo, origin: str | None) -> str | None:
    """After a restore into ``repo``'s namespace: a claim for the repository the dump came from
    (``origin``: its name, when the dump says), unless the namespace holds a claim already (that
    repository made one: it is its own). The claim ID, or None."""
    if list_claims(repo):
        return None
    cid = f"origin-{os.urandom(6).hex()}"
    body = {"repository": origin or "(the repository this namespace's refs dump came from)",
            "refs": "unknown: claimed by the restore into " + repo.refs_label,
            "claimed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    repo.store.put(_claim_key(cid), json.dumps(body, indent=1).encode())
    return cid


def after_restore(repo) -> None:
    """Claims after a restore into ``repo``'s namespace: for the repository the dump came from when
    the namespace holds no claim yet (it made none there), then ``repo``'s own."""
    try:
        if (origin := claim_origin(repo, None)) is not None:
            log.warning("%s: claimed %s for the repository its refs dump came from (%s): this repository's gc "
                        "refuses to run until that one is deleted or its claim released (gc --release %s)",
                        repo.name, repo.storage_namespace, origin, origin)
        own_claim(repo)
    except GravelerError as e:
        log.warning("%s: could not claim %s yet (%s): its first gc will", repo.name, repo.storage_namespace, e)


def list_claims(repo) -> dict[str, dict]:
    """Every claim in ``repo``'s namespace: ID -> what it says (unreadable ones say so)."""
    out: dict[str, dict] = {}
    for info in repo.store.list(CLAIMS_PREFIX):
        name = info.key[len(CLAIMS_PREFIX):]
        if "/" in name or not name.endswith(".json"):
            continue
        try:
            body = json.loads(repo.store.get(info.key))
            out[name[:-5]] = body if isinstance(body, dict) else {"repository": "(unreadable claim)"}
        except (NotFound, ValueError):
            out[name[:-5]] = {"repository": "(unreadable claim)"}
    return out


def release(repo, claim: str) -> None:
    """Remove claim ``claim`` from ``repo``'s namespace (NotFound if there is none)."""
    if claim not in list_claims(repo):
        raise NotFound(f"no claim {claim!r} in {repo.storage_namespace} (see the list gc prints)")
    repo.store.delete(_claim_key(claim))
    log.warning("%s: released claim %s in %s", repo.name, claim, repo.storage_namespace)


def drop_own(repo) -> None:
    """Remove this repository's claim (its delete; best effort: a claim left behind only makes
    another repository's gc ask for ``--release``)."""
    cid = repo.refs_value(_KV_KEY)
    if cid is None:
        return
    try:
        repo.store.delete(_claim_key(cid))
    except Exception as e:  # noqa: BLE001 -- the delete of the repository goes on
        log.warning("%s: its claim %s in %s stays (%s): another repository there will ask to release it",
                    repo.name, cid, repo.storage_namespace, e)


def check_there(uri: str) -> None:
    """NotFound if the namespace ``uri`` is a local directory that is not there (moved, deleted, a
    disk not mounted): gc would find nothing to keep, and writing its claim or report would make
    a new empty directory there."""
    u = StorageURI.parse(uri)
    if u.scheme == FILE and not os.path.isdir(u.path):
        raise NotFound(f"storage namespace {uri} is not there (moved or deleted?): nothing was collected")


def check_sole_writer(repo, release_ids: list[str] = ()) -> str:
    """Conflict unless ``repo`` is the only repository claiming its namespace (after releasing
    ``release_ids``); its own claim ID. NotFound for a local namespace that is not there."""
    check_there(repo.storage_namespace)
    cid = own_claim(repo)
    for r in release_ids:
        if r == cid:
            raise Conflict(f"claim {r!r} is this repository's own: it is released by deleting the repository")
        release(repo, r)
    others = {k: v for k, v in list_claims(repo).items() if k != cid}
    if others:
        shown = "; ".join(f"{k} ({v.get('repository')}, refs {v.get('refs', 'unknown')}, claimed "
                          f"{v.get('claimed', '?')})" for k, v in sorted(others.items()))
        raise Conflict(f"{repo.storage_namespace} is written by other repositories too: {shown}. Garbage collection "
                       f"would delete what they name as garbage: delete the others (lakefuse repo delete), or, "
                       f"if one is gone for good, release its claim (--release CLAIM)")
    return cid


__all__ = ["CLAIMS_PREFIX", "after_restore", "check_sole_writer", "check_there", "claim_origin", "drop_own", "list_claims", "own_claim", "release"]
