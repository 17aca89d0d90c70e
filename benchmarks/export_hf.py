"""tools/export_hf.py on a 1B-parameter model: wall time and peak RSS against the largest shard.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/export_hf.py --workdir /tmp/export_bench [--max_shard_size 2GB]

Writes a random LLaMA of about 1.04B parameters (hidden 2048, 18 layers, 16 heads, FFN 5504, vocab
32000; float32, 4.2 GB) the way ``save_pretrained(safe_serialization=True)`` / unified checkpoints do
(paddle-layout safetensors shards of ``--max_shard_size`` with ``model.safetensors.index.json``), then
runs ``tools/export_hf.py`` on it in a child process and reports its wall time, its peak RSS
(``VmHWM`` of the child: every resident page since exec, paddle's ~0.5 GB at import included) and
that peak against the largest input and output shard. The target: peak RSS under 1.5x the largest shard
(issue #22), i.e. the exporter holds about one shard, not the model. The 1-minute load average is
printed: other jobs make the wall time worse, never the memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# About 1.04B parameters: 2 x 32000 x 2048 embeddings + 18 x (4 x 2048^2 + 3 x 2048 x 5504) + norms.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5504,
    "num_hidden_layers": 18,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "dtype": "float32",
}


# The export in a child process, printing its peak resident set (VmHWM, bytes) last. Not getrusage: a
# child's ru_maxrss counts the parent's pages it had between fork and exec (here, gigabytes).
CHILD = """
import os, runpy, sys
main = runpy.run_path(os.path.join(sys.argv[1], "tools", "export_hf.py"))["main"]
main(sys.argv[2:])
with open("/proc/self/status") as f:
    print(next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")))
"""


def paddle_shapes() -> dict:
    """``{name: shape}`` of paddlenlp's LlamaForCausalLM for CONFIG, built without memory."""
    import paddle
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM
    from paddlenlp.transformers.model_utils import no_init_weights

    with no_init_weights(_enable=True), paddle.LazyGuard():
        model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    return {name: tuple(value.shape) for name, value in model.state_dict().items()}


def write_model(folder: str, max_shard_bytes: int) -> tuple:
    """A random float32 model in ``folder`` as paddle-layout safetensors shards; (parameters, largest shard bytes)."""
    from safetensors.numpy import save_file

    os.makedirs(folder)
    rng = np.random.default_rng(0)
    shards, shard, size, params = [], {}, 0, 0
    for name, shape in paddle_shapes().items():
        array = rng.standard_normal(shape, dtype=np.float32) * 0.02
        if shard and size + array.nbytes > max_shard_bytes:
            shards.append(shard)
            save_file(shard, os.path.join(folder, f"part-{len(shards)}"), metadata={"format": "np"})
            shard, size = {}, 0
        shard[name], size, params = array, size + array.nbytes, params + array.size
    shards.append(shard)
    save_file(shard, os.path.join(folder, f"part-{len(shards)}"), metadata={"format": "np"})
    weight_map = {}
    for number, names in enumerate(shards, 1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        os.replace(os.path.join(folder, f"part-{number}"), os.path.join(folder, file))
        weight_map.update({name: file for name in names})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": params * 4}, "weight_map": weight_map}, f)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(CONFIG, f)
    return params, max(os.path.getsize(os.path.join(folder, file)) for file in set(weight_map.values()))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="Scratch folder (about 8 GB of disk); removed at the end.")
    parser.add_argument("--max_shard_size", default="2GB", help="Shard size of the input and of the export.")
    args = parser.parse_args(argv)
    from pretrain.hf_export import parse_size

    shutil.rmtree(args.workdir, ignore_errors=True)
    source, output = os.path.join(args.workdir, "model"), os.path.join(args.workdir, "hf")
    try:
        params, input_shard = write_model(source, parse_size(args.max_shard_size))
        print(f"model: {params / 1e9:.3f}B parameters, float32, largest input shard {input_shard / 1e9:.2f} GB")
        print(f"load average (1 min): {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        start = time.perf_counter()
        child = subprocess.run(
            [sys.executable, "-c", CHILD, REPO, source, "--output", output, "--max_shard_size", args.max_shard_size],
            check=True,
            env={**os.environ, "PYTHONPATH": REPO},
            stdout=subprocess.PIPE,
            text=True,
        )
        seconds = time.perf_counter() - start
        peak_rss = int(child.stdout.strip().splitlines()[-1])
        shards = [name for name in os.listdir(output) if name.endswith(".safetensors")]
        output_shard = max(os.path.getsize(os.path.join(output, name)) for name in shards)
        largest = max(input_shard, output_shard)
        result = {
            "parameters": params,
            "export_seconds": round(seconds, 1),
            "peak_rss_gb": round(peak_rss / 1e9, 2),
            "largest_shard_gb": round(largest / 1e9, 2),
            "peak_rss_over_largest_shard": round(peak_rss / largest, 2),
            "output_shards": len(shards),
        }
    finally:
        shutil.rmtree(args.workdir, ignore_errors=True)
    print(
        f"export: {result['export_seconds']} s; peak RSS {result['peak_rss_gb']} GB = "
        f"{result['peak_rss_over_largest_shard']}x the largest shard ({result['largest_shard_gb']} GB; target < 1.5x); "
        f"{result['output_shards']} output shards"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
