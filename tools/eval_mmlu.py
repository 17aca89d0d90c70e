"""Few-shot MMLU accuracy of a saved causal LM (Hendrycks et al.'s prompt and next-token scoring).

    python tools/eval_mmlu.py MODEL --data_dir DIR [--shots 5] [--lora_path ADAPTER] [--output result.json]

MODEL is a folder ``AutoModelForCausalLM.from_pretrained`` loads (a run_pretrain.py output_dir, or the
``merged/`` folder run_finetune.py writes with ``merge_lora``), holding its tokenizer too.
``--lora_path`` puts a saved adapter (run_finetune.py's output_dir or a checkpoint) on MODEL first.
DIR holds the MMLU CSVs: ``dev/<subject>_dev.csv`` (few-shot examples) and ``test/<subject>_test.csv``
(scored); rows ``question, A, B, C, D, answer``, no header. Prints each subject's accuracy and the
overall (micro) and macro averages; ``--output`` writes them with every prediction as JSON.
The prompt and the scoring are described in ``pretrain/finetune/mmlu.py``.
"""

# ruff: noqa: E402 -- the filters must be in place before paddle is imported: it warns at import
import argparse
import os

from pretrain.log import quiet_paddlenlp, silence_known_warnings

silence_known_warnings()

import paddle

from pretrain.atomic import write_json
from pretrain.errors import ArgumentParser, UserError, run_cli
from pretrain.finetune.mmlu import evaluate_mmlu
from pretrain.preflight import writable_folder_problem
from pretrain.tokenizers import load_tokenizer_from


def load_model(path: str, lora_path):
    """The causal LM in ``path`` (with the adapter in ``lora_path`` when given), computing what its training
    computed (``pretrain.use.load_model``)."""
    from pretrain.finetune.lora import load_lora_model
    from pretrain.use import load_model

    if not os.path.isfile(os.path.join(path, "config.json")):
        raise UserError(f"MODEL {path} has no config.json; give a folder written by save_pretrained")
    if lora_path:
        return load_lora_model(path, lora_path)
    return load_model(path, paddle.get_default_dtype())


def check_output(path: str) -> None:
    """Refuse an ``--output`` file that cannot be written, before the model is loaded and scored.

    Raises:
        UserError: ``path`` is a folder, its folder does not exist (or is a file), or cannot be written.
    """
    if os.path.isdir(path):
        raise UserError(f"--output {path} is a folder; give a file name for the JSON, e.g. {path}/mmlu.json")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"--output {path}: {folder} is not an existing folder; create it or give another --output")
    problem = writable_folder_problem("--output", folder)[1]
    if problem:
        raise UserError(problem)


def main(argv=None) -> dict:
    """Score MODEL on ``--data_dir`` (see the module docstring); returns ``evaluate_mmlu``'s result.

    Raises:
        UserError: a bad ``--shots`` or ``--output`` (see ``check_output``), before anything is loaded;
            see ``load_tokenizer_from``, ``load_model`` and ``evaluate_mmlu``. ``--output`` is written
            (atomically) only after every question is scored.
    """
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", metavar="MODEL", help="Model folder (config.json, weights, tokenizer).")
    parser.add_argument("--data_dir", required=True, help="MMLU folder with dev/ and test/ CSVs.")
    parser.add_argument("--shots", type=int, default=5, help="Worked dev examples in each prompt (0 to 5).")
    parser.add_argument("--lora_path", default=None, help="Adapter folder to load onto MODEL (optional).")
    parser.add_argument("--subjects", nargs="+", default=None, help="Subjects to score (default: all in test/).")
    parser.add_argument(
        "--max_length",
        type=int,
        default=None,
        help="Longest prompt in tokens; shots are dropped to fit (default: the model's max_position_embeddings).",
    )
    parser.add_argument("--output", default=None, help="JSON file for the accuracies and every prediction.")
    args = parser.parse_args(argv)
    quiet_paddlenlp()  # paddlenlp's loading chatter ("Loading configuration file ...")
    if args.shots < 0:
        raise UserError(f"--shots {args.shots} must be >= 0")
    if args.output:
        check_output(args.output)

    tokenizer = load_tokenizer_from(args.model)
    model = load_model(args.model, args.lora_path)
    max_length = args.max_length or model.config.max_position_embeddings
    result = evaluate_mmlu(model, tokenizer, args.data_dir, args.shots, max_length, args.subjects)
    for subject, scores in result["subjects"].items():
        print(f"{subject:40s} {scores['correct']:5d} / {scores['questions']:5d} = {scores['accuracy']:.4f}")
    print(
        f"{'overall (all questions)':40s} {result['correct']:5d} / {result['questions']:5d} = {result['accuracy']:.4f}"
        f"; macro average over {len(result['subjects'])} subjects {result['macro_accuracy']:.4f} ({args.shots}-shot)"
    )
    if args.output:
        write_json(args.output, result, indent=2)
    return result


if __name__ == "__main__":
    run_cli(main)
