"""Greedy answers of a saved causal LM to the prompts of a src/tgt file, with the exact-match rate.

    python tools/generate.py MODEL --data data/finetune_demo/dev.json [--num N] [--show 12] [--max_new_tokens 16]

MODEL is a folder ``AutoModelForCausalLM.from_pretrained`` loads, with its tokenizer (e.g. the
``merged/`` folder of run_finetune.py), loaded computing what its training computed (``pretrain.use``).
For each of the first ``--num`` pairs of the jsonl file (single-turn ``src``/``tgt``; default all),
answers greedily; prints the expected and the generated
answer of the first ``--show``, then how many of all match exactly (whitespace stripped).
Generation goes through ``pretrain.finetune.generate``, which works around paddlenlp 3.0.0b4's
``generate(input_ids=...)`` pitfall (docs/finetune.md).
"""

# ruff: noqa: E402 -- the filters must be in place before paddle is imported: it warns at import
import argparse

from pretrain.log import quiet_paddlenlp, silence_known_warnings

silence_known_warnings()

import paddle

from pretrain.errors import ArgumentParser, UserError, run_cli
from pretrain.finetune.generate import generate_text
from pretrain.finetune.pairs import read_examples
from pretrain.tokenizers import load_tokenizer_from
from pretrain.use import load_model


def check_lengths(tokenizer, prompts: list, max_new_tokens: int, max_positions: int) -> None:
    """Refuse a ``--max_new_tokens`` that would take a prompt past the model's positions.

    Raises:
        UserError: the longest prompt (in tokens, as generation encodes it) plus ``max_new_tokens``
            exceeds ``max_positions`` (``max_position_embeddings``), naming the largest value that fits.
    """
    lengths = [len(tokenizer(prompt)["input_ids"]) for prompt in prompts]
    longest = max(range(len(prompts)), key=lengths.__getitem__)
    if lengths[longest] + max_new_tokens > max_positions:
        fix = (
            f"give --max_new_tokens <= {max_positions - lengths[longest]}"
            if lengths[longest] < max_positions
            else "shorten the prompt"
        )
        raise UserError(
            f"--max_new_tokens {max_new_tokens}: prompt {longest + 1} is {lengths[longest]} tokens, and with "
            f"{max_new_tokens} new ones it exceeds the model's max_position_embeddings {max_positions}; {fix}"
        )


def main(argv=None) -> dict:
    """Answer ``--data``'s prompts with MODEL (see the module docstring); returns the exact-match counts.

    Raises:
        UserError: ``--num`` or ``--max_new_tokens`` < 1, ``--show`` < 0; ``--data`` unreadable (see
            ``read_examples``) or without a single-turn pair; see ``load_tokenizer_from`` and ``check_lengths``.
            Nothing is generated then.
    """
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", metavar="MODEL", help="Model folder (config.json, weights, tokenizer).")
    parser.add_argument("--data", required=True, help="jsonl of {src, tgt} pairs (run_finetune.py's format).")
    parser.add_argument("--num", type=int, default=None, help="Pairs to answer, from the top (default: all).")
    parser.add_argument("--show", type=int, default=12, help="Answers to print, from the top.")
    parser.add_argument("--max_new_tokens", type=int, default=16, help="Longest answer (tokens).")
    args = parser.parse_args(argv)
    quiet_paddlenlp()  # paddlenlp's loading chatter ("Loading configuration file ...")
    for flag, value, least in (
        ("--num", args.num, 1),
        ("--show", args.show, 0),
        ("--max_new_tokens", args.max_new_tokens, 1),
    ):
        if value is not None and value < least:
            raise UserError(f"{flag} {value} must be >= {least}")

    examples = [e for e in read_examples(args.data) if len(e.sources) == 1][: args.num]
    if not examples:
        raise UserError(f"{args.data} holds no single-turn pair to answer")
    tokenizer = load_tokenizer_from(args.model)
    model = load_model(args.model, paddle.get_default_dtype())
    prompts = [example.sources[0] for example in examples]
    check_lengths(tokenizer, prompts, args.max_new_tokens, model.config.max_position_embeddings)
    matches = 0
    for index, example in enumerate(examples):
        answer = generate_text(model, tokenizer, example.sources[0], args.max_new_tokens).strip()
        matches += answer == example.targets[0].strip()
        if index < args.show:
            prompt = example.sources[0].replace("\n", " | ")
            print(f"{prompt[:70]!r:74s} expected {example.targets[0]!r:14s} generated {answer!r}")
    print(f"exact match: {matches} / {len(examples)}")
    return {"exact_match": matches, "answered": len(examples)}


if __name__ == "__main__":
    run_cli(main)
