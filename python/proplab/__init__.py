"""proplab: read proplab run files (docs/run-format.md) and sweep folders (docs/studies.md "Sweeps") into pandas.

    import proplab
    run = proplab.open_run("runs/quickstart/quickstart.h5")   # finished, still running, or killed
    run.stats(direction="forward", stat="var")                 # step, direction, stat, depth, probe, kind, block, value
    run.train(); run.eval(); run.params(); run.theory(measured=True)
    sweep = proplab.open_sweep("runs/compare_norms")          # index.csv, typed, plus each run
    sweep.stats(stat="var", step=0)                           # with run and the swept keys as columns
"""

from .run import ALL_PARAMS, Run, RunFileError, open_run
from .sweep import Sweep, open_sweep

__version__ = "0.1.0"

__all__ = ["ALL_PARAMS", "Run", "RunFileError", "Sweep", "open_run", "open_sweep", "__version__"]
