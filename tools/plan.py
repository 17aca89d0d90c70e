"""Plan a pretraining config for its GPU cluster, on any machine: layout, batch, parameters, memory, speed.

    python tools/plan.py CONFIG [--key value ...] --nnodes N --nproc_per_node K --gpu NAME [--json] [--search]
    python tools/plan.py config/llama/pretrain_argument.json --nproc_per_node 8 --gpu A100-SXM4-80GB

Resolves the hybrid layout as ``python -m paddle.distributed.launch`` on N x K cards would (paddlenlp's
own degree derivation, no process group, no GPU), runs the preflight checks that can be answered
here for that GPU, and prints per-rank parameter shapes, the global batch, and the planner's
predicted memory per pipeline stage and tokens/card/s (docs/planner.md). Any other ``--key value``
overrides the config, as on run_pretrain.py's command line.

--json prints one JSON object on the last line of stdout (keys: layout, global_batch_size (samples),
seq_length, params_per_card, tokens_per_card_per_sec, mfu, memory_gib (GiB per card, one entry
per pipeline stage), memory_breakdown, fits, time_breakdown (seconds per step by term), assumptions
(the planner's, in words: a mixture of experts'), warnings, notes). --search prints the 10 fastest
layouts that fit (tensor/pipeline/virtual degrees, sharding stage and degree, recompute, micro
batch; the global batch kept). Exit status 2 with ``error: ...`` (one line per problem) when the
run would be refused; a plan whose predicted peak exceeds the card is printed, then refused the
same way (one line: lower the batch, recompute, shard more), and a model whose model states alone
exceed the whole cluster's memory is refused before anything is estimated (a smaller model or more cards).
"""

# ruff: noqa: E402 -- the filters must be in place before paddle is imported: it warns at import
import argparse
import json
import sys

from pretrain.log import silence_known_warnings

silence_known_warnings()

from pretrain.errors import ArgumentParser, UserError, run_cli
from pretrain.forecast import forecast_cluster, forecast_json, format_forecast, rate_text
from pretrain.planner import Workload
from pretrain.planner.search import search


def format_search(cluster, top_k: int = 10) -> str:
    """The ``top_k`` fastest configurations that fit the cluster (``pretrain.planner.search``)."""
    run, layout = cluster.run, cluster.run.layout
    workload = Workload.from_arguments(
        run.model_config, layout, run.model_args, run.data_args, run.training_args, cluster.gpu
    )
    candidates = search(workload, layout.nnodes, layout.nproc_per_node, top_k=top_k)
    lines = [
        f"fastest layouts that fit {layout.nnodes} x {layout.nproc_per_node} {cluster.gpu.part} "
        f"(global batch {run.global_batch_samples} samples kept):"
    ]
    for rank, candidate in enumerate(candidates, 1):
        result = candidate.estimate
        lines.append(
            f"{rank:>3}. {candidate.name:<52} {rate_text(result.tokens_per_card_per_sec):>8} tokens/card/s  "
            f"MFU {result.mfu:.1%}  peak {result.peak_memory_gib:5.1f} GiB  headroom {result.headroom_gib:5.1f} GiB"
        )
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "config", metavar="CONFIG", help="Pretraining JSON config, e.g. config/llama/pretrain_argument.json."
    )
    parser.add_argument("--nnodes", type=int, default=1, help="Machines (count).")
    parser.add_argument("--nproc_per_node", type=int, default=8, help="Cards per machine (count).")
    parser.add_argument("--gpu", default="A100-SXM4-80GB", help="The card: A100-SXM4-40GB, A100-SXM4-80GB, H100, ...")
    parser.add_argument("--json", action="store_true", help="Also print the plan as one JSON object on the last line.")
    parser.add_argument("--search", action="store_true", help="Also rank the layouts that fit (top 10).")
    args, overrides = parser.parse_known_args(argv)
    cluster = forecast_cluster([args.config, *overrides], args.nnodes, args.nproc_per_node, args.gpu)
    print(format_forecast(cluster))
    if args.search:
        print(format_search(cluster))
    result = forecast_json(cluster)
    if args.json:
        print(json.dumps(result))
    if cluster.does_not_fit:
        raise UserError(cluster.does_not_fit)
    return result


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
