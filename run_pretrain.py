"""Pretrain a causal LM with PaddleNLP's Trainer.

    python run_pretrain.py config/llama/pretrain_demo_cpu.json [--key value ...]
    python -m paddle.distributed.launch --devices 0,1,2,3,4,5,6,7 run_pretrain.py config/llama/pretrain_argument.json

Parse -> preflight -> build data and model -> train (resuming from the latest complete checkpoint
in output_dir unless overwrite_output_dir) -> evaluate -> report (run_summary.json).
``--dry_run true`` stops after preflight and prints the resolved config, model size and data.
Bad input ends the run with ``error: ...`` (preflight: one line per problem) and exit status 2.
"""

import sys

import paddle
from paddlenlp.trainer import set_seed

from pretrain.arguments import parse_arguments
from pretrain.data import build_datasets, collate_causal_lm
from pretrain.errors import run_cli
from pretrain.modeling import build_model
from pretrain.preflight import format_report, run_preflight
from pretrain.summary import build_summary, write_summary
from pretrain.trainer import PretrainingTrainer


def main(argv: list) -> dict:
    """Run one pretraining job from ``CONFIG.json [--key value ...]``; return the run summary (None on a dry run)."""
    model_args, data_args, training_args = parse_arguments(argv)
    report = run_preflight(model_args, data_args, training_args)
    if training_args.dry_run:
        print(format_report(report, model_args, data_args, training_args))
        return None
    set_seed(training_args.seed)
    tokenizer, config = report.tokenizer, report.model_config
    train_dataset, valid_dataset, _ = build_datasets(data_args, training_args)
    model = build_model(model_args, training_args, config)

    trainer = PretrainingTrainer(
        model=model,
        args=training_args,
        data_collator=collate_causal_lm,
        train_dataset=train_dataset if training_args.do_train else None,
        eval_dataset=valid_dataset if training_args.do_eval else None,
        tokenizer=tokenizer,
    )
    if training_args.do_train:
        trainer.train(resume_from_checkpoint=report.resume_checkpoint)
        trainer.save_model()
    eval_loss = trainer.evaluate()["eval_loss"] if training_args.do_eval else None
    summary = build_summary(trainer, config, data_args, eval_loss)
    if training_args.should_save:
        write_summary(summary, training_args.output_dir)
    if training_args.world_size > 1:
        paddle.distributed.barrier()  # leave together: a rank gone early can abort the others' gloo/NCCL teardown
    return summary


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
