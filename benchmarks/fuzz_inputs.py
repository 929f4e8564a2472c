"""Throw many random values at the public entry points and list every place that raised an error
that is not p0circuit's own (the CI test draws 300 derandomized values; this explores further).

    python benchmarks/fuzz_inputs.py [DRAWS]      # default 3000; about a minute per 1000 here

Uses the catalogue's entry points and value strategy (``tests/test_hostile_inputs.py``). Prints
one line per distinct failure site (entry, parameter, exception, file:line) with an example, and
exits 1 if there was any.
"""

import collections
import sys
import traceback
import warnings
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_hostile_inputs as catalogue  # noqa: E402

from p0circuit.core.errors import P0CircuitError  # noqa: E402


def main(draws: int) -> int:
    warnings.simplefilter("ignore")
    entries = catalogue._entries()
    sites: collections.Counter = collections.Counter()
    examples: dict = {}

    @settings(max_examples=draws, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        name, call, good, bad = data.draw(st.sampled_from(entries))
        param = data.draw(st.sampled_from(sorted(bad)))
        value = data.draw(catalogue.ANYTHING)
        try:
            call(**{**good, param: value})
        except P0CircuitError:
            pass
        except Exception as err:  # noqa: BLE001 - what this script looks for
            last = traceback.extract_tb(err.__traceback__)[-1]
            key = (name, param, type(err).__name__, f"{Path(last.filename).name}:{last.lineno}")
            sites[key] += 1
            examples.setdefault(key, f"{value!r:.60} -> {str(err)[:100]}")

    run()
    for key, count in sites.most_common():
        print(count, *key, examples[key])
    print(f"{draws} draws, {len(sites)} failure sites")
    return 1 if sites else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000))
