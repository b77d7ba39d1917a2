"""Triton's `config.pbtxt`, read with protobuf's text format against the project's `model_config.proto`.

The fields this daemon acts on are declared in that proto and parsed strictly: a misspelt field or a
wrong value is an error with its line, as Triton gives. Triton's other top-level fields (instance
groups, optimization, warm-up, ...) configure Triton's own machinery; a repository written for Triton
carries them, so they are passed over by name, and reported, rather than refused. Sequence and
ensemble models are refused: this daemon has no scheduler for them. The result is a plain dataclass,
so the repository and the v2 models know nothing of protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import text_format

from rknn_proto.kserve import model_config_pb2 as config_pb

CONFIG_PBTXT = "config.pbtxt"
# Triton's ModelConfig fields that tune Triton itself; read past, and named in the load's log line.
PASSED_OVER = frozenset(
    {
        "runtime",
        "instance_group",
        "optimization",
        "model_warmup",
        "cc_model_filenames",
        "metric_tags",
        "model_operations",
        "model_transaction_policy",
        "model_repository_agents",
        "response_cache",
        "model_metrics",
        "batch_input",
        "batch_output",
    }
)
UNSERVED = {
    "sequence_batching": "sequence batching (stateful models)",
    "ensemble_scheduling": "ensembles",
}
_OPEN, _CLOSE = "{[<", "}]>"
_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+-")


class ConfigError(ValueError):
    """A config.pbtxt this daemon cannot serve; the message says where and what is expected."""


@dataclass(frozen=True)
class DeclaredTensor:
    """An input or output as config.pbtxt declares it: the model's own name, a v2 datatype ("" when
    not given), the dims without the batch dimension when the model batches (-1: any size)."""

    name: str
    datatype: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class VersionPolicy:
    """Which version folders are served: the `latest` N (Triton's default, N=1), `all`, or `specific`."""

    kind: str = "latest"
    count: int = 1
    versions: tuple[int, ...] = ()

    def served(self, found: list[int]) -> list[int]:
        """The versions served of those `found` (sorted, ascending)."""
        ordered = sorted(found)
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[-self.count :]


@dataclass(frozen=True)
class Batching:
    """Triton's dynamic_batching: how long a request may wait for others to join its batch, and the
    batch sizes worth running at once without waiting longer."""

    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class TritonConfig:
    name: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: tuple[DeclaredTensor, ...]
    outputs: tuple[DeclaredTensor, ...]
    default_model_filename: str
    policy: VersionPolicy
    batching: Batching | None  # dynamic_batching, when the config asks for it
    passed_over: tuple[str, ...]  # the Triton-only fields found, by name


def top_level_fields(text: str) -> list[tuple[str, int, int]]:
    """(name, start, end) of each top-level field of a text-format message: a name begins where a field
    may begin (not after `:`) outside strings, comments and brackets; it ends where the next begins."""
    found: list[tuple[str, int]] = []
    depth, index, after_colon = 0, 0, False
    while index < len(text):
        char = text[index]
        if char == "#":
            end = text.find("\n", index)
            index = len(text) if end < 0 else end
            continue
        if char in "\"'":
            index = _string_end(text, index)
            after_colon = False
            continue
        if char in _OPEN:
            depth, after_colon = depth + 1, False
        elif char in _CLOSE:
            depth = max(depth - 1, 0)
        elif char == ":":
            after_colon = True
        elif char in _WORD:
            end = index
            while end < len(text) and text[end] in _WORD:
                end += 1
            if depth == 0 and not after_colon and (char.isalpha() or char == "_"):
                found.append((text[index:end], index))
            after_colon = False
            index = end
            continue
        index += 1
    return [
        (name, start, found[i + 1][1] if i + 1 < len(found) else len(text))
        for i, (name, start) in enumerate(found)
    ]


def _string_end(text: str, start: int) -> int:
    quote, index = text[start], start + 1
    while index < len(text) and text[index] != quote and text[index] != "\n":
        index += 2 if text[index] == "\\" else 1
    return index + 1


def _datatype(value: int) -> str:
    name = config_pb.DataType.Name(value)  # type: ignore[arg-type]
    return "" if value == config_pb.TYPE_INVALID else ("BYTES" if name == "TYPE_STRING" else name[5:])


def _tensors(
    where: str, entries: list[config_pb.ModelInput] | list[config_pb.ModelOutput]
) -> tuple[DeclaredTensor, ...]:
    names = [e.name for e in entries]
    if "" in names:
        raise ConfigError(f"{where}: every input and output needs a name")
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: a tensor name is declared twice ({', '.join(names)})")
    for entry in entries:
        if entry.HasField("reshape"):
            raise ConfigError(
                f"{where}: {entry.name!r} has a reshape, which this daemon does not apply; remove it"
            )
        if entry.is_shape_tensor:
            raise ConfigError(f"{where}: {entry.name!r} is a shape tensor (TensorRT only)")
    return tuple(DeclaredTensor(e.name, _datatype(e.data_type), tuple(e.dims)) for e in entries)


def _policy(where: str, message: config_pb.ModelVersionPolicy) -> VersionPolicy:
    choice = message.WhichOneof("policy_choice")
    if choice == "all":
        return VersionPolicy("all")
    if choice == "specific":
        versions = tuple(message.specific.versions)
        if not versions or min(versions) < 1:
            raise ConfigError(f"{where}: version_policy specific needs versions of 1 or more")
        return VersionPolicy("specific", versions=versions)
    return VersionPolicy("latest", max(message.latest.num_versions, 1) if choice else 1)


def _batching(where: str, message: config_pb.ModelConfig) -> Batching | None:
    if not message.HasField("dynamic_batching"):
        return None
    if message.max_batch_size < 1:
        raise ConfigError(
            f"{where}: dynamic_batching needs max_batch_size of 1 or more (the batch dimension)"
        )
    config = message.dynamic_batching
    preferred = tuple(config.preferred_batch_size)
    if any(not 0 < size <= message.max_batch_size for size in preferred):
        raise ConfigError(
            f"{where}: preferred_batch_size {list(preferred)} must lie in 1..max_batch_size {message.max_batch_size}"
        )
    return Batching(config.max_queue_delay_microseconds, preferred)


def parse_pbtxt(model: str, text: str) -> TritonConfig:
    """A model's config.pbtxt, validated: what it declares for this daemon, and what it passed over."""
    where = f"model {model!r}: {CONFIG_PBTXT}"
    fields = top_level_fields(text)
    for name, _, _ in fields:
        if name in UNSERVED:
            raise ConfigError(f"{where}: {name}: this daemon does not serve {UNSERVED[name]}")
    passed = [(name, start, end) for name, start, end in fields if name in PASSED_OVER]
    kept = text
    for _, start, end in reversed(passed):  # blanked, keeping the newlines: errors keep their line numbers
        kept = kept[:start] + "".join(c if c == "\n" else " " for c in kept[start:end]) + kept[end:]
    message = config_pb.ModelConfig()
    try:
        text_format.Parse(kept, message)
    except text_format.ParseError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if message.name and message.name != model:
        raise ConfigError(f"{where}: name {message.name[:80]!r} is not the folder's name {model!r}")
    if message.max_batch_size < 0:
        raise ConfigError(f"{where}: max_batch_size {message.max_batch_size} must be 0 (no batching) or more")
    return TritonConfig(
        name=model,
        platform=message.platform,
        backend=message.backend,
        max_batch_size=message.max_batch_size,
        inputs=_tensors(where, list(message.input)),
        outputs=_tensors(where, list(message.output)),
        default_model_filename=message.default_model_filename,
        policy=_policy(where, message.version_policy),
        batching=_batching(where, message),
        passed_over=tuple(sorted({name for name, _, _ in passed})),
    )


__all__ = [
    "CONFIG_PBTXT",
    "Batching",
    "ConfigError",
    "DeclaredTensor",
    "TritonConfig",
    "VersionPolicy",
    "parse_pbtxt",
]
