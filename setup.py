"""Installs the ``pretrain`` package (the logic behind run_pretrain.py and tools/).

CPU:  pip install -r requirements-cpu.txt && pip install -e .
GPU:  install paddlepaddle-gpu 3.x from Paddle's wheel index first (see README), then the same.
The fused RMSNorm op is a separate package: external_ops/setup.py (`make ops`).
"""

from setuptools import find_packages, setup

setup(
    name="paddle-llm-pretrain",
    version="0.1.0",
    description="PaddleNLP-native LLM pretraining: LLaMA, Qwen, Baichuan and GPT-3 on PaddlePaddle",
    packages=find_packages(include=["pretrain", "pretrain.*"]),
    python_requires=">=3.9",
    install_requires=[
        "paddlenlp",
        "numpy",
        "sentencepiece",
        "visualdl",
        "fast_dataindex",
        "sentencex",
        "zstandard",
        "crc32c",
    ],
)
