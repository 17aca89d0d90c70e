"""Reading jsonl corpora: one JSON object per line, the document text under a key (default ``text``)."""

from __future__ import annotations

import json

from pretrain.errors import UserError


def iter_texts(path: str, json_key: str = "text"):
    """Yield the ``json_key`` string of every line of a jsonl file.

    Raises:
        UserError: a line is not valid JSON or lacks ``json_key`` (message names file and line).
    """
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{line_number}: not valid JSON ({e.msg})")
            if not isinstance(record, dict) or json_key not in record:
                raise UserError(f"{path}:{line_number}: no '{json_key}' field; pass --json_key with the field holding the text")
            yield record[json_key]
