"""Hypothesis strategies for any gandiva.v1 message, built from its descriptor:
strings with NUL, control characters, non-BMP text and now and then a huge one;
integers over their whole range; NaN and infinities; repeated fields and maps."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}

nasty_text = st.one_of(
    st.text(max_size=20),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=40),
    st.sampled_from(["", "\x00", "a\x00b", "\n", "../../etc/passwd", "/", "j-" + "0" * 10,
                     "\u202e", "python", "-1", "{index}", "GANDIVA_TOKEN"]),
    st.integers(1, 3).map(lambda k: "x" * (k * 100_000)),
)


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return nasty_text
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=64 if t == FieldDescriptor.TYPE_DOUBLE else 32)
    if t == FieldDescriptor.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-5, 50))
    lo, hi = _INT_RANGES.get(t, (-(2**31), 2**31 - 1))
    return st.one_of(st.integers(lo, hi), st.integers(-3, 16).filter(lambda x: lo <= x <= hi))


def message_dict(desc: Descriptor, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """A strategy for kwargs of the message ``desc`` (one oneof member at most)."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    oneofs = {f.name for o in desc.oneofs for f in o.fields}
    for f in desc.fields:
        if f.name in oneofs:
            continue
        value = _field(f, depth)
        if value is not None:
            fields[f.name] = value
    base = st.fixed_dictionaries({}, optional=fields)
    if not desc.oneofs or depth > 2:
        return base
    choices = [f for o in desc.oneofs for f in o.fields]
    member = st.sampled_from(choices).flatmap(lambda f: st.tuples(st.just(f.name), _or_none(_field(f, depth))))
    return st.tuples(base, st.one_of(st.none(), member)).map(
        lambda bm: {**bm[0], **({bm[1][0]: bm[1][1]} if bm[1] and bm[1][1] is not None else {})})


def _or_none(strategy: st.SearchStrategy[Any] | None) -> st.SearchStrategy[Any]:
    return strategy if strategy is not None else st.none()


def _field(f: FieldDescriptor, depth: int) -> st.SearchStrategy[Any] | None:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        key = _scalar(f.message_type.fields_by_name["key"])
        val_f = f.message_type.fields_by_name["value"]
        return st.dictionaries(key, _scalar(val_f) if val_f.message_type is None else st.just(None), max_size=5) \
            if val_f.message_type is None else None
    if f.message_type is not None:
        if depth > 2:
            return None
        one = message_dict(f.message_type, depth + 1)
    else:
        one = _scalar(f)
    if f.is_repeated:
        return st.lists(one, max_size=4)
    return one


def messages(cls: Any) -> st.SearchStrategy[Any]:
    """Instances of the generated message class ``cls``."""
    return message_dict(cls.DESCRIPTOR).map(lambda kw: cls(**kw))
