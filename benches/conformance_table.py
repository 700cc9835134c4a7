"""Prints the conformance table (every recorded scenario, F32 and F16 caches) as markdown.

usage: python benches/conformance_table.py [prefix ...]
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import scenario_runner as sr  # noqa: E402
from conftest import load_model  # noqa: E402


def main() -> None:
    prefixes = tuple(sys.argv[1:]) or ("",)
    print("| scenario | cache | outputs | difference vs llama.cpp | within tolerance |")
    print("|---|---|---|---|---|")
    for name in sr.scenario_names(prefixes):
        scn = sr.load(name)
        model = load_model(scn["model"])
        for cache in ("f32", "f16"):
            t0 = time.perf_counter()
            cmp = sr.compare(name, scn, sr.run(scn, model, cache), cache)
            bad = sr.check(cmp, scn["model"], model.arch)
            print(cmp.row()[:-1] + f"| {'yes' if not bad else 'NO: ' + '; '.join(bad)} |", flush=True)


if __name__ == "__main__":
    main()
