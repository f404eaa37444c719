"""How fast a kernel will run and how to pick a faster one: the Apple GPU table and counters-only
bounds (`roofline.py`), the one cost model (`cost_model.py`), registers and occupancy
(`register_budget.py`, which also gates register staging and K-prefetch in the lowering) and the
autotuner (`autotune.py`, above the kernels).

Imports nothing here: the lowering reads `register_budget.py` without pulling in the autotuner."""
