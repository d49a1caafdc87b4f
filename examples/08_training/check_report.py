#!/usr/bin/env python3
"""Checks a report.json written by example_08_training against report_schema.md.

    python3 check_report.py REPORT_JSON [--schema report_schema.md] [--margin FRACTION]

Checks that the file parses as strict JSON (no NaN or Infinity), that every field the schema's
"Fields" table lists is present with its type and no unlisted field is, that every summary entry
has every metric of the "Summary metrics" table, and that each run's measured peak memory and the
ledger's prediction agree within the margin (default: the one report_schema.md states). Prints
what is wrong and exits 1; exits 0 when the report passes. Standard library only.
"""
import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PATH_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\[\])?$")


def table_rows(text, header):
    """Rows (lists of cells) of the markdown table whose first header cell is `header`."""
    rows, inside = [], False
    for line in text.splitlines():
        line = line.strip()
        cells = [c.strip() for c in line.strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            inside = False
        elif cells[0] == header:
            inside = True
        elif inside and not set(cells[0]) <= set("-: "):
            rows.append(cells)
    return rows


def parse_schema(path):
    """(field tree, metric names, margin, version) from report_schema.md."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    root = {"type": "object", "children": {}}
    rows = table_rows(text, "field")
    if not rows:
        raise ValueError(f"{path}: no '| field | type | ...' table")
    for cells in rows:
        name, type_ = cells[0].strip("`"), cells[1]
        node = root
        parts = name.split(".")
        for i, part in enumerate(parts):
            m = PATH_PART.match(part)
            if not m:
                raise ValueError(f"{path}: field '{name}': bad path part '{part}'")
            key, into_array = m.group(1), m.group(2)
            if i == len(parts) - 1:
                if into_array:
                    raise ValueError(f"{path}: field '{name}' ends in []")
                node["children"][key] = {"type": type_, "children": {}}
            else:
                if key not in node["children"]:
                    raise ValueError(f"{path}: field '{name}' listed before its parent '{key}'")
                node = node["children"][key]
                want = "array<object>" if into_array else "object"
                if node["type"].rstrip("?") != want:  # an object? holds its fields when present
                    raise ValueError(f"{path}: field '{name}': parent '{key}' is {node['type']}, not {want}")
    metrics = [cells[0].strip("`") for cells in table_rows(text, "metric")]
    m = re.search(r"Memory margin:\s*([0-9.]+)\s*%", text)
    if not m:
        raise ValueError(f"{path}: no 'Memory margin: N%' line")
    v = re.search(r"Schema version:\s*`([^`]+)`", text)
    if not v:
        raise ValueError(f"{path}: no 'Schema version: `...`' line")
    return root, metrics, float(m.group(1)) / 100.0, v.group(1)


def type_ok(value, type_, children, where, errors):
    """Checks `value` against a type of the schema's vocabulary, recording errors."""
    if type_.endswith("?"):
        if value is None:
            return
        type_ = type_[:-1]
    m = re.match(r"^(array|map)<(.*)>$", type_)
    if m:
        kind, inner = m.groups()
        if kind == "array":
            if not isinstance(value, list):
                errors.append(f"{where}: expected {type_}, got {type(value).__name__}")
                return
            for i, v in enumerate(value):
                type_ok(v, inner, children, f"{where}[{i}]", errors)
        else:
            if not isinstance(value, dict):
                errors.append(f"{where}: expected {type_}, got {type(value).__name__}")
                return
            for k, v in value.items():
                type_ok(v, inner, children, f"{where}.{k}", errors)
        return
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "object": lambda v: isinstance(v, dict),
    }
    if type_ not in checks:
        errors.append(f"{where}: the schema's type '{type_}' is not in its vocabulary")
        return
    if not checks[type_](value):
        shown = "null" if value is None else type(value).__name__
        errors.append(f"{where}: expected {type_}, got {shown}")
        return
    if type_ == "object":
        for key, spec in children.items():
            if key not in value:
                errors.append(f"{where}.{key}: missing")
            else:
                type_ok(value[key], spec["type"], spec["children"], f"{where}.{key}", errors)
        for key in value:
            if key not in children:
                errors.append(f"{where}.{key}: not in the schema (document it in report_schema.md)")


def strict_constant(name):
    raise ValueError(f"{name} is not JSON (write null)")


def check(report_path, schema_path, margin=None):
    """Returns the list of problems (empty: the report passes)."""
    root, metrics, schema_margin, version = parse_schema(schema_path)
    margin = schema_margin if margin is None else margin
    try:
        with open(report_path, encoding="utf-8") as f:
            report = json.load(f, parse_constant=strict_constant)
    except (OSError, ValueError) as e:
        return [f"{report_path}: does not parse: {e}"]
    errors = []
    type_ok(report, "object", root["children"], "report", errors)
    if errors:
        return errors
    if report["schema"] != version:
        errors.append(f"report.schema: is '{report['schema']}', the schema is '{version}'")
    for i, entry in enumerate(report["summary"]):
        names = [m["name"] for m in entry["metrics"]]
        for name in metrics:
            if name not in names:
                errors.append(f"report.summary[{i}].metrics: no '{name}'")
        for name in names:
            if name not in metrics:
                errors.append(f"report.summary[{i}].metrics: '{name}' is not in the schema's metric table")
    for i, run in enumerate(report["runs"]):
        measured, ledger = run["peak_bytes_measured"], run["ledger_peak_bytes"]
        who = f"report.runs[{i}] ({run['recipe']}, {run['size']}, {run['steps']} steps, seed {run['seed']})"
        if ledger <= 0:
            if measured != ledger:
                errors.append(f"{who}: ledger predicts {ledger} bytes but {measured} were measured")
            continue
        apart = abs(measured - ledger) / ledger
        if apart > margin:
            errors.append(f"{who}: measured peak {measured / 2**20:.3f} MiB and ledger {ledger / 2**20:.3f} MiB "
                          f"are {100 * apart:.1f}% apart, beyond the {100 * margin:g}% margin")
    return errors


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", help="report.json to check")
    parser.add_argument("--schema", default=os.path.join(HERE, "report_schema.md"), help="report_schema.md")
    parser.add_argument("--margin", type=float, default=None,
                        help="largest relative |measured - ledger| / ledger peak memory (default: the schema's)")
    args = parser.parse_args(argv)
    try:
        errors = check(args.report, args.schema, args.margin)
    except (OSError, ValueError) as e:
        print(f"check_report: schema: {e}", file=sys.stderr)
        return 2
    for e in errors[:40]:
        print(f"check_report: {e}", file=sys.stderr)
    if len(errors) > 40:
        print(f"check_report: ... and {len(errors) - 40} more", file=sys.stderr)
    if errors:
        return 1
    print(f"check_report: {args.report}: OK against {os.path.basename(args.schema)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
