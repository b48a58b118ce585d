"""A request body on its way to Triton: one buffer, or the pieces it arrived in.

A body that reaches the front in several pieces is held as those pieces (once: never as pieces and a
copy joining them). A binary request's JSON part is read from its first pieces and the pieces go to
Triton as they are, in one ``writev``; only what reads a whole body as one buffer (a JSON body, an image,
a compressed body, a gRPC stream, generate) joins them, once (:func:`contiguous`; a large one in a
buffer it grows as it lets go of the pieces, :meth:`BodyPieces.gathered`). Joining a 600 KB
body cost more front CPU than the copy itself (fresh pages to fault in), bench/NOTES.md Part 12.
"""

from __future__ import annotations

from collections.abc import Sequence

# A body held as one buffer.
RequestBody = bytes | bytearray

Piece = bytes | memoryview


class BodyPieces:
    """A body held as the pieces it arrived in, in order (two or more, as the reader makes them)."""

    __slots__ = ("pieces", "size")

    def __init__(self, pieces: Sequence[Piece], size: int | None = None) -> None:
        self.pieces = pieces
        self.size = sum(len(piece) for piece in pieces) if size is None else size

    def __len__(self) -> int:
        return self.size

    def prefix(self, length: int) -> bytes:
        """The body's first ``length`` bytes (a slice of the first piece where it holds them)."""
        first = self.pieces[0]
        if length <= len(first):
            return bytes(first[:length])
        taken: list[Piece] = []
        left = length
        for piece in self.pieces:
            if left <= 0:
                break
            taken.append(piece[:left])
            left -= len(piece)
        return b"".join(taken)

    def after(self, start: int) -> list[Piece]:
        """The pieces holding the body from byte ``start`` on; the piece cut at ``start`` is a view, not
        a copy."""
        rest: list[Piece] = []
        offset = 0
        for piece in self.pieces:
            end = offset + len(piece)
            if end > start:
                rest.append(piece if offset >= start else memoryview(piece)[start - offset :])
            offset = end
        return rest

    def joined(self) -> bytes:
        return b"".join(self.pieces)

    def gathered(self) -> bytearray:
        """The body in one buffer grown from the pieces, each let go once copied (the pieces are used
        up): a large body is never held twice. Its pages are moved, not copied, as it grows (a buffer
        that large is mapped on its own), so this is for large bodies; :meth:`joined` for the others."""
        pieces = list(self.pieces)
        self.pieces = []
        whole = bytearray()
        pieces.reverse()
        while pieces:
            whole += pieces.pop()
        return whole

    def isspace(self) -> bool:
        return all(bytes(piece).isspace() for piece in self.pieces)


# A body as the front holds it.
HeldBody = RequestBody | BodyPieces


def contiguous(body: HeldBody) -> RequestBody:
    """The body as one buffer (its pieces joined, once, if it is held in pieces)."""
    return body.joined() if isinstance(body, BodyPieces) else body
