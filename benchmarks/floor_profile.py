"""benchmarks/profile_step.py for the cost floor (``benchmarks/floor_mixer.py``): registers ``floor``, then runs
profile_step's command line, e.g. ``python benchmarks/floor_profile.py --mixers floor --shape mad1024 --stacked 6
--graphed --by-source``."""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here))
import floor_mixer  # noqa: E402,F401  (registers the mechanism)

sys.argv = [str(here / "profile_step.py"), *sys.argv[1:]]
runpy.run_path(str(here / "profile_step.py"), run_name="__main__")
