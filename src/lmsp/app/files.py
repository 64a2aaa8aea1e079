"""Every file of a request turned into text once, under limits, before anything is written.

A PDF is read in a worker process (:mod:`lmsp.sandbox`) with ``LMSP_FILE_CPU_TIME`` of
CPU time and ``LMSP_INPUT_MEMORY`` of memory, and the extraction stops once the text
passes :data:`lmsp.protocol.filetext.MAX_FILE_TEXT` characters; a text file is decoded
in a thread. All the PDFs of one request share its budget (a
:class:`~lmsp.fairgate.Ticket`: ``LMSP_REQUEST_CPU_TIME`` of CPU in all, done within
a deadline counted from its arrival) and wait for a worker in turn with other
clients' requests. The text is kept with its part (:data:`lmsp.protocol.items.FILE_TEXT`), so
the size check, the runner and every later turn of the conversation use it and never
parse the file again. A file that cannot be read, or goes past a limit, is a ``400
invalid_file`` naming its part; what the parser logged is one debug line.

Outcomes are remembered by the file's digest (a few dozen): the same file sent again (an
agent's next conversation, or the same hostile file) costs nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable

from lmsp.fairgate import Ticket
from lmsp.protocol import filetext, items
from lmsp.protocol.itemtypes import Items, typed
from lmsp.sandbox import Overrun, Sandbox, WorkerFailed

log = logging.getLogger(__name__)

#: how errors name item ``i`` of a request's input
Name = Callable[[int], str]
#: outcomes remembered (each at most ``MAX_FILE_TEXT`` characters)
REMEMBERED = 32
_LIMITS = {
    "cpu": "reading it took more than {seconds:g}s of CPU time (LMSP_FILE_CPU_TIME)",
    "memory": "reading it needed more memory than allowed (LMSP_INPUT_MEMORY)",
    "wall": "reading it took too long on this busy machine; retry",
    "request": (
        "the request's files and schemas together took more than {request:g}s of CPU time"
        " (LMSP_REQUEST_CPU_TIME); send fewer or smaller files"
    ),
    "deadline": (
        "the request's files were not read in time (its time counts from its arrival:"
        " LMSP_REQUEST_CPU_TIME); the machine is busy, retry later"
    ),
}
#: limits that say nothing of the file itself: its outcome is not remembered
_TRANSIENT = ("wall", "crash", "request", "deadline")


def _input(index: int) -> str:
    return f"input.{index}"


class FileReader:
    """Turns files into text in ``sandbox`` workers (see the module docstring)."""

    def __init__(self, sandbox: Sandbox, *, cpu_seconds: float) -> None:
        self.sandbox = sandbox
        self.cpu_seconds = cpu_seconds
        self._known: OrderedDict[tuple[str, str], filetext.Extracted] = OrderedDict()
        self.parsed = 0  # files parsed (not answered from memory)

    async def texts(
        self, given: Items, name: Name = _input, ticket: Ticket | None = None
    ) -> dict[str, str]:
        """The text of every ``input_file`` part of ``given`` not read yet, by where it
        sits (:func:`lmsp.protocol.items.files_of`); ``name(i)`` is how errors name item
        ``i``; ``ticket``: the request's budget."""
        found: dict[str, str] = {}
        for where, part in items.files_of(given):
            index, _, rest = where.partition(".")
            place = f"{name(int(index))}.{rest}"
            raw, kind = items.file_bytes(part.file_data, part.filename, place)
            extracted = await self._extract(raw, kind, place, ticket)
            if extracted.text is None:
                raise items.file_error(place, extracted)
            found[where] = extracted.text
        return found

    async def with_texts(
        self, given: Items, name: Name = _input, ticket: Ticket | None = None
    ) -> Items:
        """``given`` with each file's text kept with its part (:meth:`texts`)."""
        return items.with_file_texts(given, await self.texts(given, name, ticket))

    async def read(
        self, given: list[items.Item], name: Name = _input, ticket: Ticket | None = None
    ) -> None:
        """Give every ``input_file`` part of the normalized items ``given`` (as JSON)
        its text, in place (:meth:`texts`)."""
        for where, text in (await self.texts(typed(given), name, ticket)).items():
            index, _, at = where.split(".")
            given[int(index)]["content"][int(at)][items.FILE_TEXT] = text

    async def _extract(
        self, raw: bytes, kind: str, place: str, ticket: Ticket | None
    ) -> filetext.Extracted:
        key = (hashlib.sha256(raw).hexdigest(), kind)
        known = self._known.get(key)
        if known is not None:
            self._known.move_to_end(key)
            return known
        self.parsed += 1
        transient = False
        if kind != "pdf":
            extracted = await asyncio.to_thread(filetext.extract, raw, kind)
        else:
            try:
                extracted = await self.sandbox.run(
                    filetext.pdf_job,
                    raw,
                    filetext.MAX_FILE_TEXT,
                    cpu_seconds=self.cpu_seconds,
                    ticket=ticket,
                )
            except Overrun as exc:
                transient = exc.limit in _TRANSIENT
                reason = _LIMITS.get(exc.limit, "the PDF reader failed on it")
                budget = ticket.cpu_seconds if ticket is not None else 0.0
                message = reason.format(seconds=self.cpu_seconds, request=budget)
                log.info(
                    "%s: a PDF of %d bytes went past its %s limit",
                    place,
                    len(raw),
                    exc.limit,
                    extra={"event": "file.over_limit", "limit": exc.limit},
                )
                extracted = filetext.Extracted(
                    None, "invalid_file", f"the PDF is refused: {message}."
                )
            except WorkerFailed as exc:
                transient = True
                log.warning(
                    "%s: reading a PDF of %d bytes failed: %s",
                    place,
                    len(raw),
                    exc.detail,
                    extra={"event": "file.failed"},
                )
                extracted = filetext.Extracted(
                    None, "invalid_file", "the PDF cannot be read (it is damaged or not a PDF)."
                )
        if extracted.warnings:
            log.debug(
                "%s: the PDF reader gave %d warnings (the first: %s)",
                place,
                extracted.warnings,
                extracted.first_warning,
                extra={"event": "file.warnings"},
            )
        if not transient:
            self._known[key] = extracted
            while len(self._known) > REMEMBERED:
                self._known.popitem(last=False)
        return extracted
