"""What measuring the time breakdown costs (``pretrain.metrics.time_breakdown``), against the step it measures.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/time_breakdown_overhead.py [--steps 20000]

The cost: every call one optimizer step makes into the measurement, as paddlenlp's training loop
and ``PretrainingTrainer`` make them (gradient accumulation 1): ``on_load_data_end``, paddlenlp's
``forward-backward``, ``all-reduce`` and ``optimizer-step`` timers started and stopped,
``on_step_end`` (which reads them), ``step_complete``; and at each log record ``interval_record``
plus the ``time_history.json`` write. Timed over ``--steps`` steps, logging every step (the worst
case) and every 10 steps; the best of 3 rounds (other jobs only slow a round down). One process:
the 2-rank gather of ``pretrain.metrics.rank_figures`` (one small all_gather per log record) is not included.

The step: one forward + backward + AdamW step of paddlenlp's LlamaForCausalLM on this device, for
the tiny model of the tests (2 layers x 64 wide, 4 x 64 tokens: the cheapest step there is, so the
largest share) and the CPU demo's model (4 layers x 256 wide, 16 x 256 tokens); the median of
``--model_steps`` steps after one warm-up step.

On a GPU paddlenlp's timers synchronize the device at each start and stop (3 timers per step):
that cost is not what this CPU figure shows. The 1-minute load average is printed: a loaded machine
slows both sides.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import paddle
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

from pretrain.metrics.time_breakdown import TimeBreakdown

STEP_TIMERS = ("forward-backward", "all-reduce", "optimizer-step")  # paddlenlp's, in its loop's order


def hook_seconds_per_step(steps: int, logging_steps: int, folder: str) -> float:
    """Mean seconds the measurement adds to one step (best of 3 rounds of ``steps`` steps)."""
    best = float("inf")
    for _ in range(3):
        breakdown = TimeBreakdown(start_time=time.time())
        breakdown.on_train_begin(None, None, None)
        breakdown.on_epoch_begin(None, None, None)
        start = time.perf_counter()
        for step in range(1, steps + 1):
            breakdown.on_load_data_end(None, None, None)
            for name in STEP_TIMERS:
                breakdown.timers(name).start()
                breakdown.timers(name).stop()
            breakdown.on_step_end(None, None, None)
            if step % logging_steps == 0:
                breakdown.interval_record()
                breakdown.write(folder, step, durable=False)
            breakdown.step_complete()
        best = min(best, (time.perf_counter() - start) / steps)
    return best


def model_step_seconds(layers: int, hidden: int, batch: int, seq: int, steps: int) -> float:
    """Median seconds of one forward + backward + AdamW step of a LLaMA of this shape (vocabulary 8064)."""
    paddle.seed(0)
    config = LlamaConfig(
        vocab_size=8064,
        hidden_size=hidden,
        intermediate_size=hidden * 2 if hidden < 256 else 704,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max(1024, seq),
    )
    model = LlamaForCausalLM(config)
    optimizer = paddle.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters())
    tokens = paddle.randint(0, 8064, [batch, seq + 1])
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        loss = model(input_ids=inputs, labels=labels)[0]
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        float(loss)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000, help="simulated steps per round of the hook timing")
    parser.add_argument("--model_steps", type=int, default=5, help="timed training steps per model")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; device {paddle.device.get_device()}")
    with tempfile.TemporaryDirectory() as folder:
        hooks = {every: hook_seconds_per_step(args.steps, every, folder) for every in (1, 10)}
    for every, seconds in hooks.items():
        print(f"measurement, logging every {every:>2} step(s): {seconds * 1e6:8.1f} us per step")
    for name, shape in (("tiny test model", (2, 64, 4, 64)), ("CPU demo model", (4, 256, 16, 256))):
        step = model_step_seconds(*shape, steps=args.model_steps)
        share = ", ".join(f"{100 * seconds / step:.3f}% logging every {every}" for every, seconds in hooks.items())
        print(f"{name} ({shape[0]} layers x {shape[1]}, {shape[2]} x {shape[3]} tokens): {step * 1e3:.1f} ms per step;")
        print(f"  the measurement costs {share}")


if __name__ == "__main__":
    main()
