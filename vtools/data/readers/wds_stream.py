"""Tar shards streamed from a server (``http(s)://`` URLs, or webdataset's ``pipe:<command>``), for training.

A shard server cannot be read by index, so these shards are read in order, as
a stream: webdataset opens each URL (``curl`` for http, a shell pipe for
``pipe:``) and iterates its tar members; nothing is written to disk. What keeps
training exact over a stream is that its order depends only on (seed, epoch,
rank, loader worker): :func:`plan_epoch` deals each epoch's seeded shard order
to the processes and their workers and gives every worker its share of the
epoch's samples, and :func:`worker_samples` yields one worker's samples through
a seeded shuffle buffer. A resumed run repeats the stream and skips the samples
it already trained on without decoding them.

The split info (``_info.json`` that ``python -m vtools shards`` writes, or
timm's) is fetched from the same URL base for the shard lengths and class
names; without it a ``|<num_samples>`` suffix on the shard pattern (timm's
spelling) gives the epoch's length. A shard that cannot be read to its end (the
server went away, an HTTP error, a truncated tar) raises :class:`StreamLost`,
one line naming the shard URL and the cause, which training turns into a
resumable stop.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from vtools.data.datasets import SampleStore
from vtools.data.decode import BadSample, RawSample
from vtools.data.readers.wds import (
    IMAGE_EXTENSIONS,
    INFO_FILES,
    _expand,
    _split_name_in,
    label_out_of_range,
    read_split_info,
)
from vtools.errors import UsageError

STREAM_PREFIXES = ("http://", "https://", "pipe:")
INFO_TIMEOUT_S = 30

# what curl's exit status means, for the one line a lost shard gives (curl's manual, "EXIT CODES")
CURL_EXITS = {
    6: "the host name could not be resolved",
    7: "could not connect (connection refused)",
    18: "the transfer ended before the shard did (the server closed the connection)",
    22: "the server answered with an HTTP error (400 or above)",
    28: "the transfer timed out",
    52: "the server closed the connection without answering",
    55: "sending to the server failed",
    56: "the connection was reset",
}


class StreamLost(Exception):
    """A shard of a stream could not be read to its end: one line naming the shard and why."""


def is_stream(spec: str | None) -> bool:
    """Whether a data folder or split names shards on a server (or a ``pipe:`` command), not local files."""
    return bool(spec) and str(spec).startswith(STREAM_PREFIXES)


@dataclass(frozen=True)
class StreamSplit:
    """A split's shard URLs, each shard's sample count, and the class names when the split info gives them."""

    urls: list[str]
    counts: list[int]
    exact_counts: bool  # counts from the split info; False: a |num_samples total shared out evenly
    classes: list[str] | None
    info_from: str  # where the split info came from ('' when there was none)


def fetch_split_info(base: str) -> tuple[dict[str, Any], str]:
    """The split-info file at a URL base (or in a local folder), and where it came from; empty when
    the server has none (404). A server that cannot be reached is one line."""
    if not base.startswith(("http://", "https://")):
        path = Path(base)
        if base and path.is_dir():
            info = read_split_info(path)
            found = next((str(path / n) for n in INFO_FILES if (path / n).is_file()), "")
            return info, found
        return {}, ""
    for name in INFO_FILES:
        url = f"{base.rstrip('/')}/{name}"
        try:
            with urllib.request.urlopen(url, timeout=INFO_TIMEOUT_S) as answer:
                text = answer.read().decode("utf-8")
        except urllib.error.HTTPError as err:
            if err.code == 404:
                continue
            raise UsageError(f"{url}: the server answered HTTP {err.code} ({err.reason})") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise UsageError(f"{url}: cannot reach the shard server ({reason})") from None
        try:
            info = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as err:
            raise UsageError(f"{url}: not a readable split-info file ({err})".splitlines()[0]) from None
        if not isinstance(info, dict):
            raise UsageError(f"{url}: not a split-info file (expected a mapping with 'splits')")
        return info, url
    return {}, ""


def _join(base: str, name: str) -> str:
    return name if is_stream(name) or not base else f"{base.rstrip('/')}/{name}"


def _url_base(url: str) -> str:
    """The folder of an http shard URL (where its split info lies); '' for a pipe: command."""
    return url.rsplit("/", 1)[0] if url.startswith(("http://", "https://")) else ""


def open_stream_split(root: str, split: str) -> StreamSplit:
    """The shards of ``split``, where ``root`` (the data folder) or ``split`` itself is a URL or a
    ``pipe:`` command: a split named in the server's split info, or a brace pattern of shard names
    (relative to ``root``, or whole URLs / pipe: commands), optionally ``|<num_samples>``."""
    pattern, _, total_text = split.partition("|")
    if root.startswith("pipe:"):
        raise UsageError(
            f"--data-dir {root}: a pipe: command names shards, not a folder; give it as the split "
            "(--train-split / --val-split 'pipe:curl -s -L http://host/train-{000..009}.tar|<num_samples>') and "
            "--data-dir as the server's URL base (for its _info.json) or any folder"
        )
    info_base = (_url_base(pattern) or root) if is_stream(pattern) else root
    info, info_from = fetch_split_info(info_base)
    splits = info.get("splits") or {}
    lengths: dict[str, int] = {}
    if ".tar" in pattern or "{" in pattern:
        names = _expand(pattern)
        known = splits.get(_split_name_in(_shard_name(names[0]), splits), {}) if splits else {}
        lengths = dict(zip(known.get("filenames", []), known.get("shard_lengths", [])))
    elif pattern in splits:
        entry = splits[pattern]
        names = list(entry.get("filenames") or [])
        lengths = dict(zip(names, entry.get("shard_lengths") or []))
    else:
        named = f" (its split info names {', '.join(splits)})" if splits else ""
        raise UsageError(
            f"split {pattern!r}: a shard server cannot be listed{named}; name the shards with a brace pattern "
            "such as 'imagenet-train-{000000..000146}.tar|1281167', or serve the _info.json that "
            "'python -m vtools shards' writes beside them"
        )
    urls = [_join(root if is_stream(root) else "", name) for name in names]
    if not urls:
        raise UsageError(f"split {split!r}: the pattern names no shards")
    if info.get("multi_label"):
        raise UsageError(
            f"{info_from}: these shards are multi-label (each image a list of classes), and shards streamed from "
            "a server read one class per image; copy them to a local folder and read them by index there "
            "(--dataset wds/NAME --data-dir FOLDER)"
        )
    classes = info.get("classes") or None
    basenames = [_shard_name(name) for name in names]
    if all(name in lengths for name in basenames):
        counts = [int(lengths[name]) for name in basenames]
        if total_text.strip() and int(total_text) != sum(counts):
            raise UsageError(
                f"split {split!r}: |{total_text.strip()} samples, but {info_from} gives these shards {sum(counts)}"
            )
        return StreamSplit(urls, counts, True, classes, info_from)
    if not total_text.strip():
        where = f"{info_from} does not list these shards" if info_from else "the server has no _info.json"
        raise UsageError(
            f"split {pattern!r}: {where}, so the epoch's length is unknown (the learning-rate schedule needs it); "
            f"add the sample count to the pattern: '{pattern}|<num_samples>'"
        )
    try:
        total = int(total_text)
    except ValueError:
        raise UsageError(f"split {split!r}: |{total_text} is not a sample count") from None
    if total < 1:
        raise UsageError(f"split {split!r}: |{total} samples: give the split's sample count (at least 1)")
    share, extra = divmod(total, len(urls))
    return StreamSplit(urls, [share + (i < extra) for i in range(len(urls))], False, classes, info_from)


def _shard_name(name: str) -> str:
    """A shard's file name as the split info lists it: the last path part of a URL or pipe: command."""
    return re.split(r"[/\s]", name.strip())[-1]


@dataclass
class StreamedShards(SampleStore):
    """The samples of a streamed split, as a store: their count and positional names. There is no
    random access (:meth:`locate` says so); training reads them through :func:`worker_samples`."""

    urls: list[str]
    counts: list[int]
    image_keys: tuple[str, ...] = IMAGE_EXTENSIONS
    label_key: str = "cls"
    num_classes: int | None = None
    classes_from: str = ""  # where the class names come from, for messages
    exact_counts: bool = True  # counts from the split info (False: a |num_samples total shared out evenly)
    own_names = False

    def __post_init__(self) -> None:
        self.starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64).tolist()

    def __len__(self) -> int:
        return int(self.starts[-1])

    def name(self, index: int) -> str:
        shard = int(np.searchsorted(self.starts, index, side="right")) - 1
        shard = min(max(shard, 0), len(self.urls) - 1)
        return f"{self.urls[shard]} sample {index - self.starts[shard]}"

    def locate(self, index: int) -> RawSample | BadSample:
        return BadSample(self.name(index), "shards from a server are read as a stream, not by index")


@dataclass(frozen=True)
class EpochPlan:
    """One process's share of an epoch: each loader worker's shards (numbers into the split) and how many
    samples it yields (its quota)."""

    shards: list[list[int]]
    quotas: list[int]


def plan_epoch(
    counts: Sequence[int],
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    workers: int,
    total: int | None,
) -> EpochPlan:
    """Deal the epoch's shards to this rank's workers: a permutation seeded by (seed, epoch) (the split's
    own order when ``total`` is None: validation), every ``world_size``-th shard to this rank, then every
    ``workers``-th of those to each worker. With ``total`` (the samples this rank trains in the epoch),
    the workers' quotas add up to it: shortened from the last worker back when the rank's shards hold
    more, lengthened on the workers that have shards (they read their shards again) when they hold fewer.
    """
    workers = max(1, workers)
    order = list(range(len(counts)))
    if total is not None:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed & 0xFFFFFFFF, epoch, 0x5A4D])))
        order = rng.permutation(len(counts)).tolist()
    mine = order[rank::world_size]
    shards = [mine[w::workers] for w in range(workers)]
    quotas = [sum(counts[s] for s in worker) for worker in shards]
    if total is None:
        return EpochPlan(shards, quotas)
    excess = sum(quotas) - total
    for w in reversed(range(workers)):
        if excess <= 0:
            break
        cut = min(excess, quotas[w])
        quotas[w] -= cut
        excess -= cut
    holders = [w for w in range(workers) if shards[w]]
    if excess < 0 and holders:
        share, extra = divmod(-excess, len(holders))
        for position, w in enumerate(holders):
            quotas[w] += share + (position < extra)
    return EpochPlan(shards, quotas)


def canonical_batches(quotas: Sequence[int], batch_size: int) -> list[tuple[int, int]]:
    """The order a rank trains its workers' full batches in: (worker, batch number), round robin over
    the workers by batch number, as the loader delivers them. The workers' last, partial batches
    follow, joined (see ``vtools.data.stream_batches``)."""
    full = [quota // batch_size for quota in quotas]
    return [(w, j) for j in range(max(full, default=0)) for w in range(len(full)) if j < full[w]]


def worker_skips(quotas: Sequence[int], batch_size: int, trained: int) -> list[int]:
    """How many of each worker's samples a rank trained on in its first ``trained`` samples of the epoch
    (a resume's position): whole batches in :func:`canonical_batches` order, then the joined partial
    ones in worker order."""
    skips = [0] * len(quotas)
    left = trained
    for w, _ in canonical_batches(quotas, batch_size):
        if left < batch_size:
            break
        skips[w] += batch_size
        left -= batch_size
    if left:  # every whole batch was trained: the rest came from the joined partial batches
        for w, quota in enumerate(quotas):
            take = min(left, quota - skips[w])
            skips[w] += take
            left -= take
    return skips


@dataclass(frozen=True)
class StreamRecord:
    """One streamed sample before decoding: its index in the split (shard start + position; what seeds
    its augmentation), which reading of the shards it came from (a rank short of samples reads its shards
    again), and the raw sample or why it is bad."""

    index: int
    occurrence: int
    sample: RawSample | BadSample


def _cause(err: BaseException, stream: Any) -> str:
    """Why a shard stopped: curl's (or the pipe command's) exit status where it has one, else the error."""
    proc = getattr(stream, "proc", None)
    status = None
    if proc is not None:
        try:
            status = proc.wait(timeout=10)
        except Exception:
            status = None
    if status not in (None, 0, 141):
        is_curl = "curl" in str(getattr(stream, "args", ""))
        meaning = CURL_EXITS.get(status, "") if is_curl else ""
        return f"{'curl' if is_curl else 'the command'} exited with status {status}" + (
            f": {meaning}" if meaning else ""
        )
    text = str(err).split(" @ ")[0].splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def shard_samples(
    url: str,
    start: int,
    image_keys: tuple[str, ...],
    label_key: str,
    expected: int | None,
    classes: tuple[int | None, str] = (None, ""),
) -> Iterator[tuple[int, RawSample | BadSample]]:
    """(index, sample) for each sample of one shard, in tar order, read as a stream through webdataset;
    :class:`StreamLost` when the shard cannot be read to its end (with ``expected``, also when it ends
    short of the split info's count). ``classes`` (how many, and where their names come from) makes a
    label beyond them a bad sample, as in shards read by index."""
    from webdataset.gopen import gopen
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    try:
        stream = gopen(url, "rb")
    except Exception as err:
        raise StreamLost(f"shard {url}: cannot open it ({type(err).__name__}: {err})".splitlines()[0]) from None
    position = 0
    try:
        members = ({**member, "__url__": url} for member in tar_file_iterator(stream))
        for sample in group_by_keys(members):
            yield start + position, _raw(sample, url, image_keys, label_key, classes)
            position += 1
    except StreamLost:
        raise
    except GeneratorExit:
        raise
    except Exception as err:
        raise StreamLost(f"shard {url}: {_cause(err, stream)} after {position} samples") from None
    finally:
        _close(stream)
    status = getattr(stream, "status", None)
    if status not in (None, 0, 141, 23):
        raise StreamLost(f"shard {url}: {_cause(OSError('ended'), stream)} after {position} samples")
    if expected is not None and position < expected:
        raise StreamLost(
            f"shard {url}: it ended after {position} of its {expected} samples (a truncated tar, or the "
            "server closed the connection)"
        )


def _close(stream: Any) -> None:
    try:
        stream.close()
    except Exception:
        pass


def _raw(
    sample: dict[str, Any], url: str, image_keys: tuple[str, ...], label_key: str, classes: tuple[int | None, str]
) -> RawSample | BadSample:
    name = f"{url}:{sample.get('__key__', '?')}"
    members = {key.lower(): value for key, value in sample.items() if not key.startswith("__")}
    image = next((members[k] for k in image_keys if k in members), None)
    if image is None:
        return BadSample(name, f"no image ({', '.join('.' + k for k in image_keys[:4])}...) in the sample")
    label = None
    for member in (label_key, "json") if label_key == "cls" else (label_key,):
        if member in members:
            text = ""
            try:
                text = members[member].decode("utf-8")
                label = int(text.strip()) if member == "cls" else int(json.loads(text)["label"])
                break
            except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                if _lists_classes(member, text):
                    return BadSample(
                        name, f"a list of classes in .{member} (multi-label), which a stream does not read"
                    )
                continue
    if label is None:
        return BadSample(name, f"no label (.{label_key}) in the sample")
    outside = label_out_of_range(label, label_key, *classes)
    if outside:
        return BadSample(name, outside)
    return RawSample(bytes(image), label, name)


def _lists_classes(member: str, text: str) -> bool:
    """Whether a label member holds a class list (a multi-label sample) rather than no label."""
    if member == "cls":
        return text.lstrip().startswith("[") or "," in text
    try:
        meta = json.loads(text)
    except ValueError:
        return False
    return isinstance(meta, list) or (isinstance(meta, dict) and isinstance(meta.get("label"), list))


def worker_samples(
    store: StreamedShards,
    shards: Sequence[int],
    quota: int | None,
    shuffle_size: int,
    seed: Sequence[int],
) -> Iterator[StreamRecord]:
    """One worker's samples for an epoch: its shards in order through a shuffle buffer of
    ``shuffle_size`` samples seeded by ``seed`` (0: no shuffling), exactly ``quota`` of them (reading the
    shards again when they hold fewer; None: every sample once, for validation, and no more than the
    ``|num_samples`` a split without split info was given: the count the run says it evaluates)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(seed))))
    source = _passes(store, shards, quota)
    if quota is not None:
        source = _first(source, quota)
    elif not store.exact_counts:
        source = _first(source, sum(store.counts[shard] for shard in shards))
    buffer: list[StreamRecord] = []
    for record in source:
        if shuffle_size <= 1:
            yield record
            continue
        if len(buffer) < shuffle_size:
            buffer.append(record)
            continue
        slot = int(rng.integers(len(buffer)))
        buffer[slot], record = record, buffer[slot]
        yield record
    while buffer:
        slot = int(rng.integers(len(buffer)))
        buffer[slot], buffer[-1] = buffer[-1], buffer[slot]
        yield buffer.pop()


def _first(records: Iterator[StreamRecord], count: int) -> Iterator[StreamRecord]:
    for number, record in enumerate(records):
        if number >= count:
            close = getattr(records, "close", None)
            if close is not None:
                close()  # ends the shard's transfer now
            return
        yield record


def _passes(store: StreamedShards, shards: Sequence[int], quota: int | None) -> Iterator[StreamRecord]:
    """The shards' samples in order; for a quota, again (the next occurrence) until it is met."""
    occurrence, taken = 0, 0
    while True:
        for shard in shards:
            expected = store.counts[shard] if store.exact_counts else None
            for index, sample in shard_samples(
                store.urls[shard],
                store.starts[shard],
                store.image_keys,
                store.label_key,
                expected,
                (store.num_classes, store.classes_from),
            ):
                yield StreamRecord(index, occurrence, sample)
                taken += 1
        if quota is None or taken >= quota or not shards or taken == 0:
            return
        occurrence += 1
