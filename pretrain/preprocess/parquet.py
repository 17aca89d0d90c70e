"""Reading Parquet and Arrow corpora: one document per row, the text in one string column.

Public corpora ship as Parquet (FineWeb, RedPajama-v2, The Stack) and ``datasets``' ``save_to_disk``
folders hold Arrow IPC stream files (``data-00000-of-00001.arrow``). ``--json_key`` names the text
column. Files are streamed: Parquet row group by row group (``pyarrow.parquet.ParquetFile.iter_batches``,
only the text column is read), Arrow memory-mapped record batch by record batch, so the corpus is
never held in memory. The column may hold ``string``, ``large_string`` or ``string_view``, plain or
dictionary-encoded (as a ``pandas`` categorical column is written). A row is a document like a jsonl
line: a null is reported as ``missing_key`` and an empty or blank text as ``empty`` (Arrow strings
are valid UTF-8, so ``not_utf8`` and lone surrogates cannot occur); row numbers (1-based, per file)
stand where jsonl has line numbers.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.compute
import pyarrow.ipc
import pyarrow.parquet as pq

from pretrain.errors import UserError


def _unreadable(path: str, e: Exception) -> UserError:
    kind = "parquet" if path.endswith(".parquet") else "arrow"
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return UserError(
        f"{path}: cannot read {kind} data ({reason}); the file is truncated, corrupt or not {kind}: re-create it"
    )


def _is_text(kind: pa.DataType) -> bool:
    """Is ``kind`` text: ``string``, ``large_string`` or ``string_view``, or a dictionary of one of them."""
    values = kind.value_type if pa.types.is_dictionary(kind) else kind
    return pa.types.is_string(values) or pa.types.is_large_string(values) or pa.types.is_string_view(values)


def _check_column(path: str, schema: pa.Schema, column: str) -> None:
    """Raise a UserError unless ``schema`` has a text column ``column`` (``_is_text``)."""
    if column not in schema.names:
        raise UserError(
            f"{path}: no column '{column}' (columns: {', '.join(schema.names)}); pass --json_key with the "
            "column holding the text"
        )
    kind = schema.field(column).type
    if not _is_text(kind):
        raise UserError(
            f"{path}: column '{column}' holds {kind}, not text; pass --json_key with the column holding the text"
        )


@contextmanager
def _column_batches(path: str, column: str, batch_rows: int):
    """Check ``column`` and yield an iterator over its arrays, batch by batch (one row group at a time
    for Parquet, at most ``batch_rows`` rows each), each as ``large_string`` whatever text type the
    file stores (a dictionary-encoded or ``string_view`` column is decoded)."""
    try:
        if path.endswith(".parquet"):
            handle = pq.ParquetFile(path)
            _check_column(path, handle.schema_arrow, column)
            batches = handle.iter_batches(batch_size=batch_rows, columns=[column])
            yield (batch.column(0).cast(pa.large_string()) for batch in batches)
            return
        with pa.memory_map(path) as source:
            try:
                reader = pa.ipc.open_stream(source)  # what datasets' save_to_disk writes
                schema, batches = reader.schema, iter(reader)
            except pa.ArrowInvalid:
                source.seek(0)
                reader = pa.ipc.open_file(source)
                schema = reader.schema
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            _check_column(path, schema, column)
            index = schema.get_field_index(column)
            yield (
                batch.column(index).slice(start, batch_rows).cast(pa.large_string())
                for batch in batches
                for start in range(0, batch.num_rows, batch_rows)
            )
    except (pa.ArrowException, OSError) as e:
        raise _unreadable(path, e) from e


def check_file(path: str, column: str) -> int:
    """The rows of ``path`` after checking that it opens and has a string column ``column``.

    Raises:
        UserError: the file cannot be read (truncated, corrupt, not that format), lacks the column,
            or the column is not a string column.
    """
    if path.endswith(".parquet"):
        with _column_batches(path, column, 1):
            pass
        try:
            return pq.ParquetFile(path).metadata.num_rows
        except (pa.ArrowException, OSError) as e:
            raise _unreadable(path, e) from e
    with _column_batches(path, column, 1 << 30) as arrays:  # memory-mapped: counting reads no text
        return sum(len(array) for array in arrays)


def read_texts(path: str, column: str, batch_rows: int):
    """Yield ``(first_row, texts, text_bytes, disk_bytes)`` per batch of at most ``batch_rows`` rows.

    ``texts``: list of str or None (null); ``text_bytes``: UTF-8 bytes of the batch's texts;
    ``disk_bytes``: the batch's share of the file size by rows (for the progress bar; they sum to it).

    Raises:
        UserError: as ``check_file``, or the data turns out unreadable part-way.
    """
    size, rows = os.path.getsize(path), check_file(path, column)
    read_rows, shown = 0, 0
    with _column_batches(path, column, batch_rows) as arrays:  # read errors become UserErrors there
        for array in arrays:
            texts = array.to_pylist()
            text_bytes = int(pa.compute.sum(pa.compute.binary_length(array)).as_py() or 0)
            first_row, read_rows = read_rows + 1, read_rows + len(texts)
            done = size * read_rows // max(rows, 1)
            yield first_row, texts, text_bytes, done - shown
            shown = done
