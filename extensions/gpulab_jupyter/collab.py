"""Real-time collaboration (jupyter-collaboration) made read-only for viewers.

jupyter_server_ydoc's websocket ``/api/collaboration/room/<room>`` checks only
"read" when it opens, then applies every Y update a client sends and saves the
room to disk on a raw "save" message (jupyter-collaboration#324,
jupyter_server#948): a viewer could change files through it. gpulab replaces
that route's handler with :class:`ReadOnlyRoomHandler`, which asks the server's
authorizer once, when the websocket opens, whether this person may write
contents. If not, it passes on only what reading needs (sync step 1, which asks
the room for its content, and awareness: who is there, cursors) and drops sync
step 2, sync updates, "save" (answered "failed") and any other message, so a
viewer sees the document live and cannot change it. The room also asks for "read"
(jupyter_server_ydoc asks nothing), checks the Origin as kernel websockets do, and
is re-checked while open (connections.py): a revoked person's room closes.

Only active where jupyter_server_ydoc is installed (gpulab's project images).
"""

from __future__ import annotations

from jupyter_core.utils import ensure_async

# y-protocols / jupyter_server_ydoc message types (first var-uint of a message)
SYNC, AWARENESS = 0, 1
SYNC_STEP1 = 0  # second var-uint of a SYNC message: "send me what I lack"
RAW = 2


def read_var_uint(data: bytes, pos: int = 0) -> tuple[int, int]:
    """A lib0 variable-length unsigned integer at ``pos``; (value, next position)."""
    value = shift = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ValueError("truncated var-uint")


def reader_may_send(message: bytes) -> bool:
    """Whether a message changes nothing: sync step 1 or awareness (pure, for tests)."""
    try:
        kind, pos = read_var_uint(message)
        if kind == AWARENESS:
            return True
        if kind == SYNC:
            step, _ = read_var_uint(message, pos)
            return step == SYNC_STEP1
    except ValueError:
        return False
    return False


def is_save(message: bytes) -> int | None:
    """The id of a raw "save" message, or None."""
    try:
        kind, pos = read_var_uint(message)
        if kind != RAW:
            return None
        length, pos = read_var_uint(message, pos)
        if message[pos : pos + length] != b"save":
            return None
        save_id, _ = read_var_uint(message, pos + length)
        return save_id
    except ValueError:
        return None


def room_handler_class():
    """The read-only-aware subclass of jupyter_server_ydoc's room websocket (None
    where jupyter_server_ydoc is not installed)."""
    try:
        from jupyter_server_ydoc.handlers import YDocWebSocketHandler
    except ImportError:
        return None
    from jupyter_server.base.websocket import WebSocketMixin
    from tornado import web

    class ReadOnlyRoomHandler(YDocWebSocketHandler):
        gpulab_asks_only = True  # "may write?" decides read-only; the authorizer refuses nothing
        gpulab_may_write = False
        gpulab_dropped = 0

        async def get(self, *args, **kwargs):
            user = self.current_user
            if user:
                may = self.authorizer.is_authorized
                if not await ensure_async(may(self, user, "read", "contents")):
                    raise web.HTTPError(403, "not authorized to read this project")
                may_write = await ensure_async(may(self, user, "write", "contents"))
                self.gpulab_may_write = bool(may_write)
            return await super().get(*args, **kwargs)

        def check_origin(self, origin):
            # jupyter_server_ydoc lets every origin in; gpulab asks what kernel and
            # terminal websockets ask (same host, or the server's allow_origin), so a
            # page of another origin cannot use a visitor's cookie to join a room.
            return WebSocketMixin.check_origin(self, origin)

        async def on_message(self, message):
            if self.gpulab_may_write or (isinstance(message, bytes) and reader_may_send(message)):
                return await super().on_message(message)
            save_id = is_save(message) if isinstance(message, bytes) else None
            if save_id is not None:
                reply = {"type": "save", "responseTo": save_id, "status": "failed"}
                await self.send(self._encode_json_message(reply))
            self.gpulab_dropped += 1
            if self.gpulab_dropped == 1:  # once per connection: a viewer typing sends many
                self.log.info("gpulab: read-only %s: dropping changes to room", self.current_user)
            return None

    ReadOnlyRoomHandler.__gpulab_base__ = YDocWebSocketHandler
    return ReadOnlyRoomHandler


def guard_rooms(rules) -> int:
    """Put ReadOnlyRoomHandler in place of YDocWebSocketHandler in tornado ``rules``
    (a list of the app's routing rules); how many were replaced."""
    guarded = room_handler_class()
    if guarded is None:
        return 0
    count = 0
    for rule in rules:
        if rule.target is guarded.__gpulab_base__:
            rule.target = guarded
            count += 1
    return count
