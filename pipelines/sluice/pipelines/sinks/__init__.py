"""Sinks: one module per sink behind one interface (base.Sink); dead letters use the same sinks."""

from __future__ import annotations

from typing import Any

from .base import Sink, SinkContext
from .console import ConsoleSink
from .files import FilesSink
from .kafka import KafkaSink, dead_letter_record, kafka_record
from .kafka_eos import ExactlyOnceKafkaSink, release_kept_clients
from .memory import MemorySink, MemoryTables


def create_sink(operation: str, config: Any, context: SinkContext) -> Sink:
    """The sink of a toKafka/toFiles/toConsole/toMemory body (a sink node's or deadLetter's)."""
    if operation == "toKafka":
        return (ExactlyOnceKafkaSink if config.delivery == "exactlyOnce" else KafkaSink)(config, context)
    kinds: dict[str, type[Sink]] = {"toFiles": FilesSink, "toConsole": ConsoleSink, "toMemory": MemorySink}
    return kinds[operation](config, context)


__all__ = [
    "ExactlyOnceKafkaSink",
    "KafkaSink",
    "MemoryTables",
    "Sink",
    "SinkContext",
    "create_sink",
    "dead_letter_record",
    "kafka_record",
    "release_kept_clients",
]
