#!/usr/bin/env python3
"""Checks a report folder written by example_09_rl against report_schema.md.

    python3 check_report.py FOLDER [--schema report_schema.md]

Checks that FOLDER/report.json parses as strict JSON (no NaN or Infinity), that its schema id is
the one report_schema.md states, that every field of the schema's "Fields" table is present with
its type and no unlisted field is, that every per-step array of a run has `steps` elements, and
that fraction fields lie in [0, 1]; then that report.md and the four SVG plots exist and the SVGs
parse as XML with an <svg> root. Prints what is wrong and exits 1; prints "ok: N runs" and exits 0
when the folder passes. Standard library only.
"""
import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
PATH_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\[\])?$")
FILES = ["report.md", "reward.svg", "entropy.svg", "clipping.svg", "mismatch.svg"]


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
    """(field tree, version) from report_schema.md; a node is {type, unit, children}."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    root = {"type": "object", "unit": "", "children": {}}
    rows = table_rows(text, "field")
    if not rows:
        raise ValueError(f"{path}: no '| field | type | unit | meaning |' table")
    for cells in rows:
        name, type_, unit = cells[0].strip("`"), cells[1], cells[2]
        node, parts = root, name.split(".")
        for i, part in enumerate(parts):
            m = PATH_PART.match(part)
            if not m:
                raise ValueError(f"{path}: field '{name}': bad path part '{part}'")
            key, into_array = m.group(1), m.group(2)
            if i == len(parts) - 1:
                node["children"][key] = {"type": type_, "unit": unit, "children": {}}
            else:
                if key not in node["children"]:
                    raise ValueError(f"{path}: field '{name}' listed before its parent '{key}'")
                node = node["children"][key]
                want = "array<object>" if into_array else "object"
                if node["type"] != want:
                    raise ValueError(f"{path}: field '{name}': parent '{key}' is {node['type']}, not {want}")
    v = re.search(r"Schema version:\s*`([^`]+)`", text)
    if not v:
        raise ValueError(f"{path}: no 'Schema version: `...`' line")
    return root, v.group(1)


def type_ok(value, spec, where, errors):
    """Checks `value` against a schema node (type, fraction range, children), recording errors."""
    type_ = spec["type"]
    if type_.endswith("?"):
        if value is None:
            return
        type_ = type_[:-1]
    m = re.match(r"^array<(.*)>$", type_)
    if m:
        if not isinstance(value, list):
            errors.append(f"{where}: expected {type_}, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            type_ok(v, dict(spec, type=m.group(1)), f"{where}[{i}]", errors)
        return
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "object": lambda v: isinstance(v, dict),
    }
    if type_ not in checks:
        errors.append(f"{where}: the schema's type '{type_}' is not in its vocabulary")
        return
    if not checks[type_](value):
        errors.append(f"{where}: expected {type_}, got {'null' if value is None else type(value).__name__}")
        return
    if spec["unit"] == "fraction" and not 0 <= value <= 1:
        errors.append(f"{where}: {value} is a fraction outside [0, 1]")
    if type_ == "object":
        for key, child in spec["children"].items():
            if key not in value:
                errors.append(f"{where}.{key}: missing")
            else:
                type_ok(value[key], child, f"{where}.{key}", errors)
        for key in value:
            if key not in spec["children"]:
                errors.append(f"{where}.{key}: not in the schema (document it in report_schema.md)")


def strict_constant(name):
    raise ValueError(f"{name} is not JSON (write null)")


def check(folder, schema_path):
    """(problems, report); no problems: the folder passes."""
    root, version = parse_schema(schema_path)
    path = os.path.join(folder, "report.json")
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f, parse_constant=strict_constant)
    except (OSError, ValueError) as e:
        return [f"{path}: does not parse: {e}"], None
    errors = []
    if not isinstance(report, dict) or report.get("schema") != version:
        got = report.get("schema") if isinstance(report, dict) else type(report).__name__
        return [f"report.schema: is {got!r}, the schema is '{version}'"], report
    type_ok(report, root, "report", errors)
    runs = report["runs"] if isinstance(report.get("runs"), list) else []
    for i, run in enumerate(runs):
        per_step = run.get("per_step") if isinstance(run, dict) else None
        for key, values in (per_step.items() if isinstance(per_step, dict) else []):
            if isinstance(values, list) and len(values) != run.get("steps"):
                errors.append(f"report.runs[{i}].per_step.{key}: {len(values)} values, "
                              f"the run ({run.get('variant')}, seed {run.get('seed')}) has {run.get('steps')} steps")
    for name in FILES:
        p = os.path.join(folder, name)
        if not os.path.isfile(p):
            errors.append(f"{p}: missing")
        elif name.endswith(".svg"):
            try:
                tag = ET.parse(p).getroot().tag
                if tag.rsplit("}", 1)[-1] != "svg":
                    errors.append(f"{p}: the root element is <{tag}>, not <svg>")
            except ET.ParseError as e:
                errors.append(f"{p}: not XML: {e}")
    return errors, report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the folder holding report.json, report.md and the SVG plots")
    parser.add_argument("--schema", default=os.path.join(HERE, "report_schema.md"), help="report_schema.md")
    args = parser.parse_args(argv)
    try:
        errors, report = check(args.folder, args.schema)
    except (OSError, ValueError) as e:
        print(f"check_report: schema: {e}", file=sys.stderr)
        return 1
    for e in errors[:40]:
        print(f"check_report: {e}", file=sys.stderr)
    if len(errors) > 40:
        print(f"check_report: ... and {len(errors) - 40} more", file=sys.stderr)
    if errors:
        return 1
    print(f"ok: {len(report['runs'])} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
