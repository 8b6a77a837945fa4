"""Split GGUF models: llama.cpp's shard names (``{stem}-00001-of-00003.gguf``), the
check that a set of headers is one complete shard set, and the facts of a whole model,
one file or a shard set merged (metadata of shard 1, tensors of all).

A shard set is merged one header at a time (``facts_from_headers``), so a 128-file
set costs little more than one header; the tensors are capped over the whole set.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Sequence

from kama.api.gguf_bounds import MAX_TENSORS
from kama.gguf.facts import GGUFFacts, HeaderSplit, header_facts, split_of
from kama.gguf.header import GGUFHeader, InvalidGGUF

__all__ = [
    "MissingShard",
    "check_shard_set",
    "facts_from_header",
    "facts_from_headers",
    "facts_from_shard_set",
    "parse_shard_name",
    "shard_file_names",
]

_MISSING_SHOWN = 8  # missing shards named in a message
_SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


class MissingShard(Exception):
    """A set of split GGUF files is incomplete or inconsistent.

    ``missing`` holds the 1-based shard numbers (as in ``-00002-of-00003.gguf``) that are absent.
    """

    def __init__(self, message: str, *, missing: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


def _check_splits(splits: Sequence[HeaderSplit]) -> None:
    if not splits:
        raise MissingShard("no GGUF files given")
    if len(splits) == 1 and not splits[0].declared:
        return
    nos: list[int] = []
    counts: set[int] = set()
    totals: set[int] = set()
    for i, s in enumerate(splits):
        if s.no is None or s.count is None or s.total is None:
            raise MissingShard(f"file {i} of the set lacks the split.no/count/tensors.count keys")
        nos.append(s.no)
        counts.add(s.count)
        totals.add(s.total)
    if len(counts) != 1:
        raise MissingShard(f"shards disagree on split.count: {sorted(counts)}")
    (count,) = counts
    out_of_range = sorted(n + 1 for n in nos if not 0 <= n < count)
    if out_of_range:
        raise MissingShard(f"shard number(s) {out_of_range} are outside 1..{count}")
    duplicates = sorted(n + 1 for n, c in Counter(nos).items() if c > 1)
    if duplicates:
        raise MissingShard(f"shard number(s) {duplicates} of {count} appear more than once")
    present = set(nos)
    missing = tuple(n + 1 for n in range(count) if n not in present)
    if missing:
        shown = missing[:_MISSING_SHOWN]
        more = f" and {len(missing) - len(shown)} more" if len(missing) > len(shown) else ""
        names = ", ".join(f"{n:05d}-of-{count:05d}" for n in shown)
        raise MissingShard(
            f"missing shard(s) {', '.join(map(str, shown))}{more} of {count} ({names}{more})",
            missing=missing,
        )
    if len(totals) != 1:
        raise MissingShard(f"shards disagree on split.tensors.count: {sorted(totals)}")
    (total,) = totals
    found = sum(s.n_tensors for s in splits)
    if found != total:
        raise MissingShard(f"the shards hold {found} tensors but split.tensors.count is {total}")


def check_shard_set(headers: Sequence[GGUFHeader]) -> None:
    """Raise MissingShard unless ``headers`` (any order) form one complete split set.

    A single header without split keys is a complete, unsplit model; a single header
    with ``split.count`` must be shard 1 of 1. Split keys of the wrong type or out of
    range raise InvalidGGUF.
    """
    _check_splits([split_of(h) for h in headers])


class _Merge:
    """Tensors of a shard set gathered one header at a time, capped over the whole set."""

    def __init__(self, *, max_tensors: int) -> None:
        self.max_tensors = max_tensors
        self.tensors: dict[str, int] = {}
        self.parameter_count = 0

    def add(self, header: GGUFHeader) -> None:
        if len(self.tensors) + len(header.tensors) > self.max_tensors:
            raise InvalidGGUF(
                f"the files hold more than {self.max_tensors} tensors together "
                f"(the limit for one model)"
            )
        for t in header.tensors:
            if t.name in self.tensors:
                raise InvalidGGUF(f"tensor {t.name!r} is in more than one file of the set")
            self.tensors[t.name] = t.n_bytes
            self.parameter_count += t.n_elements

    def facts(self, first: GGUFFacts) -> GGUFFacts:
        return dataclasses.replace(
            first,
            parameter_count=self.parameter_count,
            tensor_bytes=sum(self.tensors.values()),
            tensors=self.tensors,
        )


def facts_from_shard_set(headers: Sequence[GGUFHeader]) -> GGUFFacts:
    """Facts of a complete shard set: metadata of shard 1, tensors of all shards.

    Prefer ``facts_from_headers``, which does not need every header in memory at once.
    """
    check_shard_set(headers)
    ordered = sorted(headers, key=lambda h: split_of(h).no or 0)
    merge = _Merge(max_tensors=MAX_TENSORS)
    for h in ordered:
        header_facts(h)  # every shard's facts are checked, not only the first's
        merge.add(h)
    return merge.facts(header_facts(ordered[0]))


def facts_from_header(header: GGUFHeader) -> GGUFFacts:
    """Facts of a header that is a whole model.

    Raises MissingShard when the header says it is one shard of a larger split set (a
    lone ``-00001-of-00003.gguf`` is not a model), InvalidGGUF when a well-known key has
    the wrong type or an implausible value.
    """
    check_shard_set([header])
    return header_facts(header)


def facts_from_headers(
    headers: Iterable[GGUFHeader], *, max_tensors: int = MAX_TENSORS
) -> GGUFFacts:
    """Facts of one model given as the headers of its GGUF files: one file, or a
    complete shard set in any order. Takes one header at a time and keeps only its
    split keys, its tensor sizes and (for shard 1) its facts, so a 128-file set read
    lazily costs little more than one header. At most ``max_tensors`` tensors (and
    never more than ``MAX_TENSORS``) over the whole set.

    Raises InvalidGGUF or MissingShard (also for a lone shard of a larger set).
    """
    splits: list[HeaderSplit] = []
    first: GGUFFacts | None = None
    merge = _Merge(max_tensors=min(max_tensors, MAX_TENSORS))
    for header in headers:
        facts = header_facts(header)
        splits.append(split_of(header))
        if first is None or facts.split_no == 0:
            first = facts
        merge.add(header)
        del header  # not held while the next one is read
    _check_splits(splits)
    assert first is not None  # _check_splits refuses an empty list
    return merge.facts(first)


def shard_file_names(stem: str, count: int) -> list[str]:
    """llama.cpp's split names: ``{stem}-00001-of-0000N.gguf`` ... ``{stem}-0000N-of-0000N.gguf``."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return [f"{stem}-{no:05d}-of-{count:05d}.gguf" for no in range(1, count + 1)]


def parse_shard_name(filename: str) -> tuple[str, int, int] | None:
    """``(stem, no, count)`` (``no`` 1-based) for a split file name, else None."""
    m = _SHARD_RE.match(filename.rsplit("/", 1)[-1])
    if m is None:
        return None
    no, count = int(m["no"]), int(m["count"])
    if not 1 <= no <= count:
        return None
    return m["stem"], no, count
