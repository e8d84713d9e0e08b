"""What check_study_claims.py and check_training_claims.py share: the pass/fail ledger and the sweep of a shipped
study into a fresh folder."""
import os
import shutil
import subprocess

STUDIES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "studies")


class Checker:
    """Counts the claims that hold and lists those that do not, printing each as it is checked."""

    def __init__(self):
        self.failures = []
        self.passed = 0

    def check(self, study, claim, ok, detail):
        line = f"{study}: {claim}: {detail}"
        if ok:
            self.passed += 1
            print("  ok   " + line, flush=True)
        else:
            self.failures.append(line)
            print("  FAIL " + line, flush=True)

    def report(self):
        """Prints the summary; the exit status: 0 when every claim holds, 1 otherwise."""
        print(f"{self.passed} claims hold, {len(self.failures)} do not")
        for failure in self.failures:
            print("FAILED: " + failure)
        return 1 if self.failures else 0


def sweep_study(proplab, study, work, overrides=(), mpiexec=None, path=None):
    """`proplab sweep studies/<study>.toml` into WORK/<study> (emptied first: a sweep resumes, and points an earlier
    binary wrote must never be read), with `--set` overrides (and, given an mpiexec, its points of several
    processes under it, one point at a time); returns that folder. Exits naming the command on failure. No point
    writes a checkpoint at its end (train.final_checkpoint = false: the claims read run files only, and the
    checkpoints of the deep models' points would take gigabytes). `path`: the study file to sweep in place of
    studies/<study>.toml (a reduced version with its own [sweep] table)."""
    out = os.path.join(work, study)
    shutil.rmtree(out, ignore_errors=True)
    command = [proplab, "sweep", path or os.path.join(STUDIES_DIR, study + ".toml"), "--out", out]
    env = None
    if mpiexec:
        command += ["--mpirun", mpiexec + " --oversubscribe"]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    else:
        command += ["--jobs", "2"]
    for override in ("train.final_checkpoint=false", *overrides):
        command += ["--set", override]
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return out
