"""graveler: a versioned object store in the design and on-disk format of lakeFS's Graveler.

The public surface::

    from graveler import Graveler, GravelerConfig, Repository
    from graveler.errors import NotFound, Conflict, ...

``Graveler`` (:mod:`graveler.home`) is the lakefuse home: it creates, opens,
lists and deletes repositories. ``Repository`` (:mod:`graveler.repository`) is
one repository's operations. Configuration is :mod:`graveler.config`'s frozen
dataclasses. The names below are imported on first use, so importing one
submodule (``graveler.sstable``, ``graveler.errors``) stays light.

Layers, bottom up: ``varint``, ``lru``, ``errors``, ``config`` -> ``sstable``
(table bytes) and ``objstore`` (object I/O) -> ``model``, ``ident`` ->
``committed`` (reader, writer, diff, merge, manager) and ``kv`` -> ``refs``,
``staging``, ``listing`` -> ``core`` -> ``commits`` -> ``repository`` ->
``home``.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Graveler": "graveler.home",
    "Repository": "graveler.repository",
    "GravelerConfig": "graveler.config",
    "Config": "graveler.config",
    "CacheConfig": "graveler.config",
    "KVConfig": "graveler.config",
    "RangeParams": "graveler.config",
    "StoreConfig": "graveler.config",
    "Entry": "graveler.model",
    "Value": "graveler.model",
    "DiffRecord": "graveler.model",
    "DiffType": "graveler.model",
    "MergeStrategy": "graveler.model",
    "AddressType": "graveler.model",
    "ListItem": "graveler.listing",
    "Branch": "graveler.refs",
    "Commit": "graveler.refs",
    "Tag": "graveler.refs",
    "RefType": "graveler.refs",
    "ResolvedRef": "graveler.refs",
    "RepositoryRecord": "graveler.refs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'graveler' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
