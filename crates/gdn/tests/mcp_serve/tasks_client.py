"""A real MCP client that declares the tasks extension (fastmcp 4.1.4 with
fastmcp-tasks 4.1.4, io.modelcontextprotocol/tasks of 2026-07-28), for
crates/gdn/tests/mcp_serve.rs.

Usage: tasks_client.py SPEC, where SPEC is JSON:
  {"server": {"command": ..., "args": [...], "env": {...}} | {"url": ...},
   "ops": [{"op": "call", "name": ..., "args": {...}}
          | {"op": "task", "name": ..., "args": {...}}
          | {"op": "cancel", "name": ..., "args": {...}, "after": SECONDS}, ...]}
`call` is fastmcp's transparent call_tool (it follows a task the server
answers with); `task` calls as a task (call_tool_task), reads its status and
waits for its result; `cancel` calls as a task, sends tasks/cancel after
`after` seconds and polls tasks/get until the task has ended. One JSON line
per operation, or {"exception": "..."} when the client raised.
"""

import asyncio
import json
import sys
import time

import fastmcp_tasks  # noqa: F401  (registers the client side of the extension)
from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from fastmcp_tasks import call_tool_task

TERMINAL = ("completed", "failed", "cancelled")


def dump(result):
    return {
        "content": [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content],
        "structuredContent": result.structured_content,
        "isError": result.is_error,
    }


async def run(client, op):
    if op["op"] == "call":
        started = time.monotonic()
        result = await client.call_tool(op["name"], op.get("args"), raise_on_error=False)
        return {**dump(result), "seconds": time.monotonic() - started}
    task = await call_tool_task(client, op["name"], op.get("args"), raise_on_error=False)
    first = (await task.status()).status
    if op["op"] == "task":
        return {"taskId": task.task_id, "first": first, **dump(await task.result())}
    if op["op"] == "cancel":
        await asyncio.sleep(op.get("after", 0.5))
        await task.cancel()
        deadline = time.monotonic() + 15
        status = (await task.status()).status
        while status not in TERMINAL and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            status = (await task.status()).status
        return {"taskId": task.task_id, "first": first, "status": status}
    raise ValueError(f"unknown op {op['op']}")


async def main(spec):
    server = spec["server"]
    if "url" in server:
        target = server["url"]
    else:
        target = StdioTransport(command=server["command"], args=server.get("args", []), env=server.get("env"))
    async with Client(target) as client:
        for op in spec["ops"]:
            try:
                line = await run(client, op)
            except Exception as error:  # the test asserts on what was raised
                line = {"exception": f"{type(error).__name__}: {error}"}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
