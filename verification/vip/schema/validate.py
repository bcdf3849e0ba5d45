#!/usr/bin/env python3
"""Validates trace files against verification/vip/schema/trace.schema.json (JSON Schema
2020-12, with the `jsonschema` package) and shows the schema can fail: a copy of each file
with one slice's duration made negative must be refused.

    validate.py SCHEMA TRACE...
"""
import copy
import json
import sys

import jsonschema


def main() -> int:
    schema_path, *traces = sys.argv[1:]
    with open(schema_path) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in traces:
        with open(path) as f:
            trace = json.load(f)
        errors = sorted(validator.iter_errors(trace), key=lambda e: list(e.path))
        if errors:
            for error in errors[:5]:
                print(f"{path}: {'/'.join(map(str, error.path))}: {error.message}", file=sys.stderr)
            return 1
        broken = copy.deepcopy(trace)
        slices = [e for e in broken["traceEvents"] if e.get("ph") == "X"]
        if not slices:
            print(f"{path}: no stage slices", file=sys.stderr)
            return 1
        slices[0]["dur"] = -1.0
        if validator.is_valid(broken):
            print(f"{path}: the schema accepted a negative duration", file=sys.stderr)
            return 1
        print(f"{path}: {len(trace['traceEvents'])} events valid against {schema_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
