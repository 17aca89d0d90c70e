"""Pretrain a causal LM with PaddleNLP's Trainer.

    python run_pretrain.py config/llama/pretrain_demo_cpu.json [--key value ...]
    python -m paddle.distributed.launch --devices 0,1,2,3,4,5,6,7 run_pretrain.py config/llama/pretrain_argument.json
    python run_pretrain.py config/llama/pretrain_argument.json --rehearse true   # on CPU first: pretrain.rehearsal

parse -> lock output_dir (one run at a time) -> resolve (tokenizer, model config, data, layout,
resume point) -> check (preflight) -> build (data, model) -> train (resuming from the latest
complete checkpoint in output_dir unless overwrite_output_dir) -> evaluate -> report
(run_summary.json). ``--dry_run true`` stops after the check and prints the resolved run (it takes
no lock). Bad input ends the run with ``error: ...`` (preflight: one line per problem) and exit
status 2.

Output: a short header (model, layout, batch, data, schedule, output), one line per log record with
the ETA under a progress bar, a few summary lines; every setting goes to ``<output_dir>/run_config.json``.

Environment: ``main`` sets ``USE_CASUAL_MASK=True`` (paddlenlp's causal-mask fast path, as upstream
PaddleNLP's run_pretrain.py does; ``False`` with ``reset_attention_mask``, whose mask it would drop)
before the model is built. Importing this file only adds warning
filters for known harmless third-party warnings (``pretrain.log.KNOWN_HARMLESS_WARNINGS``).
"""

# ruff: noqa: E402 -- the filters must be in place before paddle is imported: it warns at import
import os
import sys

from pretrain.log import captured_stdout, logger, quiet_paddlenlp, silence_known_warnings

silence_known_warnings()

import paddle
from paddlenlp.trainer import set_seed

from pretrain.arguments import parse_arguments
from pretrain.cluster.agreement import agree_on
from pretrain.cluster.launched import run_launched
from pretrain.cluster.watchdog import start_watchdog
from pretrain.data import build_datasets, data_mix
from pretrain.document_mask import collator
from pretrain.errors import RunDiverged, UserError, run_cli
from pretrain.finished import finished_summary
from pretrain.forecast import estimate_on_this_gpu
from pretrain.layout import install_cpu_communication, install_cpu_group_stores
from pretrain.metrics.comm_volume import install_counter
from pretrain.metrics.step_timer import step_work
from pretrain.metrics.summary import build_summary, write_summary
from pretrain.model import build_model
from pretrain.preemption import install_stop_handlers
from pretrain.preflight import check_run, raise_problems, warn_run
from pretrain.recovery import DIVERGED_EXIT_STATUS
from pretrain.rehearsal import rehearse, requested
from pretrain.report import board_content, format_data_mix, format_dry_run, format_header, write_run_config
from pretrain.resolve import resolve_run
from pretrain.run_lock import guarded_run
from pretrain.sample_log import SAMPLE_IDS_FILE
from pretrain.trainer import PretrainingTrainer


def main(argv: list) -> dict:
    """Run one pretraining job from ``CONFIG.json [--key value ...]``; return the run summary (None on a dry run).

    Raises:
        UserError: bad input (preflight), another run holds output_dir, or a disk filled up (every
            file is written atomically and checkpoints are marked complete last: the same command
            resumes once there is room).
    """
    install_stop_handlers()  # SIGTERM/SIGUSR1: checkpoint at the next step, exit 75; SIGINT: one line
    quiet_paddlenlp()
    install_cpu_group_stores()  # CPU launches: before fleet.init creates the process groups
    model_args, data_args, args = parse_arguments(argv)
    if args.rehearse:  # given in the config file, or under a launcher: the rehearsal launches its own processes
        raise UserError("rehearse: give --rehearse true on the command line of `python run_pretrain.py CONFIG.json`")
    install_cpu_communication(args)  # CPU runs with TP/PP/EP or stage2/3: gloo stands in for NCCL
    install_counter(args)  # CPU runs of several processes: bytes and seconds of every collective
    with guarded_run(args):
        return run(resolve_run(model_args, data_args, args))


def run(plan) -> dict:
    """Check, build, train, evaluate and report a resolved run (holding its output_dir); None on a dry run."""
    # every rank stops if any rank found a problem (paddle's launcher would leave the others waiting)
    agree_on("preflight", lambda: raise_problems(check_run(plan)), plan.training_args.hang_timeout)
    predicted, estimate_warnings = estimate_on_this_gpu(plan)  # pretrain.planner, before anything is built
    for warning in warn_run(plan) + estimate_warnings:
        logger.warning(warning)
    if plan.training_args.dry_run:
        print(format_dry_run(plan, predicted))
        return None
    finished = finished_summary(plan)
    if finished is not None:
        return unless_diverged(finished)
    args = plan.training_args
    for line in format_header(plan):
        logger.info(line)
    if args.should_save:
        write_run_config(plan)
    set_seed(args.seed)
    # paddlenlp prints ~70 lines while it builds the sample indices: kept in a file, shown on failure
    with captured_stdout(os.path.join(args.output_dir, f"data_build.rank{args.process_index}.log")):
        train_dataset, valid_dataset, _ = build_datasets(plan)
    if len(plan.data) > 1 and train_dataset is not None:
        logger.info(format_data_mix(data_mix(train_dataset, args.max_steps * plan.global_batch_samples), plan.data))
    # read by paddlenlp's LLaMA/QWen attention at each forward; "True" would drop a document mask
    os.environ["USE_CASUAL_MASK"] = str(not plan.data_args.reset_attention_mask)
    model = build_model(plan)
    watchdog = start_watchdog(args.hang_timeout)  # under a launcher: a stuck rank ends the job, with a report
    trainer = PretrainingTrainer(
        model=model,
        args=args,
        data_collator=collator(plan),
        train_dataset=train_dataset if args.do_train else None,
        eval_dataset=valid_dataset if args.do_eval else None,
        tokenizer=plan.tokenizer,
        step_work=step_work(plan),
        board=board_content(plan),
        watchdog=watchdog,
        sample_ids_file=os.path.join(args.output_dir, SAMPLE_IDS_FILE) if plan.data_args.log_sample_ids else None,
    )
    if args.do_train:
        trainer.train(resume_from_checkpoint=plan.resume_checkpoint)
        trainer.preemption.raise_if_stopped(args.output_dir)  # SIGTERM, SIGUSR1, max_wall_time: checkpoint saved
        trainer.save_model()
    eval_loss = trainer.evaluate()["eval_loss"] if args.do_eval else None
    summary = build_summary(trainer, plan, eval_loss, predicted)
    # each source's realized share of the run's training tokens (pretrain.data.data_mix; null without training)
    summary["data_mix"] = data_mix(trainer.train_dataset, trainer.state.global_step * plan.global_batch_samples)
    if args.should_save:
        write_summary(summary, args.output_dir)
    if watchdog is not None:
        watchdog.enter("collective")
        paddle.distributed.barrier()  # leave together: a rank gone early can abort the others' gloo/NCCL teardown
        watchdog.stop()
    return unless_diverged(summary)


def unless_diverged(summary: dict) -> dict:
    """``summary``, once every file of the run is written; RunDiverged (exit status ``DIVERGED_EXIT_STATUS``)
    when its loss never recovered from a spike (``diverged``; a summary of an older run has no such key)."""
    if summary.get("diverged") is not None:
        raise RunDiverged(summary["diverged"], DIVERGED_EXIT_STATUS)
    return summary


if __name__ == "__main__":
    if requested(sys.argv[1:]):  # launches the recipe's layout on CPU processes itself (docs/gpu.md)
        quiet_paddlenlp()  # the checks read configs back: no "Loading configuration file" lines between them
        sys.exit(run_cli(rehearse, sys.argv[1:]))
    run_launched(main, sys.argv[1:])
