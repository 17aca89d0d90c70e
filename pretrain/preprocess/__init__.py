"""Corpus preparation: raw text -> jsonl -> tokenizer -> tokenized mmap ``.bin/.idx``."""
