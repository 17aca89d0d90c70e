"""Supervised fine-tuning of a saved causal LM with a LoRA adapter (paddlenlp.peft), on PaddleNLP's Trainer.

    python run_finetune.py config/llama/lora_demo_cpu.json [--key value ...]
    python run_finetune.py config/llama/lora_argument.json --model_name_or_path MODEL_DIR

The same machinery as run_pretrain.py: parse (``pretrain.arguments``, with the fine-tuning
dataclasses of ``pretrain.finetune.lora_arguments``) -> lock output_dir (``pretrain.run_lock``) ->
resolve -> check (pretraining's preflight plus the LoRA and data checks of ``pretrain.finetune.run``)
-> build (src/tgt pairs tokenized with the prompt masked out of the loss, ``pretrain.finetune.pairs``;
the saved model wrapped in ``LoRAModel``, ``pretrain.finetune.lora``) -> train (``PretrainingTrainer``:
atomic checkpoints of the adapter and its optimizer, auto-resume from the latest complete one, NaN
policy, tokens/s, MFU with the frozen-weight FLOPs 4N, memory) -> evaluate (the fine-tuned model,
then the base model with the adapter switched off) -> outputs: the adapter
(``lora_model_state.pdparams`` + ``lora_config.json``) in output_dir, with ``merge_lora`` the
merged model in ``<output_dir>/merged``, and ``run_summary.json``. ``--dry_run true`` stops after
the check. Bad input ends the run with ``error: ...`` and exit status 2.

Environment: ``main`` sets ``USE_CASUAL_MASK=False`` before the model is built, so paddlenlp's
LLaMA honours the collator's attention masks (padding, and the block-diagonal masks of packed
sequences) instead of assuming one causal sequence; importing this file changes nothing.
"""

import os
import sys

import paddle
from paddlenlp.trainer import set_seed

from pretrain.arguments import parse_arguments
from pretrain.cluster.agreement import agree_on
from pretrain.cluster.launched import run_launched
from pretrain.cluster.watchdog import start_watchdog
from pretrain.finetune.lora import build_lora_model, parameter_counts, save_merged
from pretrain.finetune.lora_arguments import FINETUNE_ARGUMENT_CLASSES
from pretrain.finetune.pairs import check_split, padding_collator, tokenize_split
from pretrain.finetune.run import (
    check_finetune_run,
    evaluate_base_model,
    finetune_summary,
    format_finetune_dry_run,
    resolve_finetune_run,
)
from pretrain.finished import finished_summary
from pretrain.log import logger, quiet_paddlenlp
from pretrain.metrics.step_timer import step_work
from pretrain.metrics.summary import build_summary, write_summary
from pretrain.preemption import install_stop_handlers
from pretrain.preflight import raise_problems, warn_run
from pretrain.run_lock import guarded_run
from pretrain.trainer import PretrainingTrainer

MERGED_DIR = "merged"


def main(argv: list) -> dict:
    """Run one LoRA fine-tuning job from ``CONFIG.json [--key value ...]``; return its summary (None on a dry run).

    Raises:
        UserError: bad input (preflight), another run holds output_dir, or a disk filled up (the same
            command resumes once there is room), as in run_pretrain.py.
    """
    install_stop_handlers()  # SIGTERM/SIGUSR1: checkpoint at the next step, exit 75; SIGINT: one line
    quiet_paddlenlp()
    arguments = parse_arguments(argv, FINETUNE_ARGUMENT_CLASSES, "run_finetune.py", "config/llama/lora_demo_cpu.json")
    with guarded_run(arguments[2]):
        return run(resolve_finetune_run(*arguments))


def run(plan) -> dict:
    """Check, build, train, evaluate and report a resolved fine-tuning run (holding its output_dir)."""
    agree_on("preflight", lambda: raise_problems(check_finetune_run(plan)), plan.training_args.hang_timeout)
    for warning in warn_run(plan):  # pretraining's (the planner's estimate is for full training: not used here)
        logger.warning(warning)
    if plan.training_args.dry_run:
        print(format_finetune_dry_run(plan))
        return None
    finished = finished_summary(plan)
    if finished is not None:
        return finished
    args, data_args, lora_args = plan.training_args, plan.data_args, plan.lora_args
    set_seed(args.seed)
    train = tokenize_split(plan.tokenizer, plan.train_examples, plan.seq_length, data_args.zero_padding, args.seed)
    valid = tokenize_split(plan.tokenizer, plan.eval_examples, plan.seq_length, data_args.zero_padding)
    for name, split, path in (("train", train, plan.train_file), ("eval", valid, plan.eval_file)):
        check_split(split, path, plan.seq_length)
        logger.info("%s data: %s", name, split.describe(plan.seq_length))
    os.environ["USE_CASUAL_MASK"] = "False"  # read by paddlenlp's LLaMA at each forward: honour the masks
    model = build_lora_model(plan)
    trainable, total = parameter_counts(model)
    logger.info(
        "LoRA r=%d alpha=%d on %s: %s trainable of %s parameters (%.4f%%)",
        *(lora_args.lora_rank, lora_args.lora_alpha, lora_args.lora_target_modules),
        *(f"{trainable:,}", f"{total:,}", 100 * trainable / total),
    )

    watchdog = start_watchdog(args.hang_timeout)  # under a launcher: a stuck rank ends the job, with a report
    trainer = PretrainingTrainer(
        model=model,
        args=args,
        data_collator=padding_collator(plan.tokenizer, plan.seq_length),
        train_dataset=train.dataset if args.do_train else None,
        eval_dataset=valid.dataset if args.do_eval else None,
        tokenizer=plan.tokenizer,
        step_work=step_work(plan, adapter_params=trainable),
        watchdog=watchdog,
    )
    if args.do_train:
        trainer.train(resume_from_checkpoint=plan.resume_checkpoint)
        trainer.preemption.raise_if_stopped(args.output_dir)  # SIGTERM, SIGUSR1, max_wall_time: checkpoint saved
        trainer.save_model()  # the adapter: lora_model_state.pdparams + lora_config.json (+ config, tokenizer)
    eval_loss = trainer.evaluate()["eval_loss"] if trainer.eval_dataset is not None else None
    extra = (
        evaluate_base_model(trainer, model, eval_loss) if eval_loss is not None and lora_args.eval_base_model else {}
    )
    if lora_args.merge_lora and args.should_save:
        extra["merged_model_dir"] = save_merged(model, plan.tokenizer, os.path.join(args.output_dir, MERGED_DIR))
    summary = build_summary(trainer, plan, eval_loss)
    summary.update(finetune_summary(plan, trainable, total, {"train": train, "eval": valid}, extra))
    if args.should_save:
        write_summary(summary, args.output_dir)
    if watchdog is not None:
        watchdog.enter("collective")
        paddle.distributed.barrier()  # leave together, as run_pretrain.py does
        watchdog.stop()
    return summary


if __name__ == "__main__":
    run_launched(main, sys.argv[1:])
