"""A real MCP client (the official Python SDK) for crates/gdn/tests/mcp_serve.rs.

Usage: client.py SPEC, where SPEC is JSON:
  {"server": {"command": ..., "args": [...], "env": {...}} | {"url": ...},
   "ops": [{"op": "list"} | {"op": "call", "name": ..., "args": {...}}, ...]}
Connects (stdio: starts the command; HTTP: the URL), runs the operations in
order and prints one JSON line per operation: the SDK's result as the wire
shape (camelCase), or {"exception": "..."} when the SDK raised.
"""

import asyncio
import json
import sys

from mcp import Client, StdioServerParameters


async def main(spec):
    server = spec["server"]
    if "url" in server:
        target = server["url"]
    else:
        target = StdioServerParameters(
            command=server["command"], args=server.get("args", []), env=server.get("env")
        )
    async with Client(target) as client:
        for op in spec["ops"]:
            try:
                if op["op"] == "list":
                    result = await client.list_tools()
                elif op["op"] == "call":
                    result = await client.call_tool(op["name"], op.get("args"))
                else:
                    raise ValueError(f"unknown op {op['op']}")
                line = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            except Exception as error:  # the test asserts on what was raised
                line = {"exception": f"{type(error).__name__}: {error}"}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
