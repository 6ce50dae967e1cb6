"""The connections the JVM opens to call this process's Python: a query's foreachBatch runs on the one its stream
thread opened.

py4j (0.10.9.9, in the pinned-thread mode PySpark uses) keeps such a connection, a thread and a socket on either
side, as long as the process lives, even after the JVM thread that opened it has ended: its PythonClient puts each
connection back in a pool it never cleans nor takes from. So every query a hot swap or a migration restarted left
one behind (the soak's runner gained about 2 threads and 2-3 open files at each rollout). Each batch notes the
connection it runs on under its query's id, and a query's connections are closed once it has stopped: its stream
thread has ended, nothing calls on them again. Shutting the socket down ends the thread waiting on it, which then
closes it, and the JVM's end.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame

BatchHandler = Callable[[DataFrame, int], None]

# What Spark sets on a query's stream thread (StreamExecution.QUERY_ID_KEY): the id its checkpoint keeps.
QUERY_ID_PROPERTY = "sql.streaming.queryId"


class _Noted:
    queries: dict[Any, str] = {}  # py4j ClientServerConnection -> the id of the query whose batches ran on it
    lock = threading.Lock()


def noting_connection(handle: BatchHandler) -> BatchHandler:
    """`handle` as a foreachBatch function that first notes the connection its batch runs on."""

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        _note(batch)
        handle(batch, batch_id)

    return each_batch


def _note(batch: DataFrame) -> None:
    context = batch.sparkSession.sparkContext
    # Only a ClientServer's client pins connections to threads (PYSPARK_PIN_THREAD=false: a pool py4j cleans).
    thread_connection = getattr(context._gateway._gateway_client, "get_thread_connection", None)  # type: ignore[union-attr]
    connection = thread_connection() if thread_connection is not None else None
    if connection is None or connection in _Noted.queries:  # noted before: no JVM call
        return
    # Asked on this connection, so answered by the query's stream thread (the one waiting for this batch).
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
    if query_id is None:
        return
    with _Noted.lock:
        _Noted.queries[connection] = query_id


def close_connections(query_id: str) -> int:
    """Close the connections the batches of a query that has stopped ran on; how many."""
    with _Noted.lock:
        connections = [connection for connection, query in _Noted.queries.items() if query == query_id]
        for connection in connections:
            del _Noted.queries[connection]
    for connection in connections:
        # Not connection.close(): closing its stream waits for the lock the thread reading from it holds.
        if connection.socket is not None:
            with contextlib.suppress(OSError):
                connection.socket.shutdown(socket.SHUT_RDWR)
    return len(connections)
