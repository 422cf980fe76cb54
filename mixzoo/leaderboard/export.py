"""CSV and Markdown of any view, written under a temporary name and then renamed."""
from __future__ import annotations

import csv
import io
import math
import os
import uuid
from pathlib import Path

from ..errors import UsageError
from .views import View

FORMATS = ("csv", "md")
SUFFIXES = {".csv": "csv", ".md": "md", ".markdown": "md"}


def format_of(out: str | Path, fmt: str | None = None) -> str:
    """The export format: ``fmt`` when given, else from the file's suffix (``.csv``, ``.md``; none:
    csv); an unknown format or suffix is a UsageError."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise UsageError(f"unknown export format {fmt!r}; allowed: {', '.join(FORMATS)}")
        return fmt
    suffix = Path(out).suffix.lower()
    if not suffix:
        return "csv"
    if suffix not in SUFFIXES:
        raise UsageError(f"--out {str(out)!r}: unknown export format {suffix!r}; allowed: "
                         f"{', '.join(SUFFIXES)} (or give --format csv|md)")
    return SUFFIXES[suffix]


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{uuid.uuid4().hex}-{path.name}")
    try:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _raw(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(v)
    return v


def to_csv(views: list[View]) -> str:
    """Raw values (mean and std in their own columns); several views share one header."""
    cols: list[str] = []
    for v in views:
        cols += [c for c in v.columns if c not in cols]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for v in views:
        for r in v.records:
            w.writerow([_raw(r.get(c)) for c in cols])
    return buf.getvalue()


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def to_markdown(views: list[View]) -> str:
    out = []
    for v in views:
        out.append(f"### {v.title}\n")
        if not v.records:
            out.append("(no rows)\n")
            continue
        out.append("| " + " | ".join(_md_cell(h) for h in v.headers) + " |")
        out.append("|" + "|".join("---" for _ in v.headers) + "|")
        out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in v.text_rows()]
        out.append("")
        out += [f"{n}\n" for n in v.notes]
    return "\n".join(out).rstrip() + "\n"


def export(views: list[View], fmt: str, out: str | Path) -> Path:
    if fmt not in FORMATS:
        raise UsageError(f"unknown export format {fmt!r}; allowed: {', '.join(FORMATS)}")
    return write_atomic(out, to_csv(views) if fmt == "csv" else to_markdown(views))
