"""The package's OpenMP environment on a shared machine (docs/architecture.md "Threads on a
shared machine"): a short spin before the library loads unless the user chose a wait policy, and
each call's team sized by tpk_threads_adapt (the user's OMP_NUM_THREADS kept)."""
import os
import subprocess
import sys


def _run(code, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def test_spin_default_set_before_load():
    code = "import os, tpk; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
    assert _run(code) == "10000 None"
    # libgomp itself read it (its environment display runs as it is loaded)
    e = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    e["OMP_DISPLAY_ENV"] = "verbose"
    out = subprocess.run([sys.executable, "-c", "import tpk"], env=e, capture_output=True,
                         text=True, check=True)
    assert "GOMP_SPINCOUNT = '10000'" in out.stderr


def test_user_choice_kept():
    code = "import os, tpk; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
    assert _run(code, OMP_WAIT_POLICY="active") == "None active"
    assert _run(code, GOMP_SPINCOUNT="42") == "42 None"


def test_team_follows_user_threads():
    code = "import tpk; print(tpk._lib.tpk_threads_adapt())"
    assert _run(code, OMP_NUM_THREADS="3") == "3"
    n = int(_run(code))
    assert 1 <= n <= (os.cpu_count() or 1)
