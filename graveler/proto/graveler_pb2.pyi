import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CommitData(_message.Message):
    __slots__ = ("id", "committer", "message", "creation_date", "meta_range_id", "metadata", "parents", "version", "generation")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTER_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATION_DATE_FIELD_NUMBER: _ClassVar[int]
    META_RANGE_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    id: str
    committer: str
    message: str
    creation_date: _timestamp_pb2.Timestamp
    meta_range_id: str
    metadata: _containers.ScalarMap[str, str]
    parents: _containers.RepeatedScalarFieldContainer[str]
    version: int
    generation: int
    def __init__(self, id: _Optional[str] = ..., committer: _Optional[str] = ..., message: _Optional[str] = ..., creation_date: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., meta_range_id: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., parents: _Optional[_Iterable[str]] = ..., version: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class TagData(_message.Message):
    __slots__ = ("id", "commit_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    commit_id: str
    def __init__(self, id: _Optional[str] = ..., commit_id: _Optional[str] = ...) -> None: ...

class BranchData(_message.Message):
    __slots__ = ("id", "commit_id", "staging_token", "sealed_tokens")
    ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_ID_FIELD_NUMBER: _ClassVar[int]
    STAGING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SEALED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    id: str
    commit_id: str
    staging_token: str
    sealed_tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., commit_id: _Optional[str] = ..., staging_token: _Optional[str] = ..., sealed_tokens: _Optional[_Iterable[str]] = ...) -> None: ...
