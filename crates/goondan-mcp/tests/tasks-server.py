# An MCP server (fastmcp 4.1.4 with the tasks extension of fastmcp-tasks
# 4.1.4, io.modelcontextprotocol/tasks of the 2026-07-28 revision) for the
# client's task tests, over stdio (or HTTP with TASKS_SERVER_HTTP_PORT). Its tools run as tasks:
#   slow(seconds, text)  sleeps, then answers "<text> after <seconds>s";
#                        when its task is cancelled it writes the file
#                        TASKS_SERVER_CANCELLED (if set) before it stops
#   broken(message)      raises: its task completes with an error result
#   failing(message)     raises a JSON-RPC error: its task ends `failed`
#   ask()                asks the client for input (`input_required`)
#   die()                the server process exits while the task runs
# and `quick(x)` answers at once, outside any task.
import asyncio
import os
from datetime import timedelta

import mcp_types
from fastmcp import Context, FastMCP
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension
from mcp.shared.exceptions import MCPError

mcp = FastMCP("tasks-fixture")
mcp.add_extension(TasksExtension())
# Polled often: the tests wait for the end of each task.
TASK = TaskConfig(mode="optional", poll_interval=timedelta(milliseconds=100))


@mcp.tool(task=TASK)
async def slow(seconds: float = 1.0, text: str = "done") -> str:
    """Sleep, then answer."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        marker = os.environ.get("TASKS_SERVER_CANCELLED")
        if marker:
            with open(marker, "w") as out:
                out.write("cancelled")
        raise
    return f"{text} after {seconds}s"


@mcp.tool(task=TASK)
async def broken(message: str = "it broke") -> str:
    """Raise: the task completes with an error result (isError)."""
    await asyncio.sleep(0.2)
    raise RuntimeError(message)


@mcp.tool(task=TASK)
async def failing(message: str = "it failed") -> str:
    """Raise a JSON-RPC error: the task ends failed."""
    await asyncio.sleep(0.2)
    raise MCPError(-32050, message)


@mcp.tool(task=TASK)
async def ask(ctx: Context):
    """Ask the client something (the guard pattern): `input_required`."""
    if ctx.input_responses:
        return "answered"
    question = mcp_types.ElicitRequest(
        params=mcp_types.ElicitRequestFormParams(
            message="What now?",
            requested_schema={"type": "object", "properties": {"answer": {"type": "string"}}},
        )
    )
    return mcp_types.InputRequiredResult(input_requests={"q": question})


@mcp.tool(task=TASK)
async def die() -> str:
    """End the server process."""
    await asyncio.sleep(0.3)
    os._exit(3)


@mcp.tool
def quick(x: int) -> int:
    """Double x."""
    return x * 2


if __name__ == "__main__":
    # TASKS_SERVER_HTTP_PORT set: streamable HTTP on 127.0.0.1:PORT/mcp
    # (a server that is not the client's child), else stdio.
    port = os.environ.get("TASKS_SERVER_HTTP_PORT")
    if port:
        mcp.run(transport="http", host="127.0.0.1", port=int(port), show_banner=False)
    else:
        mcp.run(show_banner=False)
