"""Hostile inputs the tests, the benchmark and the fuzz campaign share: JSON Schemas that
compile super-linearly, and PDFs whose text extraction is slow, huge or fails deep in
pypdf (built here, by hand or with pypdf; none is stored in the repository)."""

from __future__ import annotations

import base64
import io
import random
import re
import zlib
from typing import Any


def schema_bomb(properties: int = 16_000) -> dict[str, Any]:
    """An object schema of ``properties`` optional string properties (16,000: about
    496 KB, which llguidance took 17 s to compile before panicking)."""
    return {
        "type": "object",
        "properties": {f"property_{i:05d}": {"type": "string"} for i in range(properties)},
    }


def _pdf(objects: list[bytes]) -> bytes:
    """A PDF of the given indirect objects (numbered from 1; object 1 the catalog),
    with a correct cross-reference table."""
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(
        b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    )
    return out.getvalue()


def page_pdf(
    content: bytes, *, compress: bool = True, extra: bytes = b"", padding: int = 0
) -> bytes:
    """A one-page PDF (Helvetica as ``/F1``) drawing ``content``, deflated; ``padding``
    bytes of noise in an object nothing refers to (a big file with little text)."""
    data = zlib.compress(content, 9) if compress else content
    flate = b" /Filter /FlateDecode" if compress else b""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792]"
        b" /Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R" + extra + b" >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d%s >>\nstream\n" % (len(data), flate) + data + b"\nendstream",
    ]
    if padding:
        noise = random.Random(padding).randbytes(padding)
        objects.append(b"<< /Length %d >>\nstream\n" % len(noise) + noise + b"\nendstream")
    return _pdf(objects)


def text_bomb(inflated: int) -> bytes:
    """A page whose deflated drawing operators inflate to ``inflated`` bytes of text
    lines (11 KB of PDF for 10 MB: pypdf took minutes to extract it)."""
    line = b"BT /F1 12 Tf 72 712 Td (" + b"A" * 60 + b") Tj ET\n"
    return page_pdf(line * (inflated // len(line)))


def tj_bomb(operators: int = 190_000, text: bytes = b"a") -> bytes:
    """One text object of ``operators`` ``Tj`` operators (3.5 KB of PDF)."""
    return page_pdf(
        b"BT /F1 12 Tf "
        + b"("
        + text
        + b") Tj " * 1
        + (b"(" + text + b") Tj ") * (operators - 1)
        + b"ET"
    )


def nested_bomb(depth: int = 50_000) -> bytes:
    """A page showing text through arrays nested ``depth`` deep (pypdf's content
    parser recurses once per level: ``RecursionError``)."""
    return page_pdf(b"BT /F1 12 Tf " + b"[" * depth + b"(x)" + b"]" * depth + b" TJ ET")


def inflation_bomb(inflated: int = 200 << 20) -> bytes:
    """A page whose content stream inflates to ``inflated`` bytes of zeros (past
    pypdf's own output limit: ``LimitReachedError``)."""
    return page_pdf(b"\0" * inflated)


def warning_bomb(objects: int = 5_000) -> bytes:
    """A readable PDF whose cross-reference table points 3 bytes off for each of its
    ``objects`` objects: pypdf warns about every one of them (and finds them anyway)."""
    pdf = page_pdf(b"BT /F1 12 Tf 72 712 Td (Still readable.) Tj ET")
    head, _, _ = pdf.partition(b"xref\n")
    body = [head[head.index(b"1 0 obj") :]]
    filler = b"".join(b"%d 0 obj\n<< /N %d >>\nendobj\n" % (6 + i, i) for i in range(objects))
    start = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n"
    whole = start + body[0] + filler
    offsets = [m.start() for m in re.finditer(rb"(?m)^\d+ 0 obj", whole)]
    xref = len(whole)
    table = b"".join(b"%010d 00000 n \n" % (offset + 3) for offset in offsets)
    return (
        whole
        + b"xref\n0 %d\n0000000000 65535 f \n" % (len(offsets) + 1)
        + table
        + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n"
        % (len(offsets) + 1, xref)
    )


def without_xref(pdf: bytes) -> bytes:
    """``pdf`` with its cross-reference table, trailer and ``startxref`` cut off, a
    trailer with no ``/Size`` and no final newline in their place (what hand-made PDFs,
    the Open Responses suite's among them, look like): pypdf alone says "startxref not
    found"."""
    head, _, _ = pdf.partition(b"xref\n")
    return head + b"trailer << /Root 1 0 R >>\n%%EOF"


def damaged_pdf(text: bytes = b"Title: OpenResponses File Input Fixture") -> bytes:
    """The Open Responses suite's ``file-input`` fixture, byte for byte: one page,
    an uncompressed content stream whose ``/Length`` is 4 bytes too long, no xref table,
    no ``startxref``, a trailer without ``/Size``."""
    content = b"BT\n/F1 12 Tf\n72 72 Td\n(" + text + b") Tj\nET\n"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 144] /Contents 4 0 R"
        b" /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % (len(content) + 4) + content + b"endstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    body = b"".join(b"%d 0 obj\n%s\nendobj\n" % (n, o) for n, o in enumerate(objects, start=1))
    return b"%PDF-1.1\n" + body + b"trailer\n<< /Root 1 0 R >>\n%%EOF"


def data_url(pdf: bytes) -> str:
    return f"data:application/pdf;base64,{base64.b64encode(pdf).decode()}"


def pdf_input(pdf: bytes, text: str = "Summarize the file.", name: str = "f.pdf") -> list[Any]:
    """A request's ``input`` carrying ``pdf``."""
    return [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": text},
                {"type": "input_file", "filename": name, "file_data": data_url(pdf)},
            ],
        }
    ]
