"""What a two-thread training run loses when something else uses one of the two cores, in one run.

Times a rot-MNIST training step (batch 128, forward, cross-entropy, backward, Adam) of one model at 2 threads,
alone and beside a one-thread load (a process multiplying matrices, as a test suite or the app would), each with
libgomp's default wait policy (threads spin a while at every barrier) and with ``OMP_WAIT_POLICY=PASSIVE``
(they sleep at once). Every case runs in a fresh process, since the policy is read when the OpenMP runtime
starts. With one core taken, the best a 2-thread step can do is about 2x its time alone; the spinning threads
do worse, which is why a session pauses its training (``kill -STOP``, then ``kill -CONT``) while it runs the
test suite rather than letting the two share the cores.

    python -m benchmarks.training_beside_load                    # p4cnn, 15 steps per case
    python -m benchmarks.training_beside_load --model a_p4cnn --steps 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# One process timing ``steps`` training steps at 2 threads after 3 warm-up steps; prints seconds per step.
STEP_TIMER = """
import sys, time, torch, torch.nn.functional as F
from models import build_model
model_name, steps = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(2)
torch.manual_seed(0)
model = build_model(model_name, dropout=0.3)
optimiser = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4)
images, labels = torch.randn(128, 1, 28, 28), torch.randint(0, 10, (128,))
def step():
    optimiser.zero_grad()
    F.cross_entropy(model(images), labels).backward()
    optimiser.step()
for _ in range(3):
    step()
start = time.perf_counter()
for _ in range(steps):
    step()
print((time.perf_counter() - start) / steps)
"""

# One busy core: 400 x 400 matrix products on one thread, until killed.
LOAD = "import torch\ntorch.set_num_threads(1)\na = torch.randn(400, 400)\nwhile True:\n    a = (a @ a).tanh_()\n"


def step_seconds(model: str, steps: int, passive: bool, beside_load: bool) -> float:
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    load = subprocess.Popen([sys.executable, "-c", LOAD]) if beside_load else None
    try:
        if load is not None:
            time.sleep(1.0)  # the load is running before the timing starts
        out = subprocess.run([sys.executable, "-c", STEP_TIMER, model, str(steps)], env=env, cwd=REPO,
                             capture_output=True, text=True, check=True)
    finally:
        if load is not None:
            load.kill()
            load.wait()
    return float(out.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="p4cnn")
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args(argv)
    alone = step_seconds(args.model, args.steps, passive=False, beside_load=False)
    print(f"{args.model}, batch 128, 2 threads, {args.steps} steps per case; ratios to the default policy alone")
    print("| wait policy | alone: s / step | x | beside a 1-thread load: s / step | x |")
    print("|---|---|---|---|---|")
    for passive in (False, True):
        own = alone if not passive else step_seconds(args.model, args.steps, passive=True, beside_load=False)
        loaded = step_seconds(args.model, args.steps, passive=passive, beside_load=True)
        print(f"| {'PASSIVE' if passive else 'default (spin)'} | {own:.3f} | {own / alone:.2f} | {loaded:.3f} "
              f"| {loaded / alone:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
