"""Size limits of every string, bytes, map and list field of the API: pure checks over protobuf
messages, walked through their descriptors so that no field is forgotten.

The limits are a contract (docs/RELIABILITY.md, "Every input bounded at the edge"). A request over
one is INVALID_ARGUMENT naming the field and the limit, never echoing the input. Fields not named
below get the defaults. Whole-message size is bounded separately by ``max_message_bytes``.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

KiB = 1 << 10
MiB = 1 << 20

# Characters (str) or bytes (bytes) of one value, by field name.
FIELD_LIMITS: dict[str, int] = {
    "session_id": 256,
    "idempotency_key": 256,
    "pool": 256,
    "shell_session": 256,
    "workdir": 4096,
    "cwd": 4096,
    "path": 4096,
    "paths": 4096,
    "shell": 1 * MiB,
    "args": 128 * KiB,
    "spec_json": 16 * MiB,
    "workspace_tar": 32 * MiB,
    "stdin": 64 * MiB,
    "data": 128 * MiB,  # file contents: the message size limit is the real bound
}
DEFAULT_STRING = 64 * KiB
# Numbers with a range of their own (checked by their handlers).
MAX_PREFETCH_TTL = 7 * 24 * 3600.0  # seconds a prefetch keeps sandboxes after its task was last asked for
DEFAULT_BYTES = 128 * MiB

# Maps: (entries, key characters, value characters).
MAP_LIMITS: dict[str, tuple[int, int, int]] = {
    "labels": (64, 128, 1024),
    "env": (256, 256, 128 * KiB),
}
DEFAULT_MAP = (256, 256, 64 * KiB)
# Total characters of all keys and values of one map, and of all items of one list.
MAP_TOTAL = {"labels": 64 * KiB, "env": 256 * KiB}
LIST_LIMITS: dict[str, int] = {"args": 10_000, "paths": 10_000, "files": 10_000, "requests": 4096}
LIST_TOTAL = {"args": 1 * MiB}
DEFAULT_LIST = 10_000
MAX_DEPTH = 8


class LimitExceeded(ValueError):
    """A field over its limit; the message names the field and the limit, not the value."""


def _check_scalar(where: str, name: str, field: FieldDescriptor, value: str | bytes) -> None:
    default = DEFAULT_STRING if field.type == FieldDescriptor.TYPE_STRING else DEFAULT_BYTES
    limit = FIELD_LIMITS.get(name, default)
    if len(value) > limit:
        unit = "characters" if field.type == FieldDescriptor.TYPE_STRING else "bytes"
        raise LimitExceeded(f"{where}: {len(value)} {unit} is over the limit of {limit} {unit}")


def check(message: Message, *, _where: str = "", _depth: int = 0) -> None:
    """Raise LimitExceeded for the first field of ``message`` over its limit."""
    if _depth > MAX_DEPTH:
        raise LimitExceeded(f"{_where or message.DESCRIPTOR.name}: nested more than {MAX_DEPTH} levels")
    base = _where or message.DESCRIPTOR.name
    for field, value in message.ListFields():
        where = f"{base}.{field.name}"
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entries, key_limit, value_limit = MAP_LIMITS.get(field.name, DEFAULT_MAP)
            if len(value) > entries:
                raise LimitExceeded(f"{where}: {len(value)} entries is over the limit of {entries}")
            total = 0
            value_field = field.message_type.fields_by_name["value"]
            for k, v in value.items():
                if len(k) > key_limit:
                    raise LimitExceeded(f"{where}: a key of {len(k)} characters is over the limit of {key_limit}")
                if value_field.message_type is not None:
                    check(v, _where=f"{where}[{k[:40]!r}]", _depth=_depth + 1)
                    continue
                if len(v) > value_limit:
                    raise LimitExceeded(f"{where}[{k[:40]!r}]: {len(v)} characters is over the limit of {value_limit}")
                total += len(k) + len(v)
            if field.name in MAP_TOTAL and total > MAP_TOTAL[field.name]:
                raise LimitExceeded(f"{where}: {total} characters in all is over the limit of {MAP_TOTAL[field.name]}")
        elif field.is_repeated:
            limit = LIST_LIMITS.get(field.name, DEFAULT_LIST)
            if len(value) > limit:
                raise LimitExceeded(f"{where}: {len(value)} items is over the limit of {limit}")
            if field.message_type is not None:
                for i, item in enumerate(value):
                    check(item, _where=f"{where}[{i}]", _depth=_depth + 1)
            elif field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
                total = 0
                for i, item in enumerate(value):
                    _check_scalar(f"{where}[{i}]", field.name, field, item)
                    total += len(item)
                if field.name in LIST_TOTAL and total > LIST_TOTAL[field.name]:
                    raise LimitExceeded(f"{where}: {total} characters in all is over the limit of {LIST_TOTAL[field.name]}")
        elif field.message_type is not None:
            check(value, _where=where, _depth=_depth + 1)
        elif field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
            _check_scalar(where, field.name, field, value)
