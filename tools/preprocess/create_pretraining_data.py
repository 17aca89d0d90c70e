"""Tokenize a jsonl, Parquet or Arrow corpus into <output_prefix>.bin/.idx (+ .stats.json) for run_pretrain.py.

    python tools/preprocess/create_pretraining_data.py --input_path data/demo/corpus.jsonl \\
        --tokenizer_name_or_path data/demo/tokenizer --output_prefix data/demo/demo_text_document --workers 2

Input: a .jsonl, .jsonl.gz or .jsonl.zst file, or a folder of them (read in sorted order), one
JSON object per line with the text under --json_key; or .parquet / .arrow (datasets' save_to_disk)
files, one document per row, --json_key naming the text column. Output: paddlenlp's mmap indexed dataset
(uint16 tokens when the vocabulary fits, else int32) and a stats sidecar; see docs/dataset.md.
Documents are text: special-token strings inside them are not parsed; EOS is appended by id.

PaddleNLP's command lines run as they are (llm/tools/preprocess), with a local tokenizer folder for
--model_name: --tokenizer_name, --data_format JSON, --data_impl mmap, --append_eos, --log_interval,
--workers, --max_doc_num and --max_repeated_len are honoured; the Chinese whole-word-segmentation
flags are refused with the reason. Unlike PaddleNLP, EOS is appended unless --append_eos false.
SIGTERM or Ctrl-C removes the partial outputs and exits with status 128 + the signal number.
"""

from pretrain.preprocess.arguments import PretrainingDataArguments, parse
from pretrain.preprocess.interrupt import run_tool
from pretrain.preprocess.pipeline import create_pretraining_data


def main(argv=None):
    create_pretraining_data(parse(PretrainingDataArguments, argv, __doc__))


if __name__ == "__main__":
    run_tool(main)
