"""``python -m anchored_reasoning.generators TASK --n N --seed S --out FILE [--set key=value ...]``:
write N generated problems in the published JSON format (e.g. a ProsQA train split)."""
from __future__ import annotations

import argparse
import json
import sys

from anchored_reasoning.errors import AnchoredReasoningError
from anchored_reasoning.generators import GENERATORS, write_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m anchored_reasoning.generators", description=__doc__)
    parser.add_argument("task", choices=sorted(GENERATORS))
    parser.add_argument("--n", type=int, required=True, help="number of problems")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output .json file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="size option, e.g. num_nodes=12, min_hops=2 (ProsQA) or hops=3 (ProntoQA)")
    args = parser.parse_args(argv)
    size = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        size[key] = json.loads(value)
    try:
        path = write_json(args.task, args.out, args.n, args.seed, **size)
    except (AnchoredReasoningError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
