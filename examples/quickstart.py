# %% [markdown]
# A percent-format script: each `# %%` starts a cell, and every cell runs in
# the same live kernel, so state carries over. Run it with:
#   cargo run --release --bin cellhost -- run examples/quickstart.py

# %% Define some state
import math, subprocess
primes = [n for n in range(2, 50) if all(n % d for d in range(2, int(math.sqrt(n)) + 1))]
print(f"{len(primes)} primes below 50")

# %% Use it in a later cell (the last expression is the cell's value)
sum(primes)

# %% Output from child processes lands in the result too
subprocess.run(["echo", "hello from a subprocess"])
print("and from Python")

# %% A later cell still sees everything defined above
try:
    primes[100]
except IndexError as e:
    print("caught:", e)
len(primes)
