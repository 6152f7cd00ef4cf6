"""The README demo: train a small MLP on the tpu device and show what ran where.

    python -m tpu_interactive.demo
"""
from __future__ import annotations

import torch

import tpu_interactive as torch_tpu


def main(steps: int = 5) -> float:
    print(torch_tpu.backend_info())
    device = torch_tpu.device()  # torch.device('tpu:0')
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    inputs = torch.randn(32, 784, device=device)
    targets = torch.randint(0, 10, (32,), device=device)
    before = torch_tpu.stats()
    for step in range(steps):
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}")
    print("grad device:", model[0].weight.grad.device)
    delta = torch_tpu.stats_diff(before, torch_tpu.stats())
    ops = sum(delta["op_counts"].values())
    print(f"{ops} tpu ops over {steps} steps; CPU fallbacks: {delta['fallback_counts'] or 'none'}; "
          f"device memory in use: {torch_tpu.memory_stats()['bytes_in_use'] / 2**20:.2f} MiB")
    return float(loss.item())


if __name__ == "__main__":
    main()
