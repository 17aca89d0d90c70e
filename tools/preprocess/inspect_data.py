"""Describe a tokenized corpus: counts, dtype, max token id, document lengths, the first tokens decoded.

    python tools/preprocess/inspect_data.py --prefix data/demo/demo_text_document \\
        --tokenizer_name_or_path data/demo/tokenizer --decode_tokens 64 --verify

Reads <prefix>.bin/.idx or the legacy <prefix>_ids.npy/_idx.npz. --verify checks the index
against the token file (sizes, offsets, document index, .stats.json counts) and every token id
against the .stats.json's max_token_id and vocab_size, and exits with status 2 on the first
inconsistency.
"""

import numpy as np

from pretrain.corpus import id_range, open_dataset, read_stats, token_ids, token_range_problem, verify
from pretrain.errors import UserError
from pretrain.preprocess.arguments import InspectArguments, parse
from pretrain.preprocess.interrupt import run_tool
from pretrain.tokenizers import load_tokenizer_from


def document_lengths(sizes: np.ndarray, doc_idx: np.ndarray) -> np.ndarray:
    """Tokens per document, [documents] int64, from item sizes [items] and the document index [documents + 1]."""
    ends = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    return ends[doc_idx[1:]] - ends[doc_idx[:-1]]


def length_histogram(lengths: np.ndarray) -> list:
    """(low, high, count) for power-of-two bins [low, high) of document lengths in tokens."""
    if lengths.size == 0:
        return []
    top = int(np.ceil(np.log2(max(int(lengths.max()), 1) + 1)))
    edges = 2 ** np.arange(top + 1)
    counts, _ = np.histogram(lengths, bins=edges)
    return [(int(lo), int(hi), int(n)) for lo, hi, n in zip(edges[:-1], edges[1:], counts) if n]


def main(argv=None):
    args = parse(InspectArguments, argv, __doc__)

    if args.verify:
        problems = verify(args.prefix)
        if problems:
            more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise UserError(f"{problems[0]}{more}; the files are corrupt or truncated: recreate them")
    dataset = open_dataset(args.prefix)
    ids = token_ids(dataset)
    if args.verify:
        problem = token_range_problem(args.prefix, ids)
        if problem:
            raise UserError(f"{problem}; the files are corrupt or were tokenized with another tokenizer: recreate them")
        print(f"verify: {args.prefix} is consistent")
    sizes, doc_idx = np.asarray(dataset.sizes), np.asarray(dataset.doc_idx)
    lengths = document_lengths(sizes, doc_idx)
    smallest, largest = id_range(ids)
    print(f"prefix:       {args.prefix}")
    print(f"documents:    {len(doc_idx) - 1}")
    print(f"items:        {len(sizes)}")
    print(f"tokens:       {int(sizes.sum())}")
    print(f"dtype:        {np.dtype(ids.dtype).name}")
    print(f"token ids:    {smallest} .. {largest}")
    stats = read_stats(args.prefix)
    if stats is not None:
        print(
            f"stats.json:   vocab_size {stats.get('vocab_size')}, tokenizer {stats.get('tokenizer')}, "
            f"skipped {stats.get('skipped')}"
        )
    if lengths.size:
        print(f"document length (tokens): min {lengths.min()}, median {int(np.median(lengths))}, max {lengths.max()}")
        histogram = length_histogram(lengths)
        widest = max(n for _, _, n in histogram)
        for low, high, n in histogram:
            print(f"  [{low:>8}, {high:>8})  {n:>9}  {'#' * max(1, round(40 * n / widest))}")
    head = np.asarray(ids[: args.decode_tokens], dtype=np.int64)
    print(f"first {head.size} ids: {head.tolist()}")
    if args.tokenizer_name_or_path:
        tokenizer = load_tokenizer_from(args.tokenizer_name_or_path)
        print(f"decoded: {tokenizer.decode(head.tolist())!r}")


if __name__ == "__main__":
    run_tool(main)
